//! `attention_bwd_hopper_dq_convert_{bf16,f16}_d{64,128}`: dQ from the tiled f32 accumulator
//! that the dK/dV/dQ kernel added into (`dQ = scale accumulator`, in the element type, into
//! the strided dQ view).
//!
//! # Thread mapping
//! One block per tile (`HOPPER_DQ_TILE_ROWS` query rows of one query head of one sequence),
//! [`HOPPER_DQ_CONVERT_THREADS`] threads: thread `tid` reads the tile's 16-byte vectors `tid,
//! tid + 128, ..` (consecutive across a warp), each holding two column pairs of two rows
//! ([`dq_tile_position`]), and writes the pairs of rows below `seq_q` and columns below the
//! tensors' head dimension (a padded plan's tiles are wider). No shared memory, no barrier.

use super::super::elem::Elem;
use crate::arch::{global, index};
use kernel_abi::attention::backward::AttentionBwdParams;
use kernel_abi::attention::hopper_bwd::{
    HOPPER_DQ_CONVERT_THREADS, HOPPER_DQ_TILE_ROWS, dq_accum_tile_base, dq_tile_position,
};

/// The conversion of one tile; see the module documentation.
///
/// # Safety
/// Grid `(ceil(seq_q / HOPPER_DQ_TILE_ROWS), heads_q, batch)`, [`HOPPER_DQ_CONVERT_THREADS`]
/// threads, after the dK/dV/dQ kernel on the same parameters: the tiled accumulator of
/// `dq_accum_len(batch, heads_q, seq_q, D)` elements and dQ as documented on
/// [`AttentionBwdParams`] (validated by the host).
#[inline(always)]
pub(super) unsafe fn convert<E: Elem, const D: u32>(p: &AttentionBwdParams) {
    let vectors = HOPPER_DQ_TILE_ROWS * D / 4;
    const { assert!((HOPPER_DQ_TILE_ROWS * D / 4).is_multiple_of(HOPPER_DQ_CONVERT_THREADS)) };
    let tid = index::thread_idx_x();
    let (m0, h, b) = (
        index::block_idx_x() * HOPPER_DQ_TILE_ROWS,
        index::block_idx_y(),
        index::block_idx_z(),
    );
    let tile = p
        .dq_accum
        .wrapping_add(dq_accum_tile_base(b, h, p.heads_q, p.seq_q, m0, D) as usize);
    let st = p.dq_strides;
    let dq =
        p.dq.wrapping_add((b as u64 * st[0] + h as u64 * st[2]) as usize);
    for k in 0..vectors / HOPPER_DQ_CONVERT_THREADS {
        let f = tid + k * HOPPER_DQ_CONVERT_THREADS;
        // SAFETY: vector f < vectors of this block's tile, inside the accumulator (its length
        // covers every tile of the grid), 16-byte aligned (aligned base, D a multiple of 4).
        let v = unsafe { global::load_nc_v4(tile.wrapping_add(4 * f as usize) as *const u32) };
        let (row, col) = dq_tile_position(D, f);
        for hi in 0..2u32 {
            let i = m0 + row + 8 * hi;
            // Columns past the tensors' head dimension (a padded plan) are not stored.
            if i < p.seq_q && col < p.head_dim {
                let x = |w: u32| f32::from_bits(w) * p.scale;
                let pair = E::pack(x(v[2 * hi as usize]), x(v[2 * hi as usize + 1]));
                let dst = dq.wrapping_add((i as u64 * st[1]) as usize + col as usize);
                // SAFETY: row i < seq_q, columns col, col + 1 < head_dim (even): inside dQ;
                // 4-byte aligned (16-byte aligned rows, even column); each element has one
                // writer.
                unsafe { *(dst as *mut u32) = pair };
            }
        }
    }
}
