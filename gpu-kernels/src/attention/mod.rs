//! `attention_fwd_{bf16,f16}_d{64,128,256}`: fused attention forward, FlashAttention-2 style,
//! on `mma.sync` tensor cores (runs on any GPU of compute capability >= 8.0).
//!
//! # Parameters
//! [`AttentionParams`]: Q, K, V, O with arbitrary batch/sequence/head strides (head dimension
//! contiguous, every row 16-byte aligned), LSE `[batch, heads_q, seq_q]` f32, sizes, the softmax
//! scale (times log2 e), the bottom-right-aligned window (`window_right = 0` is causal).
//!
//! # Tiling
//! One block computes `block_m` = 128 query rows of one (batch, head), walking the keys its rows
//! may attend in steps of `block_n` through a `stages`-deep ring of K/V tiles in shared memory
//! ([`kernel_abi::attention::tile_config`] is the table, per head dimension). Blocks whose keys
//! all lie outside every row's window are skipped entirely (causal: the upper triangle). Rows
//! in shared memory are `D * 2 + 16` bytes: the padding puts consecutive rows 16 bytes apart
//! modulo 128, so the 8 rows an `ldmatrix` phase reads, and the 16-byte `cp.async` writes, hit
//! distinct bank groups, while offsets along a row stay compile-time constants (an XOR swizzle
//! would make them per-thread values, costing registers).
//!
//! # Thread mapping
//! `block_m / (16 warp_m_tiles)` warps; warp `w` owns `warp_m_tiles` m16 tiles of query rows
//! (rows `16 MT w .. 16 MT (w + 1)`): S = Q K^T in `block_n / 8` f32 accumulators per m-tile, the
//! online softmax on its rows (each row is held by the 4 lanes of a quad: max and sum reduce with
//! 2 shuffles), P converted in registers to the A fragments of O += P V (`D / 8` accumulators per
//! m-tile). Every K or V fragment a warp loads with `ldmatrix` feeds `warp_m_tiles` products,
//! which sets the shared-memory traffic per product (the bound of this design). Loads: every
//! thread issues an equal share of the 16-byte `cp.async` copies of each tile (every warp does
//! the same work; no warp specialization in this path).
//!
//! # Barrier protocol
//! Group accounting: the Q tile and K/V step 0 form `cp.async` group 0, steps `1 .. stages - 1`
//! one group each (a thread commits an empty group where there is no step), then one group per
//! loop iteration. At iteration `i`:
//! 1. `cp.async.wait_group(stages - 2)`: this thread's copies of step `i` (and Q) are complete.
//! 2. `sync_threads`: every thread's copies of step `i` are complete and visible to all; and
//!    every thread has finished iteration `i - 1`, i.e. its reads of stage `(i - 1) % stages`.
//! 3. Copies of step `i + stages - 1` are issued into stage `(i + stages - 1) % stages`, which
//!    is `(i - 1) % stages`: free by step 2.
//! 4. Compute from stage `i % stages` (and Q), reads only.
//!
//! Q's shared tile is written only by group 0 and never again. Registers hold everything else,
//! so no other barrier is needed. The block waits for all its copies before exiting.
//!
//! NaN safety (seed 004's bug): masked logits are -inf; a row whose running maximum is still
//! -inf uses 0 as its reference, so `exp2(-inf - ref) = 0` and no `-inf - -inf` is ever formed;
//! the output divides by the row sum only when it is positive (else O = 0, LSE = -inf).
//! The folded softmax modes ([`kernel_abi::attention::Softmax`]) keep these rules, subtract in
//! the exponent's FFMA only while the rounding residual of the reference is at most 1 (else they
//! scale first, as the default does), and bound every `p` by `2^(RESCALE_THRESHOLD + 1)` when
//! they rescale lazily.

#[cfg(target_feature = "sm_90a")]
pub mod hopper;

use crate::arch::{convert, cp_async, index, ldmatrix, math, mma, smem, sync, warp};
use kernel_abi::attention::{
    AttentionParams, HUGE_LOGIT, RESCALE_THRESHOLD, TUNING_VARIANTS, TileConfig, tile_config_of,
};

/// The 16-bit input format: its tensor-core product and f32 packing.
pub trait Elem {
    /// `d += a b` on `mma.sync.m16n8k16` fragments.
    ///
    /// # Safety
    /// Whole warp, uniform control flow.
    unsafe fn mma(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]);
    /// Two f32 to a packed pair (low first), rounding to nearest even.
    fn pack(lo: f32, hi: f32) -> u32;
}

/// bf16 inputs and output.
pub struct Bf16;
/// f16 inputs and output.
pub struct F16;

impl Elem for Bf16 {
    #[inline(always)]
    unsafe fn mma(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
        // SAFETY: forwarded to the caller (whole warp, uniform control flow).
        unsafe { mma::m16n8k16_bf16(d, a, b) }
    }
    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        convert::pack_bf16x2(lo, hi)
    }
}

impl Elem for F16 {
    #[inline(always)]
    unsafe fn mma(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
        // SAFETY: forwarded to the caller (whole warp, uniform control flow).
        unsafe { mma::m16n8k16_f16(d, a, b) }
    }
    #[inline(always)]
    fn pack(lo: f32, hi: f32) -> u32 {
        convert::pack_f16x2(lo, hi)
    }
}

/// Byte offset of 16-byte chunk `chunk` of row `row` in a tile of `D`-element rows padded by
/// 16 bytes (`TileConfig::row_bytes`). Along a row the offset is linear, so the k-slices of an
/// `ldmatrix` sequence are compile-time offsets from one per-thread base address.
#[inline(always)]
fn tile_offset<const D: u32>(row: u32, chunk: u32) -> u32 {
    row * (D * 2 + 16) + (chunk << 4)
}

/// Issue the `cp.async` copies of a `[ROWS, D]` tile into the swizzled layout of
/// [`tile_offset`] ([`crate::tiles::load_rows`]; strides and base host-checked 16-byte aligned).
#[inline(always)]
fn load_tile<const D: u32, const ROWS: u32, const THREADS: u32>(
    dst: u32,
    base: *const u16,
    first_row_offset: u64,
    stride: u64,
    valid: u32,
) {
    crate::tiles::load_rows::<D, ROWS, THREADS>(
        dst,
        tile_offset::<D>,
        base,
        first_row_offset,
        stride,
        valid,
    )
}

/// A warp's place in the problem: everything the step functions need besides the tiles.
#[derive(Clone, Copy)]
struct Warp {
    lane: u32,
    /// `lane / 4`: the row within an m16 half-tile a thread holds accumulators for.
    g: u32,
    /// `lane % 4`: which column pair of each n8 tile a thread holds.
    t: u32,
    /// First row of this warp within the block.
    warp_row: u32,
    /// First query row of the block.
    m0: u32,
    /// Query rows of the block that exist (`<= block_m`).
    rows_valid: u32,
    /// `seq_k - seq_q` (the diagonal offset of the bottom-right alignment).
    offset: i32,
    window_left: i32,
    window_right: i32,
    seq_k: i32,
    /// Softmax scale times log2(e).
    scale_log2: f32,
}

/// The A fragment of m-tile `mt`, k-slice `kk` of the Q tile at `q_s`.
#[inline(always)]
fn q_fragment<const D: u32>(w: &Warp, q_s: u32, mt: usize, kk: usize) -> [u32; 4] {
    let addr = q_s
        + tile_offset::<D>(
            w.warp_row + 16 * mt as u32 + w.lane % 16,
            2 * kk as u32 + w.lane / 16,
        );
    // SAFETY: whole warp, uniform control flow (callers); Q was published by the first barrier
    // of the block and is never written again.
    unsafe { ldmatrix::x4(addr) }
}

/// S = Q K^T for the warp's `MT` m-tiles and the `BN` keys of the K tile at `k_s`; each K
/// fragment feeds `MT` products.
///
/// # Safety
/// Whole warp, uniform control flow; the K tile (and Q) were published by a barrier and are not
/// overwritten before the caller's next barrier.
#[inline(always)]
unsafe fn qk<
    E: Elem,
    const D: u32,
    const MT: usize,
    const DK: usize,
    const NT: usize,
    const NK: usize,
    const Q_REGS: bool,
    const PF: bool,
>(
    w: &Warp,
    q_s: u32,
    q_frag: &[[[u32; 4]; DK]; MT],
    k_s: u32,
) -> [[[f32; 4]; NT]; MT] {
    let mut s = [[[0.0f32; 4]; NT]; MT];
    if PF {
        // Fragments of slice `kk + 1` are loaded before the products of slice `kk`.
        let load_a = |kk: usize| {
            let mut a = [[0u32; 4]; MT];
            for mt in 0..MT {
                a[mt] = if Q_REGS {
                    q_frag[mt][kk]
                } else {
                    q_fragment::<D>(w, q_s, mt, kk)
                };
            }
            a
        };
        let load_b = |kk: usize| {
            let mut b = [[0u32; 4]; NK];
            for jj in 0..NK {
                let key = 16 * jj as u32 + w.lane % 8 + (w.lane / 16) * 8;
                let addr = k_s + tile_offset::<D>(key, 2 * kk as u32 + (w.lane / 8) % 2);
                // SAFETY: forwarded to the caller (tile published, whole warp).
                b[jj] = unsafe { ldmatrix::x4(addr) };
            }
            b
        };
        let (mut a, mut b) = (load_a(0), load_b(0));
        for kk in 0..DK {
            let (na, nb) = if kk + 1 < DK {
                (load_a(kk + 1), load_b(kk + 1))
            } else {
                (a, b)
            };
            for jj in 0..NK {
                for mt in 0..MT {
                    // SAFETY: whole warp, uniform control flow.
                    unsafe {
                        E::mma(&mut s[mt][2 * jj], a[mt], [b[jj][0], b[jj][1]]);
                        E::mma(&mut s[mt][2 * jj + 1], a[mt], [b[jj][2], b[jj][3]]);
                    }
                }
            }
            (a, b) = (na, nb);
        }
        return s;
    }
    for kk in 0..DK {
        let mut a = [[0u32; 4]; MT];
        for mt in 0..MT {
            a[mt] = if Q_REGS {
                q_frag[mt][kk]
            } else {
                q_fragment::<D>(w, q_s, mt, kk)
            };
        }
        for jj in 0..NK {
            let key = 16 * jj as u32 + w.lane % 8 + (w.lane / 16) * 8;
            let addr = k_s + tile_offset::<D>(key, 2 * kk as u32 + (w.lane / 8) % 2);
            // SAFETY: forwarded to the caller (tile published, whole warp).
            let b = unsafe { ldmatrix::x4(addr) };
            for mt in 0..MT {
                // SAFETY: whole warp, uniform control flow.
                unsafe {
                    E::mma(&mut s[mt][2 * jj], a[mt], [b[0], b[1]]);
                    E::mma(&mut s[mt][2 * jj + 1], a[mt], [b[2], b[3]]);
                }
            }
        }
    }
    s
}

/// Mask the logits of keys `n0 .. n0 + BN` where this step crosses a window edge or `seq_k`
/// (-inf = masked), then scale to base-2 logits. Scaling before the maximum keeps the maximum's
/// own exponent exactly 0; the folded softmax modes call [`mask`] alone and scale in the FFMA
/// of the exponent instead ([`softmax_folded`]). The masking is written out here
/// rather than through [`mask`]: the call changes LLVM's block layout, and this text keeps the
/// PTX of the measured default kernels byte for byte.
#[inline(always)]
fn mask_and_scale<const MT: usize, const NT: usize, const BM: u32, const BN: u32>(
    w: &Warp,
    s: &mut [[[f32; 4]; NT]; MT],
    n0: u32,
) {
    // i32 is exact here: the host keeps sequence lengths and windows below 2^30.
    let (off, wl, wr, sk) = (w.offset, w.window_left, w.window_right, w.seq_k);
    let row_lo = w.m0 as i32;
    let row_hi = (w.m0 + BM - 1) as i32;
    let (key_lo, key_hi) = (n0 as i32, (n0 + BN - 1) as i32);
    let needs_mask = key_hi >= sk
        || (wr >= 0 && key_hi > row_lo + off + wr)
        || (wl >= 0 && key_lo < row_hi + off - wl);
    if needs_mask {
        for mt in 0..MT {
            for j in 0..NT {
                for e in 0..4 {
                    let row =
                        (w.m0 + w.warp_row + 16 * mt as u32 + w.g + 8 * (e as u32 / 2)) as i32;
                    let key = (n0 + 8 * j as u32 + 2 * w.t + (e as u32 % 2)) as i32;
                    let allowed = key < sk
                        && (wl < 0 || key >= row + off - wl)
                        && (wr < 0 || key <= row + off + wr);
                    if !allowed {
                        s[mt][j][e] = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
    for mt in 0..MT {
        for j in 0..NT {
            for e in 0..4 {
                s[mt][j][e] *= w.scale_log2;
            }
        }
    }
}

/// Mask the logits of keys `n0 .. n0 + BN` where this step crosses a window edge or `seq_k`
/// (-inf = masked).
#[inline(always)]
fn mask<const MT: usize, const NT: usize, const BM: u32, const BN: u32>(
    w: &Warp,
    s: &mut [[[f32; 4]; NT]; MT],
    n0: u32,
) {
    // i32 is exact here: the host keeps sequence lengths and windows below 2^30.
    let (off, wl, wr, sk) = (w.offset, w.window_left, w.window_right, w.seq_k);
    let row_lo = w.m0 as i32;
    let row_hi = (w.m0 + BM - 1) as i32;
    let (key_lo, key_hi) = (n0 as i32, (n0 + BN - 1) as i32);
    let needs_mask = key_hi >= sk
        || (wr >= 0 && key_hi > row_lo + off + wr)
        || (wl >= 0 && key_lo < row_hi + off - wl);
    if needs_mask {
        for mt in 0..MT {
            for j in 0..NT {
                for e in 0..4 {
                    let row =
                        (w.m0 + w.warp_row + 16 * mt as u32 + w.g + 8 * (e as u32 / 2)) as i32;
                    let key = (n0 + 8 * j as u32 + 2 * w.t + (e as u32 % 2)) as i32;
                    let allowed = key < sk
                        && (wl < 0 || key >= row + off - wl)
                        && (wr < 0 || key <= row + off + wr);
                    if !allowed {
                        s[mt][j][e] = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }
}

/// The online-softmax update in base 2 for each m-tile and row half `h` (rows `g`, `g + 8`):
/// new running maximum (a row whose maximum is still -inf uses 0 as its reference, so no
/// `-inf - -inf` is formed), rescale of `o` and the running sum, and `s` turned into P.
#[inline(always)]
fn softmax_update<const MT: usize, const NT: usize, const DT: usize>(
    s: &mut [[[f32; 4]; NT]; MT],
    o: &mut [[[f32; 4]; DT]; MT],
    row_max: &mut [[f32; 2]; MT],
    row_sum: &mut [[f32; 2]; MT],
) {
    for mt in 0..MT {
        for h in 0..2 {
            let mut mx = f32::NEG_INFINITY;
            for j in 0..NT {
                mx = mx.max(s[mt][j][2 * h]).max(s[mt][j][2 * h + 1]);
            }
            // SAFETY: all 32 lanes execute these shuffles (the callers' control flow is uniform).
            unsafe {
                mx = mx.max(warp::shfl_xor_f32(warp::FULL_MASK, mx, 1));
                mx = mx.max(warp::shfl_xor_f32(warp::FULL_MASK, mx, 2));
            }
            let new_max = row_max[mt][h].max(mx);
            let reference = if new_max == f32::NEG_INFINITY {
                0.0
            } else {
                new_max
            };
            let correction = math::exp2(row_max[mt][h] - reference);
            row_max[mt][h] = new_max;
            row_sum[mt][h] *= correction;
            for d in 0..DT {
                o[mt][d][2 * h] *= correction;
                o[mt][d][2 * h + 1] *= correction;
            }
            for j in 0..NT {
                let p0 = math::exp2(s[mt][j][2 * h] - reference);
                let p1 = math::exp2(s[mt][j][2 * h + 1] - reference);
                row_sum[mt][h] += p0 + p1;
                s[mt][j][2 * h] = p0;
                s[mt][j][2 * h + 1] = p1;
            }
        }
    }
}

/// The reference of a row whose running maximum is `m`: `m`, or 0 while `m` is -inf (so no
/// `-inf - -inf` is formed).
#[inline(always)]
fn reference(m: f32) -> f32 {
    if m == f32::NEG_INFINITY { 0.0 } else { m }
}

/// The first half of the folded online softmax ([`Softmax::Folded`], with `lazy`
/// [`Softmax::FoldedLazy`]) on the raw logits `s` (masked ones -inf), a tile at a time: the
/// maxima of all `2 MT` rows of the thread (the shuffles of the rows interleaved, so their
/// latencies overlap), the votes, the rescales. Returns whether the step has huge maxima (the
/// same on every lane), which [`softmax_folded_p`] (the exponentials) needs.
///
/// The running maximum `row_max` is in base-2 units: `t = max * scale_log2` rounded (the scale
/// is positive, so the maximum of the raw logits is the maximum of the scaled ones), and
/// `p = exp2(fma(s, scale_log2, -t))`. The exact exponent of the row's maximal key is then the
/// rounding residual of `t` rather than 0: at most 1 while `|t| < HUGE_LOGIT`, and it cancels,
/// since O and the sum are built from the same `p` and the LSE adds `t` back. A step where some
/// row of the warp has `|t| >= HUGE_LOGIT` (the residual could overflow or underflow `exp2`)
/// scales first and subtracts after, as [`softmax_update`] does (`p = 1` exactly for the
/// maximal key); the vote makes the branch uniform.
///
/// With `lazy` the warp rescales only when some row's maximum exceeds its reference by more
/// than [`RESCALE_THRESHOLD`] (a second vote); otherwise every row keeps its reference, so
/// `p <= 2^(threshold + 1)`, and O and the sums are not touched.
///
/// [`Softmax::Folded`]: kernel_abi::attention::Softmax::Folded
/// [`Softmax::FoldedLazy`]: kernel_abi::attention::Softmax::FoldedLazy
#[inline(always)]
fn softmax_folded_rescale<const MT: usize, const NT: usize, const DT: usize>(
    s: &[[[f32; 4]; NT]; MT],
    o: &mut [[[f32; 4]; DT]; MT],
    row_max: &mut [[f32; 2]; MT],
    row_sum: &mut [[f32; 2]; MT],
    scale_log2: f32,
    lazy: bool,
) -> bool {
    let mut correction = [[1.0f32; 2]; MT];
    let (huge, rescale) =
        softmax_folded_max::<MT, NT>(s, row_max, row_sum, scale_log2, lazy, &mut correction);
    if rescale {
        rescale_o(o, &correction);
    }
    huge
}

/// [`softmax_folded_rescale`] without touching O: updates the maxima (references) and the
/// sums, and returns whether the step has huge maxima and whether the warp rescales; if it
/// does, `correction` holds each row's factor (the caller multiplies O by it, with
/// [`rescale_o`], once O is not in use).
#[inline(always)]
fn softmax_folded_max<const MT: usize, const NT: usize>(
    s: &[[[f32; 4]; NT]; MT],
    row_max: &mut [[f32; 2]; MT],
    row_sum: &mut [[f32; 2]; MT],
    scale_log2: f32,
    lazy: bool,
    correction: &mut [[f32; 2]; MT],
) -> (bool, bool) {
    let mut mx = [[f32::NEG_INFINITY; 2]; MT];
    for mt in 0..MT {
        for h in 0..2 {
            if NT > 8 {
                // Wide tiles (the Hopper path's 64x128 steps): a tree, not a chain of `2 NT`
                // dependent maxima.
                let mut m = [f32::NEG_INFINITY; NT];
                for j in 0..NT {
                    m[j] = s[mt][j][2 * h].max(s[mt][j][2 * h + 1]);
                }
                for level in 0..TREE_LEVELS {
                    let stride = 1usize << level;
                    for j in 0..NT {
                        if j % (2 * stride) == 0 && j + stride < NT {
                            m[j] = m[j].max(m[j + stride]);
                        }
                    }
                }
                mx[mt][h] = m[0];
            } else {
                for j in 0..NT {
                    mx[mt][h] = mx[mt][h].max(s[mt][j][2 * h]).max(s[mt][j][2 * h + 1]);
                }
            }
        }
    }
    for k in 0..2 {
        let lane_mask = 1 << k;
        for mt in 0..MT {
            for h in 0..2 {
                // SAFETY: all 32 lanes execute these shuffles (uniform control flow).
                let other = unsafe { warp::shfl_xor_f32(warp::FULL_MASK, mx[mt][h], lane_mask) };
                mx[mt][h] = mx[mt][h].max(other);
            }
        }
    }
    let mut t = [[0.0f32; 2]; MT];
    let (mut huge, mut grow) = (false, false);
    for mt in 0..MT {
        for h in 0..2 {
            t[mt][h] = mx[mt][h] * scale_log2;
            // -inf is a row with no allowed key in this tile (handled by `reference`).
            huge |= t[mt][h].abs() >= HUGE_LOGIT && t[mt][h] != f32::NEG_INFINITY;
            // False for -inf - -inf (NaN) and for a NaN maximum.
            grow |= t[mt][h] - row_max[mt][h] > RESCALE_THRESHOLD;
        }
    }
    // SAFETY: all 32 lanes execute the votes (uniform control flow).
    let (huge, rescale) = unsafe {
        (
            warp::any(warp::FULL_MASK, huge),
            !lazy || warp::any(warp::FULL_MASK, grow),
        )
    };
    if rescale {
        for mt in 0..MT {
            for h in 0..2 {
                let new_max = row_max[mt][h].max(t[mt][h]);
                correction[mt][h] = math::exp2(row_max[mt][h] - reference(new_max));
                row_max[mt][h] = new_max;
                row_sum[mt][h] *= correction[mt][h];
            }
        }
    }
    (huge, rescale)
}

/// O's rows times their factors `correction` (rows `g` and `g + 8` of each m-tile).
#[inline(always)]
fn rescale_o<const MT: usize, const DT: usize>(
    o: &mut [[[f32; 4]; DT]; MT],
    correction: &[[f32; 2]; MT],
) {
    for mt in 0..MT {
        for h in 0..2 {
            for d in 0..DT {
                o[mt][d][2 * h] *= correction[mt][h];
                o[mt][d][2 * h + 1] *= correction[mt][h];
            }
        }
    }
}

/// Levels of the row-sum tree of [`softmax_folded_p`]: up to 32 n8 tiles per step.
const TREE_LEVELS: u32 = 5;

/// The second half of the folded softmax: `s` (raw logits) turned into
/// `p = exp2(s scale_log2 - reference)` in one FFMA, or (`SCALED_FIRST`, a step with huge
/// maxima, see [`softmax_folded_rescale`]) with the product rounded first; then the row sums
/// (pairwise).
#[inline(always)]
fn softmax_folded_p<const MT: usize, const NT: usize, const SCALED_FIRST: bool>(
    s: &mut [[[f32; 4]; NT]; MT],
    row_max: &[[f32; 2]; MT],
    row_sum: &mut [[f32; 2]; MT],
    scale_log2: f32,
) {
    for mt in 0..MT {
        for h in 0..2 {
            let r = reference(row_max[mt][h]);
            for j in 0..NT {
                for e in 2 * h..2 * h + 2 {
                    let x = if SCALED_FIRST {
                        s[mt][j][e] * scale_log2 - r
                    } else {
                        math::fma(s[mt][j][e], scale_log2, -r)
                    };
                    s[mt][j][e] = math::exp2(x);
                }
            }
        }
    }
    for mt in 0..MT {
        for h in 0..2 {
            let mut pairs = [0.0f32; NT];
            for j in 0..NT {
                pairs[j] = s[mt][j][2 * h] + s[mt][j][2 * h + 1];
            }
            // A tree over the pairs (constant trip counts: unrolled, the array in registers;
            // `TREE_LEVELS` levels cover `NT <= 2^TREE_LEVELS`, and a bound much above that
            // leaves the loop rolled and the array in local memory).
            const { assert!(NT <= 1 << TREE_LEVELS) };
            for level in 0..TREE_LEVELS {
                let stride = 1usize << level;
                for j in 0..NT {
                    if stride < NT && j % (2 * stride) == 0 && j + stride < NT {
                        pairs[j] += pairs[j + stride];
                    }
                }
            }
            row_sum[mt][h] += pairs[0];
        }
    }
}

/// O += P V for the `BN` keys of the V tile at `v_s`: P from the S accumulators (converted in
/// registers to A fragments), V through `ldmatrix.trans`; each V fragment feeds `MT` products.
///
/// # Safety
/// As for [`qk`], for the V tile.
#[inline(always)]
unsafe fn pv<
    E: Elem,
    const D: u32,
    const MT: usize,
    const DT: usize,
    const DK: usize,
    const NT: usize,
    const NK: usize,
    const PF: bool,
>(
    w: &Warp,
    s: &[[[f32; 4]; NT]; MT],
    o: &mut [[[f32; 4]; DT]; MT],
    v_s: u32,
) {
    if PF {
        // All of P packed first (S dies), and each V fragment loaded one product group ahead.
        let mut p = [[[0u32; 4]; NK]; MT];
        for kk in 0..NK {
            for mt in 0..MT {
                p[mt][kk] = [
                    E::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]),
                    E::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]),
                    E::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]),
                    E::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]),
                ];
            }
        }
        let load_v = |kk: usize, dj: usize| {
            let addr =
                v_s + tile_offset::<D>(16 * kk as u32 + w.lane % 16, 2 * dj as u32 + w.lane / 16);
            // SAFETY: forwarded to the caller (tile published, whole warp).
            unsafe { ldmatrix::x4_trans(addr) }
        };
        let mut b = load_v(0, 0);
        for kk in 0..NK {
            for dj in 0..DK {
                let nb = if dj + 1 < DK {
                    load_v(kk, dj + 1)
                } else if kk + 1 < NK {
                    load_v(kk + 1, 0)
                } else {
                    b
                };
                for mt in 0..MT {
                    // SAFETY: whole warp, uniform control flow.
                    unsafe {
                        E::mma(&mut o[mt][2 * dj], p[mt][kk], [b[0], b[1]]);
                        E::mma(&mut o[mt][2 * dj + 1], p[mt][kk], [b[2], b[3]]);
                    }
                }
                b = nb;
            }
        }
        return;
    }
    for kk in 0..NK {
        let mut a = [[0u32; 4]; MT];
        for mt in 0..MT {
            a[mt] = [
                E::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]),
                E::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]),
                E::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]),
                E::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]),
            ];
        }
        for dj in 0..DK {
            let addr =
                v_s + tile_offset::<D>(16 * kk as u32 + w.lane % 16, 2 * dj as u32 + w.lane / 16);
            // SAFETY: forwarded to the caller (tile published, whole warp).
            let b = unsafe { ldmatrix::x4_trans(addr) };
            for mt in 0..MT {
                // SAFETY: whole warp, uniform control flow.
                unsafe {
                    E::mma(&mut o[mt][2 * dj], a[mt], [b[0], b[1]]);
                    E::mma(&mut o[mt][2 * dj + 1], a[mt], [b[2], b[3]]);
                }
            }
        }
    }
}

/// Finish the row sums across the quad, normalize, store O and LSE (rows with no allowed key
/// get O = 0 and LSE = -inf).
#[inline(always)]
fn store_output<E: Elem, const MT: usize, const DT: usize>(
    p: &AttentionParams,
    w: &Warp,
    o: &[[[f32; 4]; DT]; MT],
    row_max: &[[f32; 2]; MT],
    row_sum: &[[f32; 2]; MT],
) {
    let (head, batch) = (index::block_idx_y(), index::block_idx_z());
    let o_base =
        p.o.wrapping_add((batch as u64 * p.o_strides[0] + head as u64 * p.o_strides[2]) as usize);
    for mt in 0..MT {
        for h in 0..2 {
            let mut sum = row_sum[mt][h];
            // SAFETY: all 32 lanes execute these shuffles.
            unsafe {
                sum += warp::shfl_xor_f32(warp::FULL_MASK, sum, 1);
                sum += warp::shfl_xor_f32(warp::FULL_MASK, sum, 2);
            }
            let (inv, lse) = if sum > 0.0 {
                (1.0 / sum, (row_max[mt][h] + math::log2(sum)) * math::LN_2)
            } else {
                (0.0, f32::NEG_INFINITY)
            };
            let row = w.warp_row + 16 * mt as u32 + w.g + 8 * h as u32;
            if row < w.rows_valid {
                let i = w.m0 + row;
                let dst = o_base.wrapping_add((i as u64 * p.o_strides[1]) as usize);
                for d in 0..DT {
                    let v = E::pack(o[mt][d][2 * h] * inv, o[mt][d][2 * h + 1] * inv);
                    // SAFETY: row i < seq_q and column 8 d + 2 t + 1 < D: inside O; the address
                    // is 4-byte aligned (16-byte aligned rows, even column).
                    unsafe { *(dst.wrapping_add(8 * d + 2 * w.t as usize) as *mut u32) = v };
                }
                if w.t == 0 {
                    let idx =
                        (batch as u64 * p.heads_q as u64 + head as u64) * p.seq_q as u64 + i as u64;
                    // SAFETY: idx < batch * heads_q * seq_q: inside LSE.
                    unsafe { *p.lse.add(idx as usize) = lse };
                }
            }
        }
    }
}

/// The forward pass; see the module documentation. `MT` m16 tiles per warp, `DT = D / 8`,
/// `DK = D / 16`, `NT = BN / 8`, `NK = BN / 16`, `WAIT = STAGES - 2` (the `cp.async` groups
/// that may stay in flight), `SM` the softmax mode's code (`Softmax::code`).
///
/// # Safety
/// Launched as documented on [`AttentionParams`], with the tile configuration `cfg`, whose
/// fields the const parameters repeat.
#[inline(always)]
unsafe fn forward<
    E: Elem,
    const D: u32,
    const MT: usize,
    const DT: usize,
    const DK: usize,
    const BM: u32,
    const BN: u32,
    const NT: usize,
    const NK: usize,
    const STAGES: u32,
    const WAIT: u32,
    const Q_REGS: bool,
    const PF: bool,
    const SM: u32,
    const THREADS: u32,
>(
    p: &AttentionParams,
    cfg: &TileConfig,
) {
    const { assert!(DT as u32 * 8 == D && DK as u32 * 16 == D) };
    const {
        assert!(
            NT as u32 * 8 == BN && NK as u32 * 16 == BN && BM / (16 * MT as u32) * 32 == THREADS
        )
    };
    const { assert!(STAGES >= 2 && WAIT == STAGES - 2) };
    let lane = index::lane_id();
    let m_block = if p.reverse_m != 0 {
        p.num_m_blocks - 1 - index::block_idx_x()
    } else {
        index::block_idx_x()
    };
    let (head, batch) = (index::block_idx_y(), index::block_idx_z());
    let head_kv = head / (p.heads_q / p.heads_kv);
    let m0 = m_block * BM;
    let w = Warp {
        lane,
        g: lane / 4,
        t: lane % 4,
        warp_row: index::warp_id() * 16 * MT as u32,
        m0,
        rows_valid: (p.seq_q - m0).min(BM),
        offset: p.seq_k as i32 - p.seq_q as i32,
        window_left: p.window_left,
        window_right: p.window_right,
        seq_k: p.seq_k as i32,
        scale_log2: p.scale_log2,
    };

    // Keys any row of this block may attend: [n_lo, n_hi).
    let first_row = m0 as i64;
    let last_row = (m0 + w.rows_valid - 1) as i64;
    let offset = w.offset as i64;
    let n_lo = if p.window_left >= 0 {
        (first_row + offset - p.window_left as i64).max(0)
    } else {
        0
    };
    let n_hi = if p.window_right >= 0 {
        (last_row + offset + p.window_right as i64 + 1).min(p.seq_k as i64)
    } else {
        p.seq_k as i64
    };

    let mut o = [[[0.0f32; 4]; DT]; MT];
    let mut row_max = [[f32::NEG_INFINITY; 2]; MT];
    let mut row_sum = [[0.0f32; 2]; MT];

    if n_hi > n_lo {
        let q_base = p
            .q
            .wrapping_add((batch as u64 * p.q_strides[0] + head as u64 * p.q_strides[2]) as usize);
        let k_base = p.k.wrapping_add(
            (batch as u64 * p.k_strides[0] + head_kv as u64 * p.k_strides[2]) as usize,
        );
        let v_base = p.v.wrapping_add(
            (batch as u64 * p.v_strides[0] + head_kv as u64 * p.v_strides[2]) as usize,
        );
        let smem = smem::aligned_base();
        let q_s = smem + cfg.q_offset() as u32;
        let k_s = |stage: u32| smem + cfg.k_offset(stage) as u32;
        let v_s = |stage: u32| smem + cfg.v_offset(stage) as u32;
        let nb_lo = (n_lo as u32) / BN;
        let steps = (n_hi as u32).div_ceil(BN) - nb_lo;
        let n0 = |step: u32| (nb_lo + step) * BN;
        let (ks, vs) = (p.k_strides[1], p.v_strides[1]);
        let load_kv = |step: u32, stage: u32| {
            let first = n0(step);
            let valid = (p.seq_k - first).min(BN);
            load_tile::<D, BN, THREADS>(k_s(stage), k_base, first as u64 * ks, ks, valid);
            load_tile::<D, BN, THREADS>(v_s(stage), v_base, first as u64 * vs, vs, valid);
        };

        // Prologue: Q and steps 0 .. STAGES - 2, one cp.async group each (empty past the end).
        let qs = p.q_strides[1];
        load_tile::<D, BM, THREADS>(q_s, q_base, m0 as u64 * qs, qs, w.rows_valid);
        for s in 0..STAGES - 1 {
            if s < steps {
                load_kv(s, s);
            }
            cp_async::commit_group();
        }
        let mut q_frag = [[[0u32; 4]; DK]; MT];

        {
            for step in 0..steps {
                cp_async::wait_group::<WAIT>();
                // SAFETY: barrier protocol step 2; every thread reaches it `steps` times.
                unsafe { sync::sync_threads() };
                let issue = step + STAGES - 1;
                if issue < steps {
                    load_kv(issue, issue % STAGES);
                }
                cp_async::commit_group();
                if Q_REGS && step == 0 {
                    for mt in 0..MT {
                        for kk in 0..DK {
                            q_frag[mt][kk] = q_fragment::<D>(&w, q_s, mt, kk);
                        }
                    }
                }
                let stage = step % STAGES;
                // SAFETY: the stage was published by the barrier of this iteration and is not
                // overwritten before the next one.
                let mut s =
                    unsafe { qk::<E, D, MT, DK, NT, NK, Q_REGS, PF>(&w, q_s, &q_frag, k_s(stage)) };
                if SM == 0 {
                    mask_and_scale::<MT, NT, BM, BN>(&w, &mut s, n0(step));
                    softmax_update::<MT, NT, DT>(&mut s, &mut o, &mut row_max, &mut row_sum);
                    // SAFETY: as for K above.
                    unsafe { pv::<E, D, MT, DT, DK, NT, NK, PF>(&w, &s, &mut o, v_s(stage)) };
                } else {
                    mask::<MT, NT, BM, BN>(&w, &mut s, n0(step));
                    let (m, l, c) = (&mut row_max, &mut row_sum, w.scale_log2);
                    let huge = softmax_folded_rescale::<MT, NT, DT>(&s, &mut o, m, l, c, SM == 2);
                    // The exponentials and P V in one basic block per branch, so that ptxas
                    // interleaves the MUFU and the tensor-core work.
                    if huge {
                        softmax_folded_p::<MT, NT, true>(&mut s, m, l, c);
                        // SAFETY: as for K above.
                        unsafe { pv::<E, D, MT, DT, DK, NT, NK, PF>(&w, &s, &mut o, v_s(stage)) };
                    } else {
                        softmax_folded_p::<MT, NT, false>(&mut s, m, l, c);
                        // SAFETY: as for K above.
                        unsafe { pv::<E, D, MT, DT, DK, NT, NK, PF>(&w, &s, &mut o, v_s(stage)) };
                    }
                }
            }
        }
        cp_async::wait_all();
    }
    store_output::<E, MT, DT>(p, &w, &o, &row_max, &row_sum);
}

/// The body of a kernel with element type `$elem` and tile configuration `$cfg` (a constant
/// expression) on the parameter struct `$p`.
macro_rules! attention_body {
    ($p:expr, $elem:ty, $cfg:expr) => {{
        const CFG: kernel_abi::attention::TileConfig = $cfg;
        forward::<
            $elem,
            { CFG.head_dim },
            { CFG.warp_m_tiles as usize },
            { (CFG.head_dim / 8) as usize },
            { (CFG.head_dim / 16) as usize },
            { CFG.block_m },
            { CFG.block_n },
            { (CFG.block_n / 8) as usize },
            { (CFG.block_n / 16) as usize },
            { CFG.stages },
            { CFG.stages - 2 },
            { CFG.q_in_registers },
            { CFG.prefetch },
            { CFG.softmax.code() },
            { CFG.threads() },
        >(&$p, &CFG)
    }};
}

/// Declare the kernels: the PTX entry points (with their launch bounds) and, in host builds,
/// the emulator's table of the same bodies.
macro_rules! attention_kernels {
    ($( $name:ident, $elem:ty, $cfg:expr; )*) => {
        $(
            /// See the module documentation (the tile configuration named in the macro call).
            ///
            /// # Safety
            /// Launched with grid `(num_m_blocks, heads_q, batch)`, the configuration's threads
            /// and shared memory, and parameters satisfying [`AttentionParams`]'s contract
            /// (validated by the host).
            #[cfg(target_arch = "nvptx64")]
            #[unsafe(no_mangle)]
            pub unsafe extern "ptx-kernel" fn $name(p: AttentionParams) {
                crate::launch_bounds!($name, $cfg.threads(), $cfg.blocks_per_sm);
                // SAFETY: forwarded to the caller.
                unsafe { attention_body!(p, $elem, $cfg) }
            }
        )*

        /// The kernels of this family, for the CPU emulator (`crate::emu`).
        #[cfg(not(target_arch = "nvptx64"))]
        pub const EMU_KERNELS: &[crate::emu::EmuKernel] = &[
            $(
                crate::emu::EmuKernel {
                    name: stringify!($name),
                    params: core::mem::size_of::<AttentionParams>(),
                    threads: $cfg.threads(),
                    run: {
                        unsafe fn run(p: *const u8) {
                            // SAFETY: the emulator passes a parameter struct of this kernel's
                            // type (it checks the size), whose contract the caller upholds.
                            unsafe {
                                let p = core::ptr::read_unaligned(p as *const AttentionParams);
                                attention_body!(p, $elem, $cfg)
                            }
                        }
                        run
                    },
                },
            )*
        ];
    };
}

attention_kernels! {
    attention_fwd_bf16_d64, Bf16, tile_config_of(64);
    attention_fwd_bf16_d128, Bf16, tile_config_of(128);
    attention_fwd_bf16_d256, Bf16, tile_config_of(256);
    attention_fwd_f16_d64, F16, tile_config_of(64);
    attention_fwd_f16_d128, F16, tile_config_of(128);
    attention_fwd_f16_d256, F16, tile_config_of(256);
    // Tuning variants (`kernel_abi::attention::TUNING_VARIANTS`, in order).
    attention_fwd_bf16_d128_mt1, Bf16, TUNING_VARIANTS[0].1;
    attention_fwd_bf16_d128_n64, Bf16, TUNING_VARIANTS[1].1;
    attention_fwd_bf16_d128_n64pf, Bf16, TUNING_VARIANTS[2].1;
    attention_fwd_bf16_d256_n32, Bf16, TUNING_VARIANTS[3].1;
    attention_fwd_bf16_d128_ffma, Bf16, TUNING_VARIANTS[4].1;
    attention_fwd_bf16_d128_scaled, Bf16, TUNING_VARIANTS[5].1;
    attention_fwd_bf16_d128_n64lazy, Bf16, TUNING_VARIANTS[6].1;
}
