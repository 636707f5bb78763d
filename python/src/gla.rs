//! GLA forward: the workspace query and the launch (`rustkernels/gla.py`).

use crate::{TensorArgs, tensor, to_py};
use kernels::gla::{
    GlaKernel, GlaOptions, RawGlaTensors, RawGlaWorkspace, Target, forward_raw, workspace_lens,
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
