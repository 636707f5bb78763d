//! The passes on tensors this library does not own ([`crate::raw`]): a framework's tensors on
//! its stream. The problem comes from the tensors' shapes, the plan is the typed API's
//! ([`SemiCrfProblem::plan`]), so the checks are the same; each raw pass adds the checks of
//! raw memory (device, allocation, outputs and state apart from the inputs) and takes the
//! lengths on the host: it validates them (each in `1..=T`) and writes them into the caller's
//! lengths tensor itself, on the stream before the kernels, so the kernels never read a length
//! the library did not check.
//!
//! What the forward keeps for the backward (the f64 checkpoints, normalizers and partial
//! counts) is one f64 tensor, the **state**, laid out by [`state_layout`].

use super::plan::{GradientViews, InputViews, SemiCrfTensors, StateViews, ViterbiViews};
use super::problem::SemiCrfProblem;
use crate::error::{Error, Result};
use crate::exec::DevView;
use crate::raw::{RawElem, RawStream, RawTensor, check_disjoint};

/// Start of every buffer carved from the state tensor, in f64 elements: 256 bytes, the
/// alignment of a fresh CUDA allocation.
const CARVE_ALIGN: usize = 32;

/// The inputs of a raw pass: f32 scores, contiguous, and the lengths' device tensor.
#[derive(Clone, Copy)]
pub struct RawSemiCrfInputs<'t> {
    /// Cumulative scores `[B, T + 1, C]` f32.
    pub cumsum: &'t RawTensor,
    /// Duration scores `[K, C]` f32, row `k - 1` for duration `k`.
    pub dur: &'t RawTensor,
    /// Transition scores `[C (from), C (to)]` f32.
    pub trans: &'t RawTensor,
    /// `[B]` int32: written by the pass with the host lengths it is given.
    pub lengths: &'t RawTensor,
}

/// Where each buffer of the state lies in the state tensor, as `(offset, len)` in f64
/// elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SemiCrfStateLayout {
    /// f64 elements of the state tensor.
    pub total: usize,
    /// log Z of both directions `[2, B]`.
    pub log_z64: (usize, usize),
    /// Alpha checkpoints `[B, nseg, K + 1, C]`.
    pub alpha_ckpt: (usize, usize),
    /// Their normalizers `[B, nseg]`.
    pub alpha_norm: (usize, usize),
    /// Beta checkpoints `[B, nseg, K, C]`.
    pub beta_ckpt: (usize, usize),
    /// Their normalizers `[B, nseg]`.
    pub beta_norm: (usize, usize),
    /// Partial expected counts `[B, nseg, K C + C C]` (durations, then transitions), written
    /// by the backward: the counts of sequence `b` are the sum over its segments
    /// `j <= L_b / checkpoint`.
    pub partials: (usize, usize),
    /// The checkpoint interval `S`.
    pub checkpoint: usize,
    /// Checkpoint segments per sequence, `nseg = T / S + 1`.
    pub segments: usize,
}

impl SemiCrfProblem {
    /// The problem of cumulative scores of shape `cumsum` (`[B, T + 1, C]`) and duration scores
    /// of shape `dur` (`[K, C]`), with checkpoint interval `checkpoint` (`None`: the default).
    pub fn from_shapes(
        cumsum: &[usize],
        dur: &[usize],
        checkpoint: Option<usize>,
    ) -> Result<SemiCrfProblem> {
        let [batch, rows, c] = <[usize; 3]>::try_from(cumsum)
            .map_err(|_| Error::shape("semi-CRF cumulative scores rank", 3, cumsum.len()))?;
        let [k, _] = <[usize; 2]>::try_from(dur)
            .map_err(|_| Error::shape("semi-CRF duration scores rank", 2, dur.len()))?;
        let t = rows.checked_sub(1).ok_or_else(|| {
            Error::invalid(
                "semi-CRF cumulative scores",
                "[B, T + 1, C] needs at least one row (T + 1 >= 1)",
            )
        })?;
        let problem = SemiCrfProblem::new(batch, t, k, c);
        Ok(match checkpoint {
            Some(s) => problem.with_checkpoint(s),
            None => problem,
        })
    }

    /// The layout of the raw passes' state tensor.
    pub fn state_layout(&self) -> SemiCrfStateLayout {
        let n = self.buffer_lens();
        let mut at = 0;
        let mut next = |len: usize| {
            let part = (at, len);
            at += len.div_ceil(CARVE_ALIGN) * CARVE_ALIGN;
            part
        };
        let log_z64 = next(n.log_z64);
        let alpha_ckpt = next(n.alpha_ckpt);
        let alpha_norm = next(n.alpha_norm);
        let beta_ckpt = next(n.beta_ckpt);
        let beta_norm = next(n.beta_norm);
        let partials = next(n.partials);
        SemiCrfStateLayout {
            total: partials.0 + partials.1,
            log_z64,
            alpha_ckpt,
            alpha_norm,
            beta_ckpt,
            beta_norm,
            partials,
            checkpoint: self.checkpoint,
            segments: self.num_segments(),
        }
    }
}

/// The state layout of a problem of these shapes (validated), for a caller that allocates the
/// state before the forward.
pub fn state_layout(
    cumsum: &[usize],
    dur: &[usize],
    checkpoint: Option<usize>,
) -> Result<SemiCrfStateLayout> {
    let problem = SemiCrfProblem::from_shapes(cumsum, dur, checkpoint)?;
    problem.validate()?;
    Ok(problem.state_layout())
}

/// The validated problem of the inputs, their views, and the lengths as kernel words.
fn problem_and_inputs<'a>(
    inputs: &RawSemiCrfInputs<'_>,
    lengths: &[i64],
    checkpoint: Option<usize>,
) -> Result<(SemiCrfProblem, InputViews<'a>, Vec<u32>)> {
    let p = SemiCrfProblem::from_shapes(&inputs.cumsum.shape, &inputs.dur.shape, checkpoint)?;
    p.validate()?;
    if lengths.len() != p.batch {
        return Err(Error::shape("semi-CRF lengths [B]", p.batch, lengths.len()));
    }
    if let Some((i, &l)) = lengths
        .iter()
        .enumerate()
        .find(|(_, l)| **l < 1 || **l as u128 > p.t as u128)
    {
        return Err(Error::invalid(
            "semi-CRF lengths",
            format!("lengths[{i}] = {l} is outside 1..={}", p.t),
        ));
    }
    let words = lengths.iter().map(|&l| l as u32).collect();
    // The lengths tensor is written by the pass.
    check_disjoint(&scores(inputs), &[("lengths", inputs.lengths)])?;
    let views = InputViews {
        cumsum: view::<f32>(
            "semi-CRF cumulative scores",
            inputs.cumsum,
            &[p.batch, p.t + 1, p.c],
        )?,
        dur: view::<f32>("semi-CRF duration scores", inputs.dur, &[p.k, p.c])?,
        trans: view::<f32>("semi-CRF transition scores", inputs.trans, &[p.c, p.c])?,
        lengths: view::<u32>("semi-CRF lengths", inputs.lengths, &[p.batch])?,
    };
    Ok((p, views, words))
}

fn view<'a, T: RawElem>(what: &str, t: &RawTensor, shape: &[usize]) -> Result<DevView<'a, T>> {
    t.contiguous_view(what, shape, 16)
}

/// The state views carved from the state tensor, with log Z `[B]` f32.
fn state_views<'a>(
    p: &SemiCrfProblem,
    state: &RawTensor,
    log_z: &RawTensor,
) -> Result<StateViews<'a>> {
    let layout = p.state_layout();
    let all: DevView<'a, f64> = view("semi-CRF state", state, &[layout.total])?;
    // SAFETY: every part lies inside the checked view (`state_layout`); addresses only.
    let part = |(at, len): (usize, usize)| unsafe {
        DevView::<f64>::from_raw(all.addr() + 8 * at as u64, len)
    };
    Ok(StateViews {
        log_z: view("semi-CRF log Z", log_z, &[p.batch])?,
        log_z64: part(layout.log_z64),
        alpha_ckpt: part(layout.alpha_ckpt),
        alpha_norm: part(layout.alpha_norm),
        beta_ckpt: part(layout.beta_ckpt),
        beta_norm: part(layout.beta_norm),
        partials: part(layout.partials),
    })
}

/// The scores, named.
fn scores<'t>(i: &RawSemiCrfInputs<'t>) -> Vec<(&'static str, &'t RawTensor)> {
    vec![
        ("cumulative scores", i.cumsum),
        ("duration scores", i.dur),
        ("transition scores", i.trans),
    ]
}

/// Check every tensor's memory on the stream's device, write the lengths, run `plan`.
///
/// # Safety
/// As the raw passes: the storages are live device memory the caller owns until the launches
/// complete, and the plan was made on exactly these tensors.
unsafe fn launch(
    stream: &RawStream,
    tensors: &[(&str, &RawTensor)],
    lengths: (&DevView<'_, u32>, &[u32]),
    plan: &super::SemiCrfPlan,
) -> Result<()> {
    let gpu = stream.gpu();
    for (what, t) in tensors {
        t.check_memory(what, gpu)?;
    }
    // SAFETY: the lengths view is inside its checked storage, device memory of the stream's
    // device (checked above), not accessed by others (the caller's contract).
    unsafe { stream.upload(lengths.0, lengths.1) }?;
    // SAFETY: the plan checked every view's length; the lengths were checked in `1..=T` and
    // written just above on the same stream; the scores' values are the caller's (finite, as
    // documented); the memory is the caller's contract.
    unsafe { plan.run(stream) }
}

/// Plan the forward on raw tensors (pure): log Z `[B]` f32 and the state written.
pub fn plan_forward_raw(
    inputs: &RawSemiCrfInputs<'_>,
    lengths: &[i64],
    checkpoint: Option<usize>,
    state: &RawTensor,
    log_z: &RawTensor,
) -> Result<(super::SemiCrfPlan, Vec<u32>)> {
    let (p, views, words) = problem_and_inputs(inputs, lengths, checkpoint)?;
    let mut ins = scores(inputs);
    ins.push(("lengths", inputs.lengths));
    check_disjoint(&ins, &[("state", state), ("log Z", log_z)])?;
    let plan = p.plan(&SemiCrfTensors::Forward {
        inputs: views,
        state: state_views(&p, state, log_z)?,
    })?;
    Ok((plan, words))
}

/// Launch the forward (asynchronous): log Z `[B]` f32 into `log_z` and the state (laid out by
/// [`state_layout`]) for a backward, from the inputs and the host `lengths` (each in `1..=T`;
/// written into `inputs.lengths` first), with checkpoint interval `checkpoint` (`None`: the
/// default). Checks as [`plan_forward_raw`], and every tensor's memory.
///
/// # Safety
/// Each tensor's storage is memory the caller owns, live until the launches have completed on
/// `stream`; nothing else writes the inputs or accesses the outputs until then. Non-finite
/// scores give non-finite results.
pub unsafe fn forward_raw(
    stream: &RawStream,
    inputs: &RawSemiCrfInputs<'_>,
    lengths: &[i64],
    checkpoint: Option<usize>,
    state: &RawTensor,
    log_z: &RawTensor,
) -> Result<()> {
    let (plan, words) = plan_forward_raw(inputs, lengths, checkpoint, state, log_z)?;
    let lens = view::<u32>("semi-CRF lengths", inputs.lengths, &[words.len()])?;
    let mut all = scores(inputs);
    all.extend([
        ("lengths", inputs.lengths),
        ("state", state),
        ("log Z", log_z),
    ]);
    // SAFETY: forwarded to the caller; the plan was made on these tensors.
    unsafe { launch(stream, &all, (&lens, &words), &plan) }
}

/// The gradients of a raw backward: f32, contiguous.
#[derive(Clone, Copy)]
pub struct RawSemiCrfGradients<'t> {
    /// `d log Z_b / d S` `[B, T + 1, C]` (written).
    pub grad_cumsum: &'t RawTensor,
    /// `d (sum_b log Z_b) / d dur` `[K, C]` (written).
    pub grad_dur: &'t RawTensor,
    /// `d (sum_b log Z_b) / d trans` `[C, C]` (written).
    pub grad_trans: &'t RawTensor,
}

/// Plan the backward on raw tensors (pure).
pub fn plan_backward_raw(
    inputs: &RawSemiCrfInputs<'_>,
    lengths: &[i64],
    checkpoint: Option<usize>,
    state: &RawTensor,
    log_z: &RawTensor,
    grads: &RawSemiCrfGradients<'_>,
) -> Result<(super::SemiCrfPlan, Vec<u32>)> {
    let (p, views, words) = problem_and_inputs(inputs, lengths, checkpoint)?;
    let mut ins = scores(inputs);
    ins.push(("lengths", inputs.lengths));
    // The state is completed by the reverse scan and log Z read: both apart from the inputs
    // and the gradients.
    check_disjoint(
        &ins,
        &[
            ("state", state),
            ("log Z", log_z),
            ("gradient of the cumulative scores", grads.grad_cumsum),
            ("gradient of the duration scores", grads.grad_dur),
            ("gradient of the transitions", grads.grad_trans),
        ],
    )?;
    let grad = GradientViews {
        grad_cumsum: view(
            "semi-CRF gradient of the cumulative scores",
            grads.grad_cumsum,
            &[p.batch, p.t + 1, p.c],
        )?,
        grad_dur: view(
            "semi-CRF gradient of the duration scores",
            grads.grad_dur,
            &[p.k, p.c],
        )?,
        grad_trans: view(
            "semi-CRF gradient of the transitions",
            grads.grad_trans,
            &[p.c, p.c],
        )?,
        marginals: None,
    };
    let plan = p.plan(&SemiCrfTensors::Backward {
        inputs: views,
        state: state_views(&p, state, log_z)?,
        grads: grad,
    })?;
    Ok((plan, words))
}

/// Launch the backward (asynchronous) after [`forward_raw`] on the same inputs, lengths,
/// checkpoint interval, state and log Z: the reverse scan, the segment kernel and the
/// reduction into `grads` (and the partial counts into the state). Checks as
/// [`plan_backward_raw`], and every tensor's memory.
///
/// # Safety
/// As [`forward_raw`]; the state holds that forward's results (enqueued before on `stream`;
/// otherwise the results are wrong, never out of bounds).
pub unsafe fn backward_raw(
    stream: &RawStream,
    inputs: &RawSemiCrfInputs<'_>,
    lengths: &[i64],
    checkpoint: Option<usize>,
    state: &RawTensor,
    log_z: &RawTensor,
    grads: &RawSemiCrfGradients<'_>,
) -> Result<()> {
    let (plan, words) = plan_backward_raw(inputs, lengths, checkpoint, state, log_z, grads)?;
    let lens = view::<u32>("semi-CRF lengths", inputs.lengths, &[words.len()])?;
    let mut all = scores(inputs);
    all.extend([
        ("lengths", inputs.lengths),
        ("state", state),
        ("log Z", log_z),
        ("gradient of the cumulative scores", grads.grad_cumsum),
        ("gradient of the duration scores", grads.grad_dur),
        ("gradient of the transitions", grads.grad_trans),
    ]);
    // SAFETY: forwarded to the caller; the plan was made on these tensors.
    unsafe { launch(stream, &all, (&lens, &words), &plan) }
}

/// The outputs of a raw Viterbi pass: contiguous, int32 but for the f32 scores.
#[derive(Clone, Copy)]
pub struct RawViterbiOutputs<'t> {
    /// Best scores `[B]` f32.
    pub score: &'t RawTensor,
    /// Backpointers `[B, T + 1, C]` (workspace).
    pub backptr: &'t RawTensor,
    /// Segment starts `[B, T]` (the first `count[b]` of row `b`, in order of position).
    pub seg_start: &'t RawTensor,
    /// Segment durations `[B, T]`.
    pub seg_dur: &'t RawTensor,
    /// Segment labels `[B, T]`.
    pub seg_label: &'t RawTensor,
    /// Segment counts `[B]`.
    pub seg_count: &'t RawTensor,
}

impl<'t> RawViterbiOutputs<'t> {
    fn named(&self) -> Vec<(&'static str, &'t RawTensor)> {
        vec![
            ("Viterbi scores", self.score),
            ("Viterbi backpointers", self.backptr),
            ("Viterbi segment starts", self.seg_start),
            ("Viterbi segment durations", self.seg_dur),
            ("Viterbi segment labels", self.seg_label),
            ("Viterbi segment counts", self.seg_count),
        ]
    }
}

/// Plan the Viterbi pass on raw tensors (pure).
pub fn plan_viterbi_raw(
    inputs: &RawSemiCrfInputs<'_>,
    lengths: &[i64],
    out: &RawViterbiOutputs<'_>,
) -> Result<(super::SemiCrfPlan, Vec<u32>)> {
    let (p, views, words) = problem_and_inputs(inputs, lengths, None)?;
    let mut ins = scores(inputs);
    ins.push(("lengths", inputs.lengths));
    check_disjoint(&ins, &out.named())?;
    let (b, t, c) = (p.batch, p.t, p.c);
    let views_out = ViterbiViews {
        score: view("semi-CRF Viterbi scores", out.score, &[b])?,
        backptr: view("semi-CRF Viterbi backpointers", out.backptr, &[b, t + 1, c])?,
        seg_start: view("semi-CRF Viterbi segment starts", out.seg_start, &[b, t])?,
        seg_dur: view("semi-CRF Viterbi segment durations", out.seg_dur, &[b, t])?,
        seg_label: view("semi-CRF Viterbi segment labels", out.seg_label, &[b, t])?,
        seg_count: view("semi-CRF Viterbi segment counts", out.seg_count, &[b])?,
    };
    let plan = p.plan(&SemiCrfTensors::Viterbi {
        inputs: views,
        out: views_out,
    })?;
    Ok((plan, words))
}

/// Launch the Viterbi pass (asynchronous): the best segmentation of every sequence and its
/// score. Checks as [`plan_viterbi_raw`], and every tensor's memory.
///
/// # Safety
/// As [`forward_raw`].
pub unsafe fn viterbi_raw(
    stream: &RawStream,
    inputs: &RawSemiCrfInputs<'_>,
    lengths: &[i64],
    out: &RawViterbiOutputs<'_>,
) -> Result<()> {
    let (plan, words) = plan_viterbi_raw(inputs, lengths, out)?;
    let lens = view::<u32>("semi-CRF lengths", inputs.lengths, &[words.len()])?;
    let mut all = scores(inputs);
    all.push(("lengths", inputs.lengths));
    all.extend(out.named());
    // SAFETY: forwarded to the caller; the plan was made on these tensors.
    unsafe { launch(stream, &all, (&lens, &words), &plan) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raw::ElemType;

    struct Fixture {
        cumsum: RawTensor,
        dur: RawTensor,
        trans: RawTensor,
        lengths: RawTensor,
        state: RawTensor,
        log_z: RawTensor,
        grads: [RawTensor; 3],
    }

    fn fixture(b: usize, t: usize, k: usize, c: usize) -> Fixture {
        let at = |i: u64| i << 36;
        let layout = state_layout(&[b, t + 1, c], &[k, c], None).unwrap();
        Fixture {
            cumsum: RawTensor::contiguous(at(1), ElemType::F32, &[b, t + 1, c]),
            dur: RawTensor::contiguous(at(2), ElemType::F32, &[k, c]),
            trans: RawTensor::contiguous(at(3), ElemType::F32, &[c, c]),
            lengths: RawTensor::contiguous(at(4), ElemType::I32, &[b]),
            state: RawTensor::contiguous(at(5), ElemType::F64, &[layout.total]),
            log_z: RawTensor::contiguous(at(6), ElemType::F32, &[b]),
            grads: [
                RawTensor::contiguous(at(7), ElemType::F32, &[b, t + 1, c]),
                RawTensor::contiguous(at(8), ElemType::F32, &[k, c]),
                RawTensor::contiguous(at(9), ElemType::F32, &[c, c]),
            ],
        }
    }

    impl Fixture {
        fn inputs(&self) -> RawSemiCrfInputs<'_> {
            RawSemiCrfInputs {
                cumsum: &self.cumsum,
                dur: &self.dur,
                trans: &self.trans,
                lengths: &self.lengths,
            }
        }

        fn backward(&self, lengths: &[i64]) -> Result<Vec<u32>> {
            let grads = RawSemiCrfGradients {
                grad_cumsum: &self.grads[0],
                grad_dur: &self.grads[1],
                grad_trans: &self.grads[2],
            };
            plan_backward_raw(
                &self.inputs(),
                lengths,
                None,
                &self.state,
                &self.log_z,
                &grads,
            )
            .map(|(_, w)| w)
        }
    }

    #[test]
    fn layout_is_aligned_and_disjoint() {
        let p = SemiCrfProblem::new(3, 1000, 12, 5);
        let l = p.state_layout();
        let n = p.buffer_lens();
        let parts = [
            l.log_z64,
            l.alpha_ckpt,
            l.alpha_norm,
            l.beta_ckpt,
            l.beta_norm,
            l.partials,
        ];
        let lens = [
            n.log_z64,
            n.alpha_ckpt,
            n.alpha_norm,
            n.beta_ckpt,
            n.beta_norm,
            n.partials,
        ];
        for (i, ((at, len), want)) in parts.iter().zip(lens).enumerate() {
            assert_eq!(*len, want);
            assert_eq!(at % CARVE_ALIGN, 0);
            if i > 0 {
                assert!(parts[i - 1].0 + parts[i - 1].1 <= *at);
            }
        }
        assert_eq!(l.total, l.partials.0 + l.partials.1);
        assert_eq!((l.checkpoint, l.segments), (p.checkpoint, p.num_segments()));
    }

    #[test]
    fn raw_plans_check_lengths_and_tensors() {
        let f = fixture(2, 50, 4, 3);
        assert_eq!(f.backward(&[50, 7]).unwrap(), vec![50, 7]);
        let (_, words) = plan_forward_raw(&f.inputs(), &[1, 50], None, &f.state, &f.log_z).unwrap();
        assert_eq!(words, vec![1, 50]);
        for (lengths, needle) in [
            (&[0i64, 5][..], "lengths[0] = 0 is outside 1..=50"),
            (&[5, 51], "lengths[1] = 51"),
            (&[5, -1], "lengths[1] = -1"),
            (&[5], "lengths [B]"),
        ] {
            let e = f.backward(lengths).unwrap_err();
            assert!(e.to_string().contains(needle), "{needle}: {e}");
        }
        let refuse = |change: &dyn Fn(&mut Fixture), needle: &str| {
            let mut g = fixture(2, 50, 4, 3);
            change(&mut g);
            let e = g.backward(&[50, 50]).unwrap_err();
            assert!(e.to_string().contains(needle), "{needle}: {e}");
        };
        refuse(
            &|f| f.cumsum.dtype = ElemType::F64,
            "cumulative scores dtype",
        );
        refuse(&|f| f.dur.shape = vec![4, 4], "duration scores shape");
        refuse(
            &|f| f.trans.strides = vec![1, 3],
            "transition scores strides",
        );
        refuse(&|f| f.lengths.dtype = ElemType::F32, "lengths dtype");
        refuse(&|f| f.state.shape[0] -= 1, "state shape");
        refuse(
            &|f| f.grads[0].ptr = f.cumsum.ptr,
            "overlaps cumulative scores",
        );
        refuse(
            &|f| f.grads[2].ptr = f.state.ptr,
            "overlaps gradient of the transitions",
        );
        refuse(
            &|f| f.lengths.ptr = f.trans.ptr,
            "overlaps transition scores",
        );
        refuse(&|f| f.cumsum.shape[1] = 0, "at least one row");
    }
}
