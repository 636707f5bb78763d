//! Launcher of the semi-CRF negative control (`gpu-kernels/src/negative.rs`): a kernel with a
//! deliberate bug, for the reliability tests only (feature `negative-controls`; the rest of the
//! library never launches it; the block-reduction control is launched by `kernels-testing`).
//! Its results are wrong by design; what the tests check is that the reference checks notice.

use crate::error::Result;
use crate::exec::OnStream;
use crate::gpu::Gpu;
use crate::semicrf::{DeviceInputs, ForwardState, Gradients, SemiCrfProblem};
use cust::stream::Stream;
use kernel_abi::semicrf::NEGATIVE_SEMICRF_MARGINALS_ALIASED;

/// `semicrf::forward_backward_launch` with `negative_semicrf_marginals_aliased` (segments
/// `2i` and `2i + 1` share one `partials` slice): its plan with the marginals kernel swapped.
pub fn semicrf_forward_backward_aliased_launch(
    gpu: &Gpu,
    stream: &Stream,
    problem: &SemiCrfProblem,
    inputs: &DeviceInputs,
    state: &mut ForwardState,
    grads: &mut Gradients,
) -> Result<()> {
    let plan = crate::semicrf::forward_backward_plan(problem, inputs, state, grads)?
        .with_marginals_kernel(&NEGATIVE_SEMICRF_MARGINALS_ALIASED, problem);
    // SAFETY: the buffers were made for this validated problem and are borrowed for the call
    // (state and gradients mutably); the inputs were validated at upload. The negative kernel
    // has the parameters and launch shape of `semicrf_marginals`.
    unsafe { plan.run(&OnStream { gpu, stream }) }
}
