//! The deterministic dQ kernel (`attention_bwd_dq_*`, and `attention_bwd_dq_varlen_*` on packed
//! sequences): one block per `BM` query rows of one (sequence, query head) recomputes, over the keys its rows may see, `S = Q K^T`,
//! `P = exp2(S scale_log2 - LSE log2 e)`, `dP = dO V^T`, `dS = P (dP - delta')` (with
//! `SOFTCAP`, `S` replaced by `t = tanh(S softcap_scale)` and `dS` scaled by `1 - t^2`), and
//! accumulates `dQ = dS K` in registers; then writes `scale dQ` in the element type. Every
//! element of dQ is summed by one thread in a fixed order: bitwise reproducible.
//!
//! # Tiling
//! The forward's: Q and dO tiles (`[BM, D]`) loaded once, K and V tiles of `BN` keys through a
//! 2-stage `cp.async` ring ([`kernel_abi::attention::backward::DqTileConfig`]), over the key
//! blocks that some row of the block may attend (the others are skipped).
//!
//! # Thread mapping
//! Warp `w` owns query rows `16 w ..+ 16`: `S` and `dP` (`16 x BN`), dS rounded to the element
//! type as the A fragments of `dQ += dS K` (`16 x D` accumulators).
//!
//! # Barrier protocol
//! `cp.async` groups: Q, dO and step 0's K/V form group 0; each iteration commits one group
//! (step `i + 1`'s K/V, or empty). At iteration `i`:
//! 1. `cp.async.wait_group(0)`: this thread's copies of step `i` (and Q, dO) are complete.
//! 2. `sync_threads`: every thread's copies are visible; every thread finished iteration
//!    `i - 1`, i.e. its reads of stage `(i - 1) % 2`.
//! 3. Step `i + 1`'s copies are issued into stage `(i + 1) % 2`, free by step 2.
//! 4. Products from stage `i % 2`, Q and dO (reads only).
//!
//! The step count is block-uniform, so the barrier counts match; the block waits for all its
//! copies before the epilogue. On packed sequences a block whose first row lies past its
//! sequence's query rows returns before any barrier (the condition is block-uniform).

use super::super::elem::Elem;
use super::super::{logits, mask};
use super::frag::{a_rows, at, mma_ab, mma_abt, pack_a};
use super::layout::BwdLayout;
use crate::arch::{cp_async, global, index, math, smem, sync};
use crate::tiles::load_rows;
use kernel_abi::attention::backward::{DQ_STAGES, DqTileConfig};

/// The kernel body; see the module documentation. `RB` bytes per padded row, `KD = D / 16`,
/// `DT = D / 8`, `NT = BN / 8`, `KN = BN / 16`.
///
/// # Safety
/// Launched with grid `(ceil(seq_q / BM), heads_q, batch)` (`seq_q` the longest sequence's for
/// a packed layout), the configuration's threads and shared memory, and parameters satisfying
/// their type's contract (validated by the host), delta written by the preprocess of the same
/// launch sequence.
#[inline(always)]
pub(super) unsafe fn dq<
    L: BwdLayout,
    E: Elem,
    const D: u32,
    const RB: u32,
    const BM: u32,
    const BN: u32,
    const KD: usize,
    const DT: usize,
    const NT: usize,
    const KN: usize,
    const THREADS: u32,
    const SOFTCAP: bool,
>(
    pp: &L::Params,
    cfg: &DqTileConfig,
) {
    let p = L::base(pp);
    const { assert!(KD as u32 * 16 == D && DT as u32 * 8 == D) };
    const { assert!(NT as u32 * 8 == BN && KN as u32 * 16 == BN && BM / 16 * 32 == THREADS) };
    // The protocol waits for every copy at the top of each step: a 2-stage ring.
    const { assert!(DQ_STAGES == 2) };
    let lane = index::lane_id();
    let (g, t) = (lane / 4, lane % 4);
    let warp_row = 16 * index::warp_id();
    let (m_block, head) = (index::block_idx_x(), index::block_idx_y());
    // SAFETY: the grid's z is the batch (the caller's contract).
    let seq = unsafe { L::locate(pp, index::block_idx_z()) };
    let (seq_q, seq_k) = (seq.seq_q(pp), seq.seq_k(pp));
    let head_kv = head / (p.heads_q / p.heads_kv);
    let m0 = m_block * BM;
    if L::MAY_BE_PAST_END && m0 >= seq_q {
        // No query row of the sequence in this block (block-uniform, before any barrier).
        return;
    }
    let rows_valid = (seq_q - m0).min(BM);
    let (wl, wr) = (p.window_left, p.window_right);
    let off = seq_k as i64 - seq_q as i64;

    // Keys any row of this block may attend: [n_lo, n_hi) (as in the forward).
    let first_row = m0 as i64;
    let last_row = (m0 + rows_valid - 1) as i64;
    let n_lo = if wl >= 0 {
        (first_row + off - wl as i64).max(0)
    } else {
        0
    };
    let n_hi = if wr >= 0 {
        (last_row + off + wr as i64 + 1).min(seq_k as i64)
    } else {
        seq_k as i64
    };

    // LSE (base 2, +inf where P must be 0) and delta' of the thread's two rows of each half.
    let row_base = seq.lse_base(pp, head);
    let mut lse2 = [f32::INFINITY; 2];
    let mut delta = [0.0f32; 2];
    for hh in 0..2 {
        let i = m0 + warp_row + g + 8 * hh as u32;
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
                lse2[hh] = l * math::LOG2_E;
            }
            delta[hh] = d;
        }
    }

    let mut dq = [[0.0f32; 4]; DT];
    if n_hi > n_lo {
        let smem = smem::aligned_base();
        let q_s = smem + cfg.q_offset() as u32;
        let do_s = smem + cfg.do_offset() as u32;
        let k_s = |stage: u32| smem + cfg.k_offset(stage) as u32;
        let v_s = |stage: u32| smem + cfg.v_offset(stage) as u32;
        let nb_lo = (n_lo as u32) / BN;
        let steps = (n_hi as u32).div_ceil(BN) - nb_lo;
        let n0_of = |step: u32| (nb_lo + step) * BN;
        let k_base = p.k.wrapping_add(seq.k_head(&p.k_strides, head_kv) as usize);
        let v_base = p.v.wrapping_add(seq.k_head(&p.v_strides, head_kv) as usize);
        let load_kv = |step: u32, stage: u32| {
            let first = n0_of(step);
            let valid = (seq_k - first).min(BN);
            let (ks, vs) = (p.k_strides[1], p.v_strides[1]);
            load_rows::<D, BN, THREADS>(k_s(stage), at::<RB>, k_base, first as u64 * ks, ks, valid);
            load_rows::<D, BN, THREADS>(v_s(stage), at::<RB>, v_base, first as u64 * vs, vs, valid);
        };
        let q_base = p.q.wrapping_add(seq.q_head(&p.q_strides, head) as usize);
        let do_base = p.d_o.wrapping_add(seq.q_head(&p.do_strides, head) as usize);
        let (qs, dos) = (p.q_strides[1], p.do_strides[1]);
        load_rows::<D, BM, THREADS>(q_s, at::<RB>, q_base, m0 as u64 * qs, qs, rows_valid);
        load_rows::<D, BM, THREADS>(do_s, at::<RB>, do_base, m0 as u64 * dos, dos, rows_valid);
        load_kv(0, 0);
        cp_async::commit_group();

        for step in 0..steps {
            cp_async::wait_group::<0>();
            // SAFETY: barrier protocol step 2; every thread reaches it `steps` times.
            unsafe { sync::sync_threads() };
            if step + 1 < steps {
                load_kv(step + 1, (step + 1) % DQ_STAGES);
            }
            cp_async::commit_group();
            let stage = step % DQ_STAGES;
            let n0 = n0_of(step);
            let mut s = [[0.0f32; 4]; NT];
            let mut dp = [[0.0f32; 4]; NT];
            // SAFETY: Q, dO (group 0) and this stage were published by this iteration's
            // barrier and are not written before the next; whole warp, uniform control flow.
            unsafe {
                mma_abt::<E, RB, KD, NT>(
                    lane,
                    &mut s,
                    |kk| a_rows::<RB>(lane, q_s, warp_row, kk),
                    k_s(stage),
                    0,
                );
                mma_abt::<E, RB, KD, NT>(
                    lane,
                    &mut dp,
                    |kk| a_rows::<RB>(lane, do_s, warp_row, kk),
                    v_s(stage),
                    0,
                );
            }
            let needs_mask = m0 + BM > seq_q
                || mask::step_needs_mask::<BM, BN>(m0, n0, off as i32, wl, wr, seq_k as i32);
            for j in 0..NT {
                for e in 0..4 {
                    let hh = e / 2;
                    let i = m0 + warp_row + g + 8 * hh as u32;
                    let key = (n0 + 8 * j as u32 + 2 * t + (e as u32 % 2)) as i32;
                    let (x, dx) =
                        logits::backward_logit::<SOFTCAP>(s[j][e], p.logits.softcap_scale);
                    let mut pr = math::exp2(math::fma(x, p.scale_log2, -lse2[hh]));
                    if needs_mask
                        && !(i < seq_q
                            && mask::allowed(i as i32, key, off as i32, wl, wr, seq_k as i32))
                    {
                        pr = 0.0;
                    }
                    dp[j][e] = pr * (dp[j][e] - delta[hh]);
                    if SOFTCAP {
                        dp[j][e] *= dx;
                    }
                }
            }
            // SAFETY: as above (K of this stage).
            unsafe {
                mma_ab::<E, RB, KN, DT>(lane, &mut dq, |kk| pack_a::<E, NT>(&dp, kk), k_s(stage), 0)
            };
        }
        cp_async::wait_all();
    }

    // dQ times the scale, rows < seq_q.
    let dq_base = p.dq.wrapping_add(seq.q_head(&p.dq_strides, head) as usize);
    for hh in 0..2 {
        let row = warp_row + g + 8 * hh as u32;
        if row < rows_valid {
            let dst = dq_base.wrapping_add(((m0 + row) as u64 * p.dq_strides[1]) as usize);
            for j in 0..DT {
                let v = E::pack(dq[j][2 * hh] * p.scale, dq[j][2 * hh + 1] * p.scale);
                // SAFETY: row < seq_q, column 8 j + 2 t + 1 < D: inside dQ, 4-byte aligned;
                // one writer per element.
                unsafe { *(dst.wrapping_add(8 * j + 2 * t as usize) as *mut u32) = v };
            }
        }
    }
}
