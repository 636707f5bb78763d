//! Negative controls: kernels with a deliberate bug of two kinds that a kernel can ship with
//! (a missing barrier, blocks sharing a workspace slice), compiled into
//! the PTX under `negative_*` names only so that the test suites can show their checks catch
//! such bugs. The library never launches them (`kernels::negative`, behind the host crate's
//! `negative-controls` feature, and `kernels_testing::negative` are the only launchers); each is an existing kernel's body
//! instantiated with its bug switched on, so nothing is duplicated.
//!
//! - `negative_block_reduce_no_barrier`: `smoke_block_reduce` without the barrier between the
//!   warps' shared-memory stores and warp 0's loads. Racecheck
//!   must report hazards, the emulator reports them on the CPU, and the sums are wrong
//!   whenever warp 0 reads before another warp's store lands.
//! - `negative_semicrf_marginals_aliased`: `semicrf_marginals` with two segments writing one
//!   `partials` slice (a workspace shared between segments): the duration and transition gradients
//!   are wrong (the other slice keeps its NaN poison). A global-memory race, which racecheck
//!   does not see: the reference tests catch it.
//! - `negative_attention_bwd_no_ds_barrier`: `attention_bwd_bf16_d64` without barrier (B) of its
//!   protocol (`attention::backward`'s dK/dV kernel), between the warps' stores of the `dS^T`
//!   tile and every warp's `ldmatrix` reads of it for the dQ product: a read-after-write race
//!   on shared memory. Racecheck must report hazards and the emulator reports them on the CPU;
//!   dK and dV do not depend on the tile and stay right.
//! - `negative_attention_bwd_hopper_early_empty` (sm_90a; instantiated beside the kernel it
//!   breaks, in `attention::hopper_bwd`, whose macro names its tensor-map parameters):
//!   `attention_bwd_hopper_dkdvq_bf16_d256` with every consumer thread arriving on the Q/dO
//!   ring's `empty[s]` as soon as `full[s]` completes, before its reads of the stage's row
//!   values (LSE, `delta'`) and before the products read its Q and dO: the producer may refill
//!   the stage under them, a write-after-read race on shared memory (the row values by warp
//!   1's stores, Q and dO by TMA). Racecheck must report hazards; the gradients are wrong
//!   whenever a refill lands first.
//! - `negative_gla_bwd_no_carry_barrier`: `gla_bwd_dqkg_tc_dk64_dv64` without barrier F of its
//!   protocol (`gla::backward`'s dq/dk/dg kernel, `dqkg_tc.rs`), between the carry pass's
//!   stores of each chunk's carry and every thread's reads of them: a read-after-write race on
//!   shared memory. Racecheck must report hazards, the emulator reports them on the CPU, and
//!   dg is wrong whenever a thread reads a stale carry (likely: see `dqkg_tc.rs`); dq, dk, dv
//!   and the initial-state gradients do not depend on it and stay right.

use kernel_abi::attention::backward::AttentionBwdParams;
use kernel_abi::gla::backward::DqkgTcParams;
use kernel_abi::semicrf::MarginalParams;
use kernel_abi::smoke::ReduceParams;

/// `smoke_block_reduce` without its barrier (see the module documentation).
///
/// # Safety
/// As for `smoke_block_reduce`; its result is undefined (a data race on shared memory).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn negative_block_reduce_no_barrier(p: ReduceParams) {
    crate::launch_bounds!(negative_block_reduce_no_barrier in kernel_abi::smoke::KERNELS);
    // SAFETY: forwarded to the caller.
    unsafe { crate::smoke::reduce::block_reduce::<false>(p) }
}

/// `semicrf_marginals` with aliased segment workspaces (see the module documentation).
///
/// # Safety
/// As for `semicrf_marginals`; two blocks write the same `partials` words (a data race).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn negative_semicrf_marginals_aliased(p: MarginalParams) {
    crate::launch_bounds!(negative_semicrf_marginals_aliased in kernel_abi::semicrf::NEGATIVE);
    // SAFETY: forwarded to the caller.
    unsafe { crate::semicrf::marginals::marginals::<true>(p) }
}

/// `attention_bwd_bf16_d64` without barrier (B) (see the module documentation).
///
/// # Safety
/// As for `attention_bwd_bf16_d64`; its dQ is undefined (a data race on shared memory).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn negative_attention_bwd_no_ds_barrier(p: AttentionBwdParams) {
    crate::launch_bounds!(
        negative_attention_bwd_no_ds_barrier in kernel_abi::attention::backward::NEGATIVE
    );
    // SAFETY: forwarded to the caller.
    unsafe { crate::attention::backward::dkdv_dq_without_ds_barrier(&p) }
}

/// `gla_bwd_dqkg_tc_dk64_dv64` without barrier F (see the module documentation).
///
/// # Safety
/// As for `gla_bwd_dqkg_tc_dk64_dv64`; its dg is undefined (a data race on shared memory).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn negative_gla_bwd_no_carry_barrier(p: DqkgTcParams) {
    crate::launch_bounds!(negative_gla_bwd_no_carry_barrier in kernel_abi::gla::backward::NEGATIVE);
    // SAFETY: forwarded to the caller.
    unsafe { crate::gla::backward::dqkg_tc_without_carry_barrier(&p) }
}
