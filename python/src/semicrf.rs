//! Semi-CRF: the state layout, forward (log Z), backward (gradients) and Viterbi launches
//! (`rustkernels/semicrf.py`).

use crate::{TensorArgs, tensor, to_py};
use kernels::raw::{RawStream, RawTensor};
use kernels::semicrf::{
    RawSemiCrfGradients, RawSemiCrfInputs, RawViterbiOutputs, backward_raw, forward_raw,
    state_layout, viterbi_raw,
};
use pyo3::prelude::*;

/// The layout of the f64 state a forward keeps for the backward, for cumulative scores of
/// shape `cumsum_shape` (`[B, T + 1, C]`) and duration scores of shape `dur_shape` (`[K, C]`):
/// `(total elements, partials offset, partials length, checkpoint interval, segments per
/// sequence)` (the partial counts `[B, segments, K C + C C]` are what the backward leaves
/// per sequence and segment).
#[pyfunction]
#[pyo3(signature = (cumsum_shape, dur_shape, checkpoint = None))]
pub fn semicrf_state_layout(
    cumsum_shape: Vec<usize>,
    dur_shape: Vec<usize>,
    checkpoint: Option<usize>,
) -> PyResult<(usize, usize, usize, usize, usize)> {
    let l = state_layout(&cumsum_shape, &dur_shape, checkpoint).map_err(to_py)?;
    Ok((
        l.total,
        l.partials.0,
        l.partials.1,
        l.checkpoint,
        l.segments,
    ))
}

/// The inputs described.
struct Inputs {
    cumsum: RawTensor,
    dur: RawTensor,
    trans: RawTensor,
    lengths: RawTensor,
}

impl Inputs {
    fn new(
        cumsum: TensorArgs,
        dur: TensorArgs,
        trans: TensorArgs,
        lengths: TensorArgs,
    ) -> PyResult<Inputs> {
        Ok(Inputs {
            cumsum: tensor("cum_scores", cumsum)?,
            dur: tensor("duration_bias", dur)?,
            trans: tensor("transition", trans)?,
            lengths: tensor("lengths", lengths)?,
        })
    }

    fn raw(&self) -> RawSemiCrfInputs<'_> {
        RawSemiCrfInputs {
            cumsum: &self.cumsum,
            dur: &self.dur,
            trans: &self.trans,
            lengths: &self.lengths,
        }
    }
}

/// Semi-CRF forward on device `device`'s stream `stream`: log Z `[B]` f32 and the f64 state
/// (`semicrf_state_layout`'s length) from the f32 scores and the host `lengths` (written into
/// the int32 tensor `lengths_buf` `[B]` on the stream). See `kernels::semicrf::forward_raw`.
/// Asynchronous.
#[pyfunction]
#[pyo3(signature = (device, stream, cum_scores, duration_bias, transition, lengths_buf, lengths, checkpoint, state, log_z))]
#[allow(clippy::too_many_arguments)]
pub fn semicrf_forward(
    py: Python<'_>,
    device: u32,
    stream: u64,
    cum_scores: TensorArgs,
    duration_bias: TensorArgs,
    transition: TensorArgs,
    lengths_buf: TensorArgs,
    lengths: Vec<i64>,
    checkpoint: Option<usize>,
    state: TensorArgs,
    log_z: TensorArgs,
) -> PyResult<()> {
    let inputs = Inputs::new(cum_scores, duration_bias, transition, lengths_buf)?;
    let (state, log_z) = (tensor("state", state)?, tensor("log_z", log_z)?);
    py.detach(|| {
        // SAFETY: the handle of torch's current stream of `device`, which torch keeps alive.
        let stream = unsafe { RawStream::new(device, stream) }?;
        // SAFETY: live torch tensors the Python side holds across this call, whose memory stays
        // valid for work enqueued on `stream` (torch's caching allocator); the lengths buffer,
        // the state and log Z are fresh allocations.
        unsafe { forward_raw(&stream, &inputs.raw(), &lengths, checkpoint, &state, &log_z) }
    })
    .map_err(to_py)
}

/// Semi-CRF backward on device `device`'s stream `stream`, after `semicrf_forward` on the same
/// tensors: the gradients of `sum_b log Z_b` (`grad_cumsum` per sequence) and the partial
/// counts in the state. See `kernels::semicrf::backward_raw`. Asynchronous.
#[pyfunction]
#[pyo3(signature = (device, stream, cum_scores, duration_bias, transition, lengths_buf, lengths, checkpoint, state, log_z, grad_cum_scores, grad_duration_bias, grad_transition))]
#[allow(clippy::too_many_arguments)]
pub fn semicrf_backward(
    py: Python<'_>,
    device: u32,
    stream: u64,
    cum_scores: TensorArgs,
    duration_bias: TensorArgs,
    transition: TensorArgs,
    lengths_buf: TensorArgs,
    lengths: Vec<i64>,
    checkpoint: Option<usize>,
    state: TensorArgs,
    log_z: TensorArgs,
    grad_cum_scores: TensorArgs,
    grad_duration_bias: TensorArgs,
    grad_transition: TensorArgs,
) -> PyResult<()> {
    let inputs = Inputs::new(cum_scores, duration_bias, transition, lengths_buf)?;
    let (state, log_z) = (tensor("state", state)?, tensor("log_z", log_z)?);
    let grads = [
        tensor("grad_cum_scores", grad_cum_scores)?,
        tensor("grad_duration_bias", grad_duration_bias)?,
        tensor("grad_transition", grad_transition)?,
    ];
    py.detach(|| {
        // SAFETY: as in `semicrf_forward`.
        let stream = unsafe { RawStream::new(device, stream) }?;
        let grads = RawSemiCrfGradients {
            grad_cumsum: &grads[0],
            grad_dur: &grads[1],
            grad_trans: &grads[2],
        };
        // SAFETY: as in `semicrf_forward`; the state and log Z are the forward's, enqueued
        // before on the same stream; the gradients are fresh allocations.
        unsafe {
            backward_raw(
                &stream,
                &inputs.raw(),
                &lengths,
                checkpoint,
                &state,
                &log_z,
                &grads,
            )
        }
    })
    .map_err(to_py)
}

/// Semi-CRF Viterbi on device `device`'s stream `stream`: the best score `[B]` f32 and
/// segmentation (int32 starts, durations, labels `[B, T]`, counts `[B]`) with the int32
/// backpointer workspace `[B, T + 1, C]`. See `kernels::semicrf::viterbi_raw`. Asynchronous.
#[pyfunction]
#[pyo3(signature = (device, stream, cum_scores, duration_bias, transition, lengths_buf, lengths, score, backptr, seg_start, seg_dur, seg_label, seg_count))]
#[allow(clippy::too_many_arguments)]
pub fn semicrf_viterbi(
    py: Python<'_>,
    device: u32,
    stream: u64,
    cum_scores: TensorArgs,
    duration_bias: TensorArgs,
    transition: TensorArgs,
    lengths_buf: TensorArgs,
    lengths: Vec<i64>,
    score: TensorArgs,
    backptr: TensorArgs,
    seg_start: TensorArgs,
    seg_dur: TensorArgs,
    seg_label: TensorArgs,
    seg_count: TensorArgs,
) -> PyResult<()> {
    let inputs = Inputs::new(cum_scores, duration_bias, transition, lengths_buf)?;
    let out = [
        tensor("score", score)?,
        tensor("workspace", backptr)?,
        tensor("seg_start", seg_start)?,
        tensor("seg_dur", seg_dur)?,
        tensor("seg_label", seg_label)?,
        tensor("seg_count", seg_count)?,
    ];
    py.detach(|| {
        // SAFETY: as in `semicrf_forward`.
        let stream = unsafe { RawStream::new(device, stream) }?;
        let outputs = RawViterbiOutputs {
            score: &out[0],
            backptr: &out[1],
            seg_start: &out[2],
            seg_dur: &out[3],
            seg_label: &out[4],
            seg_count: &out[5],
        };
        // SAFETY: as in `semicrf_forward`; the outputs are fresh allocations.
        unsafe { viterbi_raw(&stream, &inputs.raw(), &lengths, &outputs) }
    })
    .map_err(to_py)
}
