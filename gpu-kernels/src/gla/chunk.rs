//! The math shared by the GLA kernels ([`super::baseline`] and, on sm_90a, `super::pingpong`):
//! the chunkwise form and its numerical stability, the operand formulas of one
//! (token, channel), the chunk's edge cumulative decays, the intra-chunk scores, and
//! [`ChunkTiles`], through which an element-wise phase addresses its kernel's tiles.
//!
//! # The chunkwise form and its stability
//! A kernel walks a segment in chunks of 16 tokens with the state `S` (`DK x DV`, f32) in
//! registers. Inside a chunk let `b_t` be the cumulative log-decay from the chunk start,
//! inclusive, in log2 units (`g` clamped below at `G_FLOOR`, times `log2 e`). Then
//! - `o_t = scale [(q_t 2^{b_t}) S + sum_{s <= t} (q_t . k_s 2^{b_t - b_s}) v_s]`,
//! - `S <- 2^{b_15} S + sum_s (k_s 2^{b_15 - b_s})^T v_s`.
//!
//! Values below `2^-126` may be lost: `ex2.approx.ftz` flushes them to 0 (and the tensor cores
//! and the bf16 conversion need not keep subnormals). A lost value is harmless when every product
//! it enters is itself negligible. The intra-chunk score `2^{b_t - b_s}` must be split into a
//! row factor and a column factor for the tensor cores; relative to one reference point per 16
//! tokens, one of them can reach `2^{15 * 28.9}` and overflow. So the 16 x 16 block is split in
//! halves of 8 tokens with midpoints `M_h = (b_{8h} + b_{8h+7}) / 2`:
//! - rows of half h use `q_diag_t = q_t 2^{b_t - M_h}`;
//! - (half 0, half 0) scores pair it with `k_half0_s = k_s 2^{M_0 - b_s}`;
//! - (half 1, any) scores pair it with `k_half1_s = k_s 2^{M_1 - b_s}` (`<= 1` for `s` in half
//!   0, since `M_1 <= b_7 <= b_s`);
//! - (half 0, half 1) is masked (future tokens).
//!
//! Within a half `|b_t - M_h| <= 3.5 * 20 * log2(e) = 101` (log2), so these factors lie in
//! `[2^-101, 2^101]`, inside the normal range of f32 and bf16 (`2^+-126`), except `k_half1` in
//! half 0, which may be tiny; when it is below `2^-126`, its scores (with `q_diag <= 2^101`) are
//! below `2^-25`. Kept scores are products with exponent `<= 0`; masked ones may overflow in the
//! tensor cores and are replaced by 0 with a select (never a multiply), so an infinity or NaN
//! there never propagates. The other operands are derived from these by factors `<= 1`:
//! - `q_inter = q_diag 2^{M_h}` (`= q 2^{b_t}`): the factor is flushed only if `M_h < -126`, and
//!   then `q_inter < 2^{101 - 126}`: the inter-chunk term lost is below `2^-25 |q| |S|`;
//! - `k_state = k_half1 2^{b_15 - M_1}` (`= k 2^{b_15 - b_s}`): likewise, a lost term is below
//!   `2^-25 |k| |v|` (in half 1; in half 0 both factors are `<= 1`, so nothing is lost that is
//!   not itself below `2^-126`);
//! - `k_half1 = k_half0 2^{M_1 - M_0}` in half 0: this factor alone can lie far below `2^-126`
//!   (down to `2^{-8 * 28.9}`) while `k_half1` does not (`k_half0` reaches `2^101`): flushed, it
//!   would drop whole channels of the (half 1, half 0) scores, which are of order 1 at rows 8-9
//!   (spiky decays reach this case). So it is applied as two equal factors
//!   `r = 2^{(M_1 - M_0) / 2} >= 2^{-4 * 28.9} = 2^-115.4`, normal: `k_half1 = (k_half0 r) r`,
//!   whose intermediate is at least `k_half1`, so nothing is lost unless `k_half1 < 2^-126`.
//!
//! So every term the kernels drop is below `2^-25` times the magnitudes of its factors, for `g`
//! down to `G_FLOOR = -20` (the larger bound, 115.4 < 126, is asserted at compile time).
//! Hence two `ex2` per (token, channel), plus five per channel and chunk.

use crate::arch::{convert, ldmatrix, math, mma, warp};
use kernel_abi::gla::GlaConfig;

/// `d += a b` (bf16 `mma.sync.m16n8k16`).
///
/// # Safety
/// Whole warp, uniform control flow.
#[inline(always)]
pub(crate) unsafe fn mma_bf16(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
    // SAFETY: forwarded to the caller.
    unsafe { mma::m16n8k16_bf16(d, a, b) }
}

/// `shfl.sync.idx` of an f32 over the full warp.
///
/// # Safety
/// All 32 lanes execute the call.
#[inline(always)]
pub(crate) unsafe fn shfl_f32(v: f32, src: u32) -> f32 {
    // SAFETY: forwarded to the caller (full warp).
    unsafe { warp::shfl_idx_f32(warp::FULL_MASK, v, src) }
}

/// The raw input tiles the element-wise phase reads.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Raw {
    Q,
    K,
    G,
}

impl Raw {
    /// The one of the three tile addresses this names.
    #[inline(always)]
    pub(crate) fn pick(self, q: u32, k: u32, g: u32) -> u32 {
        match self {
            Raw::Q => q,
            Raw::K => k,
            Raw::G => g,
        }
    }
}

/// The operand tiles the element-wise phase writes.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Var {
    QInter,
    QDiag,
    KHalf0,
    KHalf1,
    KState,
}

/// Where the element-wise phase of one chunk reads and writes: shared-memory byte addresses of
/// (chunk row `0..16`, byte column) in each tile, and of the chunk's decay row. The baseline
/// kernels use padded rows ([`Variants`]); the pingpong kernels swizzled TMA tiles.
pub(crate) trait ChunkTiles {
    /// Address of `(row, col)` of raw tile `t`.
    fn raw(&self, t: Raw, row: u32, col: u32) -> u32;
    /// Address of `(row, col)` of operand tile `t`.
    fn var(&self, t: Var, row: u32, col: u32) -> u32;
    /// Address of the chunk's decay row (`DK` f32).
    fn decay(&self) -> u32;
}

/// `b_0, b_7, b_8, b_15` of each of the thread's `C` channels: the chunk's `P` lanes from
/// `base_lane` hold runs of `TPT` tokens of the cumulative sums `b`, in token order.
///
/// # Safety
/// All 32 lanes execute the call (uniform control flow).
#[inline(always)]
pub(crate) unsafe fn chunk_edges<const C: usize, const TPT: usize, const P: u32>(
    b: &[[f32; C]; TPT],
    base_lane: u32,
) -> [[f32; C]; 4] {
    let mut edge = [[0.0f32; C]; 4];
    for c in 0..C {
        // SAFETY: every lane executes the shuffles (the caller's contract).
        unsafe {
            edge[0][c] = shfl_f32(b[0][c], base_lane);
            edge[1][c] = shfl_f32(b[TPT - 1][c], base_lane + P / 2 - 1);
            edge[2][c] = shfl_f32(b[0][c], base_lane + P / 2);
            edge[3][c] = shfl_f32(b[TPT - 1][c], base_lane + P - 1);
        }
    }
    edge
}

/// The operand values of one (token, channel) of a chunk (see the module documentation), from
/// `q`, `k`, `x = b_t - M_h` and the channel's factors `f = [2^{M_h}, r, 2^{b_15 - M_1}]` with
/// `r = 2^{(M_1 - M_0) / 2}` in half 0 and 1 in half 1: `[q_diag, k_half0, q_inter, k_half1,
/// k_state]` (`k_half1` through `r` twice, never through the possibly flushed
/// `2^{M_1 - M_0}`).
#[inline(always)]
pub(crate) fn chunk_operands(q: f32, k: f32, x: f32, f: [f32; 3]) -> [f32; 5] {
    let [f_inter, f_10_root, f_state] = f;
    let qd = q * math::exp2(x);
    let kd = k * math::exp2(-x);
    let kh1 = kd * f_10_root * f_10_root;
    [qd, kd, qd * f_inter, kh1, kh1 * f_state]
}

/// The intra-chunk scores of one chunk (one warp; see the module documentation): `q_diag`
/// against `k_half0` (rows of half 0) and `k_half1` (rows of half 1), masked to `s <= t` with
/// selects (so masked infinities vanish), as the A fragment of `o += P v` (rows `t`, k = `s`):
/// `[P[g][2t..], P[g+8][2t..], P[g][8+2t..] = 0, P[g+8][8+2t..]]`, bf16 pairs. The tile
/// addresses are those of the chunk's first row, in padded rows.
///
/// # Safety
/// Whole warp, uniform control flow; the tiles were published by a barrier.
#[inline(always)]
pub(crate) unsafe fn intra_scores<const DK: u32, const NKK: usize>(
    lane: u32,
    q_diag: u32,
    k_half0: u32,
    k_half1: u32,
) -> [u32; 4] {
    let rb = const { GlaConfig::row_bytes(DK) };
    let mut x = [0.0f32; 4];
    let mut y = [0.0f32; 4];
    let mut z = [0.0f32; 4];
    for kk in 0..NKK {
        let kc = 2 * kk as u32;
        // SAFETY: published tiles (the caller's contract), rows < 16 (8 for k_half0).
        unsafe {
            let qa = ldmatrix::x4(q_diag + (lane % 16) * rb + (kc + lane / 16) * 16);
            let b0 = ldmatrix::x2(k_half0 + (lane % 8) * rb + (kc + (lane / 8) % 2) * 16);
            let b1 = ldmatrix::x4(
                k_half1 + (lane % 8 + (lane / 16) * 8) * rb + (kc + (lane / 8) % 2) * 16,
            );
            mma_bf16(&mut x, qa, b0);
            mma_bf16(&mut y, qa, [b1[0], b1[1]]);
            mma_bf16(&mut z, qa, [b1[2], b1[3]]);
        }
    }
    let (g, t) = (lane / 4, lane % 4);
    // Keep s <= t within each half (select, so masked infinities vanish); (half 1, half 0)
    // from y; (half 0, half 1) is zero.
    let keep0 = 2 * t <= g;
    let keep1 = 2 * t < g;
    let sel = |keep: bool, v: f32| if keep { v } else { 0.0 };
    [
        convert::pack_bf16x2(sel(keep0, x[0]), sel(keep1, x[1])),
        convert::pack_bf16x2(y[2], y[3]),
        convert::pack_bf16x2(0.0, 0.0),
        convert::pack_bf16x2(sel(keep0, z[2]), sel(keep1, z[3])),
    ]
}
