//! The dK/dV kernels (`attention_bwd_*`, `attention_bwd_dkdv_*`, and their `_varlen_` forms on
//! packed sequences): one block per `BN` keys of one key/value head of one sequence, dK and dV accumulated in registers (f32) over every query head of the
//! group and every query block that sees the keys; with `DQ`, each step's share of dQ added
//! into the f32 accumulator.
//!
//! # Tiling
//! The block's K and V tiles (`[BN, D]`) are loaded once; Q and dO tiles of `BM` query rows
//! stream through a 2-stage `cp.async` ring ([`kernel_abi::attention::backward::BwdTileConfig`]
//! is the table and the shared-memory layout). The steps are the query blocks `[mb_lo, mb_hi)`
//! that may see a key of the block (causal and window bounds: the others are skipped), for each
//! query head of the group in turn.
//!
//! # Thread mapping
//! Warp `w` owns keys `16 (w % (BN / 16)) ..+ 16` of the block and dK/dV columns
//! `(w / (BN / 16)) D / d_split ..+ D / d_split`. Per step it computes, with keys as rows,
//! `S^T = K Q^T` and `dP^T = V dO^T` (`16 x BM`, all of D), then
//! `P^T = exp2(S^T scale_log2 - LSE log2 e)` (0 where masked or LSE = -inf),
//! `dS^T = P^T (dP^T - delta')` (with `SOFTCAP`, `S^T` replaced by `t = tanh(S^T softcap_scale)`
//! and `dS^T` scaled by `1 - t^2`: [`logits::backward_logit`]), and `dV += P^T dO`, `dK += dS^T Q` on its columns (P and dS
//! rounded to the element type as A fragments). With `DQ`, the warps of the first column
//! group store `dS^T` (element type) in shared memory, and warp `w` computes the m16 tile
//! `w % (BM / 16)` of `dQ_step = dS K` on its column group `w / (BM / 16)` (the groups split the
//! `D / 8` n8 tiles as evenly as whole tiles allow), added into the
//! accumulator with `red.global.add.f32` (the order of additions across blocks is not fixed:
//! the deterministic mode builds this kernel without `DQ`).
//!
//! # Barrier protocol
//! `cp.async` groups: K, V and step 0's Q/dO form group 0; each iteration commits one group
//! (step `i + 1`'s Q/dO, or empty). At iteration `i`:
//! 1. `cp.async.wait_group(0)`: this thread's copies of step `i` (and of K, V) are complete.
//! 2. `sync_threads` (A): every thread's copies are complete and visible; every thread has
//!    finished iteration `i - 1`: its reads of stage `(i - 1) % 2` and (with `DQ`) of the
//!    `dS^T` tile.
//! 3. Step `i + 1`'s copies are issued into stage `(i + 1) % 2 = (i - 1) % 2`: free by (A).
//! 4. Products from stage `i % 2`, K and V (reads only).
//! 5. With `DQ`: the first column group's warps store `dS^T` (free by (A)); `sync_threads` (B)
//!    publishes it; every warp reads it and K for its dQ tile. The next write of `dS^T` comes
//!    after the next iteration's (A).
//!
//! Every thread runs the same number of iterations (the step count is block-uniform), so the
//! barrier counts match. The block waits for all its copies before the epilogue. On packed
//! sequences a block whose first key lies past its sequence's keys returns before any barrier
//! (the condition is block-uniform).

use super::super::elem::Elem;
use super::super::{logits, mask};
use super::frag::{a_rows, a_trans, at, mma_ab, mma_abt, pack_a};
use super::layout::BwdLayout;
use crate::arch::{atomic, cp_async, global, index, math, smem, sync};
use crate::tiles::load_rows;
use kernel_abi::attention::backward::{BWD_STAGES, BwdTileConfig};

/// n8 tiles of dQ columns per pass of the dQ product (16 accumulator registers); a last pass
/// takes the rest where it does not divide a warp's tiles.
const DQ_PASS: usize = 4;

/// Issue the copies of a `[ROWS, D]` tile (rows `>= valid` zero-filled).
#[inline(always)]
fn load<const D: u32, const RB: u32, const ROWS: u32, const THREADS: u32>(
    dst: u32,
    base: *const u16,
    first_row: u32,
    stride: u64,
    valid: u32,
) {
    load_rows::<D, ROWS, THREADS>(
        dst,
        at::<RB>,
        base,
        first_row as u64 * stride,
        stride,
        valid,
    )
}

/// The kernel body; see the module documentation. `RB` bytes per padded `[.., D]` row,
/// `DSRB` per padded `dS^T` row, `KD = D / 16`, `NTQ = BM / 8`, `KQ = BM / 16`, `KN = BN / 16`,
/// `WT = D / d_split / 8` (dK/dV n8 tiles of a warp), `QT` dQ n8 tiles of a warp (one more
/// in the first `QR` column groups).
/// `DS_BARRIER = false` (with `DQ`) is the negative control
/// `negative_attention_bwd_no_ds_barrier` (`crate::negative`), never launched by the library:
/// barrier (B) is left out, so warps read rows of the `dS^T` tile that other warps are still
/// storing (a shared-memory read-after-write race; dK and dV are unaffected, dQ is not).
/// `SOFTCAP`: the logits soft-capped ([`logits::backward_logit`]).
///
/// # Safety
/// Launched with grid `(ceil(seq_k / BN), heads_kv, batch)` (`seq_k` the longest sequence's
/// for a packed layout), the configuration's threads and shared memory, and parameters
/// satisfying their type's contract (validated by the host): with `DQ` the accumulator zeroed
/// by the preprocess of the same launch sequence.
#[inline(always)]
pub(super) unsafe fn dkdv<
    L: BwdLayout,
    E: Elem,
    const D: u32,
    const RB: u32,
    const DSRB: u32,
    const BN: u32,
    const BM: u32,
    const KD: usize,
    const NTQ: usize,
    const KQ: usize,
    const KN: usize,
    const WT: usize,
    const QT: usize,
    const QR: usize,
    const THREADS: u32,
    const DQ: bool,
    const DS_BARRIER: bool,
    const SOFTCAP: bool,
>(
    pp: &L::Params,
    cfg: &BwdTileConfig,
) {
    let p = L::base(pp);
    const { assert!(KD as u32 * 16 == D && NTQ as u32 * 8 == BM && KQ as u32 * 16 == BM) };
    const { assert!(KN as u32 * 16 == BN) };
    // The protocol waits for every copy at the top of each step: a 2-stage ring.
    const { assert!(BWD_STAGES == 2) };
    let lane = index::lane_id();
    let warp = index::warp_id();
    let (g, t) = (lane / 4, lane % 4);
    let (n_block, head_kv) = (index::block_idx_x(), index::block_idx_y());
    // SAFETY: the grid's z is the batch (the caller's contract).
    let seq = unsafe { L::locate(pp, index::block_idx_z()) };
    let (seq_q, seq_k) = (seq.seq_q(pp), seq.seq_k(pp));
    let n0 = n_block * BN;
    if L::MAY_BE_PAST_END && n0 >= seq_k {
        // No key of the sequence in this block (block-uniform, before any barrier).
        return;
    }
    let keys_valid = (seq_k - n0).min(BN);
    let key_row = 16 * (warp % (BN / 16));
    let col_chunk = (warp / (BN / 16)) * (WT as u32);
    let group = p.heads_q / p.heads_kv;

    let off = seq_k as i64 - seq_q as i64;
    let (wl, wr) = (p.window_left, p.window_right);
    let (mb_lo, m_steps) = mask::query_blocks(n0, keys_valid, seq_q, seq_k, wl, wr, BM);
    let steps = group * m_steps;

    let mut dk = [[0.0f32; 4]; WT];
    let mut dv = [[0.0f32; 4]; WT];

    if steps > 0 {
        let smem = smem::aligned_base();
        let k_s = smem + cfg.k_offset() as u32;
        let v_s = smem + cfg.v_offset() as u32;
        let q_s = |stage: u32| smem + cfg.q_offset(stage) as u32;
        let do_s = |stage: u32| smem + cfg.do_offset(stage) as u32;
        let ds_s = smem + cfg.ds_offset() as u32;
        // Step `s`: query head and first query row.
        let head_of = |s: u32| head_kv * group + s / m_steps;
        let m0_of = |s: u32| (mb_lo + s % m_steps) * BM;
        let load_step = |s: u32, stage: u32| {
            let (h, m0) = (head_of(s), m0_of(s));
            let valid = (seq_q - m0).min(BM);
            let q_base = p.q.wrapping_add(seq.q_head(&p.q_strides, h) as usize);
            let do_base = p.d_o.wrapping_add(seq.q_head(&p.do_strides, h) as usize);
            load::<D, RB, BM, THREADS>(q_s(stage), q_base, m0, p.q_strides[1], valid);
            load::<D, RB, BM, THREADS>(do_s(stage), do_base, m0, p.do_strides[1], valid);
        };
        let k_base = p.k.wrapping_add(seq.k_head(&p.k_strides, head_kv) as usize);
        let v_base = p.v.wrapping_add(seq.k_head(&p.v_strides, head_kv) as usize);
        load::<D, RB, BN, THREADS>(k_s, k_base, n0, p.k_strides[1], keys_valid);
        load::<D, RB, BN, THREADS>(v_s, v_base, n0, p.v_strides[1], keys_valid);
        load_step(0, 0);
        cp_async::commit_group();

        for step in 0..steps {
            cp_async::wait_group::<0>();
            // SAFETY: barrier (A) of the protocol; every thread reaches it `steps` times.
            unsafe { sync::sync_threads() };
            if step + 1 < steps {
                load_step(step + 1, (step + 1) % BWD_STAGES);
            }
            cp_async::commit_group();
            let stage = step % BWD_STAGES;
            let (h, m0) = (head_of(step), m0_of(step));
            let row_base = seq.lse_base(pp, h);

            // S^T = K Q^T and dP^T = V dO^T for the warp's 16 keys.
            let mut s = [[0.0f32; 4]; NTQ];
            let mut dp = [[0.0f32; 4]; NTQ];
            // SAFETY: K, V (group 0) and this stage were published by (A) and are not written
            // before the next (A); whole warp, uniform control flow.
            unsafe {
                mma_abt::<E, RB, KD, NTQ>(
                    lane,
                    &mut s,
                    |kk| a_rows::<RB>(lane, k_s, key_row, kk),
                    q_s(stage),
                    0,
                );
                mma_abt::<E, RB, KD, NTQ>(
                    lane,
                    &mut dp,
                    |kk| a_rows::<RB>(lane, v_s, key_row, kk),
                    do_s(stage),
                    0,
                );
            }

            // LSE (base 2, +inf where P must be 0) and delta' of the thread's query columns.
            let mut lse2 = [[f32::INFINITY; 2]; NTQ];
            let mut delta = [[0.0f32; 2]; NTQ];
            for j in 0..NTQ {
                for e in 0..2 {
                    let i = m0 + 8 * j as u32 + 2 * t + e as u32;
                    if i < seq_q {
                        let idx = (row_base + i as u64) as usize;
                        // SAFETY: row i < seq_q of this (sequence, head): inside LSE and delta.
                        let (l, d) = unsafe {
                            (
                                global::load_nc_f32(p.lse.wrapping_add(idx)),
                                global::load_nc_f32(p.delta.wrapping_add(idx)),
                            )
                        };
                        if l != f32::NEG_INFINITY {
                            lse2[j][e] = l * math::LOG2_E;
                        }
                        delta[j][e] = d;
                    }
                }
            }
            let needs_mask = m0 + BM > seq_q
                || mask::step_needs_mask::<BM, BN>(m0, n0, off as i32, wl, wr, seq_k as i32);
            for j in 0..NTQ {
                for e in 0..4 {
                    let key = (n0 + key_row + g + 8 * (e as u32 / 2)) as i32;
                    let i = m0 + 8 * j as u32 + 2 * t + (e as u32 % 2);
                    let (x, dx) =
                        logits::backward_logit::<SOFTCAP>(s[j][e], p.logits.softcap_scale);
                    let mut pr = math::exp2(math::fma(x, p.scale_log2, -lse2[j][e % 2]));
                    if needs_mask
                        && !(i < seq_q
                            && mask::allowed(i as i32, key, off as i32, wl, wr, seq_k as i32))
                    {
                        pr = 0.0;
                    }
                    s[j][e] = pr;
                    dp[j][e] = pr * (dp[j][e] - delta[j][e % 2]);
                    if SOFTCAP {
                        dp[j][e] *= dx;
                    }
                }
            }

            // dV += P^T dO, dK += dS^T Q on the warp's columns.
            // SAFETY: as above.
            unsafe {
                mma_ab::<E, RB, KQ, WT>(
                    lane,
                    &mut dv,
                    |kk| pack_a::<E, NTQ>(&s, kk),
                    do_s(stage),
                    col_chunk,
                );
                mma_ab::<E, RB, KQ, WT>(
                    lane,
                    &mut dk,
                    |kk| pack_a::<E, NTQ>(&dp, kk),
                    q_s(stage),
                    col_chunk,
                );
            }

            if DQ {
                if warp < BN / 16 {
                    for j in 0..NTQ {
                        for hh in 0..2 {
                            let row = key_row + g + 8 * hh as u32;
                            let addr = ds_s + row * DSRB + (8 * j as u32 + 2 * t) * 2;
                            let v = E::pack(dp[j][2 * hh], dp[j][2 * hh + 1]);
                            // SAFETY: inside the dS^T tile (row < BN, column < BM), 4-byte
                            // aligned; free since (A) (protocol step 5), one writer per word.
                            unsafe { smem::SmemValue::store(addr, v) };
                        }
                    }
                }
                if DS_BARRIER {
                    // SAFETY: barrier (B); every thread reaches it once per iteration.
                    unsafe { sync::sync_threads() };
                }
                let mq = warp % (BM / 16);
                let cg = warp / (BM / 16);
                // The warp's dQ columns in passes of `DQ_PASS` n8 tiles (fewer live registers
                // beside dK and dV), then one of the rest where `DQ_PASS` does not divide them.
                macro_rules! dq_pass {
                    ($n:expr, $chunk0:expr) => {{
                        let chunk0: u32 = $chunk0;
                        let mut dq = [[0.0f32; 4]; $n];
                        // SAFETY: dS^T published by (B), K by (A); neither is written before
                        // the next (A); whole warp, uniform control flow.
                        unsafe {
                            mma_ab::<E, RB, KN, { $n }>(
                                lane,
                                &mut dq,
                                |kk| a_trans::<DSRB>(lane, ds_s, 16 * kk as u32, 2 * mq),
                                k_s,
                                chunk0,
                            )
                        };
                        for j in 0..$n {
                            for e in 0..4 {
                                let i = m0 + 16 * mq + g + 8 * (e as u32 / 2);
                                let col = 8 * (chunk0 + j as u32) + 2 * t + (e as u32 % 2);
                                if i < seq_q {
                                    let idx = (row_base + i as u64) * D as u64 + col as u64;
                                    let dst = p.dq_accum.wrapping_add(idx as usize);
                                    // SAFETY: row i < seq_q of the accumulator, column < D:
                                    // inside it, 4-byte aligned.
                                    unsafe { atomic::red_add_f32(dst, dq[j][e]) };
                                }
                            }
                        }
                    }};
                }
                // The group's first tile: `QT` per group, one more in each group before it
                // below `QR`.
                let first = cg * QT as u32 + if QR > 0 { cg.min(QR as u32) } else { 0 };
                for pass in 0..QT / DQ_PASS {
                    dq_pass!(DQ_PASS, first + (pass * DQ_PASS) as u32);
                }
                let rest = first + (QT / DQ_PASS * DQ_PASS) as u32;
                match QT % DQ_PASS {
                    1 => dq_pass!(1, rest),
                    2 => dq_pass!(2, rest),
                    3 => dq_pass!(3, rest),
                    _ => {}
                }
                if QR > 0 && cg < QR as u32 {
                    // Warp-uniform: the group's extra tile.
                    dq_pass!(1, first + QT as u32);
                }
            }
        }
        cp_async::wait_all();
    }

    // dK (times the scale) and dV of the warp's keys and columns.
    let dk_base =
        p.dk.wrapping_add(seq.k_head(&p.dk_strides, head_kv) as usize);
    let dv_base =
        p.dv.wrapping_add(seq.k_head(&p.dv_strides, head_kv) as usize);
    for hh in 0..2 {
        let key = n0 + key_row + g + 8 * hh as u32;
        if key < seq_k {
            let dk_row = dk_base.wrapping_add((key as u64 * p.dk_strides[1]) as usize);
            let dv_row = dv_base.wrapping_add((key as u64 * p.dv_strides[1]) as usize);
            for j in 0..WT {
                let col = (8 * (col_chunk + j as u32) + 2 * t) as usize;
                let k2 = E::pack(dk[j][2 * hh] * p.scale, dk[j][2 * hh + 1] * p.scale);
                let v2 = E::pack(dv[j][2 * hh], dv[j][2 * hh + 1]);
                // SAFETY: key < seq_k, column + 1 < D: inside dK and dV; 4-byte aligned
                // (16-byte aligned rows, even column); each element has one writer.
                unsafe {
                    *(dk_row.wrapping_add(col) as *mut u32) = k2;
                    *(dv_row.wrapping_add(col) as *mut u32) = v2;
                }
            }
        }
    }
}
