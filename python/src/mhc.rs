//! mHC: the layout query and the launches of the forward's halves and the backward
//! (`rustkernels/mhc.py`).

use crate::{TensorArgs, tensor, to_py};
use kernels::mhc::{
    MhcOptions, RawMhcGradients, RawMhcWeights, backward_raw, forward_post_raw, forward_pre_raw,
    raw_layout,
};
use kernels::raw::{RawStream, RawTensor};
use pyo3::prelude::*;

fn options(sinkhorn_iters: u32, eps: f32, gamma: bool) -> MhcOptions {
    MhcOptions {
        sinkhorn_iters,
        eps,
        gamma,
    }
}

/// The f32 elements of the coefficient and scratch tensors of an mHC problem of `x_shape`
/// (`[B, S, n, C]`): `(coefficients, scratch)`.
#[pyfunction]
pub fn mhc_layout(
    x_shape: Vec<usize>,
    sinkhorn_iters: u32,
    eps: f32,
    gamma: bool,
) -> PyResult<(usize, usize)> {
    let l = raw_layout(&x_shape, &options(sinkhorn_iters, eps, gamma)).map_err(to_py)?;
    Ok((l.coeffs_total, l.scratch_total))
}

/// The weights described.
struct Weights {
    phi: RawTensor,
    gamma: Option<RawTensor>,
    alpha: RawTensor,
    bias: RawTensor,
}

impl Weights {
    fn new(
        phi: TensorArgs,
        gamma: Option<TensorArgs>,
        alpha: TensorArgs,
        bias: TensorArgs,
    ) -> PyResult<Weights> {
        Ok(Weights {
            phi: tensor("phi", phi)?,
            gamma: gamma.map(|g| tensor("gamma", g)).transpose()?,
            alpha: tensor("alpha", alpha)?,
            bias: tensor("bias", bias)?,
        })
    }

    fn raw(&self) -> RawMhcWeights<'_> {
        RawMhcWeights {
            phi: &self.phi,
            gamma: self.gamma.as_ref(),
            alpha: &self.alpha,
            bias: &self.bias,
        }
    }
}

/// The forward's first half on device `device`'s stream `stream`: the coefficients (f32,
/// `mhc_layout`'s length) and `x_in [B, S, C]` bf16 from `x [B, S, n, C]` bf16 and the f32
/// weights, with the f32 `scratch`. See `kernels::mhc::forward_pre_raw`. Asynchronous.
#[pyfunction]
#[pyo3(signature = (device, stream, x, phi, gamma, alpha, bias, scratch, coeffs, x_in, sinkhorn_iters, eps))]
#[allow(clippy::too_many_arguments)]
pub fn mhc_forward_pre(
    py: Python<'_>,
    device: u32,
    stream: u64,
    x: TensorArgs,
    phi: TensorArgs,
    gamma: Option<TensorArgs>,
    alpha: TensorArgs,
    bias: TensorArgs,
    scratch: TensorArgs,
    coeffs: TensorArgs,
    x_in: TensorArgs,
    sinkhorn_iters: u32,
    eps: f32,
) -> PyResult<()> {
    let options = options(sinkhorn_iters, eps, gamma.is_some());
    let weights = Weights::new(phi, gamma, alpha, bias)?;
    let (x, scratch, coeffs, x_in) = (
        tensor("x", x)?,
        tensor("workspace", scratch)?,
        tensor("coefficients", coeffs)?,
        tensor("x_in", x_in)?,
    );
    py.detach(|| {
        // SAFETY: the handle of torch's current stream of `device`, which torch keeps alive.
        let stream = unsafe { RawStream::new(device, stream) }?;
        // SAFETY: live torch tensors the Python side holds across this call, whose memory stays
        // valid for work enqueued on `stream` (torch's caching allocator); the scratch, the
        // coefficients and x_in are fresh allocations.
        unsafe {
            forward_pre_raw(
                &stream,
                &options,
                &weights.raw(),
                &x,
                &scratch,
                &coeffs,
                &x_in,
            )
        }
    })
    .map_err(to_py)
}

/// The forward's second half on device `device`'s stream `stream`: `x_next [B, S, n, C]` bf16
/// from `x`, the layer's output `y [B, S, C]` bf16 and the first half's coefficients. See
/// `kernels::mhc::forward_post_raw`. Asynchronous.
#[pyfunction]
#[pyo3(signature = (device, stream, x, y, coeffs, x_next, sinkhorn_iters, eps))]
#[allow(clippy::too_many_arguments)]
pub fn mhc_forward_post(
    py: Python<'_>,
    device: u32,
    stream: u64,
    x: TensorArgs,
    y: TensorArgs,
    coeffs: TensorArgs,
    x_next: TensorArgs,
    sinkhorn_iters: u32,
    eps: f32,
) -> PyResult<()> {
    // The second half reads no weight: whether gamma exists does not matter to it.
    let options = options(sinkhorn_iters, eps, false);
    let (x, y, coeffs, x_next) = (
        tensor("x", x)?,
        tensor("y", y)?,
        tensor("coefficients", coeffs)?,
        tensor("x_next", x_next)?,
    );
    py.detach(|| {
        // SAFETY: as in `mhc_forward_pre`.
        let stream = unsafe { RawStream::new(device, stream) }?;
        // SAFETY: as in `mhc_forward_pre`; x_next is a fresh allocation.
        unsafe { forward_post_raw(&stream, &options, &x, &y, &coeffs, &x_next) }
    })
    .map_err(to_py)
}

/// The backward on device `device`'s stream `stream`: dx, dy (bf16), dphi, dgamma (when gamma
/// is given), dalpha, dbias (f32) from `d_xin`, `d_xnext` (bf16), the forward's inputs and
/// coefficients, with the f32 `scratch`. See `kernels::mhc::backward_raw`. Asynchronous.
#[pyfunction]
#[pyo3(signature = (device, stream, x, y, phi, gamma, alpha, bias, coeffs, d_xin, d_xnext, scratch, dx, dy, dphi, dgamma, dalpha, dbias, sinkhorn_iters, eps))]
#[allow(clippy::too_many_arguments)]
pub fn mhc_backward(
    py: Python<'_>,
    device: u32,
    stream: u64,
    x: TensorArgs,
    y: TensorArgs,
    phi: TensorArgs,
    gamma: Option<TensorArgs>,
    alpha: TensorArgs,
    bias: TensorArgs,
    coeffs: TensorArgs,
    d_xin: TensorArgs,
    d_xnext: TensorArgs,
    scratch: TensorArgs,
    dx: TensorArgs,
    dy: TensorArgs,
    dphi: TensorArgs,
    dgamma: Option<TensorArgs>,
    dalpha: TensorArgs,
    dbias: TensorArgs,
    sinkhorn_iters: u32,
    eps: f32,
) -> PyResult<()> {
    let options = options(sinkhorn_iters, eps, gamma.is_some());
    let weights = Weights::new(phi, gamma, alpha, bias)?;
    let (x, y, coeffs, d_xin, d_xnext, scratch) = (
        tensor("x", x)?,
        tensor("y", y)?,
        tensor("coefficients", coeffs)?,
        tensor("d_xin", d_xin)?,
        tensor("d_xnext", d_xnext)?,
        tensor("workspace", scratch)?,
    );
    let grads = [
        tensor("dx", dx)?,
        tensor("dy", dy)?,
        tensor("dphi", dphi)?,
        tensor("dalpha", dalpha)?,
        tensor("dbias", dbias)?,
    ];
    let dgamma = dgamma.map(|g| tensor("dgamma", g)).transpose()?;
    py.detach(|| {
        // SAFETY: as in `mhc_forward_pre`.
        let stream = unsafe { RawStream::new(device, stream) }?;
        let grads = RawMhcGradients {
            dx: &grads[0],
            dy: &grads[1],
            dphi: &grads[2],
            dgamma: dgamma.as_ref(),
            dalpha: &grads[3],
            dbias: &grads[4],
        };
        // SAFETY: as in `mhc_forward_pre`; the coefficients are the forward's on the same
        // inputs, enqueued before on the same stream; the gradients and scratch are fresh.
        unsafe {
            backward_raw(
                &stream,
                &options,
                &weights.raw(),
                &x,
                &y,
                &coeffs,
                &d_xin,
                &d_xnext,
                &scratch,
                &grads,
            )
        }
    })
    .map_err(to_py)
}
