//! mHC (manifold-constrained hyper-connections, DeepSeek, arXiv 2512.24880): per-token
//! coefficients of `n` residual streams, their applications, and the full backward.
//!
//! # Semantics (the f64 reference in [`reference`] is the specification)
//! Per token, `x~ = x[b, s]` flattened (`K = n C` values, bf16), `M = n^2 + 2 n`:
//! - `r = sqrt(|x~|^2 / K + eps)` (`eps = 0` is the plain `|x~| / sqrt(K)`);
//! - `h~ = x~ phi' / r` with `phi' = diag(gamma) phi` (`phi [K, M]` f32, `gamma [K]` optional);
//! - `H_pre = sigmoid(a_pre h~_pre + b_pre)`, `H_post = 2 sigmoid(a_post h~_post + b_post)`,
//!   `H_res = SinkhornKnopp(exp(a_res h~_res + b_res))` (`t_max` iterations, each a row then a
//!   column normalisation), coefficients in the order pre `[0, n)`, post `[n, 2n)`, res
//!   `[2n, 2n + n^2)` (row-major), for `alpha = (a_pre, a_post, a_res)` and `bias [M]`;
//! - `x_in = H_pre x` (`[B, S, C]`, the layer's input), and, given the layer's output `y`,
//!   `x_next = H_res x + H_post^T y` (`[B, S, n, C]`), both bf16.
//!
//! The backward takes `d_xin`, `d_xnext` (bf16) and produces `dx`, `dy` (bf16), `dphi`,
//! `dgamma`, `dalpha`, `dbias` (f32), through every Sinkhorn iteration.
//!
//! # API
//! [`MhcProblem`] (validated before anything is launched), device buffers for the weights
//! ([`MhcWeights`]), the saved coefficients ([`MhcCoefficients`], written by [`forward_pre`],
//! read by [`forward_post`] and [`backward`]), a scratch [`MhcWorkspace`] and
//! [`MhcGradients`]. Every launcher is asynchronous on the given stream. The same launch
//! sequence is available over raw device views and any [`Exec`] ([`forward_pre_raw`], ...),
//! which the CPU tests use to run the kernels in the emulator.
//!
//! Kernels, tiling and the reasons for them: `gpu-kernels/src/mhc/`.

pub mod reference;

use crate::error::{Error, Result};
use crate::gpu::{Gpu, LaunchConfig};
use crate::memory::{poisoned, zeroed};
use cust::memory::DeviceBuffer;
use cust::stream::Stream;
use half::bf16;
use kernel_abi::mhc as abi;

/// Default number of Sinkhorn iterations (DeepSeek's).
pub const DEFAULT_SINKHORN_ITERS: u32 = 20;
/// Default RMS epsilon.
pub const DEFAULT_EPS: f32 = 1e-6;

/// An mHC problem: shapes and options. Tensors are contiguous and row-major.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MhcProblem {
    /// Batch size `B`.
    pub batch: usize,
    /// Sequence length `S`.
    pub seq: usize,
    /// Residual streams `n` (2..=8).
    pub n: usize,
    /// Channels per stream `C` (a multiple of 8).
    pub c: usize,
    /// Sinkhorn iterations `t_max` (1..=`MAX_SINKHORN_ITERS`).
    pub sinkhorn_iters: u32,
    /// RMS epsilon (finite, `>= 0`).
    pub eps: f32,
    /// Whether an RMSNorm weight `gamma [n C]` is given (folded into `phi`).
    pub gamma: bool,
    /// A tuning variant of the projection's pipeline (`kernel_abi::mhc::PROJ_VARIANTS`, for
    /// this `n`), or `None` for the default `proj_config(n)`. Results may differ in the last
    /// bits between variants (the K split changes the summation order).
    pub proj_variant: Option<&'static str>,
}

impl MhcProblem {
    /// A problem with the default options (20 iterations, `eps = 1e-6`, no `gamma`).
    pub fn new(batch: usize, seq: usize, n: usize, c: usize) -> Self {
        MhcProblem {
            batch,
            seq,
            n,
            c,
            sinkhorn_iters: DEFAULT_SINKHORN_ITERS,
            eps: DEFAULT_EPS,
            gamma: false,
            proj_variant: None,
        }
    }

    /// The same problem with (`true`) or without an RMSNorm weight.
    pub fn with_gamma(mut self, gamma: bool) -> Self {
        self.gamma = gamma;
        self
    }

    /// The same problem with `iters` Sinkhorn iterations.
    pub fn with_iters(mut self, iters: u32) -> Self {
        self.sinkhorn_iters = iters;
        self
    }

    /// The same problem with RMS epsilon `eps`.
    pub fn with_eps(mut self, eps: f32) -> Self {
        self.eps = eps;
        self
    }

    /// Tokens `T = B S`.
    pub fn tokens(&self) -> usize {
        self.batch * self.seq
    }

    /// `K = n C`.
    pub fn k(&self) -> usize {
        self.n * self.c
    }

    /// Coefficients per token, `M = n^2 + 2 n`.
    pub fn m(&self) -> usize {
        self.n * self.n + 2 * self.n
    }

    /// Check everything the kernels require.
    pub fn validate(&self) -> Result<()> {
        if self.batch == 0 || self.seq == 0 {
            return Err(Error::invalid(
                "mHC batch and sequence",
                "must be at least 1",
            ));
        }
        if !(abi::MIN_N as usize..=abi::MAX_N as usize).contains(&self.n) {
            return Err(Error::unsupported(
                format!("mHC n = {}", self.n),
                format!("streams must be {}..={}", abi::MIN_N, abi::MAX_N),
            ));
        }
        if self.c == 0 {
            return Err(Error::invalid("mHC C", "must be at least 8"));
        }
        if !self.c.is_multiple_of(abi::C_MULTIPLE as usize) {
            return Err(Error::unsupported(
                format!("mHC C = {}", self.c),
                format!(
                    "must be a multiple of {} (16-byte vectors)",
                    abi::C_MULTIPLE
                ),
            ));
        }
        if self.sinkhorn_iters == 0 {
            return Err(Error::invalid("mHC sinkhorn_iters", "must be at least 1"));
        }
        if self.sinkhorn_iters > abi::MAX_SINKHORN_ITERS {
            return Err(Error::unsupported(
                format!("mHC sinkhorn_iters = {}", self.sinkhorn_iters),
                format!(
                    "at most {} (the backward keeps every iterate in shared memory)",
                    abi::MAX_SINKHORN_ITERS
                ),
            ));
        }
        if !self.eps.is_finite() || self.eps < 0.0 {
            return Err(Error::invalid(
                "mHC eps",
                format!("{} is not finite and >= 0", self.eps),
            ));
        }
        if let Some(v) = self.proj_variant
            && abi::proj_variant(self.n as u32, v).is_none()
        {
            return Err(Error::unsupported(
                format!("mHC projection variant {v:?}"),
                format!("no such variant for n = {}", self.n),
            ));
        }
        // Products in u128 (a wrapped usize product could pass the limits).
        let (t, k) = (
            self.batch as u128 * self.seq as u128,
            self.n as u128 * self.c as u128,
        );
        if k > 1 << 20 || t > i32::MAX as u128 || t * k > 1 << 40 {
            return Err(Error::unsupported(
                format!("mHC size (T = {t}, n C = {k})"),
                "n C must be at most 2^20, T below 2^31 and T n C at most 2^40".to_string(),
            ));
        }
        Ok(())
    }

    /// Bytes the forward must move at least (`x` read by `x_in` and again by `x_next`, which
    /// needs `y` = the layer applied to `x_in`; `y` read; `x_in`, `x_next` written), bf16:
    /// `2 (3 n C + 2 C)` per token.
    pub fn forward_bytes(&self) -> f64 {
        2.0 * (3 * self.k() + 2 * self.c) as f64 * self.tokens() as f64
    }

    /// Bytes the backward must move at least: `x`, `y`, `d_xin`, `d_xnext` read and `dx`,
    /// `dy` written, bf16: `2 (3 n C + 3 C)` per token.
    pub fn backward_bytes(&self) -> f64 {
        2.0 * (3 * self.k() + 3 * self.c) as f64 * self.tokens() as f64
    }

    /// FLOPs of the projection `x~ phi'` (`2 K M` per token; the backward does it twice more).
    pub fn projection_flops(&self) -> f64 {
        2.0 * (self.k() * self.m()) as f64 * self.tokens() as f64
    }

    /// The projection's pipeline: the default for `n`, or the tuning variant (which
    /// [`MhcProblem::validate`] checks exists; the default is used if it does not).
    pub fn proj_config(&self) -> abi::ProjConfig {
        self.proj_variant
            .and_then(|v| abi::proj_variant(self.n as u32, v))
            .unwrap_or(abi::proj_config(self.n as u32))
    }

    /// Name of the projection kernel.
    pub fn proj_kernel(&self) -> String {
        match self.proj_variant {
            Some(v) => format!("mhc_fwd_proj_n{}_{v}", self.n),
            None => format!("mhc_fwd_proj_n{}", self.n),
        }
    }

    /// Grid shapes, splits and scratch sizes (the problem must be valid).
    pub fn plan(&self) -> Plan {
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
        Plan {
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
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

pub use crate::exec::{DevView, Exec, OnStream};

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

/// The scratch buffers as views (sizes in [`Plan`]).
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

fn check_scratch(problem: &MhcProblem, plan: &Plan, s: &RawScratch) -> Result<()> {
    let t = problem.tokens();
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

/// Pack `phi'` (`mhc_prep`).
///
/// # Safety
/// The views are valid for `exec` (validated here for sizes and alignment).
unsafe fn prep(
    exec: &impl Exec,
    problem: &MhcProblem,
    plan: &Plan,
    w: &RawWeights,
    s: &RawScratch,
) -> Result<()> {
    let params = abi::PrepParams {
        phi: w.phi.ptr(),
        gamma: w.gamma.map_or(std::ptr::null(), |g| g.ptr()),
        packed_f1: s.packed_f1.ptr(),
        packed_b2: s.packed_b2.ptr(),
        n: problem.n as u32,
        c: problem.c as u32,
    };
    let blocks = (plan.packed_f1 + plan.packed_b2).div_ceil(abi::PREP_THREADS as usize);
    let cfg = LaunchConfig::new(grid_1d(blocks)?, abi::PREP_THREADS, 0);
    // SAFETY: phi [K, M], gamma [K] (or null), packings of the plan's sizes (checked by the
    // callers); the grid covers every packed word.
    unsafe { exec.launch_by_name("mhc_prep", &cfg, &params) }
}

/// The first half of the forward over views: coefficients (saved in `coeffs`) and `x_in`.
///
/// # Safety
/// Every view refers to memory `exec`'s kernels can access, for the duration of the launches;
/// outputs (`coeffs`, `scratch`, `x_in`) do not overlap each other or the inputs. Sizes and
/// alignment are validated here.
#[allow(clippy::too_many_arguments)]
pub unsafe fn forward_pre_raw(
    exec: &impl Exec,
    problem: &MhcProblem,
    weights: &RawWeights,
    x: DevView<bf16>,
    scratch: &RawScratch,
    coeffs: &RawCoefficients,
    x_in: DevView<bf16>,
) -> Result<()> {
    problem.validate()?;
    let plan = problem.plan();
    let (t, n, c, k) = (problem.tokens(), problem.n, problem.c, problem.k());
    check_weights(problem, weights)?;
    check("x", &x, t * k, 16)?;
    check("x_in", &x_in, t * c, 16)?;
    check_scratch(problem, &plan, scratch)?;
    check_coefficients(problem, coeffs)?;
    // SAFETY: validated above.
    unsafe { prep(exec, problem, &plan, weights, scratch)? };

    let params = abi::ProjParams {
        x: x.ptr(),
        packed_f1: scratch.packed_f1.ptr(),
        part_proj: scratch.part_proj.ptr(),
        part_sumsq: scratch.part_sumsq.ptr(),
        tokens: t as u32,
        k: k as u32,
        chunks_per_split: plan.chunks_per_split,
    };
    let cfg = LaunchConfig::new(
        (plan.token_blocks, plan.proj_splits, 1),
        abi::PROJ_THREADS,
        plan.proj.smem_bytes(n as u32),
    );
    // SAFETY: x [T, K] 16-byte aligned; partials of [proj_splits, T, (M)]; the grid covers T
    // and every chunk (chunks_per_split * splits >= chunks); the kernel's shared memory size.
    unsafe { exec.launch_by_name(&problem.proj_kernel(), &cfg, &params)? };

    let params = abi::FwdCoeffParams {
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
        splits: plan.proj_splits,
        iters: problem.sinkhorn_iters,
        eps: problem.eps,
    };
    let cfg = LaunchConfig::new(
        grid_1d(t.div_ceil(abi::COEFF_TOKENS as usize))?,
        abi::COEFF_THREADS,
        0,
    );
    // SAFETY: every buffer validated for T, n, M; grid covers T; 2 <= n <= 8.
    unsafe { exec.launch_by_name("mhc_fwd_coeff", &cfg, &params)? };

    let params = abi::PreParams {
        x: x.ptr(),
        h_pre: coeffs.h_pre.ptr(),
        x_in: x_in.ptr(),
        tokens: t as u32,
        c: c as u32,
    };
    let cfg = LaunchConfig::new(
        grid_1d((t * c / 8).div_ceil(abi::APPLY_THREADS as usize))?,
        abi::APPLY_THREADS,
        0,
    );
    // SAFETY: x [T, n, C], h_pre [T, n], x_in [T, C], 16-byte aligned; grid covers T C / 8.
    unsafe { exec.launch_by_name(&format!("mhc_fwd_pre_n{n}"), &cfg, &params) }
}

/// The second half of the forward over views: `x_next = H_res x + H_post^T y`.
///
/// # Safety
/// As for [`forward_pre_raw`] (`x_next` is the only output).
pub unsafe fn forward_post_raw(
    exec: &impl Exec,
    problem: &MhcProblem,
    x: DevView<bf16>,
    y: DevView<bf16>,
    coeffs: &RawCoefficients,
    x_next: DevView<bf16>,
) -> Result<()> {
    problem.validate()?;
    let (t, n, c, k) = (problem.tokens(), problem.n, problem.c, problem.k());
    check("x", &x, t * k, 16)?;
    check("y", &y, t * c, 16)?;
    check("x_next", &x_next, t * k, 16)?;
    check_coefficients(problem, coeffs)?;
    let params = abi::PostParams {
        x: x.ptr(),
        y: y.ptr(),
        h_post: coeffs.h_post.ptr(),
        h_res: coeffs.h_res.ptr(),
        x_next: x_next.ptr(),
        tokens: t as u32,
        c: c as u32,
    };
    let cfg = LaunchConfig::new(
        grid_1d((t * c / 8).div_ceil(abi::APPLY_THREADS as usize))?,
        abi::APPLY_THREADS,
        0,
    );
    // SAFETY: sizes and alignment validated; grid covers T C / 8.
    unsafe { exec.launch_by_name(&format!("mhc_fwd_post_n{n}"), &cfg, &params) }
}

/// The backward over views.
///
/// # Safety
/// As for [`forward_pre_raw`] (outputs: `scratch`, `grads`).
#[allow(clippy::too_many_arguments)]
pub unsafe fn backward_raw(
    exec: &impl Exec,
    problem: &MhcProblem,
    weights: &RawWeights,
    x: DevView<bf16>,
    y: DevView<bf16>,
    coeffs: &RawCoefficients,
    d_xin: DevView<bf16>,
    d_xnext: DevView<bf16>,
    scratch: &RawScratch,
    grads: &RawGradients,
) -> Result<()> {
    problem.validate()?;
    let plan = problem.plan();
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
    check_scratch(problem, &plan, scratch)?;
    check("dx", &grads.dx, t * k, 16)?;
    check("dy", &grads.dy, t * c, 16)?;
    check("dphi", &grads.dphi, k * m, 4)?;
    check("dalpha", &grads.dalpha, 3, 4)?;
    check("dbias", &grads.dbias, m, 4)?;
    check_gamma(problem, "dgamma", grads.dgamma.is_some())?;
    if let Some(g) = &grads.dgamma {
        check("dgamma", g, k, 4)?;
    }
    // SAFETY: validated above.
    unsafe { prep(exec, problem, &plan, weights, scratch)? };

    let params = abi::DhParams {
        x: x.ptr(),
        y: y.ptr(),
        d_xin: d_xin.ptr(),
        d_xnext: d_xnext.ptr(),
        h_post: coeffs.h_post.ptr(),
        dh: scratch.dh.ptr(),
        dy: grads.dy.ptr(),
        tokens: t as u32,
        c: c as u32,
    };
    let cfg = LaunchConfig::new(
        grid_1d(t.div_ceil(abi::DH_TOKENS as usize))?,
        abi::DH_THREADS,
        0,
    );
    // SAFETY: sizes and alignment validated; grid covers T.
    unsafe { exec.launch_by_name(&format!("mhc_bwd_dh_n{n}"), &cfg, &params)? };

    let params = abi::BwdCoeffParams {
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
    };
    let cfg = LaunchConfig::new(
        (plan.coef_blocks, 1, 1),
        abi::COEFF_THREADS,
        abi::bwd_coeff_smem_bytes(problem.sinkhorn_iters),
    );
    // SAFETY: sizes validated; coef_blocks rows of part_coef; shared memory sized for iters.
    unsafe { exec.launch_by_name("mhc_bwd_coeff", &cfg, &params)? };

    let params = abi::DxParams {
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
    };
    let cfg = LaunchConfig::new(
        grid_1d(t.div_ceil(abi::DX_TOKENS as usize))?,
        abi::DX_THREADS,
        abi::dx_smem_bytes(n as u32),
    );
    // SAFETY: sizes and alignment validated; grid covers T.
    unsafe { exec.launch_by_name(&format!("mhc_bwd_dx_n{n}"), &cfg, &params)? };

    let params = abi::WgradParams {
        x: x.ptr(),
        u: scratch.u.ptr(),
        part_w: scratch.part_w.ptr(),
        tokens: t as u32,
        k: k as u32,
        tokens_per_split: plan.tokens_per_split,
    };
    let cfg = LaunchConfig::new(
        (plan.k_tiles, plan.w_splits, 1),
        abi::WG_THREADS,
        abi::wg_smem_bytes(n as u32),
    );
    // SAFETY: sizes and alignment validated; the grid covers K and, with tokens_per_split (a
    // multiple of WG_STEP), every token.
    unsafe { exec.launch_by_name(&format!("mhc_bwd_wgrad_n{n}"), &cfg, &params)? };

    let params = abi::FinalizeParams {
        part_w: scratch.part_w.ptr(),
        part_coef: scratch.part_coef.ptr(),
        phi: weights.phi.ptr(),
        gamma: weights.gamma.map_or(std::ptr::null(), |g| g.ptr()),
        dphi: grads.dphi.ptr(),
        dgamma: grads.dgamma.map_or(std::ptr::null_mut(), |g| g.ptr()),
        dbias: grads.dbias.ptr(),
        dalpha: grads.dalpha.ptr(),
        n: n as u32,
        k: k as u32,
        w_splits: plan.w_splits,
        coef_blocks: plan.coef_blocks,
    };
    let cfg = LaunchConfig::new(
        (abi::finalize_blocks(n as u32, k as u32), 1, 1),
        abi::FIN_THREADS,
        abi::finalize_smem_bytes(),
    );
    // SAFETY: sizes validated; dgamma given exactly when gamma is.
    unsafe { exec.launch_by_name(&format!("mhc_bwd_finalize_n{n}"), &cfg, &params) }
}

// ---------------------------------------------------------------------------------------------
// Typed device API.

/// The weights on the device.
#[derive(Clone, Copy)]
pub struct MhcWeights<'a> {
    /// `[n C, M]` f32.
    pub phi: &'a DeviceBuffer<f32>,
    /// `[n C]` f32, exactly when the problem has `gamma`.
    pub gamma: Option<&'a DeviceBuffer<f32>>,
    /// `[3]` f32: `a_pre, a_post, a_res`.
    pub alpha: &'a DeviceBuffer<f32>,
    /// `[M]` f32.
    pub bias: &'a DeviceBuffer<f32>,
}

impl<'a> MhcWeights<'a> {
    fn raw(&self) -> RawWeights<'a> {
        RawWeights {
            phi: self.phi.into(),
            gamma: self.gamma.map(DevView::from),
            alpha: self.alpha.into(),
            bias: self.bias.into(),
        }
    }
}

/// The coefficients the forward saves for the second half and the backward (f32).
pub struct MhcCoefficients {
    /// `[T, n]`.
    pub h_pre: DeviceBuffer<f32>,
    /// `[T, n]`.
    pub h_post: DeviceBuffer<f32>,
    /// `[T, n, n]`.
    pub h_res: DeviceBuffer<f32>,
    /// `[T, M]`: `h~ = x~ phi' / r`.
    pub hproj: DeviceBuffer<f32>,
    /// `[T]`: `r`.
    pub rms: DeviceBuffer<f32>,
}

impl MhcCoefficients {
    /// Buffers for `problem`, poisoned (NaN) until the forward writes them.
    pub fn new(problem: &MhcProblem) -> Result<Self> {
        problem.validate()?;
        let (t, n, m) = (problem.tokens(), problem.n, problem.m());
        Ok(MhcCoefficients {
            h_pre: poisoned(t * n)?,
            h_post: poisoned(t * n)?,
            h_res: poisoned(t * n * n)?,
            hproj: poisoned(t * m)?,
            rms: poisoned(t)?,
        })
    }

    fn raw(&self) -> RawCoefficients<'_> {
        RawCoefficients {
            h_pre: (&self.h_pre).into(),
            h_post: (&self.h_post).into(),
            h_res: (&self.h_res).into(),
            hproj: (&self.hproj).into(),
            rms: (&self.rms).into(),
        }
    }

    fn raw_mut(&mut self) -> RawCoefficients<'_> {
        RawCoefficients {
            h_pre: (&mut self.h_pre).into(),
            h_post: (&mut self.h_post).into(),
            h_res: (&mut self.h_res).into(),
            hproj: (&mut self.hproj).into(),
            rms: (&mut self.rms).into(),
        }
    }
}

/// Scratch memory of the launches (sizes from [`MhcProblem::plan`]).
pub struct MhcWorkspace {
    packed_f1: DeviceBuffer<u32>,
    packed_b2: DeviceBuffer<u32>,
    part_proj: DeviceBuffer<f32>,
    part_sumsq: DeviceBuffer<f32>,
    dh: DeviceBuffer<f32>,
    u: DeviceBuffer<f32>,
    xcoef: DeviceBuffer<f32>,
    part_coef: DeviceBuffer<f32>,
    part_w: DeviceBuffer<f32>,
}

impl MhcWorkspace {
    /// Scratch for `problem`.
    pub fn new(problem: &MhcProblem) -> Result<Self> {
        problem.validate()?;
        let p = problem.plan();
        Ok(MhcWorkspace {
            packed_f1: zeroed(p.packed_f1)?,
            packed_b2: zeroed(p.packed_b2)?,
            part_proj: zeroed(p.part_proj)?,
            part_sumsq: zeroed(p.part_sumsq)?,
            dh: zeroed(p.dh)?,
            u: zeroed(p.u)?,
            xcoef: zeroed(problem.tokens())?,
            part_coef: zeroed(p.part_coef)?,
            part_w: zeroed(p.part_w)?,
        })
    }

    fn raw_mut(&mut self) -> RawScratch<'_> {
        RawScratch {
            packed_f1: (&mut self.packed_f1).into(),
            packed_b2: (&mut self.packed_b2).into(),
            part_proj: (&mut self.part_proj).into(),
            part_sumsq: (&mut self.part_sumsq).into(),
            dh: (&mut self.dh).into(),
            u: (&mut self.u).into(),
            xcoef: (&mut self.xcoef).into(),
            part_coef: (&mut self.part_coef).into(),
            part_w: (&mut self.part_w).into(),
        }
    }
}

/// The gradients the backward writes.
pub struct MhcGradients {
    /// `[T, n, C]` bf16.
    pub dx: DeviceBuffer<bf16>,
    /// `[T, C]` bf16.
    pub dy: DeviceBuffer<bf16>,
    /// `[n C, M]` f32.
    pub dphi: DeviceBuffer<f32>,
    /// `[n C]` f32, when the problem has `gamma`.
    pub dgamma: Option<DeviceBuffer<f32>>,
    /// `[3]` f32.
    pub dalpha: DeviceBuffer<f32>,
    /// `[M]` f32 (pre, post, res).
    pub dbias: DeviceBuffer<f32>,
}

impl MhcGradients {
    /// Buffers for `problem`, poisoned (NaN) until the backward writes them.
    pub fn new(problem: &MhcProblem) -> Result<Self> {
        problem.validate()?;
        let (t, c, k, m) = (problem.tokens(), problem.c, problem.k(), problem.m());
        Ok(MhcGradients {
            dx: poisoned(t * k)?,
            dy: poisoned(t * c)?,
            dphi: poisoned(k * m)?,
            dgamma: if problem.gamma {
                Some(poisoned(k)?)
            } else {
                None
            },
            dalpha: poisoned(3)?,
            dbias: poisoned(m)?,
        })
    }

    fn raw_mut(&mut self) -> RawGradients<'_> {
        RawGradients {
            dx: (&mut self.dx).into(),
            dy: (&mut self.dy).into(),
            dphi: (&mut self.dphi).into(),
            dgamma: self.dgamma.as_mut().map(DevView::from),
            dalpha: (&mut self.dalpha).into(),
            dbias: (&mut self.dbias).into(),
        }
    }
}

/// The first half of the forward on `stream` (asynchronous): the coefficients of every token
/// into `coeffs`, and `x_in = H_pre x` (`[T, C]` bf16).
#[allow(clippy::too_many_arguments)]
pub fn forward_pre(
    gpu: &Gpu,
    stream: &Stream,
    problem: &MhcProblem,
    weights: &MhcWeights,
    x: &DeviceBuffer<bf16>,
    workspace: &mut MhcWorkspace,
    coeffs: &mut MhcCoefficients,
    x_in: &mut DeviceBuffer<bf16>,
) -> Result<()> {
    let exec = OnStream { gpu, stream };
    // SAFETY: every view comes from a live device buffer of this GPU's context, borrowed for the
    // call (outputs mutably, so they cannot alias each other or the inputs); launches are
    // ordered on `stream`, and the buffers outlive them only if the caller synchronizes before
    // dropping them, as for every asynchronous launch in this crate.
    unsafe {
        forward_pre_raw(
            &exec,
            problem,
            &weights.raw(),
            x.into(),
            &workspace.raw_mut(),
            &coeffs.raw_mut(),
            x_in.into(),
        )
    }
}

/// The second half of the forward on `stream` (asynchronous), once the layer produced
/// `y [T, C]`: `x_next = H_res x + H_post^T y` (`[T, n, C]` bf16).
pub fn forward_post(
    gpu: &Gpu,
    stream: &Stream,
    problem: &MhcProblem,
    x: &DeviceBuffer<bf16>,
    y: &DeviceBuffer<bf16>,
    coeffs: &MhcCoefficients,
    x_next: &mut DeviceBuffer<bf16>,
) -> Result<()> {
    let exec = OnStream { gpu, stream };
    // SAFETY: as in `forward_pre`.
    unsafe {
        forward_post_raw(
            &exec,
            problem,
            x.into(),
            y.into(),
            &coeffs.raw(),
            x_next.into(),
        )
    }
}

/// The backward on `stream` (asynchronous): from `d_xin [T, C]` and `d_xnext [T, n, C]`, all
/// gradients into `grads`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    gpu: &Gpu,
    stream: &Stream,
    problem: &MhcProblem,
    weights: &MhcWeights,
    x: &DeviceBuffer<bf16>,
    y: &DeviceBuffer<bf16>,
    coeffs: &MhcCoefficients,
    d_xin: &DeviceBuffer<bf16>,
    d_xnext: &DeviceBuffer<bf16>,
    workspace: &mut MhcWorkspace,
    grads: &mut MhcGradients,
) -> Result<()> {
    let exec = OnStream { gpu, stream };
    // SAFETY: as in `forward_pre`.
    unsafe {
        backward_raw(
            &exec,
            problem,
            &weights.raw(),
            x.into(),
            y.into(),
            &coeffs.raw(),
            d_xin.into(),
            d_xnext.into(),
            &workspace.raw_mut(),
            &grads.raw_mut(),
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Convenience: one problem from host data (tests, benchmark, examples).

/// Host copies of every output of the forward and the backward.
#[derive(Clone, Debug)]
pub struct MhcHostOutputs {
    /// `[T, C]`.
    pub x_in: Vec<bf16>,
    /// `[T, n, C]`.
    pub x_next: Vec<bf16>,
    /// `[T, n]`.
    pub h_pre: Vec<f32>,
    /// `[T, n]`.
    pub h_post: Vec<f32>,
    /// `[T, n, n]`.
    pub h_res: Vec<f32>,
    /// `[T, M]`.
    pub hproj: Vec<f32>,
    /// `[T]`.
    pub rms: Vec<f32>,
    /// `[T, n, C]`.
    pub dx: Vec<bf16>,
    /// `[T, C]`.
    pub dy: Vec<bf16>,
    /// `[n C, M]`.
    pub dphi: Vec<f32>,
    /// `[n C]`, with gamma.
    pub dgamma: Option<Vec<f32>>,
    /// `[3]`.
    pub dalpha: Vec<f32>,
    /// `[M]`.
    pub dbias: Vec<f32>,
}

impl MhcHostOutputs {
    /// Whether two runs produced the same bits in every output.
    pub fn same_bits(&self, o: &MhcHostOutputs) -> bool {
        fn f(a: &[f32], b: &[f32]) -> bool {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
        }
        fn h(a: &[bf16], b: &[bf16]) -> bool {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
        }
        h(&self.x_in, &o.x_in)
            && h(&self.x_next, &o.x_next)
            && h(&self.dx, &o.dx)
            && h(&self.dy, &o.dy)
            && f(&self.h_pre, &o.h_pre)
            && f(&self.h_post, &o.h_post)
            && f(&self.h_res, &o.h_res)
            && f(&self.hproj, &o.hproj)
            && f(&self.rms, &o.rms)
            && f(&self.dphi, &o.dphi)
            && f(&self.dalpha, &o.dalpha)
            && f(&self.dbias, &o.dbias)
            && match (&self.dgamma, &o.dgamma) {
                (Some(a), Some(b)) => f(a, b),
                (None, None) => true,
                _ => false,
            }
    }
}

/// Every device buffer of one problem: inputs uploaded from host data, outputs poisoned.
pub struct MhcDeviceRun {
    /// The problem.
    pub problem: MhcProblem,
    /// `x`.
    pub x: DeviceBuffer<bf16>,
    /// `y`.
    pub y: DeviceBuffer<bf16>,
    /// `phi`.
    pub phi: DeviceBuffer<f32>,
    /// `gamma`.
    pub gamma: Option<DeviceBuffer<f32>>,
    /// `alpha`.
    pub alpha: DeviceBuffer<f32>,
    /// `bias`.
    pub bias: DeviceBuffer<f32>,
    /// `d_xin`.
    pub d_xin: DeviceBuffer<bf16>,
    /// `d_xnext`.
    pub d_xnext: DeviceBuffer<bf16>,
    /// Scratch.
    pub workspace: MhcWorkspace,
    /// Saved coefficients.
    pub coeffs: MhcCoefficients,
    /// Gradients.
    pub grads: MhcGradients,
    /// `x_in`.
    pub x_in: DeviceBuffer<bf16>,
    /// `x_next`.
    pub x_next: DeviceBuffer<bf16>,
}

impl MhcDeviceRun {
    /// Upload `data` and allocate everything else.
    pub fn upload(data: &reference::MhcData) -> Result<Self> {
        use crate::memory::upload;
        let p = data.problem;
        p.validate()?;
        Ok(MhcDeviceRun {
            problem: p,
            x: upload(&data.x)?,
            y: upload(&data.y)?,
            phi: upload(&data.phi)?,
            gamma: data.gamma.as_deref().map(upload).transpose()?,
            alpha: upload(&data.alpha)?,
            bias: upload(&data.bias)?,
            d_xin: upload(&data.d_xin)?,
            d_xnext: upload(&data.d_xnext)?,
            workspace: MhcWorkspace::new(&p)?,
            coeffs: MhcCoefficients::new(&p)?,
            grads: MhcGradients::new(&p)?,
            x_in: poisoned(p.tokens() * p.c)?,
            x_next: poisoned(p.tokens() * p.k())?,
        })
    }

    /// [`forward_pre`] (asynchronous).
    pub fn forward_pre(&mut self, gpu: &Gpu, stream: &Stream) -> Result<()> {
        let w = MhcWeights {
            phi: &self.phi,
            gamma: self.gamma.as_ref(),
            alpha: &self.alpha,
            bias: &self.bias,
        };
        forward_pre(
            gpu,
            stream,
            &self.problem,
            &w,
            &self.x,
            &mut self.workspace,
            &mut self.coeffs,
            &mut self.x_in,
        )
    }

    /// [`forward_post`] (asynchronous).
    pub fn forward_post(&mut self, gpu: &Gpu, stream: &Stream) -> Result<()> {
        forward_post(
            gpu,
            stream,
            &self.problem,
            &self.x,
            &self.y,
            &self.coeffs,
            &mut self.x_next,
        )
    }

    /// Both halves of the forward (asynchronous).
    pub fn forward(&mut self, gpu: &Gpu, stream: &Stream) -> Result<()> {
        self.forward_pre(gpu, stream)?;
        self.forward_post(gpu, stream)
    }

    /// [`backward`] (asynchronous; needs the forward's coefficients).
    pub fn backward(&mut self, gpu: &Gpu, stream: &Stream) -> Result<()> {
        let w = MhcWeights {
            phi: &self.phi,
            gamma: self.gamma.as_ref(),
            alpha: &self.alpha,
            bias: &self.bias,
        };
        backward(
            gpu,
            stream,
            &self.problem,
            &w,
            &self.x,
            &self.y,
            &self.coeffs,
            &self.d_xin,
            &self.d_xnext,
            &mut self.workspace,
            &mut self.grads,
        )
    }

    /// Copy every output to the host (synchronous).
    pub fn download(&self) -> Result<MhcHostOutputs> {
        use crate::memory::download;
        Ok(MhcHostOutputs {
            x_in: download(&self.x_in)?,
            x_next: download(&self.x_next)?,
            h_pre: download(&self.coeffs.h_pre)?,
            h_post: download(&self.coeffs.h_post)?,
            h_res: download(&self.coeffs.h_res)?,
            hproj: download(&self.coeffs.hproj)?,
            rms: download(&self.coeffs.rms)?,
            dx: download(&self.grads.dx)?,
            dy: download(&self.grads.dy)?,
            dphi: download(&self.grads.dphi)?,
            dgamma: self.grads.dgamma.as_ref().map(download).transpose()?,
            dalpha: download(&self.grads.dalpha)?,
            dbias: download(&self.grads.dbias)?,
        })
    }
}
