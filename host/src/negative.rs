//! Launchers of the semi-CRF, attention-backward (`mma.sync` and Hopper) and GLA-backward
//! negative controls (`gpu-kernels/src/negative.rs`): kernels with a deliberate bug, for the
//! reliability tests only (feature `negative-controls`; the rest of the library never launches
//! them; the block-reduction control is launched by `kernels-testing`). Their results are wrong by design;
//! what the tests check is that the reference checks, racecheck and the emulator notice.

use crate::attention::{AttentionBackwardPlan, BackwardPath, BackwardWorkspace, BwdLaunch, Dtype};
use crate::error::{Error, Result};
use crate::exec::{Exec, OnStream};
use crate::gla::{GlaBackwardLaunch, GlaBackwardPlan, GlaBackwardWorkspace};
use crate::gpu::Gpu;
use crate::launch::Launch;
use crate::semicrf::{DeviceInputs, ForwardState, Gradients, SemiCrfProblem};
use cust::stream::Stream;
use kernel_abi::attention::backward::NEGATIVE_ATTENTION_BWD_NO_DS_BARRIER;
use kernel_abi::attention::hopper_bwd::{
    NEGATIVE_ATTENTION_BWD_HOPPER_EARLY_EMPTY, hopper_bwd_kernel, hopper_dkdvq_config,
};
use kernel_abi::gla::backward::{GLA_BWD_DQKG_TC_DK64_DV64, NEGATIVE_GLA_BWD_NO_CARRY_BARRIER};
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

/// `AttentionBackwardPlan::run` with `negative_attention_bwd_no_ds_barrier` (no barrier between
/// the `dS^T` stores and their reads) in place of the dK/dV kernel `attention_bwd_bf16_d64`, on
/// `exec` (a stream or the emulator). The plan must be of a bf16 problem with D = 64 on the
/// `mma.sync` path and dQ by atomics (not deterministic): the kernel the control replaces; otherwise
/// `Error::InvalidArgument`.
///
/// # Safety
/// As for `AttentionBackwardPlan::run`.
pub unsafe fn attention_backward_no_ds_barrier_run(
    plan: &AttentionBackwardPlan,
    exec: &impl Exec,
    ws: &BackwardWorkspace<'_>,
) -> Result<()> {
    let k = plan.kernels();
    if k.dtype != Dtype::Bf16
        || k.head_dim != 64
        || plan.deterministic()
        || plan.path() != BackwardPath::MmaSync
    {
        return Err(Error::invalid(
            "negative control",
            "negative_attention_bwd_no_ds_barrier replaces attention_bwd_bf16_d64: a bf16, \
             D = 64 plan on the mma.sync path with dQ by atomics",
        ));
    }
    let l = plan.launches(ws)?;
    let dkdv = Launch::new(
        &NEGATIVE_ATTENTION_BWD_NO_DS_BARRIER,
        l.dkdv.config().grid,
        k.tiles,
        *l.dkdv.params(),
    );
    // SAFETY: as in `AttentionBackwardPlan::run` (the caller's contract): the plan checked the
    // tensors and `launches` the workspace; the negative kernel has the parameters, launch shape
    // and shared memory of the kernel it replaces, and the launches run in the plan's order.
    unsafe {
        exec.launch(&l.pre)?;
        exec.launch(&dkdv)?;
        match &l.dq {
            BwdLaunch::MmaSync(dq) => exec.launch(dq),
            // Not reached: the plan is on the mma.sync path (checked above).
            BwdLaunch::Hopper(_) => Err(Error::invalid("negative control", "a Hopper plan")),
        }
    }
}

/// `AttentionBackwardPlan::run` with `negative_attention_bwd_hopper_early_empty` (each stage of
/// the Q/dO ring released before it is read) in place of the wide dK/dV/dQ kernel
/// `attention_bwd_hopper_dkdvq_bf16_d256`, on `exec` (a stream). The plan must be of a bf16
/// problem with D = 256, no softcap, on the Hopper path: the kernel the control replaces;
/// otherwise `Error::InvalidArgument`.
///
/// # Safety
/// As for `AttentionBackwardPlan::run`.
pub unsafe fn attention_backward_hopper_early_empty_run(
    plan: &AttentionBackwardPlan,
    exec: &impl Exec,
    ws: &BackwardWorkspace<'_>,
) -> Result<()> {
    let replaced = hopper_bwd_kernel(Dtype::Bf16, 256, false)
        .and_then(|k| k.fused.as_ref())
        .map(|f| f.kernel.name);
    let l = plan.launches(ws)?;
    let main = match &l.dkdv {
        BwdLaunch::Hopper(main) if Some(main.name()) == replaced => main,
        _ => {
            return Err(Error::invalid(
                "negative control",
                "negative_attention_bwd_hopper_early_empty replaces \
                 attention_bwd_hopper_dkdvq_bf16_d256: a bf16, D = 256 plan without softcap on \
                 the Hopper path",
            ));
        }
    };
    let main = plan.encode_maps(main)?;
    let negative = Launch::new(
        &NEGATIVE_ATTENTION_BWD_HOPPER_EARLY_EMPTY,
        main.config().grid,
        hopper_dkdvq_config(256, false),
        *main.params(),
    );
    // SAFETY: as in `AttentionBackwardPlan::run` (the caller's contract): the plan checked the
    // tensors and `launches` the workspace; the negative kernel has the parameters (tensor
    // maps encoded as for the kernel it replaces), launch shape and shared memory of that
    // kernel, and the launches run in the plan's order.
    unsafe {
        exec.launch(&l.pre)?;
        exec.launch(&negative)?;
        match &l.dq {
            BwdLaunch::MmaSync(dq) => exec.launch(dq),
            BwdLaunch::Hopper(dq) => exec.launch(&plan.encode_maps(dq)?),
        }
    }
}

/// `GlaBackwardPlan::run` with `negative_gla_bwd_no_carry_barrier` (no barrier between the
/// carry pass's stores of the chunks' carries and their reads) in place of the dq/dk/dg kernel
/// `gla_bwd_dqkg_tc_dk64_dv64`, on `exec` (a stream or the emulator). The plan must be a whole
/// backward with Dk = Dv = 64 and the tensor-core dq/dk/dg kernel (`DqkgKernel::TensorCore`,
/// the default): the kernel the control replaces; otherwise `Error::InvalidArgument`.
///
/// # Safety
/// As for `GlaBackwardPlan::run`.
pub unsafe fn gla_backward_no_carry_barrier_run(
    plan: &GlaBackwardPlan,
    exec: &impl Exec,
    workspace: &GlaBackwardWorkspace<'_>,
) -> Result<()> {
    let launches = plan.launches(workspace)?;
    let replaced = |l: &GlaBackwardLaunch| matches!(l, GlaBackwardLaunch::DqkgTc(t) if t.name() == GLA_BWD_DQKG_TC_DK64_DV64.name);
    if !launches.iter().any(replaced) {
        return Err(Error::invalid(
            "negative control",
            "negative_gla_bwd_no_carry_barrier replaces gla_bwd_dqkg_tc_dk64_dv64: a whole \
             backward with Dk = Dv = 64 and the tensor-core dq/dk/dg kernel",
        ));
    }
    for launch in &launches {
        // SAFETY: as in `GlaBackwardPlan::run` (the caller's contract): the plan checked the
        // tensors and `launches` the workspace; the launches run in the plan's order, and the
        // negative kernel has the parameters, launch shape and shared memory of the kernel it
        // replaces.
        unsafe {
            match launch {
                GlaBackwardLaunch::DqkgTc(l) => {
                    let neg = Launch::new(
                        &NEGATIVE_GLA_BWD_NO_CARRY_BARRIER,
                        l.config().grid,
                        (),
                        *l.params(),
                    );
                    exec.launch(&neg)?
                }
                GlaBackwardLaunch::Reverse(l) => exec.launch(l)?,
                GlaBackwardLaunch::Combine(l) => exec.launch(l)?,
                GlaBackwardLaunch::ForwardStates(l) => exec.launch(l)?,
                GlaBackwardLaunch::Dqkg(l) => exec.launch(l)?,
            }
        }
    }
    Ok(())
}
