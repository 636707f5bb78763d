//! The plan of a valid problem (splits, grids, scratch sizes: [`MhcLayout`]) and, for the tensors
//! of one call, the launches of each pass ([`MhcForwardPre`], [`MhcForwardPost`],
//! [`MhcBackward`]): pure, checked against the problem (sizes, alignment, gamma), run on any
//! [`Exec`].

use super::MhcProblem;
use crate::error::{Error, Result};
use crate::exec::{DevView, Exec};
use crate::launch::Launch;
use half::bf16;
use kernel_abi::Kernel;
use kernel_abi::mhc::{
    self as abi, BwdCoeffParams, DhdvParams, DxParams, FinalizeParams, FwdCoeffParams, PostParams,
    PreParams, PrepParams, ProjParams, WgradParams,
};

impl MhcProblem {
    /// Splits, grids and scratch sizes (the problem must be valid: see
    /// [`MhcProblem::validate`]; the launches of the plan validate it again).
    pub fn layout(&self) -> MhcLayout {
        let (n, c) = (self.n as u32, self.c as u32);
        let (t, k) = (self.tokens() as u32, self.k() as u32);
        let proj = self.proj_config();
        let token_blocks = t.div_ceil(abi::proj_tokens(n));
        let chunks = abi::f1_chunks(k);
        let want = proj.target_blocks.div_ceil(token_blocks).clamp(1, chunks);
        let chunks_per_split = chunks.div_ceil(want);
        let proj_splits = chunks.div_ceil(chunks_per_split);
        let k_tiles = k.div_ceil(abi::wg_ktile(n));
        let steps = t.div_ceil(abi::WG_STEP);
        let want = abi::WG_TARGET_BLOCKS.div_ceil(k_tiles).clamp(1, steps);
        let steps_per_split = steps.div_ceil(want);
        let w_splits = steps.div_ceil(steps_per_split);
        let (m, m16) = (abi::m_of(n) as usize, abi::m16_of(n) as usize);
        let coef_blocks = t.div_ceil(abi::COEFF_TOKENS);
        MhcLayout {
            problem: *self,
            proj,
            token_blocks,
            chunks_per_split,
            proj_splits,
            k_tiles,
            tokens_per_split: steps_per_split * abi::WG_STEP,
            w_splits,
            coef_blocks,
            packed_f1: abi::f1_words(n, k) as usize,
            packed_b2: abi::b2_words(n, c) as usize,
            part_proj: proj_splits as usize * t as usize * m,
            part_sumsq: proj_splits as usize * t as usize,
            dh: t as usize * m,
            u: t as usize * m16,
            part_coef: coef_blocks as usize * abi::COEF_PARTIAL as usize,
            part_w: w_splits as usize * k as usize * m,
        }
    }
}

/// How a valid problem is launched: splits, grids, scratch sizes (elements).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MhcLayout {
    /// The problem.
    pub problem: MhcProblem,
    /// The projection's pipeline.
    pub proj: abi::ProjConfig,
    /// Token blocks of the projection.
    pub token_blocks: u32,
    /// K chunks (32 values) per projection split.
    pub chunks_per_split: u32,
    /// K splits of the projection.
    pub proj_splits: u32,
    /// K tiles of the weight gradient.
    pub k_tiles: u32,
    /// Tokens per split of the weight gradient.
    pub tokens_per_split: u32,
    /// Token splits of the weight gradient.
    pub w_splits: u32,
    /// Blocks of the backward coefficient kernel (rows of its partials).
    pub coef_blocks: u32,
    /// u32 words of the projection packing of `phi'`.
    pub packed_f1: usize,
    /// u32 words of the input-gradient packing of `phi'`.
    pub packed_b2: usize,
    /// f32 partial projections.
    pub part_proj: usize,
    /// f32 partial sums of squares.
    pub part_sumsq: usize,
    /// f32 `dL/dH` per token.
    pub dh: usize,
    /// f32 `dL/d(x~ phi')` per token (`m16` stride).
    pub u: usize,
    /// f32 partials of `dbias`, `dalpha`.
    pub part_coef: usize,
    /// f32 partials of `W = x~^T u`.
    pub part_w: usize,
}

/// The weights as views.
#[derive(Clone, Copy)]
pub struct RawWeights<'a> {
    /// `[K, M]` f32.
    pub phi: DevView<'a, f32>,
    /// `[K]` f32, given exactly when the problem has `gamma`.
    pub gamma: Option<DevView<'a, f32>>,
    /// `[3]` f32.
    pub alpha: DevView<'a, f32>,
    /// `[M]` f32.
    pub bias: DevView<'a, f32>,
}

/// The saved coefficients as views (outputs of the forward's first half).
#[derive(Clone, Copy)]
pub struct RawCoefficients<'a> {
    /// `[T, n]` f32.
    pub h_pre: DevView<'a, f32>,
    /// `[T, n]` f32.
    pub h_post: DevView<'a, f32>,
    /// `[T, n, n]` f32.
    pub h_res: DevView<'a, f32>,
    /// `[T, M]` f32: `h~`.
    pub hproj: DevView<'a, f32>,
    /// `[T]` f32: `r`.
    pub rms: DevView<'a, f32>,
}

/// The scratch buffers as views (sizes in [`MhcLayout`]).
#[derive(Clone, Copy)]
pub struct RawScratch<'a> {
    /// Projection packing of `phi'`.
    pub packed_f1: DevView<'a, u32>,
    /// Input-gradient packing of `phi'`.
    pub packed_b2: DevView<'a, u32>,
    /// Partial projections.
    pub part_proj: DevView<'a, f32>,
    /// Partial sums of squares.
    pub part_sumsq: DevView<'a, f32>,
    /// `dL/dH`.
    pub dh: DevView<'a, f32>,
    /// `dL/d(x~ phi')`.
    pub u: DevView<'a, f32>,
    /// The norm's coefficient of `x` in `dx`.
    pub xcoef: DevView<'a, f32>,
    /// Partials of `dbias`, `dalpha`.
    pub part_coef: DevView<'a, f32>,
    /// Partials of `W`.
    pub part_w: DevView<'a, f32>,
}

/// The gradients as views (outputs of the backward).
#[derive(Clone, Copy)]
pub struct RawGradients<'a> {
    /// `[T, n, C]` bf16.
    pub dx: DevView<'a, bf16>,
    /// `[T, C]` bf16.
    pub dy: DevView<'a, bf16>,
    /// `[K, M]` f32.
    pub dphi: DevView<'a, f32>,
    /// `[K]` f32, given exactly when the problem has `gamma`.
    pub dgamma: Option<DevView<'a, f32>>,
    /// `[3]` f32.
    pub dalpha: DevView<'a, f32>,
    /// `[M]` f32.
    pub dbias: DevView<'a, f32>,
}

/// The launches of the forward's first half: pack `phi'`, project, the coefficients,
/// `x_in = H_pre x`.
#[derive(Clone, Copy, Debug)]
pub struct MhcForwardPre {
    /// `mhc_prep`.
    pub prep: Launch<PrepParams>,
    /// `mhc_fwd_proj_n{n}` or a tuning variant.
    pub proj: Launch<ProjParams>,
    /// `mhc_fwd_coeff`.
    pub coeff: Launch<FwdCoeffParams>,
    /// `mhc_fwd_pre_n{n}`.
    pub pre: Launch<PreParams>,
}

/// The launch of the forward's second half: `x_next = H_res x + H_post^T y`.
#[derive(Clone, Copy, Debug)]
pub struct MhcForwardPost {
    /// `mhc_fwd_post_n{n}`.
    pub post: Launch<PostParams>,
}

/// The launches of the backward.
#[derive(Clone, Copy, Debug)]
pub struct MhcBackward {
    /// `mhc_prep`.
    pub prep: Launch<PrepParams>,
    /// `mhc_bwd_dh_n{n}`.
    pub dh: Launch<DhdvParams>,
    /// `mhc_bwd_coeff`.
    pub coeff: Launch<BwdCoeffParams>,
    /// `mhc_bwd_dx_n{n}`.
    pub dx: Launch<DxParams>,
    /// `mhc_bwd_wgrad_n{n}`.
    pub wgrad: Launch<WgradParams>,
    /// `mhc_bwd_finalize_n{n}`.
    pub finalize: Launch<FinalizeParams>,
}

fn check<T>(what: &str, view: &DevView<'_, T>, len: usize, align: u64) -> Result<()> {
    if view.len() != len {
        return Err(Error::shape(what, format!("{len} elements"), view.len()));
    }
    if !view.addr().is_multiple_of(align) {
        return Err(Error::Misaligned {
            what: what.to_string(),
            required: align,
            actual: view.addr() % align,
        });
    }
    Ok(())
}

fn check_gamma(problem: &MhcProblem, what: &str, given: bool) -> Result<()> {
    if given == problem.gamma {
        Ok(())
    } else if problem.gamma {
        Err(Error::invalid(
            what,
            "the problem has gamma, but none was given",
        ))
    } else {
        Err(Error::invalid(what, "given, but the problem has no gamma"))
    }
}

fn check_weights(problem: &MhcProblem, w: &RawWeights) -> Result<()> {
    let (k, m) = (problem.k(), problem.m());
    check("phi", &w.phi, k * m, 4)?;
    check("alpha", &w.alpha, 3, 4)?;
    check("bias", &w.bias, m, 4)?;
    check_gamma(problem, "gamma", w.gamma.is_some())?;
    if let Some(g) = &w.gamma {
        check("gamma", g, k, 4)?;
    }
    Ok(())
}

fn check_coefficients(problem: &MhcProblem, c: &RawCoefficients) -> Result<()> {
    let (t, n, m) = (problem.tokens(), problem.n, problem.m());
    check("h_pre", &c.h_pre, t * n, 4)?;
    check("h_post", &c.h_post, t * n, 4)?;
    check("h_res", &c.h_res, t * n * n, 4)?;
    check("hproj", &c.hproj, t * m, 4)?;
    check("rms", &c.rms, t, 4)
}

fn check_scratch(plan: &MhcLayout, s: &RawScratch) -> Result<()> {
    let t = plan.problem.tokens();
    check("scratch packed_f1", &s.packed_f1, plan.packed_f1, 16)?;
    check("scratch packed_b2", &s.packed_b2, plan.packed_b2, 16)?;
    check("scratch part_proj", &s.part_proj, plan.part_proj, 4)?;
    check("scratch part_sumsq", &s.part_sumsq, plan.part_sumsq, 4)?;
    check("scratch dh", &s.dh, plan.dh, 4)?;
    check("scratch u", &s.u, plan.u, 16)?;
    check("scratch xcoef", &s.xcoef, t, 4)?;
    check("scratch part_coef", &s.part_coef, plan.part_coef, 4)?;
    check("scratch part_w", &s.part_w, plan.part_w, 4)
}

fn grid_1d(blocks: usize) -> Result<(u32, u32, u32)> {
    u32::try_from(blocks)
        .ok()
        .filter(|b| *b >= 1 && *b <= i32::MAX as u32)
        .map(|b| (b, 1, 1))
        .ok_or_else(|| Error::unsupported("mHC grid", format!("{blocks} blocks")))
}

/// The handle of `n` streams in a per-`n` table (`n` validated).
fn kernel_for<P, S>(table: &'static [Kernel<P, S>], n: usize) -> Result<&'static Kernel<P, S>> {
    u32::try_from(n)
        .ok()
        .and_then(|n| abi::for_n(table, n))
        .ok_or_else(|| Error::unsupported(format!("mHC n = {n}"), "no kernel for it"))
}

fn null_or<T>(view: Option<DevView<'_, T>>) -> *const T {
    view.map_or(std::ptr::null(), |v| v.ptr())
}

impl MhcLayout {
    /// The launch of `mhc_prep`: pack `phi'` (weights and scratch checked by the callers).
    fn prep(&self, w: &RawWeights, s: &RawScratch) -> Result<Launch<PrepParams>> {
        let params = PrepParams {
            phi: w.phi.ptr(),
            gamma: null_or(w.gamma),
            packed_f1: s.packed_f1.ptr(),
            packed_b2: s.packed_b2.ptr(),
            n: self.problem.n as u32,
            c: self.problem.c as u32,
        };
        let blocks = (self.packed_f1 + self.packed_b2).div_ceil(abi::PREP.threads as usize);
        Ok(Launch::new(&abi::PREP, grid_1d(blocks)?, (), params))
    }

    /// The launches of the forward's first half on these tensors: the coefficients of every
    /// token (saved in `coeffs`) and `x_in`. Checks the problem and every view (length,
    /// alignment, gamma given exactly when the problem has it).
    pub fn forward_pre(
        &self,
        weights: &RawWeights,
        x: DevView<bf16>,
        scratch: &RawScratch,
        coeffs: &RawCoefficients,
        x_in: DevView<bf16>,
    ) -> Result<MhcForwardPre> {
        let problem = &self.problem;
        problem.validate()?;
        let (t, n, c, k) = (problem.tokens(), problem.n, problem.c, problem.k());
        check_weights(problem, weights)?;
        check("x", &x, t * k, 16)?;
        check("x_in", &x_in, t * c, 16)?;
        check_scratch(self, scratch)?;
        check_coefficients(problem, coeffs)?;
        let proj_kernel = problem.proj_kernel().ok_or_else(|| {
            Error::unsupported("mHC projection", format!("no kernel for {problem:?}"))
        })?;
        let proj = Launch::new(
            proj_kernel,
            (self.token_blocks, self.proj_splits, 1),
            (),
            ProjParams {
                x: x.ptr(),
                packed_f1: scratch.packed_f1.ptr(),
                part_proj: scratch.part_proj.ptr(),
                part_sumsq: scratch.part_sumsq.ptr(),
                tokens: t as u32,
                k: k as u32,
                chunks_per_split: self.chunks_per_split,
            },
        );
        let coeff = Launch::new(
            &abi::FWD_COEFF,
            grid_1d(t.div_ceil(abi::COEFF_TOKENS as usize))?,
            (),
            FwdCoeffParams {
                part_proj: scratch.part_proj.ptr(),
                part_sumsq: scratch.part_sumsq.ptr(),
                alpha: weights.alpha.ptr(),
                bias: weights.bias.ptr(),
                h_pre: coeffs.h_pre.ptr(),
                h_post: coeffs.h_post.ptr(),
                h_res: coeffs.h_res.ptr(),
                hproj: coeffs.hproj.ptr(),
                rms: coeffs.rms.ptr(),
                tokens: t as u32,
                n: n as u32,
                k: k as u32,
                splits: self.proj_splits,
                iters: problem.sinkhorn_iters,
                eps: problem.eps,
            },
        );
        let pre = kernel_for(abi::FWD_PRE, n)?;
        let pre = Launch::new(
            pre,
            grid_1d((t * c / 8).div_ceil(pre.threads as usize))?,
            (),
            PreParams {
                x: x.ptr(),
                h_pre: coeffs.h_pre.ptr(),
                x_in: x_in.ptr(),
                tokens: t as u32,
                c: c as u32,
            },
        );
        Ok(MhcForwardPre {
            prep: self.prep(weights, scratch)?,
            proj,
            coeff,
            pre,
        })
    }

    /// The launch of the forward's second half on these tensors: `x_next = H_res x + H_post^T y`.
    pub fn forward_post(
        &self,
        x: DevView<bf16>,
        y: DevView<bf16>,
        coeffs: &RawCoefficients,
        x_next: DevView<bf16>,
    ) -> Result<MhcForwardPost> {
        let problem = &self.problem;
        problem.validate()?;
        let (t, n, c, k) = (problem.tokens(), problem.n, problem.c, problem.k());
        check("x", &x, t * k, 16)?;
        check("y", &y, t * c, 16)?;
        check("x_next", &x_next, t * k, 16)?;
        check_coefficients(problem, coeffs)?;
        let post = kernel_for(abi::FWD_POST, n)?;
        Ok(MhcForwardPost {
            post: Launch::new(
                post,
                grid_1d((t * c / 8).div_ceil(post.threads as usize))?,
                (),
                PostParams {
                    x: x.ptr(),
                    y: y.ptr(),
                    h_post: coeffs.h_post.ptr(),
                    h_res: coeffs.h_res.ptr(),
                    x_next: x_next.ptr(),
                    tokens: t as u32,
                    c: c as u32,
                },
            ),
        })
    }

    /// The launches of the backward on these tensors: every gradient into `grads`.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        weights: &RawWeights,
        x: DevView<bf16>,
        y: DevView<bf16>,
        coeffs: &RawCoefficients,
        d_xin: DevView<bf16>,
        d_xnext: DevView<bf16>,
        scratch: &RawScratch,
        grads: &RawGradients,
    ) -> Result<MhcBackward> {
        let problem = &self.problem;
        problem.validate()?;
        let (t, n, c, k, m) = (
            problem.tokens(),
            problem.n,
            problem.c,
            problem.k(),
            problem.m(),
        );
        check_weights(problem, weights)?;
        check("x", &x, t * k, 16)?;
        check("y", &y, t * c, 16)?;
        check("d_xin", &d_xin, t * c, 16)?;
        check("d_xnext", &d_xnext, t * k, 16)?;
        check_coefficients(problem, coeffs)?;
        check_scratch(self, scratch)?;
        check("dx", &grads.dx, t * k, 16)?;
        check("dy", &grads.dy, t * c, 16)?;
        check("dphi", &grads.dphi, k * m, 4)?;
        check("dalpha", &grads.dalpha, 3, 4)?;
        check("dbias", &grads.dbias, m, 4)?;
        check_gamma(problem, "dgamma", grads.dgamma.is_some())?;
        if let Some(g) = &grads.dgamma {
            check("dgamma", g, k, 4)?;
        }
        let dh = kernel_for(abi::BWD_DH, n)?;
        let dh = Launch::new(
            dh,
            grid_1d(t.div_ceil(abi::DH_TOKENS as usize))?,
            (),
            DhdvParams {
                x: x.ptr(),
                y: y.ptr(),
                d_xin: d_xin.ptr(),
                d_xnext: d_xnext.ptr(),
                h_post: coeffs.h_post.ptr(),
                dh: scratch.dh.ptr(),
                dy: grads.dy.ptr(),
                tokens: t as u32,
                c: c as u32,
            },
        );
        let coeff = Launch::new(
            &abi::BWD_COEFF,
            (self.coef_blocks, 1, 1),
            problem.sinkhorn_iters,
            BwdCoeffParams {
                dh: scratch.dh.ptr(),
                hproj: coeffs.hproj.ptr(),
                rms: coeffs.rms.ptr(),
                alpha: weights.alpha.ptr(),
                bias: weights.bias.ptr(),
                u: scratch.u.ptr(),
                xcoef: scratch.xcoef.ptr(),
                part_coef: scratch.part_coef.ptr(),
                tokens: t as u32,
                n: n as u32,
                k: k as u32,
                iters: problem.sinkhorn_iters,
            },
        );
        let dx = Launch::new(
            kernel_for(abi::BWD_DX, n)?,
            grid_1d(t.div_ceil(abi::DX_TOKENS as usize))?,
            (),
            DxParams {
                x: x.ptr(),
                d_xin: d_xin.ptr(),
                d_xnext: d_xnext.ptr(),
                h_pre: coeffs.h_pre.ptr(),
                h_res: coeffs.h_res.ptr(),
                xcoef: scratch.xcoef.ptr(),
                u: scratch.u.ptr(),
                packed_b2: scratch.packed_b2.ptr(),
                dx: grads.dx.ptr(),
                tokens: t as u32,
                c: c as u32,
            },
        );
        let wgrad = Launch::new(
            kernel_for(abi::BWD_WGRAD, n)?,
            (self.k_tiles, self.w_splits, 1),
            (),
            WgradParams {
                x: x.ptr(),
                u: scratch.u.ptr(),
                part_w: scratch.part_w.ptr(),
                tokens: t as u32,
                k: k as u32,
                tokens_per_split: self.tokens_per_split,
            },
        );
        let finalize = Launch::new(
            kernel_for(abi::BWD_FINALIZE, n)?,
            (abi::finalize_blocks(n as u32, k as u32), 1, 1),
            (),
            FinalizeParams {
                part_w: scratch.part_w.ptr(),
                part_coef: scratch.part_coef.ptr(),
                phi: weights.phi.ptr(),
                gamma: null_or(weights.gamma),
                dphi: grads.dphi.ptr(),
                dgamma: grads.dgamma.map_or(std::ptr::null_mut(), |g| g.ptr()),
                dbias: grads.dbias.ptr(),
                dalpha: grads.dalpha.ptr(),
                n: n as u32,
                k: k as u32,
                w_splits: self.w_splits,
                coef_blocks: self.coef_blocks,
            },
        );
        Ok(MhcBackward {
            prep: self.prep(weights, scratch)?,
            dh,
            coeff,
            dx,
            wgrad,
            finalize,
        })
    }
}

impl MhcForwardPre {
    /// Run the launches in order (asynchronous on a stream).
    ///
    /// # Safety
    /// The tensors the launches were planned for are memory `exec`'s kernels can access, for the
    /// duration of the launches, and the outputs (`coeffs`, scratch, `x_in`) do not overlap each
    /// other or the inputs.
    pub unsafe fn run(&self, exec: &impl Exec) -> Result<()> {
        // SAFETY: for every launch, the plan checked every view's length and alignment against
        // the problem (packings and partials of the plan's sizes, x and x_in 16-byte aligned);
        // the grids cover every packed word, T and every K chunk (chunks_per_split * splits >=
        // chunks), T C / 8 vectors; 2 <= n <= 8; the memory is live (the caller's contract).
        unsafe {
            exec.launch(&self.prep)?;
            exec.launch(&self.proj)?;
            exec.launch(&self.coeff)?;
            exec.launch(&self.pre)
        }
    }
}

impl MhcForwardPost {
    /// Run the launch (asynchronous on a stream).
    ///
    /// # Safety
    /// As for [`MhcForwardPre::run`] (`x_next` is the only output).
    pub unsafe fn run(&self, exec: &impl Exec) -> Result<()> {
        // SAFETY: sizes and alignment checked by the plan; the grid covers T C / 8 vectors; the
        // memory is live (the caller's contract).
        unsafe { exec.launch(&self.post) }
    }
}

impl MhcBackward {
    /// Run the launches in order (asynchronous on a stream).
    ///
    /// # Safety
    /// As for [`MhcForwardPre::run`] (outputs: scratch and the gradients).
    pub unsafe fn run(&self, exec: &impl Exec) -> Result<()> {
        // SAFETY: for every launch, sizes and alignment checked by the plan, dgamma given exactly
        // when gamma is; the grids cover T (dH, coefficients: coef_blocks rows of part_coef, dx),
        // K and every token (wgrad: tokens_per_split a multiple of WG_STEP), K rows and the
        // M + 3 coefficient outputs (finalize); bwd_coeff's shared memory is sized for the
        // problem's iterations; the memory is live (the caller's contract).
        unsafe {
            exec.launch(&self.prep)?;
            exec.launch(&self.dh)?;
            exec.launch(&self.coeff)?;
            exec.launch(&self.dx)?;
            exec.launch(&self.wgrad)?;
            exec.launch(&self.finalize)
        }
    }
}

/// The tensors of one call of a pass, as views.
#[derive(Clone, Copy)]
pub enum MhcTensors<'a> {
    /// The forward's first half: the coefficients of every token (into `coeffs`) and `x_in`.
    ForwardPre {
        /// The weights.
        weights: RawWeights<'a>,
        /// `[T, n, C]` bf16.
        x: DevView<'a, bf16>,
        /// Scratch of the layout's sizes.
        scratch: RawScratch<'a>,
        /// The saved coefficients (written).
        coeffs: RawCoefficients<'a>,
        /// `[T, C]` bf16 (written).
        x_in: DevView<'a, bf16>,
    },
    /// The forward's second half: `x_next = H_res x + H_post^T y`.
    ForwardPost {
        /// `[T, n, C]` bf16.
        x: DevView<'a, bf16>,
        /// `[T, C]` bf16, the layer's output.
        y: DevView<'a, bf16>,
        /// The saved coefficients.
        coeffs: RawCoefficients<'a>,
        /// `[T, n, C]` bf16 (written).
        x_next: DevView<'a, bf16>,
    },
    /// The backward: every gradient into `grads`.
    Backward {
        /// The weights.
        weights: RawWeights<'a>,
        /// `[T, n, C]` bf16.
        x: DevView<'a, bf16>,
        /// `[T, C]` bf16.
        y: DevView<'a, bf16>,
        /// The saved coefficients.
        coeffs: RawCoefficients<'a>,
        /// `[T, C]` bf16: the gradient of `x_in`.
        d_xin: DevView<'a, bf16>,
        /// `[T, n, C]` bf16: the gradient of `x_next`.
        d_xnext: DevView<'a, bf16>,
        /// Scratch of the layout's sizes.
        scratch: RawScratch<'a>,
        /// The gradients (written).
        grads: RawGradients<'a>,
    },
}

/// The launches of one pass on its tensors ([`MhcProblem::plan`]). Its variants differ in size
/// (the backward has six launches); a plan lives for one call, on the stack, so none is boxed.
#[derive(Clone, Copy, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum MhcPlan {
    /// [`MhcTensors::ForwardPre`].
    ForwardPre(MhcForwardPre),
    /// [`MhcTensors::ForwardPost`].
    ForwardPost(MhcForwardPost),
    /// [`MhcTensors::Backward`].
    Backward(MhcBackward),
}

impl MhcProblem {
    /// Plan one pass on `tensors`: the problem and every view are checked (length, alignment,
    /// gamma given exactly when the problem has it), the launches built from the
    /// [`MhcProblem::layout`]. Pure: no GPU needed.
    pub fn plan(&self, tensors: &MhcTensors<'_>) -> Result<MhcPlan> {
        self.validate()?;
        let layout = self.layout();
        Ok(match *tensors {
            MhcTensors::ForwardPre {
                weights,
                x,
                scratch,
                coeffs,
                x_in,
            } => MhcPlan::ForwardPre(layout.forward_pre(&weights, x, &scratch, &coeffs, x_in)?),
            MhcTensors::ForwardPost {
                x,
                y,
                coeffs,
                x_next,
            } => MhcPlan::ForwardPost(layout.forward_post(x, y, &coeffs, x_next)?),
            MhcTensors::Backward {
                weights,
                x,
                y,
                coeffs,
                d_xin,
                d_xnext,
                scratch,
                grads,
            } => MhcPlan::Backward(
                layout.backward(&weights, x, y, &coeffs, d_xin, d_xnext, &scratch, &grads)?,
            ),
        })
    }
}

impl MhcPlan {
    /// Run the pass's launches in order (asynchronous on a stream).
    ///
    /// # Safety
    /// As for [`MhcForwardPre::run`]: the planned tensors are live memory of `exec`, outputs
    /// overlap nothing.
    pub unsafe fn run(&self, exec: &impl Exec) -> Result<()> {
        // SAFETY: forwarded to the caller; each pass's launches were checked by the plan.
        unsafe {
            match self {
                MhcPlan::ForwardPre(p) => p.run(exec),
                MhcPlan::ForwardPost(p) => p.run(exec),
                MhcPlan::Backward(p) => p.run(exec),
            }
        }
    }
}
