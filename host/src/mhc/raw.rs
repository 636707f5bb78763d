//! The passes on tensors this library does not own ([`crate::raw`]): a framework's tensors on
//! its stream. The problem comes from `x`'s shape `[B, S, n, C]` and [`MhcOptions`], the plan is
//! the typed API's ([`MhcProblem::plan`]), so the checks are the same; each raw pass adds the
//! checks of raw memory (device, allocation, outputs apart from the inputs and each other).
//!
//! The coefficients the forward saves (`h_pre`, `h_post`, `h_res`, `h~`, `r`) are one f32
//! tensor, and the launches' scratch another, both laid out by [`MhcProblem::raw_layout`].

use super::plan::{MhcTensors, RawCoefficients, RawGradients, RawScratch, RawWeights};
use super::problem::MhcProblem;
use crate::error::{Error, Result};
use crate::exec::DevView;
use crate::raw::{RawElem, RawStream, RawTensor, check_disjoint};
use half::bf16;

/// Start of every buffer carved from the coefficient or scratch tensor, in 4-byte elements:
/// 256 bytes, the alignment of a fresh CUDA allocation (the kernels need at most 16).
const CARVE_ALIGN: usize = 64;

/// The options of a pass (the sizes come from the tensors).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MhcOptions {
    /// Sinkhorn iterations.
    pub sinkhorn_iters: u32,
    /// RMS epsilon.
    pub eps: f32,
    /// Whether an RMSNorm weight `gamma [n C]` is given.
    pub gamma: bool,
}

/// Where each buffer lies in the coefficient and scratch tensors, as `(offset, len)` in 4-byte
/// elements (the packings are u32 words in the f32 scratch tensor).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MhcRawLayout {
    /// f32 elements of the coefficient tensor.
    pub coeffs_total: usize,
    /// `h_pre [T, n]`, `h_post [T, n]`, `h_res [T, n, n]`, `h~ [T, M]`, `r [T]`.
    pub coeffs: [(usize, usize); 5],
    /// 4-byte elements of the scratch tensor.
    pub scratch_total: usize,
    /// `packed_f1`, `packed_b2`, `part_proj`, `part_sumsq`, `dh`, `u`, `xcoef`, `part_coef`,
    /// `part_w` (sizes of [`super::MhcLayout`]).
    pub scratch: [(usize, usize); 9],
}

/// Consecutive parts of the given lengths, each starting at a multiple of [`CARVE_ALIGN`].
fn carve<const N: usize>(lens: [usize; N]) -> ([(usize, usize); N], usize) {
    let mut at = 0;
    let parts = lens.map(|len| {
        let part = (at, len);
        at += len.div_ceil(CARVE_ALIGN) * CARVE_ALIGN;
        part
    });
    let total = parts.last().map_or(0, |(o, l)| o + l);
    (parts, total)
}

impl MhcProblem {
    /// The problem of `x` of shape `x` (`[B, S, n, C]`) with `options`.
    pub fn from_shape(x: &[usize], options: &MhcOptions) -> Result<MhcProblem> {
        let [batch, seq, n, c] =
            <[usize; 4]>::try_from(x).map_err(|_| Error::shape("mHC x rank", 4, x.len()))?;
        Ok(MhcProblem::new(batch, seq, n, c)
            .with_iters(options.sinkhorn_iters)
            .with_eps(options.eps)
            .with_gamma(options.gamma))
    }

    /// The layout of the raw passes' coefficient and scratch tensors (the problem must be
    /// valid).
    pub fn raw_layout(&self) -> MhcRawLayout {
        let (t, n, m) = (self.tokens(), self.n, self.m());
        let l = self.layout();
        let (coeffs, coeffs_total) = carve([t * n, t * n, t * n * n, t * m, t]);
        let (scratch, scratch_total) = carve([
            l.packed_f1,
            l.packed_b2,
            l.part_proj,
            l.part_sumsq,
            l.dh,
            l.u,
            t,
            l.part_coef,
            l.part_w,
        ]);
        MhcRawLayout {
            coeffs_total,
            coeffs,
            scratch_total,
            scratch,
        }
    }
}

/// The coefficient and scratch lengths (f32 elements) of a problem of `x`'s shape with
/// `options` (validated), for a caller that allocates them before the forward.
pub fn raw_layout(x: &[usize], options: &MhcOptions) -> Result<MhcRawLayout> {
    let problem = MhcProblem::from_shape(x, options)?;
    problem.validate()?;
    Ok(problem.raw_layout())
}

/// The weights of a raw pass: f32, contiguous.
#[derive(Clone, Copy)]
pub struct RawMhcWeights<'t> {
    /// `phi [n C, M]`.
    pub phi: &'t RawTensor,
    /// `gamma [n C]`, given exactly when the options say so.
    pub gamma: Option<&'t RawTensor>,
    /// `alpha [3]`: `a_pre, a_post, a_res`.
    pub alpha: &'t RawTensor,
    /// `bias [M]`.
    pub bias: &'t RawTensor,
}

impl<'t> RawMhcWeights<'t> {
    fn named(&self) -> Vec<(&'static str, &'t RawTensor)> {
        let mut v = vec![
            ("mHC phi", self.phi),
            ("mHC alpha", self.alpha),
            ("mHC bias", self.bias),
        ];
        v.extend(self.gamma.map(|g| ("mHC gamma", g)));
        v
    }

    fn views<'a>(&self, p: &MhcProblem) -> Result<RawWeights<'a>> {
        let (k, m) = (p.k(), p.m());
        if self.gamma.is_some() != p.gamma {
            return Err(Error::invalid(
                "mHC gamma",
                if p.gamma {
                    "the options say gamma, but none was given"
                } else {
                    "given, but the options say no gamma"
                },
            ));
        }
        Ok(RawWeights {
            phi: view("mHC phi", self.phi, &[k, m])?,
            gamma: self.gamma.map(|g| view("mHC gamma", g, &[k])).transpose()?,
            alpha: view("mHC alpha", self.alpha, &[3])?,
            bias: view("mHC bias", self.bias, &[m])?,
        })
    }
}

fn view<'a, T: RawElem>(what: &str, t: &RawTensor, shape: &[usize]) -> Result<DevView<'a, T>> {
    t.contiguous_view(what, shape, 16)
}

/// The activations' shapes: `x [B, S, n, C]` and `[B, S, C]`.
fn shapes(p: &MhcProblem) -> ([usize; 4], [usize; 3]) {
    ([p.batch, p.seq, p.n, p.c], [p.batch, p.seq, p.c])
}

/// The coefficient views carved from the coefficient tensor.
fn coefficients<'a>(p: &MhcProblem, t: &RawTensor) -> Result<RawCoefficients<'a>> {
    let layout = p.raw_layout();
    let all: DevView<'a, f32> = view("mHC coefficients", t, &[layout.coeffs_total])?;
    // SAFETY: every part lies inside the checked view (`raw_layout`); addresses only.
    let [h_pre, h_post, h_res, hproj, rms] = layout
        .coeffs
        .map(|(at, len)| unsafe { DevView::from_raw(all.addr() + 4 * at as u64, len) });
    Ok(RawCoefficients {
        h_pre,
        h_post,
        h_res,
        hproj,
        rms,
    })
}

/// The scratch views carved from the scratch tensor (f32; the packings read as u32 words).
fn scratch<'a>(p: &MhcProblem, t: &RawTensor) -> Result<RawScratch<'a>> {
    let layout = p.raw_layout();
    let all: DevView<'a, f32> = view("mHC scratch", t, &[layout.scratch_total])?;
    let at = |(o, _): (usize, usize)| all.addr() + 4 * o as u64;
    let s = layout.scratch;
    // SAFETY: every part lies inside the checked view (`raw_layout`); addresses only; the
    // packings are 4-byte words, as f32.
    unsafe {
        Ok(RawScratch {
            packed_f1: DevView::from_raw(at(s[0]), s[0].1),
            packed_b2: DevView::from_raw(at(s[1]), s[1].1),
            part_proj: DevView::from_raw(at(s[2]), s[2].1),
            part_sumsq: DevView::from_raw(at(s[3]), s[3].1),
            dh: DevView::from_raw(at(s[4]), s[4].1),
            u: DevView::from_raw(at(s[5]), s[5].1),
            xcoef: DevView::from_raw(at(s[6]), s[6].1),
            part_coef: DevView::from_raw(at(s[7]), s[7].1),
            part_w: DevView::from_raw(at(s[8]), s[8].1),
        })
    }
}

/// Check every tensor's memory on the stream's device and run `plan`.
///
/// # Safety
/// As the raw passes.
unsafe fn launch(
    stream: &RawStream,
    tensors: &[(&str, &RawTensor)],
    plan: &super::MhcPlan,
) -> Result<()> {
    for (what, t) in tensors {
        t.check_memory(what, stream.gpu())?;
    }
    // SAFETY: the plan checked every view against the problem and its storage, the outputs
    // overlap no other tensor (checked by the raw plan), the memory is device memory of the
    // stream's device (checked above) and live (the caller's contract).
    unsafe { plan.run(stream) }
}

/// Plan the forward's first half on raw tensors (pure): `x_in [B, S, C]` bf16 and the
/// coefficients written from `x [B, S, n, C]` bf16 and the weights; `scratch` of the layout's
/// length.
pub fn plan_forward_pre_raw(
    options: &MhcOptions,
    weights: &RawMhcWeights<'_>,
    x: &RawTensor,
    scratch_t: &RawTensor,
    coeffs: &RawTensor,
    x_in: &RawTensor,
) -> Result<super::MhcPlan> {
    let p = MhcProblem::from_shape(&x.shape, options)?;
    p.validate()?;
    let (xs, ys) = shapes(&p);
    let mut ins = weights.named();
    ins.push(("mHC x", x));
    check_disjoint(
        &ins,
        &[
            ("mHC scratch", scratch_t),
            ("mHC coefficients", coeffs),
            ("mHC x_in", x_in),
        ],
    )?;
    p.plan(&MhcTensors::ForwardPre {
        weights: weights.views(&p)?,
        x: view::<bf16>("mHC x", x, &xs)?,
        scratch: scratch(&p, scratch_t)?,
        coeffs: coefficients(&p, coeffs)?,
        x_in: view("mHC x_in", x_in, &ys)?,
    })
}

/// Launch the forward's first half (asynchronous): see [`plan_forward_pre_raw`].
///
/// # Safety
/// Each tensor's storage is memory the caller owns, live until the launches have completed on
/// `stream`; nothing else writes the inputs or accesses the outputs and scratch until then.
pub unsafe fn forward_pre_raw(
    stream: &RawStream,
    options: &MhcOptions,
    weights: &RawMhcWeights<'_>,
    x: &RawTensor,
    scratch: &RawTensor,
    coeffs: &RawTensor,
    x_in: &RawTensor,
) -> Result<()> {
    let plan = plan_forward_pre_raw(options, weights, x, scratch, coeffs, x_in)?;
    let mut all = weights.named();
    all.extend([
        ("mHC x", x),
        ("mHC scratch", scratch),
        ("mHC coefficients", coeffs),
        ("mHC x_in", x_in),
    ]);
    // SAFETY: forwarded to the caller; the plan was made on these tensors.
    unsafe { launch(stream, &all, &plan) }
}

/// Plan the forward's second half on raw tensors (pure): `x_next [B, S, n, C]` bf16 written
/// from `x`, the layer's output `y [B, S, C]` bf16 and the coefficients of the first half.
pub fn plan_forward_post_raw(
    options: &MhcOptions,
    x: &RawTensor,
    y: &RawTensor,
    coeffs: &RawTensor,
    x_next: &RawTensor,
) -> Result<super::MhcPlan> {
    let p = MhcProblem::from_shape(&x.shape, options)?;
    p.validate()?;
    let (xs, ys) = shapes(&p);
    check_disjoint(
        &[("mHC x", x), ("mHC y", y), ("mHC coefficients", coeffs)],
        &[("mHC x_next", x_next)],
    )?;
    p.plan(&MhcTensors::ForwardPost {
        x: view("mHC x", x, &xs)?,
        y: view("mHC y", y, &ys)?,
        coeffs: coefficients(&p, coeffs)?,
        x_next: view("mHC x_next", x_next, &xs)?,
    })
}

/// Launch the forward's second half (asynchronous): see [`plan_forward_post_raw`].
///
/// # Safety
/// As [`forward_pre_raw`]; the coefficients were written by a first half on the same `x`
/// (enqueued before on `stream`; otherwise the results are wrong, never out of bounds).
pub unsafe fn forward_post_raw(
    stream: &RawStream,
    options: &MhcOptions,
    x: &RawTensor,
    y: &RawTensor,
    coeffs: &RawTensor,
    x_next: &RawTensor,
) -> Result<()> {
    let plan = plan_forward_post_raw(options, x, y, coeffs, x_next)?;
    let all = [
        ("mHC x", x),
        ("mHC y", y),
        ("mHC coefficients", coeffs),
        ("mHC x_next", x_next),
    ];
    // SAFETY: forwarded to the caller; the plan was made on these tensors.
    unsafe { launch(stream, &all, &plan) }
}

/// The gradients of a raw backward.
#[derive(Clone, Copy)]
pub struct RawMhcGradients<'t> {
    /// `dx [B, S, n, C]` bf16.
    pub dx: &'t RawTensor,
    /// `dy [B, S, C]` bf16.
    pub dy: &'t RawTensor,
    /// `dphi [n C, M]` f32.
    pub dphi: &'t RawTensor,
    /// `dgamma [n C]` f32, exactly when the options say gamma.
    pub dgamma: Option<&'t RawTensor>,
    /// `dalpha [3]` f32.
    pub dalpha: &'t RawTensor,
    /// `dbias [M]` f32.
    pub dbias: &'t RawTensor,
}

impl<'t> RawMhcGradients<'t> {
    fn named(&self) -> Vec<(&'static str, &'t RawTensor)> {
        let mut v = vec![
            ("mHC dx", self.dx),
            ("mHC dy", self.dy),
            ("mHC dphi", self.dphi),
            ("mHC dalpha", self.dalpha),
            ("mHC dbias", self.dbias),
        ];
        v.extend(self.dgamma.map(|g| ("mHC dgamma", g)));
        v
    }
}

/// Plan the backward on raw tensors (pure): every gradient from `d_xin [B, S, C]` and
/// `d_xnext [B, S, n, C]` (bf16), the forward's inputs and its coefficients.
#[allow(clippy::too_many_arguments)]
pub fn plan_backward_raw(
    options: &MhcOptions,
    weights: &RawMhcWeights<'_>,
    x: &RawTensor,
    y: &RawTensor,
    coeffs: &RawTensor,
    d_xin: &RawTensor,
    d_xnext: &RawTensor,
    scratch_t: &RawTensor,
    grads: &RawMhcGradients<'_>,
) -> Result<super::MhcPlan> {
    let p = MhcProblem::from_shape(&x.shape, options)?;
    p.validate()?;
    let (xs, ys) = shapes(&p);
    let (k, m) = (p.k(), p.m());
    let mut ins = weights.named();
    ins.extend([
        ("mHC x", x),
        ("mHC y", y),
        ("mHC coefficients", coeffs),
        ("mHC d_xin", d_xin),
        ("mHC d_xnext", d_xnext),
    ]);
    let mut outs = vec![("mHC scratch", scratch_t)];
    outs.extend(grads.named());
    check_disjoint(&ins, &outs)?;
    if grads.dgamma.is_some() != p.gamma {
        return Err(Error::invalid(
            "mHC dgamma",
            "given exactly when the options say gamma",
        ));
    }
    p.plan(&MhcTensors::Backward {
        weights: weights.views(&p)?,
        x: view("mHC x", x, &xs)?,
        y: view("mHC y", y, &ys)?,
        coeffs: coefficients(&p, coeffs)?,
        d_xin: view("mHC d_xin", d_xin, &ys)?,
        d_xnext: view("mHC d_xnext", d_xnext, &xs)?,
        scratch: scratch(&p, scratch_t)?,
        grads: RawGradients {
            dx: view("mHC dx", grads.dx, &xs)?,
            dy: view("mHC dy", grads.dy, &ys)?,
            dphi: view("mHC dphi", grads.dphi, &[k, m])?,
            dgamma: grads
                .dgamma
                .map(|g| view("mHC dgamma", g, &[k]))
                .transpose()?,
            dalpha: view("mHC dalpha", grads.dalpha, &[3])?,
            dbias: view("mHC dbias", grads.dbias, &[m])?,
        },
    })
}

/// Launch the backward (asynchronous): see [`plan_backward_raw`].
///
/// # Safety
/// As [`forward_post_raw`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn backward_raw(
    stream: &RawStream,
    options: &MhcOptions,
    weights: &RawMhcWeights<'_>,
    x: &RawTensor,
    y: &RawTensor,
    coeffs: &RawTensor,
    d_xin: &RawTensor,
    d_xnext: &RawTensor,
    scratch: &RawTensor,
    grads: &RawMhcGradients<'_>,
) -> Result<()> {
    let plan = plan_backward_raw(
        options, weights, x, y, coeffs, d_xin, d_xnext, scratch, grads,
    )?;
    let mut all = weights.named();
    all.extend([
        ("mHC x", x),
        ("mHC y", y),
        ("mHC coefficients", coeffs),
        ("mHC d_xin", d_xin),
        ("mHC d_xnext", d_xnext),
        ("mHC scratch", scratch),
    ]);
    all.extend(grads.named());
    // SAFETY: forwarded to the caller; the plan was made on these tensors.
    unsafe { launch(stream, &all, &plan) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::ElemType;

    const OPTIONS: MhcOptions = MhcOptions {
        sinkhorn_iters: 20,
        eps: 1e-6,
        gamma: true,
    };

    struct Fixture {
        x: RawTensor,
        y: RawTensor,
        phi: RawTensor,
        gamma: RawTensor,
        alpha: RawTensor,
        bias: RawTensor,
        coeffs: RawTensor,
        scratch: RawTensor,
        x_in: RawTensor,
        x_next: RawTensor,
    }

    fn fixture(x: [usize; 4]) -> Fixture {
        let [b, s, n, c] = x;
        let at = |i: u64| i << 36;
        let l = raw_layout(&x, &OPTIONS).unwrap();
        let m = n * n + 2 * n;
        Fixture {
            x: RawTensor::contiguous(at(1), ElemType::Bf16, &x),
            y: RawTensor::contiguous(at(2), ElemType::Bf16, &[b, s, c]),
            phi: RawTensor::contiguous(at(3), ElemType::F32, &[n * c, m]),
            gamma: RawTensor::contiguous(at(4), ElemType::F32, &[n * c]),
            alpha: RawTensor::contiguous(at(5), ElemType::F32, &[3]),
            bias: RawTensor::contiguous(at(6), ElemType::F32, &[m]),
            coeffs: RawTensor::contiguous(at(7), ElemType::F32, &[l.coeffs_total]),
            scratch: RawTensor::contiguous(at(8), ElemType::F32, &[l.scratch_total]),
            x_in: RawTensor::contiguous(at(9), ElemType::Bf16, &[b, s, c]),
            x_next: RawTensor::contiguous(at(10), ElemType::Bf16, &x),
        }
    }

    impl Fixture {
        fn pre(&self) -> Result<super::super::MhcPlan> {
            let w = RawMhcWeights {
                phi: &self.phi,
                gamma: Some(&self.gamma),
                alpha: &self.alpha,
                bias: &self.bias,
            };
            plan_forward_pre_raw(
                &OPTIONS,
                &w,
                &self.x,
                &self.scratch,
                &self.coeffs,
                &self.x_in,
            )
        }
    }

    #[test]
    fn layouts_are_aligned_and_disjoint() {
        let p = MhcProblem::new(2, 77, 4, 64).with_gamma(true);
        let l = p.raw_layout();
        let lay = p.layout();
        let want = [
            lay.packed_f1,
            lay.packed_b2,
            lay.part_proj,
            lay.part_sumsq,
            lay.dh,
            lay.u,
            p.tokens(),
            lay.part_coef,
            lay.part_w,
        ];
        for parts in [&l.coeffs[..], &l.scratch[..]] {
            for w in parts.windows(2) {
                assert!(w[0].0 + w[0].1 <= w[1].0);
                assert_eq!(w[1].0 % CARVE_ALIGN, 0);
            }
        }
        assert_eq!(l.scratch.map(|(_, len)| len), want);
        assert_eq!(l.coeffs_total, l.coeffs[4].0 + p.tokens());
    }

    #[test]
    fn raw_plans_check_tensors() {
        let f = fixture([2, 33, 4, 64]);
        f.pre().unwrap();
        let post = plan_forward_post_raw(&OPTIONS, &f.x, &f.y, &f.coeffs, &f.x_next);
        post.unwrap();
        let refuse = |change: &dyn Fn(&mut Fixture), needle: &str| {
            let mut g = fixture([2, 33, 4, 64]);
            change(&mut g);
            let e = g.pre().map(|_| ()).unwrap_err();
            assert!(e.to_string().contains(needle), "{needle}: {e}");
        };
        refuse(&|f| f.x.dtype = ElemType::F16, "mHC x dtype");
        refuse(&|f| f.phi.shape = vec![256, 23], "mHC phi shape");
        refuse(&|f| f.gamma.shape = vec![255], "mHC gamma shape");
        refuse(&|f| f.coeffs.shape[0] -= 1, "mHC coefficients shape");
        refuse(&|f| f.scratch.dtype = ElemType::F64, "mHC scratch dtype");
        refuse(&|f| f.x.shape = vec![2, 33, 9, 64], "mHC n = 9");
        refuse(&|f| f.x_in.strides = vec![64, 128, 1], "mHC x_in strides");
        refuse(
            &|f| {
                f.x_in.ptr = f.x.ptr;
                f.x_in.storage_ptr = f.x.ptr;
            },
            "overlaps mHC x",
        );
    }
}
