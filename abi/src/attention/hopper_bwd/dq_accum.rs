//! The tiled dQ accumulator of the Hopper dK/dV/dQ kernels: its layout (dense and packed), the
//! order of the vectors within a tile, the deterministic mode's counters and the dK/dV grid's
//! interleaving of its (key/value head, sequence) pairs.

use super::HOPPER_DQ_TILE_ROWS;
use crate::WARPGROUP_SIZE;

/// Rows per (sequence, head) of the tiled dQ accumulator: `seq_q` rounded up to whole tiles.
#[inline]
pub const fn dq_accum_rows(seq_q: u32) -> u32 {
    seq_q.div_ceil(HOPPER_DQ_TILE_ROWS) * HOPPER_DQ_TILE_ROWS
}

/// f32 elements of the tiled dQ accumulator.
#[inline]
pub const fn dq_accum_len(batch: usize, heads_q: usize, seq_q: usize, d: usize) -> usize {
    batch * heads_q * dq_accum_rows(seq_q as u32) as usize * d
}

/// The first row of query head `h` of sequence `b` in the tiled dQ accumulator of a dense
/// batch: each (sequence, head) owns [`dq_accum_rows`] rows.
#[inline]
pub const fn dq_accum_row0(b: u32, h: u32, heads_q: u32, seq_q: u32) -> u64 {
    (b as u64 * heads_q as u64 + h as u64) * dq_accum_rows(seq_q) as u64
}

/// Tiles per query head of the tiled dQ accumulator over packed sequences: `floor(total_q /
/// HOPPER_DQ_TILE_ROWS) + batch`, enough for every sequence to start on a tile of its own
/// ([`dq_accum_varlen_row0`]).
#[inline]
pub const fn dq_accum_varlen_tiles(total_q: u32, batch: u32) -> u32 {
    total_q / HOPPER_DQ_TILE_ROWS + batch
}

/// f32 elements of the tiled dQ accumulator over packed sequences.
#[inline]
pub const fn dq_accum_varlen_len(heads_q: usize, total_q: usize, batch: usize, d: usize) -> usize {
    heads_q
        * dq_accum_varlen_tiles(total_q as u32, batch as u32) as usize
        * HOPPER_DQ_TILE_ROWS as usize
        * d
}

/// The first row of query head `h` of sequence `b` (first query row `q0`) in the tiled dQ
/// accumulator over packed sequences: head `h` owns [`dq_accum_varlen_tiles`] tiles, and
/// sequence `b` those from `floor(q0 / HOPPER_DQ_TILE_ROWS) + b`. A sequence of `n` rows
/// from `q0` needs `ceil(n / HOPPER_DQ_TILE_ROWS)` tiles, at most `floor((q0 + n) /
/// HOPPER_DQ_TILE_ROWS) - floor(q0 / HOPPER_DQ_TILE_ROWS) + 1`: the tiles up to the next
/// sequence's first (and for the last, up to the head's end), whenever the sequences' rows
/// are in order inside `0 ..= total_q`.
#[inline]
pub const fn dq_accum_varlen_row0(q0: u32, b: u32, h: u32, total_q: u32, batch: u32) -> u64 {
    (h as u64 * dq_accum_varlen_tiles(total_q, batch) as u64
        + (q0 / HOPPER_DQ_TILE_ROWS + b) as u64)
        * HOPPER_DQ_TILE_ROWS as u64
}

/// Element offset of the tile of query rows `m0 .. m0 + HOPPER_DQ_TILE_ROWS` (`m0` a multiple
/// of the tile rows) of query head `h` of sequence `b` in the tiled dQ accumulator: each
/// (sequence, head) owns [`dq_accum_rows`] rows, each tile `HOPPER_DQ_TILE_ROWS D` contiguous
/// elements whose order is [`dq_tile_vector`]'s (the consumers' registers, so that their
/// shared-memory copy of a tile is written without bank conflicts and added with one bulk
/// reduce per consumer).
#[inline]
pub const fn dq_accum_tile_base(b: u32, h: u32, heads_q: u32, seq_q: u32, m0: u32, d: u32) -> u64 {
    (dq_accum_row0(b, h, heads_q, seq_q) + m0 as u64) * d as u64
}

/// Element offset within a dQ tile of the 4-element vector `v` (`0 .. D / 16`) of thread `tid`
/// (`0 .. 128`) of half `c`: its accumulator registers `4 v .. 4 v + 4` of an `m64n{D/2}`
/// product over the tile's columns `c D / 2 ..` (rows and columns as in
/// [`dq_tile_position`]). Half `c` is `HOPPER_DQ_TILE_ROWS D / 2` contiguous elements. An
/// `m64n{D}` product over the whole tile has the same order: its vector `v` is vector `v % (D /
/// 16)` of half `v / (D / 16)`.
#[inline]
pub const fn dq_tile_vector(d: u32, c: u32, v: u32, tid: u32) -> u32 {
    c * HOPPER_DQ_TILE_ROWS * d / 2 + (v * WARPGROUP_SIZE + tid) * 4
}

/// u32 counters of the deterministic mode's order ([`dq_order_index`]): one per tile of the
/// tiled dQ accumulator.
#[inline]
pub const fn dq_order_len(batch: usize, heads_q: usize, seq_q: usize) -> usize {
    batch * heads_q * (dq_accum_rows(seq_q as u32) / HOPPER_DQ_TILE_ROWS) as usize
}

/// u32 counters of the deterministic mode's order over packed sequences: one per tile of the
/// packed tiled accumulator ([`dq_accum_varlen_len`]); the counter of the tile from
/// accumulator row `r` is `r / HOPPER_DQ_TILE_ROWS`.
#[inline]
pub const fn dq_order_varlen_len(heads_q: usize, total_q: usize, batch: usize) -> usize {
    heads_q * dq_accum_varlen_tiles(total_q as u32, batch as u32) as usize
}

/// Index of the counter of the accumulator tile of query rows `m0 .. m0 +
/// HOPPER_DQ_TILE_ROWS` of query head `h` of sequence `b` (tiles in the accumulator's order).
/// In deterministic mode it holds `nb - n` once key block `n` (of `nb`, descending from `nb -
/// 1`) has added its share of the tile and the additions are performed; the preprocess
/// zeroes it.
#[inline]
pub const fn dq_order_index(b: u32, h: u32, heads_q: u32, seq_q: u32, m0: u32) -> u64 {
    dq_accum_tile_base(b, h, heads_q, seq_q, m0, 1) / HOPPER_DQ_TILE_ROWS as u64
}

/// The (key/value head, sequence) pairs the deterministic mode interleaves in the dK/dV grid's
/// launch order ([`dkdv_block`]) for `key_blocks` blocks per pair, `pairs` pairs and
/// `multiprocessors` SMs: enough pairs that the blocks launched together (one per SM) span
/// about twice the SMs' worth of each pair's chain, at most `pairs`, at least 1.
///
/// Why: in deterministic mode key block `n` adds into a dQ tile only after key block `n + 1`
/// has, so the blocks of a pair that start together go through their common tiles one after
/// the other, each later by the time its predecessor's additions take. Launched pair after
/// pair, the blocks that replace a finished wave's start together again, pairs at a time,
/// and pay that staircase at every wave; interleaved, each pair gets a new block as its
/// previous one frees an SM, and the chain's stagger carries over from wave to wave.
#[inline]
pub const fn dq_order_group(key_blocks: u32, pairs: u32, multiprocessors: u32) -> u32 {
    // The kernels compute launch indices in u32 (`dkdv_block`): a larger grid keeps its order.
    if key_blocks as u64 * pairs as u64 > u32::MAX as u64 {
        return 1;
    }
    let g = (2 * multiprocessors).div_ceil(if key_blocks == 0 { 1 } else { key_blocks });
    let g = if g > pairs { pairs } else { g };
    if g == 0 { 1 } else { g }
}

/// The (block `x`, pair `f`) that the block at grid position (`x`, pair `f`) takes, where the
/// grid has `key_blocks` blocks per pair, `pairs` (key/value head, sequence) pairs (`f = head
/// + heads_kv sequence`), and interleaves `group` pairs ([`dq_order_group`]; 1: the grid's own
/// indices). The launch index `x + key_blocks f` is split into groups of `group` pairs (the
/// last one smaller): the group's blocks take block 0 of each of its pairs, then block 1 of
/// each, and so on. A bijection of the grid; within a pair, block `x` is launched after block
/// `x - 1`, so the deterministic order still only waits for blocks launched before. With
/// `group > 1` the grid has at most `u32::MAX` blocks (u32 arithmetic, as the kernels').
#[inline]
pub const fn dkdv_block(x: u32, f: u32, key_blocks: u32, pairs: u32, group: u32) -> (u32, u32) {
    if group <= 1 {
        return (x, f);
    }
    let i = x + key_blocks * f;
    let span = group * key_blocks;
    let (g, within) = (i / span, i % span);
    let first = g * group;
    let left = pairs - first;
    let width = if left < group { left } else { group };
    (within / width, first + within % width)
}

/// The tile row and column of the first element of the vector at element offset `4 f` of a dQ
/// tile (the inverse of [`dq_tile_vector`]): its four elements are (row, col), (row, col + 1),
/// (row + 8, col), (row + 8, col + 1) (the `wgmma` accumulator layout of thread `tid`, warp `w
/// = tid / 32`, lane `l`: row `16 w + l / 4`, column `c D / 2 + 8 v + 2 (l % 4)`).
#[inline]
pub const fn dq_tile_position(d: u32, f: u32) -> (u32, u32) {
    let per_consumer = HOPPER_DQ_TILE_ROWS * d / 2 / 4;
    let (c, within) = (f / per_consumer, f % per_consumer);
    let (v, tid) = (within / WARPGROUP_SIZE, within % WARPGROUP_SIZE);
    let (w, lane) = (tid / 32, tid % 32);
    (16 * w + lane / 4, c * d / 2 + 8 * v + 2 * (lane % 4))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every interleaving is a bijection of the grid in which each pair's block `x` is
    /// launched after its block `x - 1`.
    #[test]
    fn dkdv_block_is_a_permutation_in_chain_order() {
        for key_blocks in 1..=7u32 {
            for pairs in 1..=11u32 {
                for group in 0..=13u32 {
                    let n = (key_blocks * pairs) as usize;
                    // launched[f][x]: the launch index of the block taking (x, f).
                    let mut launched = [[usize::MAX; 7]; 11];
                    for i in 0..n {
                        let (x, f) = (i as u32 % key_blocks, i as u32 / key_blocks);
                        let (bx, bf) = dkdv_block(x, f, key_blocks, pairs, group);
                        assert!(
                            bx < key_blocks && bf < pairs,
                            "{key_blocks} {pairs} {group}"
                        );
                        let slot = &mut launched[bf as usize][bx as usize];
                        assert_eq!(*slot, usize::MAX, "taken twice");
                        *slot = i;
                    }
                    for per_pair in &launched[..pairs as usize] {
                        let per_pair = &per_pair[..key_blocks as usize];
                        assert!(per_pair.windows(2).all(|w| w[0] < w[1]));
                    }
                }
            }
        }
    }

    #[test]
    fn dq_order_group_spans_twice_the_sms() {
        assert_eq!(dq_order_group(32, 128, 132), 9);
        assert_eq!(dq_order_group(32, 4, 132), 4);
        assert_eq!(dq_order_group(512, 16, 132), 1);
        assert_eq!(dq_order_group(0, 0, 132), 1);
        assert_eq!(dq_order_group(1 << 16, 1 << 16, 132), 1);
        assert_eq!(dkdv_block(5, 3, 32, 128, 1), (5, 3));
    }
}
