//! The reliability sweep, across the families. One test executable; each area is a module, and
//! the test `<area>_<name>` is the function `<area>::<name>`:
//!
//! - `props_*` ([`props`]): property tests of every family's host API: arbitrary sizes and
//!   options never panic; they either fail validation with a typed error, or validate, and then
//!   every launch the library would make passes the same checks `Gpu::launch` makes (kernel in
//!   the PTX, parameter size, block size against the launch bounds, grid and shared memory
//!   against an H100's limits), checked without a GPU; small valid problems also run the CPU
//!   reference (and, on a GPU, the kernels against it: `props_gpu_*`, [`props_gpu`]; the GLA
//!   backward's property also runs in the CPU emulator, `props_gla_backward_emulated`).
//! - `limits_*` ([`limits`]): element counts above 2^31 (accepted, the kernels use 64-bit
//!   offsets, or a typed error), the largest head dimension and sequence lengths; no allocation.
//! - `large_offsets_*` ([`large_offsets`]): the kernels on data placed past 2^31 elements.
//! - `nonfinite_*` ([`nonfinite`]): NaN and Inf inputs, behaviour as documented in README.md
//!   ("NaN and Inf"); the GLA and mHC kernels' behaviour is tested in their suites
//!   (`gla/nonfinite/*`, `mhc/nonfinite/*`), where the emulator runs the same checks without a
//!   GPU.
//! - `negative_*` ([`negative`]): the negative controls (`gpu-kernels/src/negative.rs`): the
//!   checks must catch them. The sanitizer passes of `bundle/run.sh` leave these tests out;
//!   `bundle/reliability.sh` runs them under racecheck and expects hazards.
//! - `concurrent_*` ([`concurrent`]): all four families on several streams at once, bitwise
//!   equal to sequential runs.
//! - `soak_*` ([`soak`]): 10,000 random valid and invalid attention calls from 4 threads on 4
//!   streams, every result against the reference, device memory back where it started.

mod concurrent;
mod gla_backward;
mod large_offsets;
mod limits;
mod negative;
mod nonfinite;
mod props;
mod props_gpu;
mod soak;

use kernel_tests::{Needs, Suite};
use kernels::attention::{self, AttentionProblem, View};
use kernels::memory::{download, poisoned, upload};
use kernels::{Gpu, bf16};

/// Dynamic shared memory per block an H100/H200 allows (227 KiB): launches are checked against
/// it without a GPU.
const HOPPER_MAX_SMEM: usize = 227 * 1024;

fn main() {
    let mut s = Suite::new();
    s.cpu(
        "props_attention_validate_or_typed_error",
        props::attention_validate_or_typed_error,
    );
    s.cpu("props_attention_view_bounds", props::attention_view_bounds);
    s.cpu(
        "props_attention_backward_plan_or_typed_error",
        props::attention_backward_plan_or_typed_error,
    );
    s.cpu(
        "props_semicrf_validate_or_typed_error",
        props::semicrf_validate_or_typed_error,
    );
    s.cpu(
        "props_gla_validate_or_typed_error",
        props::gla_validate_or_typed_error,
    );
    s.cpu(
        "props_mhc_validate_or_typed_error",
        props::mhc_validate_or_typed_error,
    );
    s.gpu(
        "props_gpu_attention_small",
        Needs::Gpu,
        props_gpu::attention_small,
    );
    s.gpu(
        "props_gpu_semicrf_small",
        Needs::Gpu,
        props_gpu::semicrf_small,
    );
    s.gpu(
        "props_gpu_attention_backward_small",
        Needs::Gpu,
        props_gpu::attention_backward_small,
    );
    s.gpu("props_gpu_gla_small", Needs::Gpu, props_gpu::gla_small);
    s.gpu(
        "props_gpu_gla_backward_small",
        Needs::Gpu,
        props_gpu::gla_backward_small,
    );
    s.cpu("props_gla_backward_emulated", props::gla_backward_emulated);
    s.gpu("props_gpu_mhc_small", Needs::Gpu, props_gpu::mhc_small);
    s.cpu("limits_attention", limits::attention);
    s.cpu("limits_semicrf", limits::semicrf);
    s.cpu("limits_gla", limits::gla);
    s.cpu("limits_mhc", limits::mhc);
    s.cpu("nonfinite_semicrf_rejected", nonfinite::semicrf_rejected);
    s.gpu(
        "nonfinite_semicrf_gpu_rejected",
        Needs::Gpu,
        nonfinite::semicrf_gpu_rejected,
    );
    s.cpu(
        "nonfinite_attention_reference",
        nonfinite::attention_reference,
    );
    s.gpu(
        "nonfinite_attention_gpu",
        Needs::Gpu,
        nonfinite::attention_gpu,
    );
    s.gpu(
        "large_offsets_attention_gpu",
        Needs::Gpu,
        large_offsets::attention_gpu,
    );
    s.gpu("large_offsets_gla_gpu", Needs::Gpu, large_offsets::gla_gpu);
    s.cpu("nonfinite_gla_reference", nonfinite::gla_reference);
    s.cpu(
        "negative_emulated_reduce_barrier_hazard",
        negative::emulated_reduce_barrier_hazard,
    );
    s.gpu(
        "negative_reduce_no_barrier_wrong",
        Needs::Gpu,
        negative::reduce_no_barrier_wrong,
    );
    s.gpu(
        "negative_reduce_no_barrier_racecheck_target",
        Needs::Gpu,
        negative::reduce_no_barrier_racecheck_target,
    );
    s.cpu(
        "negative_emulated_attention_bwd_ds_barrier_hazard",
        negative::emulated_attention_bwd_ds_barrier_hazard,
    );
    s.gpu(
        "negative_attention_bwd_no_ds_barrier_racecheck_target",
        Needs::Gpu,
        negative::attention_bwd_no_ds_barrier_racecheck_target,
    );
    s.gpu(
        "negative_attention_bwd_hopper_early_empty_racecheck_target",
        Needs::Hopper,
        negative::attention_bwd_hopper_early_empty_racecheck_target,
    );
    s.cpu(
        "negative_emulated_gla_bwd_carry_barrier_hazard",
        negative::emulated_gla_bwd_carry_barrier_hazard,
    );
    s.gpu(
        "negative_gla_bwd_no_carry_barrier_racecheck_target",
        Needs::Gpu,
        negative::gla_bwd_no_carry_barrier_racecheck_target,
    );
    s.gpu(
        "negative_semicrf_aliased_wrong",
        Needs::Gpu,
        negative::semicrf_aliased_wrong,
    );
    s.gpu("soak_threads_streams", Needs::Gpu, soak::threads_streams);
    s.gpu(
        "concurrent_four_families_bitwise",
        Needs::Gpu,
        concurrent::four_families_bitwise,
    );
    s.run()
}

/// Contiguous attention on `stream`: O and LSE downloaded.
fn run_attention(
    g: &Gpu,
    stream: &kernels::Stream,
    p: &AttentionProblem,
    q: &[bf16],
    k: &[bf16],
    v: &[bf16],
) -> kernels::Result<(Vec<bf16>, Vec<f32>)> {
    let (dq, dk, dv) = (upload(q)?, upload(k)?, upload(v)?);
    let o_buf = poisoned::<bf16>(q.len())?;
    let mut lse = poisoned::<f32>(p.lse_len())?;
    {
        let mut o = View::contiguous(&o_buf, p.q_shape());
        attention::forward(
            g,
            stream,
            p,
            &View::contiguous(&dq, p.q_shape()),
            &View::contiguous(&dk, p.kv_shape()),
            &View::contiguous(&dv, p.kv_shape()),
            &mut o,
            &mut lse,
        )?;
    }
    g.sync(stream, "attention")?;
    Ok((download(&o_buf)?, download(&lse)?))
}
