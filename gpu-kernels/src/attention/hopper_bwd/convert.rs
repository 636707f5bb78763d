//! `attention_bwd_hopper_dq_convert_{bf16,f16}_d{64,128,256}` (and `_varlen_`, over packed
//! sequences): dQ from the tiled f32 accumulator that the dK/dV/dQ kernel added into (`dQ =
//! scale accumulator`, in the element type, into the strided dQ view).
//!
//! # Thread mapping
//! One block per tile (`HOPPER_DQ_TILE_ROWS` query rows of one query head of one sequence),
//! [`HOPPER_DQ_CONVERT_THREADS`] threads: thread `tid` reads the tile's 16-byte vectors `tid,
//! tid + 128, ..` (consecutive across a warp), each holding two column pairs of two rows
//! ([`dq_tile_position`]), and writes the pairs of rows below `seq_q` and columns below the
//! tensors' head dimension (a padded plan's tiles are wider). A block of a packed sequence
//! past its rows (the grid is sized for the longest) returns at once. No shared memory, no
//! barrier.

use super::super::backward::layout::BwdLayout;
use super::super::elem::Elem;
use crate::arch::{global, index};
use kernel_abi::attention::hopper_bwd::{
    HOPPER_DQ_CONVERT_THREADS, HOPPER_DQ_TILE_ROWS, dq_tile_position,
};

/// The conversion of one tile; see the module documentation.
///
/// # Safety
/// Grid `(ceil(seq_q / HOPPER_DQ_TILE_ROWS), heads_q, batch)` (`seq_q` the longest sequence's
/// for a packed layout), [`HOPPER_DQ_CONVERT_THREADS`] threads, after the dK/dV/dQ kernel on
/// the same parameters: the tiled accumulator (`dq_accum_len` or `dq_accum_varlen_len`
/// elements) and dQ as documented on the parameters' type (validated by the host).
#[inline(always)]
pub(super) unsafe fn convert<L: BwdLayout, E: Elem, const D: u32>(pp: &L::Params) {
    let p = L::base(pp);
    let vectors = HOPPER_DQ_TILE_ROWS * D / 4;
    const { assert!((HOPPER_DQ_TILE_ROWS * D / 4).is_multiple_of(HOPPER_DQ_CONVERT_THREADS)) };
    let tid = index::thread_idx_x();
    let (m0, h) = (
        index::block_idx_x() * HOPPER_DQ_TILE_ROWS,
        index::block_idx_y(),
    );
    // SAFETY: the grid's z is the batch (the caller's contract).
    let seq = unsafe { L::locate(pp, index::block_idx_z()) };
    // The rows the dK/dV/dQ kernel covers: up to the longest length (packed sequences).
    let seq_q = seq.seq_q(pp).min(p.seq_q);
    if L::MAY_BE_PAST_END && m0 >= seq_q {
        return;
    }
    let tile = p
        .dq_accum
        .wrapping_add(((seq.accum_row0(pp, h) + m0 as u64) * D as u64) as usize);
    let st = p.dq_strides;
    let dq = p.dq.wrapping_add(seq.q_head(&st, h) as usize);
    for k in 0..vectors / HOPPER_DQ_CONVERT_THREADS {
        let f = tid + k * HOPPER_DQ_CONVERT_THREADS;
        // SAFETY: vector f < vectors of this block's tile, inside the accumulator (its length
        // covers every tile of the grid), 16-byte aligned (aligned base, D a multiple of 4).
        let v = unsafe { global::load_nc_v4(tile.wrapping_add(4 * f as usize) as *const u32) };
        let (row, col) = dq_tile_position(D, f);
        for hi in 0..2u32 {
            let i = m0 + row + 8 * hi;
            // Columns past the tensors' head dimension (a padded plan) are not stored.
            if i < seq_q && col < p.head_dim {
                let x = |w: u32| f32::from_bits(w) * p.scale;
                let pair = E::pack(x(v[2 * hi as usize]), x(v[2 * hi as usize + 1]));
                let dst = dq.wrapping_add((i as u64 * st[1]) as usize + col as usize);
                // SAFETY: row i < seq_q of the sequence, columns col, col + 1 < head_dim (even): inside dQ;
                // 4-byte aligned (16-byte aligned rows, even column); each element has one
                // writer.
                unsafe { *(dst as *mut u32) = pair };
            }
        }
    }
}
