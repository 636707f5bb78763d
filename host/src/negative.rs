//! Launcher of the semi-CRF negative control (`gpu-kernels/src/negative.rs`): a kernel with a
//! deliberate bug, for the reliability tests only (feature `negative-controls`; the rest of the
//! library never launches it; the block-reduction control is launched by `kernels-testing`). Their results are wrong
//! by design; what the tests check is that the reference checks and the sanitizers notice.

use crate::error::Result;
use crate::gpu::Gpu;
use crate::semicrf::{DeviceInputs, ForwardState, Gradients, SemiCrfProblem};
use cust::stream::Stream;

/// `semicrf::forward_backward_launch` with `negative_semicrf_marginals_aliased` (segments
/// `2i` and `2i + 1` share one `partials` slice).
pub fn semicrf_forward_backward_aliased_launch(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &DeviceInputs,
    state: &mut ForwardState,
    grads: &mut Gradients,
) -> Result<()> {
    crate::semicrf::launch_scans(gpu, stream, problem, inputs, state)?;
    crate::semicrf::launch_marginals_and_reduce_of(
        gpu,
        stream,
        "negative_semicrf_marginals_aliased",
        problem,
        inputs,
        state,
        grads,
    )
}
