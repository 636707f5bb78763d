//! GLA chunkwise backward: what its kernels (`gpu-kernels/src/gla/backward`) and the host
//! (`host/src/gla/backward.rs`) share. The gradients are specified by the f64 reverse sweep in
//! `host/src/gla/reference/backward.rs`; the design is in bench/NOTES.md ("GLA backward: plan").
//!
//! # Kernels
//! - `gla_bwd_dhdv_dk{DK}_dv{DV}`: the reverse pass. One block per (segment, head) walks its
//!   segment's chunks in reverse, from the gradient of the segment's end state (`dL/dS_final`
//!   for a sequence's last segment, else zero), keeping `G = dL/dS` (`DK x DV`, f32) in
//!   registers. Per chunk of [`CHUNK`] tokens, with inclusive cumulative log-decays `b_t` from
//!   the chunk start, `B = b` of its last token and `G` the gradient at the chunk's end from
//!   everything after it:
//!   - `dv_s = sum_{t >= s in the chunk} scale (q_t . (k_s exp(b_t - b_s))) dO_t +
//!     (k_s exp(B - b_s)) G` (the chunk's own outputs, then everything after it);
//!   - `G <- exp(B) G + scale sum_t (q_t exp(b_t))^T dO_t` (the gradient at the chunk's start).
//!
//!   Before each [`G_BLOCK`]-token block of the segment (in reverse) it stores `G`, the
//!   gradient of the state at the block's end from everything after it, in a slot of `grad`
//!   ([`grad_slot`]); after the segment's first chunk, `G` is the gradient of its initial state
//!   (`d_init_state` for a sequence's first segment). A segment that is not the last of its
//!   sequence starts from `seg_end`, written by `gla_bwd_combine`.
//! - `gla_bwd_states_dk{DK}_dv{DV}`: the same walk from a zero gradient, for every segment of a
//!   split sequence that is not the first, without dv or stored gradients: the gradient the
//!   segment adds at its start (`delta`) and its total log2-decay per key channel
//!   (`decay_log2`), as the forward's `gla_states` (whose workspace layout it shares).
//! - `gla_bwd_combine` ([`CombineParams`], read backward): per split sequence, head and state
//!   element, the gradient at the end of every segment but the last, from the sequence's end:
//!   `seg_end_{i-1} = exp2(D_i) seg_end_i + delta_i` with `seg_end_last = dL/dS_final` (or 0).
//!
//! - `gla_bwd_dqkg_dk{DK}_dv{DV}` ([`DqkgParams`]): dq, dk and dg. One block per (segment,
//!   head) walks its segment token by token, twice, with the state in registers
//!   ([`DQKG_LANES`] threads per key channel, each holding `DV / DQKG_LANES` value columns of
//!   it): forward from the segment's initial state `S` (the user's initial state or zero for a
//!   sequence's first segment, else `seg_init` from the forward's own `gla_states` and
//!   `gla_combine`), `S <- diag(a_t) S + k_t^T v_t`, `dq_t = scale dO_t S^T`; then backward
//!   from the gradient of the segment's end state `G` (as `gla_bwd_dhdv`),
//!   `G <- G + scale q_t^T dO_t`, `dk_t = v_t G^T`, `G <- diag(a_t) G`. dg is the reverse
//!   cumulative sum over the segment of `q dq - k dk` plus `rowsum(S_end * G_end)` (what the
//!   segment's log-decays give through its end state), zero where `g < G_FLOOR`; the first
//!   walk leaves `q dq` (f32) in `dg` for the second.
//!
//! - `gla_bwd_dqkg_tc_dk{DK}_dv{DV}` ([`DqkgTcParams`]): dq, dk and dg chunkwise on tensor cores
//!   (the default; `gla_bwd_dqkg` is its reference on the device). One block per (segment,
//!   head), [`tc_threads`] threads (warp `w` owns key channels `16 w ..+ 16` of the state and
//!   of its gradient), walks its segment forward one [`G_BLOCK`]-token block at a time from the
//!   segment's initial state, reading the block's end gradient `G` from the reverse pass's
//!   `grad`. Per chunk of [`CHUNK`] tokens, with `b_t` the inclusive cumulative log-decays from
//!   the chunk start, `B = b_15`, `S` the state at the chunk's start, `G` the gradient at its
//!   end and `dA[t][s] = scale dO_t . v_s`: `dq_t = sum_{s <= t} dA[t][s] exp(b_t - b_s) k_s +
//!   scale exp(b_t) (S dO_t)`, `dk_s = sum_{t >= s} dA[t][s] exp(b_t - b_s) q_t + exp(B - b_s)
//!   (G v_s)`; dg as for `gla_bwd_dqkg`, from the same sums without the diagonal terms
//!   `s = t` (which cancel exactly in `q dq - k dk`).
//!
//! The reverse pass's shared-memory layout and block size are the forward's ([`GlaConfig`]): q,
//! k, g and dO take the forward ring's q, k, g and v tiles, the chunk's operands its variant
//! buffers. `gla_bwd_dqkg` stages [`DQKG_STEP`] tokens of q, k, g, v, dO at a time as f32
//! ([`dqkg_smem_bytes`]).

use super::{CHUNK, COMBINE_THREADS, CombineParams, GlaConfig, Segment, config_of};
use crate::{Kernel, KernelDecl, SMEM_ALIGN};

/// Tokens per block of the stored state gradients: the backward keeps `dL/dS` at the end of
/// every block of this many tokens of a segment (counted from the segment's start; the last
/// block may be shorter), so the `dq`/`dk`/`dv`/`dg` walk reads one `DK x DV` gradient per
/// block instead of per chunk.
pub const G_BLOCK: u32 = 64;
/// Chunks per [`G_BLOCK`].
pub const CHUNKS_PER_G_BLOCK: u32 = G_BLOCK / CHUNK;

/// The slot of `grad` holding the gradient at the end of block `j` of segment `slot` (the
/// segment's index in the table) that starts at token row `start`: `start / G_BLOCK + slot + j`.
/// Distinct for all (segment, block) pairs of a table of consecutive disjoint segments, and
/// below [`grad_slots`]: block `j` of a segment of `len` tokens satisfies
/// `start / 64 + ceil(len / 64) <= ceil((start + len) / 64)`, and the next segment's first
/// slot is at least `(start + len) / 64 + slot + 1`.
#[inline]
pub const fn grad_slot(start: u32, slot: u32, j: u32) -> u32 {
    start / G_BLOCK + slot + j
}

/// Slots of `grad` for `rows` token rows cut into `segments` segments:
/// `ceil(rows / G_BLOCK) + segments` (an upper bound of every [`grad_slot`] plus one).
#[inline]
pub const fn grad_slots(rows: usize, segments: usize) -> usize {
    rows.div_ceil(G_BLOCK as usize) + segments
}

/// Parameters of `gla_bwd_dhdv_dk{DK}_dv{DV}` (grid `(segments, heads)`,
/// [`GlaConfig::threads`] threads, [`GlaConfig::smem_bytes`]).
///
/// Tensors are contiguous: q, k, g `[rows, heads, dk]`, dO and dv `[rows, heads, dv]` (bf16
/// bits); state gradients `[seqs, heads, dk, dv]` f32; `grad` `[grad_slots, heads, dk, dv]`
/// f32.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DhdvParams {
    /// Queries.
    pub q: *const u16,
    /// Keys.
    pub k: *const u16,
    /// Log-decays (natural log, clamped below at `G_FLOOR` as in the forward).
    pub g: *const u16,
    /// Gradient of the outputs.
    pub d_o: *const u16,
    /// Written: gradient of the values.
    pub d_v: *mut u16,
    /// The segment table (`gridDim.x` entries).
    pub segments: *const Segment,
    /// Gradient of the final states, read by last segments when `has_d_final != 0`.
    pub d_final_state: *const f32,
    /// Written by first segments: gradient of the initial states.
    pub d_init_state: *mut f32,
    /// Written: the gradient at every block end ([`grad_slot`]).
    pub grad: *mut f32,
    /// Gradient at the end of every segment that is not last, `[segments, heads, dk, dv]`
    /// (written by `gla_bwd_combine`, read by `gla_bwd_dhdv`).
    pub seg_end: *const f32,
    /// Gradient each segment adds at its start from a zero end gradient, `[segments, heads,
    /// dk, dv]` (written by `gla_bwd_states`).
    pub delta: *mut f32,
    /// Total log2-decay of each segment per key channel, `[segments, heads, dk]` (written by
    /// `gla_bwd_states`).
    pub decay_log2: *mut f32,
    /// Heads.
    pub heads: u32,
    /// Output scale of the forward.
    pub scale: f32,
    /// Whether `d_final_state` is given.
    pub has_d_final: u32,
    /// Unused (keeps the struct a multiple of 8 bytes).
    pub pad: u32,
}

/// Threads of `gla_bwd_dqkg` per key channel (state row): each holds every
/// `DQKG_LANES`-th value column of the row, and the row's dot products are summed over these
/// lanes with warp shuffles (no barrier per token).
pub const DQKG_LANES: u32 = 4;
/// Tokens of q, k, g, v, dO that `gla_bwd_dqkg` stages in shared memory at a time.
pub const DQKG_STEP: u32 = 16;

/// Threads per block of `gla_bwd_dqkg` for key dimension `dk`.
pub const fn dqkg_threads(dk: u32) -> u32 {
    dk * DQKG_LANES
}

/// Offsets (bytes from the aligned base) of the staged q, k, g, v, dO rows of `gla_bwd_dqkg`
/// (`[DQKG_STEP][d]` f32 each), and the end of the last.
pub const fn dqkg_layout(dk: u32, dv: u32) -> [u32; 6] {
    let (rk, rv) = (DQKG_STEP * dk * 4, DQKG_STEP * dv * 4);
    [0, rk, 2 * rk, 3 * rk, 3 * rk + rv, 3 * rk + 2 * rv]
}

/// Dynamic shared memory of `gla_bwd_dqkg` (the staged rows and the alignment slack).
pub const fn dqkg_smem_bytes(dk: u32, dv: u32) -> usize {
    dqkg_layout(dk, dv)[5] as usize + SMEM_ALIGN
}

/// Parameters of `gla_bwd_dqkg_dk{DK}_dv{DV}` (grid `(segments, heads)`, [`dqkg_threads`]
/// threads, [`dqkg_smem_bytes`]).
///
/// Tensors are contiguous: q, k, g, dq, dk, dg `[rows, heads, dk]`, v, dO `[rows, heads, dv]`
/// (bf16 bits but dg, f32); states and state gradients `[seqs, heads, dk, dv]` f32, the
/// per-segment ones `[segments, heads, dk, dv]` f32.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DqkgParams {
    /// Queries.
    pub q: *const u16,
    /// Keys.
    pub k: *const u16,
    /// Values.
    pub v: *const u16,
    /// Log-decays (natural log, clamped below at `G_FLOOR` as in the forward).
    pub g: *const u16,
    /// Gradient of the outputs.
    pub d_o: *const u16,
    /// Written: gradient of the queries.
    pub d_q: *mut u16,
    /// Written: gradient of the keys.
    pub d_k: *mut u16,
    /// Written: gradient of the log-decays (f32; zero where `g < G_FLOOR`).
    pub d_g: *mut f32,
    /// The segment table (`gridDim.x` entries).
    pub segments: *const Segment,
    /// The forward's initial states, read by first segments when `has_init != 0`.
    pub init_state: *const f32,
    /// The forward state at the start of every segment that is not first (written by the
    /// forward's `gla_combine`).
    pub seg_init: *const f32,
    /// Gradient of the final states, read by last segments when `has_d_final != 0`.
    pub d_final_state: *const f32,
    /// Gradient at the end of every segment that is not last (written by `gla_bwd_combine`).
    pub seg_end: *const f32,
    /// Heads.
    pub heads: u32,
    /// Output scale of the forward.
    pub scale: f32,
    /// Whether `init_state` is given.
    pub has_init: u32,
    /// Whether `d_final_state` is given.
    pub has_d_final: u32,
}

/// Threads per block of `gla_bwd_dqkg_tc` for key dimension `dk`: a warp per 16 key channels.
pub const fn tc_threads(dk: u32) -> u32 {
    dk / 16 * crate::WARP_SIZE
}

/// Bytes between the high and the low tile of an operand pair of `gla_bwd_dqkg_tc` beyond the
/// tile itself: the f32 tiles stored over a pair put a warp's channels 0..8 in the high tile
/// and 8..16 in the low one, and this skew puts the two halves of a row in distinct banks.
pub const TC_PAIR_SKEW: u32 = 64;

/// Shared-memory layout of `gla_bwd_dqkg_tc` (byte offsets from the aligned base). Tiles of
/// [`G_BLOCK`] rows, bf16 rows padded to [`GlaConfig::row_bytes`].
#[derive(Clone, Copy, Debug)]
pub struct TcLayout {
    /// Raw q, k, g rows (bf16, `dk` wide).
    pub q: u32,
    /// Raw keys.
    pub k: u32,
    /// Raw log-decays.
    pub g: u32,
    /// Raw v rows (bf16, `dv` wide).
    pub v: u32,
    /// Raw dO rows (bf16, `dv` wide).
    pub d_o: u32,
    /// `scale q exp(b)` (bf16, `dk` wide): the gradient update's operand; with `q_dec_lo`,
    /// then `G v^T` per token (f32: dk's inter-chunk part before its decay).
    pub q_dec: u32,
    /// What `q_dec` leaves of `scale q exp(b)` (bf16): the low part of the operand.
    pub q_dec_lo: u32,
    /// `k exp(B - b)` (bf16, `dk` wide): the state update's operand; with `k_dec_lo`, then
    /// `S dO^T` per token (f32: dq's inter-chunk part before its decay and scale).
    pub k_dec: u32,
    /// What `k_dec` leaves of `k exp(B - b)` (bf16).
    pub k_dec_lo: u32,
    /// `dA` of each chunk, `[CHUNKS_PER_G_BLOCK][16][16]` f32.
    pub d_a: u32,
    /// `exp(B)` of each chunk, `[CHUNKS_PER_G_BLOCK][dk]` f32.
    pub chunk_decay: u32,
    /// What the segment's log-decays give through its end state, `[dk]` f32.
    pub through_end: u32,
    /// The dg carried into each chunk from everything after it, `[CHUNKS_PER_G_BLOCK][dk]` f32
    /// (after the walk, in the place of `chunk_decay`).
    pub carry: u32,
    /// End of the layout.
    pub end: u32,
}

/// The [`TcLayout`] of head dimensions `(dk, dv)`.
pub const fn tc_layout(dk: u32, dv: u32) -> TcLayout {
    let (bk, bv) = (
        G_BLOCK * GlaConfig::row_bytes(dk),
        G_BLOCK * GlaConfig::row_bytes(dv),
    );
    let q = 0;
    let k = q + bk;
    let g = k + bk;
    let v = g + bk;
    let d_o = v + bv;
    let q_dec = d_o + bv;
    let q_dec_lo = q_dec + bk + TC_PAIR_SKEW;
    let k_dec = q_dec_lo + bk;
    let k_dec_lo = k_dec + bk + TC_PAIR_SKEW;
    let d_a = k_dec_lo + bk;
    let chunk_decay = d_a + CHUNKS_PER_G_BLOCK * CHUNK * CHUNK * 4;
    let through_end = chunk_decay + CHUNKS_PER_G_BLOCK * dk * 4;
    let carry = chunk_decay;
    let end = through_end + dk * 4;
    TcLayout {
        q,
        k,
        g,
        v,
        d_o,
        q_dec,
        q_dec_lo,
        k_dec,
        k_dec_lo,
        d_a,
        chunk_decay,
        through_end,
        carry,
        end,
    }
}

/// Dynamic shared memory of `gla_bwd_dqkg_tc` (the layout and the alignment slack).
pub const fn tc_smem_bytes(dk: u32, dv: u32) -> usize {
    tc_layout(dk, dv).end as usize + SMEM_ALIGN
}

/// Parameters of `gla_bwd_dqkg_tc_dk{DK}_dv{DV}` (grid `(segments, heads)`, [`tc_threads`]
/// threads, [`tc_smem_bytes`]): those of `gla_bwd_dqkg` and the reverse pass's block
/// gradients.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DqkgTcParams {
    /// As for `gla_bwd_dqkg`, but `seg_end` and `d_final_state` are not read (a segment's end
    /// gradient is its last block's slot of `grad`); `d_g` is also the kernel's f32 scratch
    /// (the per-chunk sums before the carry from later chunks is added).
    pub base: DqkgParams,
    /// The gradient at the end of every block of every segment ([`grad_slot`]), `[grad_slots,
    /// heads, dk, dv]` f32, written by `gla_bwd_dhdv`.
    pub grad: *const f32,
}

/// Declare the handles of each head-dimension pair's backward kernels, the table and the
/// lookup.
macro_rules! bwd_kernels {
    ($( ($dk:literal, $dv:literal): $dhdv:ident, $states:ident, $dqkg:ident, $tc:ident; )*) => {
        $(
            #[doc = concat!("`gla_bwd_dhdv_dk", stringify!($dk), "_dv", stringify!($dv), "`: ",
                "grid `(segments, heads)`, [`GlaConfig::threads`] threads, ",
                "[`GlaConfig::smem_bytes`].")]
            pub const $dhdv: Kernel<DhdvParams> = Kernel::new(
                concat!("gla_bwd_dhdv_dk", stringify!($dk), "_dv", stringify!($dv)),
                config_of($dk, $dv).threads(),
                config_of($dk, $dv).blocks_per_sm,
                |()| config_of($dk, $dv).smem_bytes(),
            );
            #[doc = concat!("`gla_bwd_states_dk", stringify!($dk), "_dv", stringify!($dv), "`: ",
                "launched as the reverse-pass kernel of the pair.")]
            pub const $states: Kernel<DhdvParams> = Kernel::new(
                concat!("gla_bwd_states_dk", stringify!($dk), "_dv", stringify!($dv)),
                config_of($dk, $dv).threads(),
                config_of($dk, $dv).blocks_per_sm,
                |()| config_of($dk, $dv).smem_bytes(),
            );
            #[doc = concat!("`gla_bwd_dqkg_dk", stringify!($dk), "_dv", stringify!($dv), "`: ",
                "grid `(segments, heads)`, [`dqkg_threads`] threads, [`dqkg_smem_bytes`].")]
            pub const $dqkg: Kernel<DqkgParams> = Kernel::new(
                concat!("gla_bwd_dqkg_dk", stringify!($dk), "_dv", stringify!($dv)),
                dqkg_threads($dk),
                1,
                |()| dqkg_smem_bytes($dk, $dv),
            );
            #[doc = concat!("`gla_bwd_dqkg_tc_dk", stringify!($dk), "_dv", stringify!($dv),
                "`: grid `(segments, heads)`, [`tc_threads`] threads, [`tc_smem_bytes`].")]
            pub const $tc: Kernel<DqkgTcParams> = Kernel::new(
                concat!("gla_bwd_dqkg_tc_dk", stringify!($dk), "_dv", stringify!($dv)),
                tc_threads($dk),
                1,
                |()| tc_smem_bytes($dk, $dv),
            );
        )*

        /// The backward's kernels (part of the family's table `kernel_abi::gla::KERNELS`).
        pub const KERNELS: [KernelDecl; 17] = [
            $( $dhdv.info(), $states.info(), )*
            GLA_BWD_COMBINE.info(),
            $( $dqkg.info(), )*
            $( $tc.info(), )*
        ];

        /// The chunkwise dq, dk, dg kernel `gla_bwd_dqkg_tc` of head dimensions `(dk, dv)`,
        /// if any.
        pub const fn dqkg_tc_kernel(dk: u32, dv: u32) -> Option<&'static Kernel<DqkgTcParams>> {
            match (dk, dv) {
                $( ($dk, $dv) => Some(&$tc), )*
                _ => None,
            }
        }

        /// The dq, dk, dg kernel `gla_bwd_dqkg` of head dimensions `(dk, dv)`, if any.
        pub const fn dqkg_kernel(dk: u32, dv: u32) -> Option<&'static Kernel<DqkgParams>> {
            match (dk, dv) {
                $( ($dk, $dv) => Some(&$dqkg), )*
                _ => None,
            }
        }

        /// The reverse-pass kernels `(gla_bwd_dhdv, gla_bwd_states)` of head dimensions
        /// `(dk, dv)`, if any.
        pub const fn reverse_kernels(
            dk: u32,
            dv: u32,
        ) -> Option<(&'static Kernel<DhdvParams>, &'static Kernel<DhdvParams>)> {
            match (dk, dv) {
                $( ($dk, $dv) => Some((&$dhdv, &$states)), )*
                _ => None,
            }
        }
    };
}

bwd_kernels! {
    (64, 64): GLA_BWD_DHDV_DK64_DV64, GLA_BWD_STATES_DK64_DV64, GLA_BWD_DQKG_DK64_DV64,
        GLA_BWD_DQKG_TC_DK64_DV64;
    (64, 128): GLA_BWD_DHDV_DK64_DV128, GLA_BWD_STATES_DK64_DV128, GLA_BWD_DQKG_DK64_DV128,
        GLA_BWD_DQKG_TC_DK64_DV128;
    (128, 64): GLA_BWD_DHDV_DK128_DV64, GLA_BWD_STATES_DK128_DV64, GLA_BWD_DQKG_DK128_DV64,
        GLA_BWD_DQKG_TC_DK128_DV64;
    (128, 128): GLA_BWD_DHDV_DK128_DV128, GLA_BWD_STATES_DK128_DV128, GLA_BWD_DQKG_DK128_DV128,
        GLA_BWD_DQKG_TC_DK128_DV128;
}

/// `gla_bwd_combine`: grid `(split sequences, heads, ceil(dk dv / COMBINE_THREADS))`,
/// [`COMBINE_THREADS`] threads, no dynamic shared memory. Its [`CombineParams`] read
/// backward: `init_state` is the final-state gradient (when `has_init != 0`), `seg_init` the
/// written `seg_end`, `delta` and `decay_log2` those of `gla_bwd_states`.
pub const GLA_BWD_COMBINE: Kernel<CombineParams> =
    Kernel::new("gla_bwd_combine", COMBINE_THREADS, 1, |()| 0);

/// `negative_gla_bwd_no_carry_barrier`: `gla_bwd_dqkg_tc_dk64_dv64` without the barrier
/// between the carry pass's stores of each chunk's carry and every thread's reads of them (barrier
/// F of its protocol), a negative control for the test suites (`gpu-kernels/src/negative.rs`);
/// the launch shape, parameters and shared memory of [`GLA_BWD_DQKG_TC_DK64_DV64`].
pub const NEGATIVE_GLA_BWD_NO_CARRY_BARRIER: Kernel<DqkgTcParams> = Kernel::new(
    "negative_gla_bwd_no_carry_barrier",
    tc_threads(64),
    1,
    |()| tc_smem_bytes(64, 64),
);

/// The backward's negative controls (never launched by the library).
pub const NEGATIVE: &[KernelDecl] = &[NEGATIVE_GLA_BWD_NO_CARRY_BARRIER.info()];

// The configuration's element-wise mapping must cover a chunk with whole runs (as the
// forward's), and a block of stored gradients whole chunks.
const _: () = {
    assert!(G_BLOCK.is_multiple_of(CHUNK));
    let c: GlaConfig = config_of(64, 128);
    assert!(c.threads_per_pair() * c.tokens_per_thread() == CHUNK);
    // gla_bwd_dqkg: a key channel's lanes are consecutive lanes of one warp, its value columns
    // split evenly among them, and a block fits the hardware.
    assert!(32 % DQKG_LANES == 0 && 64 % DQKG_LANES == 0 && dqkg_threads(128) <= 1024);
    // gla_bwd_dqkg_tc: a warp per chunk of a block for dA, its largest layout fits an SM.
    assert!(tc_threads(64) / crate::WARP_SIZE >= CHUNKS_PER_G_BLOCK);
    assert!(tc_smem_bytes(128, 128) <= 227 * 1024);
};
