//! The FP8 forward (Hopper only): Q, K, V in e4m3 ([`E4m3`]) with per-tensor descales
//! ([`Fp8Scales`]: the real value of an element is its e4m3 value times its tensor's descale),
//! O in bf16, LSE in f32, with the masks and grouped heads of the 16-bit forward (no softcap,
//! sinks or packed sequences).
//!
//! One plan, two launches: `attention_fwd_hopper_fp8_vt` writes the transposed, key-permuted copy `V^T`
//! of V into a workspace of [`AttentionProblem::fp8_workspace_len`] bytes (FP8 `wgmma` reads
//! its B operand K-major only; `kernel_abi::attention::fp8` documents the layout), then the
//! Hopper forward with `m64nNk32` e4m3 products runs on Q, K and `V^T`. The softmax scale
//! takes the Q and K descales; O is multiplied by V's before it is stored; P is rounded to
//! e4m3 before O += P V (as in FlashAttention-3's FP8 forward), the row sums are of the
//! unrounded P.
//!
//! The specification is [`reference_fp8`]: the f64 reference on the dequantized inputs;
//! [`naive_fp8`] is the same computation in the kernels' precision (e4m3 P, f32 sums, bf16 O),
//! for FlashAttention's tolerance rule.

use super::plan::{HOPPER_MAX_TILES, Target, hopper_grid, hopper_tiles};
use super::problem::{AttentionProblem, Dtype, Path, View};
use super::reference::{AttentionOutput, reference_f64};
use crate::error::{Error, Result};
use crate::exec::{DevView, Exec, OnStream};
use crate::gpu::Gpu;
use crate::launch::Launch;
use crate::tensor_map::{MapDtype, MapSpec, MapSwizzle, TiledMap};
use cust::memory::DeviceBuffer;
use cust::stream::Stream;
use half::bf16;
use kernel_abi::attention::fp8::{
    FP8_HEAD_DIMS, FP8_VT_GROUP, FP8_VT_KERNEL, Fp8Kernel, Fp8VtParams, fp8_kernel, fp8_vt_grid,
};
use kernel_abi::attention::{HOPPER_BLOCK_M, HopperParams};

/// An e4m3 float (FP8: 1 sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinities, NaN
/// `0x7f`/`0xff`, largest finite 448), as the kernels read it.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct E4m3(pub u8);

// SAFETY: a plain byte; every bit pattern is a value.
unsafe impl cust::memory::DeviceCopy for E4m3 {}

impl E4m3 {
    /// Largest finite value.
    pub const MAX: f32 = 448.0;

    /// From f32, rounding to nearest even and saturating finite values and infinities beyond
    /// +-448 to +-448 (`cvt.rn.satfinite.e4m3x2.f32`); NaN to NaN.
    pub fn from_f32(x: f32) -> E4m3 {
        if x.is_nan() {
            return E4m3(0x7f);
        }
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        let a = (x as f64).abs();
        if a >= Self::MAX as f64 {
            return E4m3(sign | 0x7e);
        }
        // Subnormals (and zero): multiples of 2^-9 below 2^-6; 8 * 2^-9 is the least normal,
        // whose code is 8 as well.
        if a < 2f64.powi(-6) {
            let m = (a * 512.0).round_ties_even() as u8;
            return E4m3(sign | m);
        }
        let mut e = a.log2().floor() as i32;
        // Guard the floor against log2's rounding.
        if 2f64.powi(e) > a {
            e -= 1;
        } else if 2f64.powi(e + 1) <= a {
            e += 1;
        }
        let mut q = ((a / 2f64.powi(e) - 1.0) * 8.0).round_ties_even() as i32;
        if q == 8 {
            e += 1;
            q = 0;
        }
        // a < 448 rounds to at most 1.75 * 2^8 (code 0x7e): never the NaN code.
        E4m3(sign | (((e + 7) as u8) << 3) | q as u8)
    }

    /// To f32 (exact).
    pub fn to_f32(self) -> f32 {
        let sign = if self.0 & 0x80 != 0 { -1.0 } else { 1.0 };
        let (e, m) = ((self.0 >> 3) & 0xf, self.0 & 7);
        if e == 15 && m == 7 {
            return f32::NAN;
        }
        let v = if e == 0 {
            m as f32 * 2f32.powi(-9)
        } else {
            (1.0 + m as f32 / 8.0) * 2f32.powi(e as i32 - 7)
        };
        sign * v
    }
}

/// Quantize `x` to e4m3 with one per-tensor descale: `amax / 448` (1 for an all-zero tensor),
/// so the largest magnitude maps to 448. Returns the values and the descale.
pub fn quantize_e4m3(x: &[f32]) -> (Vec<E4m3>, f32) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let descale = if amax > 0.0 && amax.is_finite() {
        amax / E4m3::MAX
    } else {
        1.0
    };
    (
        x.iter().map(|&v| E4m3::from_f32(v / descale)).collect(),
        descale,
    )
}

/// The descales of Q, K and V: the real value of an element is its e4m3 value times its
/// tensor's descale.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fp8Scales {
    /// Q's descale.
    pub q: f32,
    /// K's descale.
    pub k: f32,
    /// V's descale.
    pub v: f32,
}

impl Default for Fp8Scales {
    fn default() -> Self {
        Fp8Scales {
            q: 1.0,
            k: 1.0,
            v: 1.0,
        }
    }
}

/// The tensors of an FP8 forward pass.
#[derive(Clone, Copy)]
pub struct Fp8Tensors<'a> {
    /// Q `[batch, seq_q, heads_q, D]` e4m3.
    pub q: View<'a, E4m3>,
    /// K `[batch, seq_k, heads_kv, D]` e4m3.
    pub k: View<'a, E4m3>,
    /// V, as K.
    pub v: View<'a, E4m3>,
    /// O, as Q, bf16 (written; must not overlap the inputs).
    pub o: View<'a, bf16>,
    /// LSE `[batch, heads_q, seq_q]` f32 (written).
    pub lse: DevView<'a, f32>,
    /// The workspace `V^T`: [`AttentionProblem::fp8_workspace_len`] bytes, 16-byte aligned
    /// (written).
    pub workspace: DevView<'a, E4m3>,
}

/// A planned FP8 forward pass: the transpose of V, then the forward (tensor maps still to be
/// encoded by the driver).
pub struct Fp8Plan {
    /// The transpose's launch.
    pub transpose: Launch<Fp8VtParams>,
    /// The forward kernel.
    pub kernel: &'static Fp8Kernel,
    /// The forward's grid.
    pub grid: (u32, u32, u32),
    /// Q, K and `V^T` as the kernel's tensor maps describe them.
    pub maps: [MapSpec; 3],
    /// The forward's parameters, tensor maps zero.
    pub params: HopperParams,
}

impl AttentionProblem {
    /// Keys of a `V^T` row: `seq_k` rounded up to 16.
    fn fp8_seq_pad(&self) -> usize {
        self.seq_k.div_ceil(FP8_VT_GROUP as usize) * FP8_VT_GROUP as usize
    }

    /// Bytes of the FP8 forward's workspace (`V^T`): `batch * heads_kv * D * seq_pad`, with
    /// `seq_pad` = `seq_k` rounded up to 16.
    pub fn fp8_workspace_len(&self) -> usize {
        self.batch
            .saturating_mul(self.heads_kv)
            .saturating_mul(self.head_dim)
            .saturating_mul(self.fp8_seq_pad())
    }

    /// Plan the FP8 forward on `tensors` with the descales `scales` for `target`. The problem's
    /// dtype is the output's and must be bf16; head dimensions 128 and 256; no softcap, sinks
    /// or the `mma.sync` path; a Hopper target.
    pub fn plan_fp8(
        &self,
        target: Target,
        tensors: &Fp8Tensors<'_>,
        scales: Fp8Scales,
    ) -> Result<Fp8Plan> {
        self.plan_fp8_variant(target, tensors, scales, None)
    }

    /// [`AttentionProblem::plan_fp8`] with the FP8 tuning variant `variant` (by name, in
    /// `kernel_abi::attention::fp8::FP8_KERNELS`), for benchmarks.
    pub fn plan_fp8_variant(
        &self,
        target: Target,
        tensors: &Fp8Tensors<'_>,
        scales: Fp8Scales,
        variant: Option<&str>,
    ) -> Result<Fp8Plan> {
        self.validate()?;
        if self.dtype != Dtype::Bf16 {
            return Err(Error::unsupported(
                format!("FP8 forward with {:?} output", self.dtype),
                "the FP8 forward writes bf16 O (set the problem's dtype to bf16)",
            ));
        }
        if self.has_logit_options() {
            return Err(Error::unsupported(
                "FP8 forward with a softcap or sinks",
                "the FP8 kernels take neither",
            ));
        }
        if self.has_value_dim() {
            return Err(Error::unsupported(
                "FP8 forward with a value head dimension of its own",
                "the FP8 kernels take V of Q's head dimension",
            ));
        }
        if self.path == Path::MmaSync || !target.arch.has_hopper_kernels() {
            return Err(Error::unsupported(
                "FP8 attention forward",
                format!(
                    "runs on the Hopper path only (sm_90a); this is {} with path {:?}",
                    target.arch, self.path
                ),
            ));
        }
        let d = self.head_dim as u32;
        let kernel = fp8_kernel(d, variant).ok_or_else(|| match variant {
            None => Error::unsupported(
                format!("FP8 head dimension {d}"),
                format!("supported: {FP8_HEAD_DIMS:?}"),
            ),
            Some(v) => Error::unsupported(
                format!("FP8 tuning variant {v}"),
                format!("not built for head dimension {d}"),
            ),
        })?;
        for (what, s) in [("q", scales.q), ("k", scales.k), ("v", scales.v)] {
            if !(s.is_finite() && s > 0.0) {
                return Err(Error::invalid(
                    format!("{what} descale"),
                    format!("{s} is not a positive finite number"),
                ));
            }
        }
        tensors.q.check("Q", self.q_shape())?;
        tensors.k.check("K", self.kv_shape())?;
        tensors.v.check("V", self.kv_shape())?;
        tensors.o.check("O", self.q_shape())?;
        tensors.o.check_distinct("O")?;
        if tensors.lse.len() != self.lse_len() {
            return Err(Error::shape(
                "LSE",
                format!("{} elements", self.lse_len()),
                tensors.lse.len(),
            ));
        }
        let ws = self.fp8_workspace_len();
        if tensors.workspace.len() < ws {
            return Err(Error::shape(
                "FP8 workspace",
                format!("at least {ws} bytes"),
                tensors.workspace.len(),
            ));
        }
        if !tensors.workspace.addr().is_multiple_of(16) {
            return Err(Error::Misaligned {
                what: "FP8 workspace start".into(),
                required: 16,
                actual: tensors.workspace.addr() % 16,
            });
        }
        let tiles = hopper_tiles(self);
        if tiles > u64::from(HOPPER_MAX_TILES) {
            return Err(Error::unsupported(
                "FP8 attention forward",
                format!("{tiles} query tiles; one launch takes at most {HOPPER_MAX_TILES}"),
            ));
        }
        let seq_pad = self.fp8_seq_pad();
        let grid = fp8_vt_grid(self.batch as u32, self.heads_kv as u32, d, seq_pad as u32);
        if grid.2 > 65535 {
            return Err(Error::unsupported(
                "FP8 attention forward",
                format!(
                    "batch {} (at most {} at D = {d})",
                    self.batch,
                    65535 / (grid.2 / self.batch as u32)
                ),
            ));
        }
        let transpose = Launch::new(
            &FP8_VT_KERNEL,
            grid,
            (),
            Fp8VtParams {
                v: tensors.v.ptr() as *const u8,
                vt: tensors.workspace.addr() as *mut u8,
                v_strides: tensors.v.strides3(),
                seq_k: self.seq_k as u32,
                seq_pad: seq_pad as u32,
                heads_kv: self.heads_kv as u32,
                head_dim: d,
            },
        );
        let cfg = &kernel.cfg;
        let map = |view: &View<'_, E4m3>, rows: u32| {
            let [b, s, h, dd] = view.shape();
            let st = view.strides();
            fp8_map(
                view.ptr(),
                [dd, h, s, b].map(|x| x as u64),
                [st[2], st[1], st[0]].map(|x| x as u64),
                [cfg.atom(), 1, rows, 1],
            )
        };
        let row = seq_pad as u64;
        let maps = [
            map(&tensors.q, HOPPER_BLOCK_M)?,
            map(&tensors.k, cfg.block_n)?,
            fp8_map(
                tensors.workspace.addr(),
                [row, d as u64, self.heads_kv as u64, self.batch as u64],
                [row, row * d as u64, row * d as u64 * self.heads_kv as u64],
                [cfg.block_n, d, 1, 1],
            )?,
        ];
        let base = self.hopper_params(&tensors.o, &tensors.lse, None);
        let params = HopperParams {
            num_tiles: u32::try_from(tiles).expect("checked above"),
            scale_log2: base.scale_log2 * scales.q * scales.k,
            o_scale: scales.v,
            ..base
        };
        Ok(Fp8Plan {
            transpose,
            kernel,
            grid: hopper_grid(self, cfg, target.multiprocessors),
            maps,
            params,
        })
    }
}

/// A tensor map of bytes: `dims` innermost first, byte strides of dimensions 1 to 3, box
/// `box_dims`, 128-byte swizzle.
fn fp8_map(address: u64, dims: [u64; 4], strides: [u64; 3], box_dims: [u32; 4]) -> Result<MapSpec> {
    TiledMap {
        address,
        dtype: MapDtype::U8,
        dims: &dims,
        strides_bytes: &strides,
        box_dims: &box_dims,
        swizzle: MapSwizzle::B128,
    }
    .spec()
}

impl Fp8Plan {
    /// The forward's launch with the tensor maps encoded (needs the driver).
    pub fn forward_launch(&self) -> Result<Launch<HopperParams>> {
        let params = HopperParams {
            tmap_q: self.maps[0].encode()?,
            tmap_k: self.maps[1].encode()?,
            tmap_v: self.maps[2].encode()?,
            ..self.params
        };
        Ok(Launch::new(
            &self.kernel.kernel,
            self.grid,
            self.kernel.cfg,
            params,
        ))
    }

    /// Run the plan: the transpose of V, then the forward (asynchronous on a stream).
    ///
    /// # Safety
    /// The tensors the plan was made for are live memory of `exec` for the whole run, and O,
    /// LSE and the workspace overlap neither each other nor the inputs.
    pub unsafe fn run(&self, exec: &impl Exec) -> Result<()> {
        let forward = self.forward_launch()?;
        // SAFETY: the plan checked V's view (shape, 16-byte aligned start and strides, in
        // bounds) and the workspace (length, alignment); the grid covers every key group of
        // every (batch, head) as the kernel expects; the memory is live and the workspace
        // aliases nothing (the caller's contract).
        unsafe { exec.launch(&self.transpose)? };
        // SAFETY: the tensor maps describe the checked views of Q and K and the workspace just
        // written (same stream: ordered after the transpose); O and LSE were checked, the sizes
        // and window validated, `num_tiles` matches the problem; outputs alias nothing.
        unsafe { exec.launch(&forward) }
    }
}

/// Launch the FP8 forward on `stream` (asynchronous): O into `o`, LSE into `lse`, `V^T` into
/// `workspace` (at least [`AttentionProblem::fp8_workspace_len`] bytes).
#[allow(clippy::too_many_arguments)]
pub fn forward_fp8(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionProblem,
    q: &View<E4m3>,
    k: &View<E4m3>,
    v: &View<E4m3>,
    scales: Fp8Scales,
    o: &mut View<bf16>,
    lse: &mut DeviceBuffer<f32>,
    workspace: &mut DeviceBuffer<E4m3>,
) -> Result<()> {
    let tensors = Fp8Tensors {
        q: *q,
        k: *k,
        v: *v,
        o: *o,
        lse: (&*lse).into(),
        workspace: (&*workspace).into(),
    };
    let plan = problem.plan_fp8(Target::of(gpu), &tensors, scales)?;
    // SAFETY: the views, `lse` and `workspace` are borrowed for the whole call, which enqueues
    // the launches; the outputs are borrowed mutably (the caller keeps O apart from the
    // inputs, as documented).
    unsafe { plan.run(&OnStream { gpu, stream }) }
}

/// `x` dequantized: each element's value times `descale`, in f64.
pub fn dequantize(x: &[E4m3], descale: f32) -> Vec<f64> {
    x.iter()
        .map(|v| v.to_f32() as f64 * descale as f64)
        .collect()
}

/// The specification of the FP8 forward: the f64 reference on the dequantized inputs.
pub fn reference_fp8(
    p: &AttentionProblem,
    q: &[E4m3],
    k: &[E4m3],
    v: &[E4m3],
    scales: Fp8Scales,
) -> AttentionOutput {
    reference_f64(
        p,
        &dequantize(q, scales.q),
        &dequantize(k, scales.k),
        &dequantize(v, scales.v),
    )
}

/// The FP8 forward in the kernels' precision, plainly: logits of the dequantized inputs in f64
/// (the e4m3 products are exact in the kernels' f32 accumulators up to their sums' rounding),
/// P = exp(s - row max) rounded to e4m3, O = V's descale * sum(P V) / sum(exp(s - max))
/// accumulated in f32 and rounded to bf16. Its distance from [`reference_fp8`] is the error of
/// the computation itself, the base of FlashAttention's tolerance rule.
pub fn naive_fp8(
    p: &AttentionProblem,
    q: &[E4m3],
    k: &[E4m3],
    v: &[E4m3],
    scales: Fp8Scales,
) -> AttentionOutput {
    let d = p.head_dim;
    let group = p.heads_q / p.heads_kv;
    let scale = p.softmax_scale() as f64 * scales.q as f64 * scales.k as f64;
    let (q, k) = (dequantize(q, 1.0), dequantize(k, 1.0));
    let v: Vec<f32> = v.iter().map(|x| x.to_f32()).collect();
    let mut o = vec![0.0; p.batch * p.seq_q * p.heads_q * d];
    let mut lse = vec![f64::NEG_INFINITY; p.lse_len()];
    let at = |b: usize, s: usize, n: usize, h: usize, heads: usize| ((b * n + s) * heads + h) * d;
    for b in 0..p.batch {
        for h in 0..p.heads_q {
            let hk = h / group;
            for i in 0..p.seq_q {
                let qi = &q[at(b, i, p.seq_q, h, p.heads_q)..][..d];
                let s: Vec<f64> = (0..p.seq_k)
                    .map(|j| {
                        if !p.allowed(i, j) {
                            return f64::NEG_INFINITY;
                        }
                        let kj = &k[at(b, j, p.seq_k, hk, p.heads_kv)..][..d];
                        qi.iter().zip(kj).map(|(x, y)| x * y).sum::<f64>() * scale
                    })
                    .collect();
                let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                if max == f64::NEG_INFINITY {
                    continue;
                }
                let mut sum = 0.0f32;
                let mut acc = vec![0.0f32; d];
                for (j, &sj) in s.iter().enumerate() {
                    let e = (sj - max).exp() as f32;
                    sum += e;
                    let w = E4m3::from_f32(e).to_f32();
                    if w == 0.0 {
                        continue;
                    }
                    let vj = &v[at(b, j, p.seq_k, hk, p.heads_kv)..][..d];
                    for (x, y) in acc.iter_mut().zip(vj) {
                        *x += w * y;
                    }
                }
                let out = &mut o[at(b, i, p.seq_q, h, p.heads_q)..][..d];
                for (x, y) in out.iter_mut().zip(&acc) {
                    *x = bf16::from_f32(y * scales.v / sum).to_f32() as f64;
                }
                lse[(b * p.heads_q + h) * p.seq_q + i] = max + (sum as f64).ln();
            }
        }
    }
    AttentionOutput { o, lse }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ptx::Arch;

    #[test]
    fn e4m3_round_trips_every_code_and_rounds_to_nearest_even() {
        for c in 0..=255u8 {
            let x = E4m3(c).to_f32();
            if x.is_nan() {
                assert_eq!(c & 0x7f, 0x7f, "code {c:#x}");
                continue;
            }
            assert_eq!(E4m3::from_f32(x).0, c, "code {c:#x} = {x}");
        }
        // Ties to even: 1 + 1/16 lies between 1 (mantissa 0) and 1.125 (mantissa 1).
        assert_eq!(E4m3::from_f32(1.0625).to_f32(), 1.0);
        assert_eq!(E4m3::from_f32(1.1875).to_f32(), 1.25);
        // Subnormals, saturation, NaN.
        assert_eq!(
            E4m3::from_f32(3.0 * 2f32.powi(-10)).to_f32(),
            2.0 * 2f32.powi(-9)
        );
        assert_eq!(E4m3::from_f32(1e6).to_f32(), 448.0);
        assert_eq!(E4m3::from_f32(f32::NEG_INFINITY).to_f32(), -448.0);
        assert_eq!(E4m3::from_f32(460.0).to_f32(), 448.0);
        assert!(E4m3::from_f32(f32::NAN).to_f32().is_nan());
        assert_eq!(E4m3::from_f32(-0.0).0, 0x80);
    }

    #[test]
    fn quantize_maps_the_largest_magnitude_to_448() {
        let (q, s) = quantize_e4m3(&[0.5, -3.0, 1.0]);
        assert_eq!(s, 3.0 / 448.0);
        assert_eq!(q[1].to_f32(), -448.0);
        assert_eq!(quantize_e4m3(&[0.0; 4]).1, 1.0);
    }

    fn dev<'a, T>(addr: u64, len: usize) -> DevView<'a, T> {
        // SAFETY: only planned, never dereferenced.
        unsafe { DevView::from_raw(addr, len) }
    }

    fn tensors<'a>(p: &AttentionProblem) -> Fp8Tensors<'a> {
        let qn = p.q_shape().iter().product();
        let kn = p.kv_shape().iter().product();
        Fp8Tensors {
            q: View::contiguous(dev(1 << 40, qn), p.q_shape()),
            k: View::contiguous(dev(2 << 40, kn), p.kv_shape()),
            v: View::contiguous(dev(3 << 40, kn), p.kv_shape()),
            o: View::contiguous(dev(4 << 40, qn), p.q_shape()),
            lse: dev(5 << 40, p.lse_len()),
            workspace: dev(6 << 40, p.fp8_workspace_len()),
        }
    }

    fn target(arch: Arch) -> Target {
        Target {
            arch,
            multiprocessors: 132,
        }
    }

    #[test]
    fn plans_the_transpose_and_the_forward() {
        let p = AttentionProblem::new(2, 1000, 1001, 8, 2, 128, Dtype::Bf16).causal();
        let plan = p
            .plan_fp8(target(Arch::Sm90a), &tensors(&p), Fp8Scales::default())
            .unwrap();
        assert_eq!(p.fp8_workspace_len(), 2 * 2 * 128 * 1008);
        let t = plan.transpose.params();
        assert_eq!((t.seq_k, t.seq_pad, t.head_dim), (1001, 1008, 128));
        // 63 key groups in blocks of 32; D 128 is 8 chunks of 16 columns, one block of warps.
        assert_eq!(plan.transpose.config().grid, (2, 2, 2));
        assert_eq!(plan.kernel.kernel.name, "attention_fwd_hopper_fp8_d128");
        assert_eq!(plan.params.num_tiles, 8 * 8 * 2);
        let scales = Fp8Scales {
            q: 0.5,
            k: 0.25,
            v: 3.0,
        };
        let scaled = p
            .plan_fp8(target(Arch::Sm90a), &tensors(&p), scales)
            .unwrap();
        assert_eq!(scaled.params.scale_log2, plan.params.scale_log2 * 0.125);
        assert_eq!(scaled.params.o_scale, 3.0);
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        let p = AttentionProblem::new(1, 64, 64, 2, 2, 128, Dtype::Bf16);
        let t = tensors(&p);
        let ok = Fp8Scales::default();
        let err = |p: &AttentionProblem, t: &Fp8Tensors, s, arch| {
            p.plan_fp8(target(arch), t, s).err().map(|e| e.to_string())
        };
        assert!(err(&p, &t, ok, Arch::Sm80).is_some_and(|e| e.contains("Hopper")));
        let p64 = AttentionProblem::new(1, 64, 64, 2, 2, 64, Dtype::Bf16);
        assert!(err(&p64, &tensors(&p64), ok, Arch::Sm90a).is_some_and(|e| e.contains("128")));
        let f16 = AttentionProblem::new(1, 64, 64, 2, 2, 128, Dtype::F16);
        assert!(err(&f16, &tensors(&f16), ok, Arch::Sm90a).is_some());
        let capped = p.clone().softcap(30.0);
        assert!(err(&capped, &t, ok, Arch::Sm90a).is_some());
        let pair = AttentionProblem::new(1, 64, 64, 2, 2, 192, Dtype::Bf16).value_dim(128);
        assert!(
            err(&pair, &tensors(&pair), ok, Arch::Sm90a).is_some_and(|e| e.contains("value head"))
        );
        for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
            let s = Fp8Scales { v: bad, ..ok };
            assert!(err(&p, &t, s, Arch::Sm90a).is_some_and(|e| e.contains("descale")));
        }
        let short = Fp8Tensors {
            workspace: dev(6 << 40, p.fp8_workspace_len() - 1),
            ..t
        };
        assert!(err(&p, &short, ok, Arch::Sm90a).is_some_and(|e| e.contains("workspace")));
        let odd = Fp8Tensors {
            workspace: dev((6 << 40) + 8, p.fp8_workspace_len()),
            ..t
        };
        assert!(err(&p, &odd, ok, Arch::Sm90a).is_some());
        // A row stride of 8 bytes (e4m3: 8 elements) is not 16-byte aligned.
        let kn = p.kv_shape().iter().product::<usize>();
        let strided = Fp8Tensors {
            k: View::new(
                dev(2 << 40, 2 * kn),
                0,
                &p.kv_shape(),
                &[64 * 2 * 136, 2 * 136, 136, 1],
            )
            .unwrap(),
            ..t
        };
        assert!(err(&p, &strided, ok, Arch::Sm90a).is_some());
    }

    #[test]
    fn the_naive_computation_is_close_to_the_reference() {
        let p = AttentionProblem::new(1, 5, 37, 2, 1, 128, Dtype::Bf16).causal();
        let mut rng = crate::data::rng(7);
        let x = |n: usize, rng: &mut _| crate::data::uniform_f32(rng, n, -2.0, 2.0);
        let (q, sq) = quantize_e4m3(&x(5 * 2 * 128, &mut rng));
        let (k, sk) = quantize_e4m3(&x(37 * 128, &mut rng));
        let (v, sv) = quantize_e4m3(&x(37 * 128, &mut rng));
        let s = Fp8Scales {
            q: sq,
            k: sk,
            v: sv,
        };
        let (want, naive) = (
            reference_fp8(&p, &q, &k, &v, s),
            naive_fp8(&p, &q, &k, &v, s),
        );
        let err = want
            .o
            .iter()
            .zip(&naive.o)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(err > 0.0 && err < 0.1, "naive FP8 error {err}");
        for (a, b) in want.lse.iter().zip(&naive.lse) {
            assert!((a - b).abs() < 1e-5, "LSE {a} vs {b}");
        }
    }
}
