//! GLA forward: the workspace query and the launch (`rustkernels/gla.py`).

use crate::{TensorArgs, tensor, to_py};
use kernels::gla::{
    GlaKernel, GlaOptions, RawGlaBackwardTensors, RawGlaTensors, RawGlaWorkspace, Target,
    backward_raw, backward_workspace_lens, forward_raw, workspace_lens,
};
use kernels::raw::{RawStream, primary_gpu};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The options of a pass from the Python arguments.
fn options(
    scale: Option<f32>,
    cu_seqlens: Option<Vec<usize>>,
    kernel: &str,
) -> PyResult<GlaOptions> {
    Ok(GlaOptions {
        scale,
        cu_seqlens,
        kernel: match kernel {
            "auto" => GlaKernel::Auto,
            "baseline" => GlaKernel::Baseline,
            "pingpong" => GlaKernel::Pingpong,
            other => {
                return Err(PyValueError::new_err(format!(
                    "kernel {other:?}: use \"auto\", \"baseline\" or \"pingpong\""
                )));
            }
        },
    })
}

/// The workspace of a GLA forward on device `device` for q of shape `q_shape` and v of shape
/// `v_shape`: `(table words, f32 buffer elements)` (int32 and float32 tensors of these lengths;
/// no buffer tensor when the second is 0). It depends on the device (its kernels and
/// multiprocessors), so it loads the kernels there on the first call.
#[pyfunction]
#[pyo3(signature = (device, q_shape, v_shape, cu_seqlens, kernel = "auto"))]
pub fn gla_forward_workspace(
    py: Python<'_>,
    device: u32,
    q_shape: Vec<usize>,
    v_shape: Vec<usize>,
    cu_seqlens: Option<Vec<usize>>,
    kernel: &str,
) -> PyResult<(usize, usize)> {
    let options = options(None, cu_seqlens, kernel)?;
    py.detach(|| {
        let gpu = primary_gpu(device)?;
        let lens = workspace_lens(Target::of(gpu), &q_shape, &v_shape, &options)?;
        Ok((lens.table_words, lens.buffer_elems))
    })
    .map_err(to_py)
}

/// GLA forward on device `device`'s stream `stream`: o (and the final states) written from q,
/// k, v, g (and the initial states), with the workspace `tables` (int32) and `buffers` (f32,
/// `None` when `gla_forward_workspace` gives 0 elements). See `kernels::gla::forward_raw`.
/// Asynchronous.
#[pyfunction]
#[pyo3(signature = (device, stream, q, k, v, g, initial_state, o, final_state, tables, buffers, scale, cu_seqlens, kernel = "auto"))]
#[allow(clippy::too_many_arguments)]
pub fn gla_forward(
    py: Python<'_>,
    device: u32,
    stream: u64,
    q: TensorArgs,
    k: TensorArgs,
    v: TensorArgs,
    g: TensorArgs,
    initial_state: Option<TensorArgs>,
    o: TensorArgs,
    final_state: Option<TensorArgs>,
    tables: TensorArgs,
    buffers: Option<TensorArgs>,
    scale: Option<f32>,
    cu_seqlens: Option<Vec<usize>>,
    kernel: &str,
) -> PyResult<()> {
    let options = options(scale, cu_seqlens, kernel)?;
    let (q, k, v, g, o) = (
        tensor("q", q)?,
        tensor("k", k)?,
        tensor("v", v)?,
        tensor("g", g)?,
        tensor("o", o)?,
    );
    let h0 = initial_state
        .map(|t| tensor("initial_state", t))
        .transpose()?;
    let ht = final_state.map(|t| tensor("final_state", t)).transpose()?;
    let tables = tensor("workspace", tables)?;
    let buffers = buffers.map(|t| tensor("workspace", t)).transpose()?;
    py.detach(|| {
        // SAFETY: the Python side passes the handle of torch's current stream of `device`,
        // which torch keeps alive.
        let stream = unsafe { RawStream::new(device, stream) }?;
        let tensors = RawGlaTensors {
            q: &q,
            k: &k,
            v: &v,
            g: &g,
            init_state: h0.as_ref(),
            o: &o,
            final_state: ht.as_ref(),
        };
        let workspace = RawGlaWorkspace {
            tables: &tables,
            buffers: buffers.as_ref(),
        };
        // SAFETY: the Python side passes live torch tensors it holds across this call; their
        // memory stays valid for work enqueued on `stream` afterwards (torch's caching
        // allocator reuses freed memory in the order of the stream it was allocated on, the
        // current stream here); o, the final states and the workspace are fresh allocations.
        unsafe { forward_raw(&stream, &options, &tensors, &workspace) }
    })
    .map_err(to_py)
}

/// The workspace of a GLA backward on device `device`: `(table words, f32 buffer elements)`
/// (the buffers zeroed by the caller). See `gla_forward_workspace`.
#[pyfunction]
#[pyo3(signature = (device, q_shape, v_shape, cu_seqlens))]
pub fn gla_backward_workspace(
    py: Python<'_>,
    device: u32,
    q_shape: Vec<usize>,
    v_shape: Vec<usize>,
    cu_seqlens: Option<Vec<usize>>,
) -> PyResult<(usize, usize)> {
    let options = options(None, cu_seqlens, "auto")?;
    py.detach(|| {
        let gpu = primary_gpu(device)?;
        let lens = backward_workspace_lens(Target::of(gpu), &q_shape, &v_shape, &options)?;
        Ok((lens.table_words, lens.buffer_elems))
    })
    .map_err(to_py)
}

/// GLA backward on device `device`'s stream `stream`: dq, dk, dv (bf16), dg and the initial
/// states' gradient (f32) of the forward of q, k, v, g (and the initial states), from dO (and
/// the final states' gradient), with the workspace `tables` (int32) and `buffers` (f32,
/// zeroed). See `kernels::gla::backward_raw`. Asynchronous.
#[pyfunction]
#[pyo3(signature = (device, stream, q, k, v, g, initial_state, d_o, d_final_state, d_q, d_k, d_v, d_g, d_initial_state, tables, buffers, scale, cu_seqlens))]
#[allow(clippy::too_many_arguments)]
pub fn gla_backward(
    py: Python<'_>,
    device: u32,
    stream: u64,
    q: TensorArgs,
    k: TensorArgs,
    v: TensorArgs,
    g: TensorArgs,
    initial_state: Option<TensorArgs>,
    d_o: TensorArgs,
    d_final_state: Option<TensorArgs>,
    d_q: TensorArgs,
    d_k: TensorArgs,
    d_v: TensorArgs,
    d_g: TensorArgs,
    d_initial_state: TensorArgs,
    tables: TensorArgs,
    buffers: TensorArgs,
    scale: Option<f32>,
    cu_seqlens: Option<Vec<usize>>,
) -> PyResult<()> {
    let options = options(scale, cu_seqlens, "auto")?;
    let inputs = [
        tensor("q", q)?,
        tensor("k", k)?,
        tensor("v", v)?,
        tensor("g", g)?,
        tensor("do", d_o)?,
    ];
    let h0 = initial_state
        .map(|t| tensor("initial_state", t))
        .transpose()?;
    let dht = d_final_state.map(|t| tensor("dht", t)).transpose()?;
    let grads = [
        tensor("dq", d_q)?,
        tensor("dk", d_k)?,
        tensor("dv", d_v)?,
        tensor("dg", d_g)?,
        tensor("dh0", d_initial_state)?,
    ];
    let (tables, buffers) = (tensor("workspace", tables)?, tensor("workspace", buffers)?);
    py.detach(|| {
        // SAFETY: as in `gla_forward`.
        let stream = unsafe { RawStream::new(device, stream) }?;
        let tensors = RawGlaBackwardTensors {
            q: &inputs[0],
            k: &inputs[1],
            v: &inputs[2],
            g: &inputs[3],
            init_state: h0.as_ref(),
            d_o: &inputs[4],
            d_final_state: dht.as_ref(),
            d_q: &grads[0],
            d_k: &grads[1],
            d_v: &grads[2],
            d_g: &grads[3],
            d_init_state: &grads[4],
        };
        let workspace = RawGlaWorkspace {
            tables: &tables,
            buffers: Some(&buffers),
        };
        // SAFETY: as in `gla_forward`; the gradients and the workspace are fresh allocations.
        unsafe { backward_raw(&stream, &options, &tensors, &workspace) }
    })
    .map_err(to_py)
}
