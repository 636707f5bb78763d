//! `gla_bwd_dqkg_tc`: dq, dk and dg of one segment, chunkwise, the matrix products on
//! `mma.sync` (the semantics: `kernel_abi::gla::backward`).
//!
//! # Algorithm
//! The segment is walked forward one [`G_BLOCK`]-token block at a time, the state `S` (from the
//! segment's initial state) in registers. Per block, with chunks of [`CHUNK`] tokens, `b_t` the
//! inclusive cumulative log-decays from the chunk start, `B` the chunk's total and the block's
//! end gradient `G` (the reverse pass's stored gradient of this block):
//! 1. element-wise: `q_dec = scale q exp(b)`, `k_dec = k exp(B - b)` and `exp(B)`, the
//!    operands as pairs of bf16 tiles (high part and the rest, 16 bits together);
//! 2. tensor cores: `dA = scale dO v^T` of each chunk; the chunks last to first from `G`:
//!    `G v^T` (dk's inter part), `G <- exp(B) G + q_dec^T dO`; the chunks first to last from
//!    `S`: `S dO^T` (dq's inter part), `S <- exp(B) S + k_dec^T v`;
//! 3. CUDA cores, a thread per (chunk, key channel): the intra-chunk sums
//!    `dq'_t = sum_{s < t} dA[t][s] exp(b_t - b_s) k_s` and
//!    `dk'_s = sum_{t > s} dA[t][s] exp(b_t - b_s) q_t`, the decay of each pair a product of the
//!    per-token decays `a_u <= 1` (no exponent grows, no difference of cumulative sums); then
//!    `dq = dq' + dA[t][t] k_t + scale exp(b_t) (S dO^T)_t`,
//!    `dk = dk' + dA[t][t] q_t + exp(B - b_t) (G v^T)_t`, and the chunk's reverse cumulative
//!    sums of `q (dq - dA[t][t] k) - k (dk - dA[t][t] q)` into dg. The diagonal terms are left
//!    out of dg: they cancel exactly, and left in they would make dg's error relative to them
//!    rather than to dg (every other term carries a decay). The segment's last token also
//!    leaves out its `k (G v^T)` (undecayed), and the end term is `rowsum(a_E S_{E-1} * G_E)`
//!    (the state update of the last chunk without its last token's own `k^T v`).
//!
//! Precision: the products with `S` and `G` take them as bf16 pairs too, and the updates take
//! the decayed operands' pairs: dg is a sum of differences of these products over the whole
//! segment, and with single bf16 operands its error reached the tests' 1e-2 (relative L2;
//! with the pairs 1e-5 within a block, and what the reverse pass's block gradients carry
//! across blocks). Twice the `mma` of single operands; dA takes the exact bf16 inputs.
//!
//! After the walk, dg gets, from the segment's last block back, the sums of every later chunk
//! and the end term added (zero where `g < G_FLOOR`).
//!
//! # Tiling and thread mapping
//! [`tc_threads`](kernel_abi::gla::backward::tc_threads) threads: warp `w` owns key channels
//! `16 w ..+ 16` of `S` and of `G`, as `m16` accumulator rows over every value column
//! (`DV / 8` tiles of `[f32; 4]` each): `dq` and `dk`'s inter parts contract over the value
//! columns inside the warp. Warps `0 .. 3` also compute `dA` of chunk `w`. The element-wise
//! and CUDA-core phases give each thread the same number of (chunk, channel) items.
//!
//! # Barrier protocol (all `bar.sync 0`, reached uniformly by every thread of the block)
//! Per block of the walk:
//! - barrier A: every thread finished the previous block (its reads of every tile); then all
//!   threads issue the `cp.async` copies of the raw q, k, g rows and wait for their own (and
//!   for the block's v and dO rows, issued after the previous block's barrier D, or before the
//!   walk for the first block);
//! - barrier B publishes the raw rows; the element-wise phase writes `q_dec`, `k_dec`,
//!   `chunk_decay` (one writer per element);
//! - barrier C publishes them; the matrix phase writes `d_a` (warps 0 .. 3, one chunk each),
//!   `dq_inter`, `dk_inter` (each warp its 16 channels) and, in the segment's last block,
//!   `through_end` (each warp its channels). `dk_inter` and `dq_inter` take the place of
//!   `q_dec` and `k_dec` (with their low parts): the matrix phase of warp `w` reads only the
//!   columns of its channels of those tiles, and it overwrites a chunk's rows of them (with
//!   the same channels' f32 values) after its last read of them, its lanes ordered by a
//!   `bar.warp.sync`;
//! - barrier D publishes them and says that the matrix phase's reads of the raw v and dO rows
//!   are done: every thread issues the copies of the next block's v and dO rows into them; the
//!   CUDA-core phase reads the published tiles and the raw q, k, g rows and writes global
//!   memory only (dq, dk and the per-chunk sums in dg of its own (token, channel) elements).
//!
//! Then the carry pass, per block from the last: barrier E (the block's sums in dg, written
//! by other threads, are visible; the previous iteration's readers of `carry` are done;
//! `carry` takes `chunk_decay`'s place, last read before the last block's barrier D),
//! thread `d < DK` writes the carry into each chunk of the block to `carry` (reading the sums at
//! the chunks' first tokens), barrier F publishes it, and every thread finishes its elements of
//! dg. Global memory is written only for this block's segment and head.
//!
//! `CARRY_BARRIER = false` is the negative control `negative_gla_bwd_no_carry_barrier`
//! (`crate::negative`), never launched by the library: without barrier F, a thread reads the
//! `carry` of a chunk (channel `d`) while thread `d` (warp `d / 32`) may not have written it
//! yet, a read-after-write race on shared memory between warps: the thread adds the stale word
//! (the previous block's carry, or `chunk_decay` in the segment's last block) to its dg.
//! Whether a launch shows it in dg depends on the order the warps run in (the readers' loads
//! may also be scheduled after their global loads): racecheck and the emulator report it on
//! every launch. dq and dk (stored before the carry pass), dv and the initial-state
//! gradients (the reverse pass) do not depend on them.

use super::super::baseline::tiles::load_tile;
use super::super::chunk::mma_bf16;
use crate::arch::smem::SmemValue;
use crate::arch::{convert, cp_async, index, ldmatrix, math, smem, sync, warp};
use kernel_abi::gla::backward::{CHUNKS_PER_G_BLOCK, DqkgTcParams, G_BLOCK, grad_slot, tc_layout};
use kernel_abi::gla::{CHUNK, G_FLOOR, GlaConfig, SEG_FIRST, Segment};

/// Tokens of a chunk, as an array length.
const C: usize = CHUNK as usize;

/// The A fragment (`m16` = the warp's 16 key channels, `k16` = value columns `16 kk ..`) of a
/// state held as accumulator tiles, as a bf16 pair `(hi, lo)` with `hi + lo` the f32 value to
/// 16 bits (the product's error relative to each element, not to the fragment's largest).
#[inline(always)]
fn state_a<const NT: usize>(st: &[[f32; 4]; NT], kk: usize) -> ([u32; 4], [u32; 4]) {
    let (x, y) = (&st[2 * kk], &st[2 * kk + 1]);
    let v = [x[0], x[1], x[2], x[3], y[0], y[1], y[2], y[3]];
    let mut hi = [0u32; 4];
    let mut lo = [0u32; 4];
    for i in 0..4 {
        let h = convert::pack_bf16x2(v[2 * i], v[2 * i + 1]);
        let (h0, h1) = convert::unpack_bf16x2(h);
        hi[i] = h;
        lo[i] = convert::pack_bf16x2(v[2 * i] - h0, v[2 * i + 1] - h1);
    }
    (hi, lo)
}

/// Byte offset, from the operand pair's tiles `hi` and `lo`, of channel `d` of token row `t`
/// of an f32 tile stored over them (the matrix phase's outputs, `dq_inter` over `k_dec` and
/// `k_dec_lo`, `dk_inter` over `q_dec` and `q_dec_lo`): the 32 bytes of row `t` that hold the
/// 16 channels of `d`'s warp in a bf16 tile hold 8 f32 channels, the first 8 in `hi`, the
/// others in `lo`.
#[inline(always)]
fn inter_at<const DK: u32>(hi: u32, lo: u32, t: u32, d: u32) -> u32 {
    let rbk = const { GlaConfig::row_bytes(DK) };
    let w = d / 16;
    (if d % 16 < 8 { hi } else { lo }) + t * rbk + 32 * w + 4 * (d % 8)
}

/// `out[d][t] = sum_e st[d][e] rows[t][e]` for the warp's 16 channels and the chunk's 16 token
/// rows at `rows` (bf16, `DV` wide, padded rows), as the accumulators of two `m16n8` tiles
/// (rows `d`, columns `t`); [`store_inter`] stores them.
///
/// # Safety
/// Whole warp, uniform control flow; `rows` published by a barrier.
#[inline(always)]
unsafe fn contract_rows<const DV: u32, const NT: usize>(
    lane: u32,
    st: &[[f32; 4]; NT],
    rows: u32,
) -> [[f32; 4]; 2] {
    let rbv = const { GlaConfig::row_bytes(DV) };
    let mut acc = [[0.0f32; 4]; 2];
    for kk in 0..NT / 2 {
        let (hi, lo) = state_a::<NT>(st, kk);
        // B[k = e][n = t] = rows[t][e]: rows t of the two n8 tiles, columns 16 kk ..+ 16.
        // SAFETY: published rows < 16, columns < DV (the caller's contract).
        unsafe {
            let b = ldmatrix::x4(
                rows + (lane % 8 + 8 * (lane / 16)) * rbv + (2 * kk as u32 + (lane / 8) % 2) * 16,
            );
            mma_bf16(&mut acc[0], lo, [b[0], b[1]]);
            mma_bf16(&mut acc[1], lo, [b[2], b[3]]);
            mma_bf16(&mut acc[0], hi, [b[0], b[1]]);
            mma_bf16(&mut acc[1], hi, [b[2], b[3]]);
        }
    }
    acc
}

/// Store [`contract_rows`]' result for the chunk whose first token row is `r0` over the bf16
/// operand pair `hi`, `lo` (see [`inter_at`]; `d0` the warp's first channel). The warp's lanes
/// first agree (`bar.warp.sync`) that every lane's reads of those rows of the pair are done.
///
/// # Safety
/// Whole warp, uniform control flow; no thread but this warp's reads or writes the warp's
/// channels of rows `r0 ..+ 16` of `hi` and `lo` until the next barrier.
#[inline(always)]
unsafe fn store_inter<const DK: u32>(
    lane: u32,
    acc: &[[f32; 4]; 2],
    hi: u32,
    lo: u32,
    r0: u32,
    d0: u32,
) {
    // SAFETY: every lane of the warp (the caller's contract).
    unsafe { sync::sync_warp(warp::FULL_MASK) };
    let (g, t) = (lane / 4, lane % 4);
    for (n, tile) in acc.iter().enumerate() {
        for (e, &x) in tile.iter().enumerate() {
            let d = d0 + g + 8 * (e as u32 / 2);
            let tok = r0 + 8 * n as u32 + 2 * t + e as u32 % 2;
            // SAFETY: tok < G_BLOCK rows, channel d of this warp: the warp's part of the
            // pair's rows (the caller's contract).
            unsafe { f32::store(inter_at::<DK>(hi, lo, tok, d), x) };
        }
    }
}

/// `st = diag(decay) st + a_rows^T b_rows` for the warp's 16 channels: `a_rows` the chunk's
/// 16 token rows of a bf16 `DK`-wide operand (columns = channels), `b_rows` of a `DV`-wide one,
/// `decay` the f32 decays of the chunk's channels.
///
/// # Safety
/// Whole warp, uniform control flow; every address published by a barrier; `d0` the warp's
/// first channel.
#[inline(always)]
unsafe fn update<const DK: u32, const DV: u32, const NT: usize>(
    lane: u32,
    d0: u32,
    st: &mut [[f32; 4]; NT],
    a_rows: u32,
    a_lo_rows: u32,
    b_rows: u32,
    decay: u32,
) {
    let (rbk, rbv) = (
        const { GlaConfig::row_bytes(DK) },
        const { GlaConfig::row_bytes(DV) },
    );
    let g = lane / 4;
    // SAFETY: published decays of channels d0 + g, d0 + g + 8 < DK.
    let (lo, hi) = unsafe {
        (
            f32::load(decay + 4 * (d0 + g)),
            f32::load(decay + 4 * (d0 + g + 8)),
        )
    };
    for tile in st.iter_mut() {
        tile[0] *= lo;
        tile[1] *= lo;
        tile[2] *= hi;
        tile[3] *= hi;
    }
    // A[m = d][k = t] = a_rows[t][d], transposed from the stored rows (and its low part).
    let at = (lane % 8 + 8 * (lane / 16)) * rbk + (d0 / 8 + (lane / 8) % 2) * 16;
    // SAFETY: published rows < 16, channels d0 ..+ 16 < DK.
    let (a, a_lo) = unsafe {
        (
            ldmatrix::x4_trans(a_rows + at),
            ldmatrix::x4_trans(a_lo_rows + at),
        )
    };
    for jj in 0..NT / 2 {
        // B[k = t][n = e] = b_rows[t][e].
        // SAFETY: published rows < 16, columns 16 jj ..+ 16 < DV.
        unsafe {
            let b =
                ldmatrix::x4_trans(b_rows + (lane % 16) * rbv + (2 * jj as u32 + lane / 16) * 16);
            mma_bf16(&mut st[2 * jj], a_lo, [b[0], b[1]]);
            mma_bf16(&mut st[2 * jj + 1], a_lo, [b[2], b[3]]);
            mma_bf16(&mut st[2 * jj], a, [b[0], b[1]]);
            mma_bf16(&mut st[2 * jj + 1], a, [b[2], b[3]]);
        }
    }
}

/// A block barrier of the protocol that a negative control leaves out.
pub(super) trait Barrier {
    /// `bar.sync 0`, or nothing.
    ///
    /// # Safety
    /// As for [`sync::sync_threads`].
    unsafe fn sync();
}

/// Barrier F of the protocol (`ON`), or nothing (the negative control). A call resolved per
/// instantiation rather than an `if` on the constant, so that the library's kernels compile
/// exactly as they would with the barrier written out.
pub(super) struct BarrierF<const ON: bool>;

impl Barrier for BarrierF<true> {
    #[inline(always)]
    unsafe fn sync() {
        // SAFETY: forwarded to the caller.
        unsafe { sync::sync_threads() }
    }
}

impl Barrier for BarrierF<false> {
    #[inline(always)]
    unsafe fn sync() {}
}

/// The body of `gla_bwd_dqkg_tc` for one head-dimension pair (`NT = DV / 8`, `ITEMS` (chunk,
/// channel) items of a block per thread; `CARRY_BARRIER` true but in the negative control, see
/// the module documentation).
///
/// # Safety
/// Launched as documented on [`DqkgTcParams`]; the segment table holds consecutive disjoint
/// segments; `seg_init` (segments that are not first) and `grad` were written by the launches
/// before (the segment's end gradient is its last block's slot of `grad`: `seg_end` and
/// `d_final_state` are not read). With `CARRY_BARRIER = false`, dg is undefined (a data race
/// on shared memory).
#[inline(always)]
pub(super) unsafe fn dqkg_tc<
    const DK: u32,
    const DV: u32,
    const THREADS: u32,
    const NT: usize,
    const ITEMS: u32,
    const CARRY_BARRIER: bool,
>(
    p: &DqkgTcParams,
) where
    BarrierF<CARRY_BARRIER>: Barrier,
{
    const {
        assert!(NT as u32 * 8 == DV && THREADS * ITEMS == CHUNKS_PER_G_BLOCK * DK);
        assert!(THREADS == DK * ROW_STEP && G_BLOCK == CHUNKS_PER_G_BLOCK * CHUNK);
        assert!(CHUNK.is_multiple_of(ROW_STEP));
    };
    let lay = const { tc_layout(DK, DV) };
    // The carry pass's row stride (`THREADS / DK`) and rows of a block per thread.
    const ROW_STEP: u32 = 2;
    const PER_THREAD: usize = (G_BLOCK / ROW_STEP) as usize;
    let (rbk, rbv) = (
        const { GlaConfig::row_bytes(DK) },
        const { GlaConfig::row_bytes(DV) },
    );
    let b = &p.base;
    let (slot, head) = (index::block_idx_x(), index::block_idx_y());
    // SAFETY: slot < gridDim.x = entries of the segment table.
    let seg: Segment = unsafe { *b.segments.add(slot as usize) };
    let len = seg.len;
    let blocks = len.div_ceil(G_BLOCK);
    if blocks == 0 {
        return;
    }
    let (tid, lane) = (index::thread_idx_x(), index::lane_id());
    let (g8, t4) = (lane / 4, lane % 4);
    let d0 = index::warp_id() * 16;
    let heads = b.heads as u64;
    let state_len = (DK * DV) as usize;
    let pair_head = (seg.seq as u64 * heads + head as u64) as usize * state_len;
    let slot_head = (slot as u64 * heads + head as u64) as usize * state_len;
    // Element (tile j, e) of the warp's accumulators in a `[DK, DV]` state.
    let acc_index = |j: usize, e: usize| {
        ((d0 + g8 + 8 * (e as u32 / 2)) * DV + 8 * j as u32 + 2 * t4 + e as u32 % 2) as usize
    };
    let grad_at = |blk: u32| {
        let s = grad_slot(seg.start, slot, blk) as u64;
        p.grad
            .wrapping_add((s * heads + head as u64) as usize * state_len)
    };
    // The element of channel `d` in a `[rows, heads, DK]` tensor at token row `t`.
    let at_qk = |t: u64, d: u32| ((t * heads + head as u64) * DK as u64 + d as u64) as usize;
    let base = smem::aligned_base();
    let floor2 = G_FLOOR * math::LOG2_E;
    let bf = |addr: u32| {
        // SAFETY: callers pass published bf16 elements of the raw tiles.
        convert::bf16_to_f32(unsafe { u16::load(addr) })
    };

    // The state at the segment's start.
    let mut st = [[0.0f32; 4]; NT];
    let init: *const f32 = if seg.flags & SEG_FIRST == 0 {
        b.seg_init.wrapping_add(slot_head)
    } else if b.has_init != 0 {
        b.init_state.wrapping_add(pair_head)
    } else {
        core::ptr::null()
    };
    if !init.is_null() {
        for (j, tile) in st.iter_mut().enumerate() {
            for (e, x) in tile.iter_mut().enumerate() {
                // SAFETY: the (segment or sequence, head) state slice has DK * DV elements
                // (host-checked sizes); acc_index < DK * DV.
                *x = unsafe { *init.add(acc_index(j, e)) };
            }
        }
    }
    let (sk, sv) = (heads * DK as u64, heads * DV as u64);
    let off = head as usize;
    let qk = |src: *const u16| src.wrapping_add(off * DK as usize);
    // The `cp.async` copies of the v and dO rows of block `blk` (issued a block ahead).
    let load_v_do = |blk: u32| {
        let first = blk * G_BLOCK;
        let (valid, row0) = ((len - first).min(G_BLOCK), seg.start as u64 + first as u64);
        let vo = |src: *const u16| src.wrapping_add(off * DV as usize);
        load_tile::<DV, G_BLOCK, THREADS>(base + lay.v, vo(b.v), row0 * sv, sv, valid);
        load_tile::<DV, G_BLOCK, THREADS>(base + lay.d_o, vo(b.d_o), row0 * sv, sv, valid);
        cp_async::commit_group();
    };
    load_v_do(0);

    for blk in 0..blocks {
        let first = blk * G_BLOCK;
        let valid = (len - first).min(G_BLOCK);
        let row0 = seg.start as u64 + first as u64;
        let last_block = blk == blocks - 1;
        // SAFETY: barrier A (uniform: `blocks` is block-uniform).
        unsafe { sync::sync_threads() };
        load_tile::<DK, G_BLOCK, THREADS>(base + lay.q, qk(b.q), row0 * sk, sk, valid);
        load_tile::<DK, G_BLOCK, THREADS>(base + lay.k, qk(b.k), row0 * sk, sk, valid);
        load_tile::<DK, G_BLOCK, THREADS>(base + lay.g, qk(b.g), row0 * sk, sk, valid);
        cp_async::commit_group();
        // This block's v and dO rows were issued before (with the previous block's CUDA-core
        // phase, or before the walk).
        cp_async::wait_all();
        // SAFETY: barrier B.
        unsafe { sync::sync_threads() };

        // Element-wise phase: the decayed operands and each chunk's total decay.
        for r in 0..ITEMS {
            let i = tid + r * THREADS;
            let (c, d) = (i / DK, i % DK);
            let r0 = c * CHUNK;
            let mut l = [0.0f32; C];
            for (t, x) in l.iter_mut().enumerate() {
                let at = base + lay.g + (r0 + t as u32) * rbk + 2 * d;
                *x = (bf(at) * math::LOG2_E).max(floor2);
            }
            let mut cum = 0.0f32;
            for (t, &x) in l.iter().enumerate() {
                cum += x;
                let row = (r0 + t as u32) * rbk + 2 * d;
                let q = bf(base + lay.q + row);
                let x = b.scale * q * math::exp2(cum);
                let hi = convert::f32_to_bf16(x);
                let lo = convert::f32_to_bf16(x - convert::bf16_to_f32(hi));
                // SAFETY: this item's element of q_dec and q_dec_lo (one writer).
                unsafe {
                    u16::store(base + lay.q_dec + row, hi);
                    u16::store(base + lay.q_dec_lo + row, lo);
                }
            }
            // SAFETY: this item's element of chunk_decay (one writer).
            unsafe { f32::store(base + lay.chunk_decay + 4 * (c * DK + d), math::exp2(cum)) };
            let mut suffix = 0.0f32;
            for t in (0..C).rev() {
                let row = (r0 + t as u32) * rbk + 2 * d;
                let own_end = last_block && first + r0 + t as u32 == len - 1;
                let k = bf(base + lay.k + row);
                let x = if own_end { 0.0 } else { k * math::exp2(suffix) };
                let hi = convert::f32_to_bf16(x);
                let lo = convert::f32_to_bf16(x - convert::bf16_to_f32(hi));
                // SAFETY: this item's element of k_dec and k_dec_lo (one writer).
                unsafe {
                    u16::store(base + lay.k_dec + row, hi);
                    u16::store(base + lay.k_dec_lo + row, lo);
                }
                suffix += l[t];
            }
        }
        // SAFETY: barrier C.
        unsafe { sync::sync_threads() };

        // Matrix phase.
        let warp_id = d0 / 16;
        if warp_id < CHUNKS_PER_G_BLOCK {
            // dA of chunk `warp_id`: A = dO rows (m = t, k = e), B[k = e][n = s] = v[s][e].
            let r0 = warp_id * CHUNK;
            let mut acc = [[0.0f32; 4]; 2];
            for kk in 0..DV / 16 {
                // SAFETY: whole warp (uniform per warp); published rows < 16 of the chunk.
                unsafe {
                    let a = ldmatrix::x4(
                        base + lay.d_o + (r0 + lane % 16) * rbv + (2 * kk + lane / 16) * 16,
                    );
                    let bv = ldmatrix::x4(
                        base + lay.v
                            + (r0 + lane % 8 + 8 * (lane / 16)) * rbv
                            + (2 * kk + (lane / 8) % 2) * 16,
                    );
                    mma_bf16(&mut acc[0], a, [bv[0], bv[1]]);
                    mma_bf16(&mut acc[1], a, [bv[2], bv[3]]);
                }
            }
            for (n, tile) in acc.iter().enumerate() {
                for (e, &x) in tile.iter().enumerate() {
                    let t = g8 + 8 * (e as u32 / 2);
                    let s = 8 * n as u32 + 2 * t4 + e as u32 % 2;
                    let at = base + lay.d_a + 4 * ((warp_id * CHUNK + t) * CHUNK + s);
                    // SAFETY: this warp's chunk of d_a, one writer per element.
                    unsafe { f32::store(at, b.scale * x) };
                }
            }
        }
        // The block's end gradient, then the chunks last to first.
        let gp = grad_at(blk);
        let mut gr = [[0.0f32; 4]; NT];
        for (j, tile) in gr.iter_mut().enumerate() {
            for (e, x) in tile.iter_mut().enumerate() {
                // SAFETY: this block's slot of grad (written by gla_bwd_dhdv), DK * DV elements.
                *x = unsafe { *gp.add(acc_index(j, e)) };
            }
        }
        for c in (0..CHUNKS_PER_G_BLOCK).rev() {
            let r0 = c * CHUNK;
            if r0 >= valid {
                continue;
            }
            // SAFETY: whole warp, uniform; published rows.
            let acc = unsafe { contract_rows::<DV, NT>(lane, &gr, base + lay.v + r0 * rbv) };
            if c > 0 {
                // SAFETY: whole warp, uniform; published tiles.
                unsafe {
                    update::<DK, DV, NT>(
                        lane,
                        d0,
                        &mut gr,
                        base + lay.q_dec + r0 * rbk,
                        base + lay.q_dec_lo + r0 * rbk,
                        base + lay.d_o + r0 * rbv,
                        base + lay.chunk_decay + 4 * c * DK,
                    )
                };
            }
            // dk_inter over the warp's channels of this chunk's q_dec rows, read last just
            // above (by this warp only).
            // SAFETY: whole warp, uniform; the warp's part of rows r0 ..+ 16.
            unsafe { store_inter::<DK>(lane, &acc, base + lay.q_dec, base + lay.q_dec_lo, r0, d0) };
        }
        // The chunks first to last from the state at the block's start.
        for c in 0..CHUNKS_PER_G_BLOCK {
            let r0 = c * CHUNK;
            if r0 >= valid {
                continue;
            }
            // SAFETY: whole warp, uniform; published rows.
            let acc = unsafe { contract_rows::<DV, NT>(lane, &st, base + lay.d_o + r0 * rbv) };
            // SAFETY: whole warp, uniform; published tiles.
            unsafe {
                update::<DK, DV, NT>(
                    lane,
                    d0,
                    &mut st,
                    base + lay.k_dec + r0 * rbk,
                    base + lay.k_dec_lo + r0 * rbk,
                    base + lay.v + r0 * rbv,
                    base + lay.chunk_decay + 4 * c * DK,
                )
            };
            // dq_inter over the warp's channels of this chunk's k_dec rows, read last just
            // above (by this warp only).
            // SAFETY: whole warp, uniform; the warp's part of rows r0 ..+ 16.
            unsafe { store_inter::<DK>(lane, &acc, base + lay.k_dec, base + lay.k_dec_lo, r0, d0) };
        }
        if last_block {
            // `st` is now `a_E S_{E-1}` (the last token's own `k^T v` left out of k_dec);
            // rowsum of it times the segment's end gradient (this block's slot).
            let mut te = [0.0f32; 2];
            for (j, tile) in st.iter().enumerate() {
                for (e, &x) in tile.iter().enumerate() {
                    // SAFETY: as for the block's gradient above.
                    te[e / 2] = math::fma(x, unsafe { *gp.add(acc_index(j, e)) }, te[e / 2]);
                }
            }
            for x in te.iter_mut() {
                // SAFETY: every lane of the warp (uniform); sums over the 4 lanes of a row.
                unsafe {
                    *x += warp::shfl_xor_f32(warp::FULL_MASK, *x, 1);
                    *x += warp::shfl_xor_f32(warp::FULL_MASK, *x, 2);
                }
            }
            if t4 == 0 {
                // SAFETY: this warp's channels of through_end, one writer each.
                unsafe {
                    f32::store(base + lay.through_end + 4 * (d0 + g8), te[0]);
                    f32::store(base + lay.through_end + 4 * (d0 + g8 + 8), te[1]);
                }
            }
        }
        // SAFETY: barrier D.
        unsafe { sync::sync_threads() };
        // The v and dO rows are read only by the matrix phase: the next block's copies overlap
        // the CUDA-core phase.
        if blk + 1 < blocks {
            load_v_do(blk + 1);
        }

        // CUDA-core phase: intra-chunk sums, dq, dk and the chunk's sums of dg.
        for r in 0..ITEMS {
            let i = tid + r * THREADS;
            let (c, d) = (i / DK, i % DK);
            let r0 = c * CHUNK;
            if r0 >= valid {
                continue;
            }
            let rows = (valid - r0).min(CHUNK);
            let mut a = [0.0f32; C];
            let mut q = [0.0f32; C];
            let mut k = [0.0f32; C];
            for t in 0..C {
                let row = (r0 + t as u32) * rbk + 2 * d;
                a[t] = math::exp2((bf(base + lay.g + row) * math::LOG2_E).max(floor2));
                q[t] = bf(base + lay.q + row);
                k[t] = bf(base + lay.k + row);
            }
            let d_a = |t: usize, s: usize| {
                // SAFETY: published dA of chunk c, t, s < 16.
                unsafe { f32::load(base + lay.d_a + 4 * ((r0 + t as u32) * CHUNK + s as u32)) }
            };
            let mut dq = [0.0f32; C];
            let mut dk = [0.0f32; C];
            for t in 1..C {
                let mut f = 1.0f32;
                for s in (0..t).rev() {
                    f *= a[s + 1];
                    let x = d_a(t, s) * f;
                    dq[t] = math::fma(x, k[s], dq[t]);
                    dk[s] = math::fma(x, q[t], dk[s]);
                }
            }
            let mut x = [0.0f32; C];
            let mut decay = 1.0f32;
            for t in 0..C {
                decay *= a[t];
                let at = inter_at::<DK>(base + lay.k_dec, base + lay.k_dec_lo, r0 + t as u32, d);
                // SAFETY: published dq_inter of this chunk's row t, channel d.
                let past = math::fma(b.scale * decay, unsafe { f32::load(at) }, dq[t]);
                x[t] = q[t] * past;
                dq[t] = math::fma(d_a(t, t), k[t], past);
            }
            let mut decay = 1.0f32;
            let mut sum = 0.0f32;
            for t in (0..C).rev() {
                let at = inter_at::<DK>(base + lay.q_dec, base + lay.q_dec_lo, r0 + t as u32, d);
                // SAFETY: published dk_inter of this chunk's row t, channel d.
                let inter = decay * unsafe { f32::load(at) };
                decay *= a[t];
                let own_end = last_block && first + r0 + t as u32 == len - 1;
                let future = dk[t] + if own_end { 0.0 } else { inter };
                sum += math::fma(-k[t], future, x[t]);
                dk[t] = math::fma(d_a(t, t), q[t], dk[t] + inter);
                if (t as u32) < rows {
                    let e = at_qk(row0 + (r0 + t as u32) as u64, d);
                    // SAFETY: a token row of the segment, channel d of this head: inside dq,
                    // dk, dg (host-checked sizes); this item is the element's only writer.
                    unsafe {
                        *b.d_q.add(e) = convert::f32_to_bf16(dq[t]);
                        *b.d_k.add(e) = convert::f32_to_bf16(dk[t]);
                        *b.d_g.add(e) = sum;
                    }
                }
            }
        }
    }

    // Carry pass: add every later chunk's sums and the end term, from the last block back.
    // SAFETY: uniform; thread d < DK owns channel d's carry.
    let mut carry = if tid < DK {
        // SAFETY: written by the last block's matrix phase, published by its barrier D.
        unsafe { f32::load(base + lay.through_end + 4 * tid) }
    } else {
        0.0
    };
    for blk in (0..blocks).rev() {
        let first = blk * G_BLOCK;
        let valid = (len - first).min(G_BLOCK);
        let row0 = seg.start as u64 + first as u64;
        // SAFETY: barrier E (uniform).
        unsafe { sync::sync_threads() };
        if tid < DK {
            let mut sums = [0.0f32; CHUNKS_PER_G_BLOCK as usize];
            for (c, s) in sums.iter_mut().enumerate() {
                let r0 = c as u32 * CHUNK;
                if r0 < valid {
                    // SAFETY: a token row of the segment (its chunk's first), written before
                    // barrier E by this block's threads.
                    *s = unsafe { *b.d_g.add(at_qk(row0 + r0 as u64, tid)) };
                }
            }
            for c in (0..CHUNKS_PER_G_BLOCK).rev() {
                // SAFETY: channel tid's carry into chunk c (one writer).
                unsafe { f32::store(base + lay.carry + 4 * (c * DK + tid), carry) };
                carry += sums[c as usize];
            }
        }
        // SAFETY: barrier F (uniform), or nothing in the negative control.
        unsafe { <BarrierF<CARRY_BARRIER> as Barrier>::sync() };
        // Thread `tid` finishes channel `d = tid % DK` of rows `tid / DK + ROW_STEP j`: the
        // carries of its channel into the block's chunks first, then every global load of the
        // block (independent, their latencies overlap), then the sums.
        let (t0, d) = (tid / DK, tid % DK);
        let mut carries = [0.0f32; CHUNKS_PER_G_BLOCK as usize];
        for (c, x) in carries.iter_mut().enumerate() {
            // SAFETY: channel d's carry into chunk c, published by barrier F.
            *x = unsafe { f32::load(base + lay.carry + 4 * (c as u32 * DK + d)) };
        }
        let mut gv = [0.0f32; PER_THREAD];
        let mut dg = [0.0f32; PER_THREAD];
        for j in 0..PER_THREAD {
            let t = t0 + ROW_STEP * j as u32;
            if t < valid {
                let e = at_qk(row0 + t as u64, d);
                // SAFETY: a token row of the segment, channel d: inside g and dg; this thread
                // is the element's only reader and writer in the pass (written before barrier
                // E of the first pass iteration by the CUDA-core phase).
                unsafe {
                    gv[j] = convert::bf16_to_f32(*b.g.add(e));
                    dg[j] = *b.d_g.add(e);
                }
            }
        }
        for j in 0..PER_THREAD {
            let t = t0 + ROW_STEP * j as u32;
            if t < valid {
                let e = at_qk(row0 + t as u64, d);
                // t / CHUNK with a constant index: t0 < ROW_STEP, and CHUNK is a multiple of
                // ROW_STEP, so row t lies in the chunk of row ROW_STEP j.
                let c = carries[(ROW_STEP * j as u32 / CHUNK) as usize];
                // SAFETY: as for the loads.
                unsafe { *b.d_g.add(e) = if gv[j] >= G_FLOOR { dg[j] + c } else { 0.0 } };
            }
        }
    }
}
