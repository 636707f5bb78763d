//! Launcher of the block-reduction negative control (`gpu-kernels/src/negative.rs`): the smoke
//! reduction without its barrier, for the reliability tests only. Its result is wrong by design;
//! what the tests check is that the reference check and racecheck notice.

use crate::smoke::block_reduce_launch_of;
use kernel_abi::smoke::NEGATIVE_BLOCK_REDUCE_NO_BARRIER;
use kernels::{DeviceBuffer, Gpu, Result, Stream};

/// [`crate::smoke::block_reduce_launch`] with `negative_block_reduce_no_barrier` (no barrier
/// between the warps' shared-memory stores and warp 0's loads).
pub fn block_reduce_no_barrier_launch(
    gpu: &Gpu,
    stream: &Stream,
    input: &DeviceBuffer<f32>,
    partial: &mut DeviceBuffer<f32>,
) -> Result<()> {
    block_reduce_launch_of(
        gpu,
        stream,
        &NEGATIVE_BLOCK_REDUCE_NO_BARRIER,
        input,
        partial,
    )
}
