//! mHC (manifold-constrained hyper-connections, DeepSeek, arXiv 2512.24880): what the kernels of
//! `gpu-kernels/src/mhc/` and the host launchers of `host/src/mhc/` agree on.
//!
//! Notation (used throughout the family): `T = B S` tokens, `n` residual streams of `C` channels,
//! `K = n C` (the flattened token `x~`), `M = n^2 + 2 n` coefficients per token, in the order
//! `pre [0, n)`, `post [n, 2n)`, `res [2n, 2n + n^2)` (row-major `(i, j)`).
//!
//! Every tensor is contiguous and row-major: `x [T, n, C]` = `[T, K]`, `y [T, C]`, `phi [K, M]`.
//!
//! Tensor-core fragment packings (`f1_*`, `b2_*`) are defined here once, as index functions that
//! the packing kernel, the consuming kernels and the host tests all use. Every function is
//! `#[inline]`: kernels call them with run-time arguments, and the kernel crate's PTX must not
//! reference functions of this crate.

use crate::{Kernel, KernelDecl, WARP_SIZE};

/// Smallest number of streams.
pub const MIN_N: u32 = 2;
/// Largest number of streams (8-lane groups hold one row of `H_res` per lane).
pub const MAX_N: u32 = 8;
/// `C` must be a multiple of this (16-byte vectors of bf16).
pub const C_MULTIPLE: u32 = 8;
/// Largest `t_max` (Sinkhorn iterations): the backward keeps every iterate's scaling vectors in
/// shared memory (`bwd_coeff_smem_bytes`).
pub const MAX_SINKHORN_ITERS: u32 = 100;
/// Channels of one 16-byte vector of bf16.
pub const VEC: u32 = 8;
/// Lanes that cooperate on one token in the coefficient kernels (lane `i` owns row `i`).
pub const GROUP: u32 = 8;

/// Coefficients per token: `n^2 + 2 n`.
#[inline]
pub const fn m_of(n: u32) -> u32 {
    n * n + 2 * n
}

/// `n8` tiles that cover the `M` coefficients (`mma` N dimension in the projection and the
/// weight gradient).
#[inline]
pub const fn nt_of(n: u32) -> u32 {
    m_of(n).div_ceil(8)
}

/// `k16` steps that cover the `M` coefficients (`mma` K dimension in the input gradient).
#[inline]
pub const fn s16_of(n: u32) -> u32 {
    m_of(n).div_ceil(16)
}

/// Row stride of the per-token `u` buffer (`dL/d(x~ phi')`), `M` rounded up to 16 (zero padded).
#[inline]
pub const fn m16_of(n: u32) -> u32 {
    16 * s16_of(n)
}

/// Column of `H_post[i]` in the coefficient order.
#[inline]
pub const fn post_col(n: u32, i: u32) -> u32 {
    n + i
}

/// Column of `H_res[i][j]` in the coefficient order.
#[inline]
pub const fn res_col(n: u32, i: u32, j: u32) -> u32 {
    2 * n + i * n + j
}

// ---------------------------------------------------------------------------------------------
// Packing of phi' = diag(gamma) phi into bf16 hi/lo fragments (`mhc_prep`).

/// Threads per block of `mhc_prep` (one packed u32 word per thread).
pub const PREP_THREADS: u32 = 256;

/// K values of one chunk of the projection (four lanes x 8 bf16).
pub const F1_CHUNK: u32 = 32;

/// Chunks of the projection for `K` values.
#[inline]
pub const fn f1_chunks(k: u32) -> u32 {
    k.div_ceil(F1_CHUNK)
}

/// u32 words of the projection packing (`[chunk][tile j][hi/lo][lane][4 words]`).
#[inline]
pub const fn f1_words(n: u32, k: u32) -> u32 {
    f1_chunks(k) * nt_of(n) * 2 * WARP_SIZE * 4
}

/// Index of block `(chunk, j, hl)` of the projection packing: a block is one 16-byte vector per
/// lane (`lane_word`).
#[inline]
pub const fn f1_block(n: u32, chunk: u32, j: u32, hl: u32) -> u32 {
    (chunk * nt_of(n) + j) * 2 + hl
}

/// Index of word `w` (0..4) of lane `lane` in packed block `block` (the packings store each
/// block lane-major, 16 bytes per lane, so a warp reads a block with one coalesced load).
#[inline]
pub const fn lane_word(block: u32, lane: u32, w: u32) -> u32 {
    (block * WARP_SIZE + lane) * 4 + w
}

/// What the projection packing holds: word `w` of lane `(g, t)` of block `(chunk, j, hl)` is the
/// pair `phi'[k][m], phi'[k + 1][m]` (low half first) with `m = 8 j + g` and
/// `k = 32 chunk + 8 t + 2 w`; i.e. each lane holds the 8 consecutive K values it multiplies
/// with its own 16-byte vector of `x` (see `gpu-kernels/src/mhc/proj.rs`). Returns `(k, m)`.
#[inline]
pub const fn f1_word_source(chunk: u32, j: u32, lane: u32, w: u32) -> (u32, u32) {
    let (g, t) = (lane / 4, lane % 4);
    (F1_CHUNK * chunk + 8 * t + 2 * w, 8 * j + g)
}

/// Channels of one group of the input-gradient GEMM (two `n8` tiles, 4 channels per lane).
pub const B2_GROUP: u32 = 16;

/// Channel groups per stream.
#[inline]
pub const fn b2_groups(c: u32) -> u32 {
    c.div_ceil(B2_GROUP)
}

/// u32 words of the input-gradient packing (`[stream][group][k16 step][hi/lo][lane][4 words]`).
#[inline]
pub const fn b2_words(n: u32, c: u32) -> u32 {
    n * b2_groups(c) * s16_of(n) * 2 * WARP_SIZE * 4
}

/// Index of block `(i, group, s, hl)` of the input-gradient packing (see [`lane_word`]).
#[inline]
pub const fn b2_block(n: u32, c: u32, i: u32, group: u32, s: u32, hl: u32) -> u32 {
    ((i * b2_groups(c) + group) * s16_of(n) + s) * 2 + hl
}

/// Channel (within stream `i`, group `group`) of column `col` (0..8) of `n8` tile `q` (0..2) in
/// the input-gradient GEMM: columns are permuted so that lane `t` of the accumulator fragment
/// owns the 4 consecutive channels `16 group + 4 t .. + 4` (tile `q` gives `+2q, +2q + 1`).
#[inline]
pub const fn b2_channel(group: u32, q: u32, col: u32) -> u32 {
    B2_GROUP * group + 4 * (col / 2) + 2 * q + col % 2
}

/// What the input-gradient packing holds: word `w = 2 q + r` of lane `(g, t)` in block
/// `(i, group, s, hl)` is register `b[r]` of the `mma` B fragment of tile `q`, k16 step `s`:
/// the pair `phi'[i C + ch][m], phi'[i C + ch][m + 1]` with `ch = b2_channel(group, q, g)` and
/// `m = 16 s + 2 t + 8 r`. Returns `(channel, m)`.
#[inline]
pub const fn b2_word_source(group: u32, s: u32, lane: u32, w: u32) -> (u32, u32) {
    let (g, t) = (lane / 4, lane % 4);
    let (q, r) = (w / 2, w % 2);
    (b2_channel(group, q, g), 16 * s + 2 * t + 8 * r)
}

/// Parameters of `mhc_prep`: pack `phi' = diag(gamma) phi` (or `phi`) into bf16 `hi` and
/// `lo = bf16(phi' - hi)` halves in the projection (`f1`) and input-gradient (`b2`) orders.
/// Entries outside `K x M` are zero.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PrepParams {
    /// `[K, M]` f32.
    pub phi: *const f32,
    /// `[K]` f32, or null (no RMSNorm weight).
    pub gamma: *const f32,
    /// `[f1_words(n, K)]`.
    pub packed_f1: *mut u32,
    /// `[b2_words(n, C)]`.
    pub packed_b2: *mut u32,
    /// Streams.
    pub n: u32,
    /// Channels.
    pub c: u32,
}

// ---------------------------------------------------------------------------------------------
// Forward, step 1: projection x~ phi' and sum of squares, split over K (`mhc_fwd_proj_n{N}`).

/// Warps per block of `mhc_fwd_proj_n*`.
pub const PROJ_WARPS: u32 = 4;
/// Threads per block of `mhc_fwd_proj_n*`.
pub const PROJ_THREADS: u32 = PROJ_WARPS * WARP_SIZE;

/// `m16` token tiles per warp of the projection: two, so that the accumulators (`2 nt 4`) and
/// three chunks of `x` in registers leave room for several blocks per SM.
#[inline]
pub const fn proj_mt(_n: u32) -> u32 {
    2
}

/// Tokens per block of the projection.
#[inline]
pub const fn proj_tokens(n: u32) -> u32 {
    PROJ_WARPS * proj_mt(n) * 16
}

/// Pipeline shape of the projection (`mhc_fwd_proj_n{n}`): a ring of `stages` `cp.async` stages
/// of `stage_chunks` chunks of K, and how many blocks the K split aims for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProjConfig {
    /// Chunks of `F1_CHUNK` K values per stage (2, 4 or 8: rows of 128 to 512 bytes).
    pub stage_chunks: u32,
    /// Stages of the ring (>= 2).
    pub stages: u32,
    /// The K split aims for at least this many blocks (token blocks x K splits); it depends
    /// only on the problem, never on the device, so results are identical on every GPU.
    pub target_blocks: u32,
}

impl ProjConfig {
    /// Bytes of one token row of a stage.
    pub const fn row_bytes(&self) -> u32 {
        self.stage_chunks * F1_CHUNK * 2
    }

    /// Bytes of the `x` tile of one stage (`[proj_tokens][row_bytes]`).
    pub const fn x_stage_bytes(&self, n: u32) -> u32 {
        proj_tokens(n) * self.row_bytes()
    }

    /// Bytes of the `phi'` packing of one stage: blocks `f1_block(n, c, j, hl)` of its chunks,
    /// which are contiguous in the packing (512 bytes each).
    pub const fn phi_stage_bytes(&self, n: u32) -> u32 {
        self.stage_chunks * nt_of(n) * 2 * WARP_SIZE * 16
    }

    /// Bytes of one stage (`x` tile, then the `phi'` blocks).
    pub const fn stage_bytes(&self, n: u32) -> u32 {
        self.x_stage_bytes(n) + self.phi_stage_bytes(n)
    }

    /// Dynamic shared memory of the kernel (with the alignment slack).
    pub const fn smem_bytes(&self, n: u32) -> usize {
        (self.stages * self.stage_bytes(n)) as usize + crate::SMEM_ALIGN
    }
}

/// The projection's pipeline for `n` streams: 2 stages of 4 chunks (rows of 256 bytes; 88 KB of
/// shared memory at `n = 4`, so 2 blocks fit on an SM), aiming for 256 blocks (at the
/// benchmark shape, 128 token blocks: 2 K splits, one wave of 2 blocks per SM on 132 SMs).
/// Measured on an H200 at B = 4, S = 4096, n = 4, C = 4096 beside the variants below
/// (`bench/NOTES.md`): the fastest of them.
#[inline]
pub const fn proj_config(_n: u32) -> ProjConfig {
    ProjConfig {
        stage_chunks: 4,
        stages: 2,
        target_blocks: 256,
    }
}

/// A tuning variant of the projection's pipeline: kernel `mhc_fwd_proj_n{n}_{name}`, measured
/// beside the default by the benchmark.
pub struct ProjVariant {
    /// The variant's name (the kernel name's suffix).
    pub name: &'static str,
    /// Streams.
    pub n: u32,
    /// The pipeline.
    pub config: ProjConfig,
    /// The kernel.
    pub kernel: Kernel<ProjParams>,
}

/// Dynamic shared memory of the projection variant `PROJ_VARIANTS[I]`.
fn proj_variant_smem<const I: usize>(_: ()) -> usize {
    let v = &PROJ_VARIANTS[I];
    v.config.smem_bytes(v.n)
}

/// The tuning variants of the projection.
pub const PROJ_VARIANTS: &[ProjVariant] = &[
    // Rows of 128 bytes, 3 stages (67 KB: 3 blocks per SM), one wave of 384 blocks.
    ProjVariant {
        name: "c2s3",
        n: 4,
        config: ProjConfig {
            stage_chunks: 2,
            stages: 3,
            target_blocks: 384,
        },
        kernel: Kernel::new(
            "mhc_fwd_proj_n4_c2s3",
            PROJ_THREADS,
            1,
            proj_variant_smem::<0>,
        ),
    },
    // Rows of 256 bytes, 3 stages (132 KB: 1 block per SM), one wave of 128 blocks.
    ProjVariant {
        name: "c4s3",
        n: 4,
        config: ProjConfig {
            stage_chunks: 4,
            stages: 3,
            target_blocks: 128,
        },
        kernel: Kernel::new(
            "mhc_fwd_proj_n4_c4s3",
            PROJ_THREADS,
            1,
            proj_variant_smem::<1>,
        ),
    },
    // Rows of 512 bytes, 2 stages (176 KB: 1 block per SM), one wave of 128 blocks.
    ProjVariant {
        name: "c8s2",
        n: 4,
        config: ProjConfig {
            stage_chunks: 8,
            stages: 2,
            target_blocks: 128,
        },
        kernel: Kernel::new(
            "mhc_fwd_proj_n4_c8s2",
            PROJ_THREADS,
            1,
            proj_variant_smem::<2>,
        ),
    },
];

/// The tuning variant `name` of the projection for `n` streams, if there is one.
pub fn proj_variant(n: u32, name: &str) -> Option<&'static ProjVariant> {
    PROJ_VARIANTS.iter().find(|v| v.name == name && v.n == n)
}

/// Parameters of `mhc_fwd_proj_n{N}`: for the `proj_tokens(n)` tokens of block `blockIdx.x` and
/// the chunks `[blockIdx.y * chunks_per_split, +chunks_per_split)` of K, write the partial
/// projection `part_proj[split][t][m] = sum_k x[t][k] phi'[k][m]` and the partial sum of squares
/// `part_sumsq[split][t] = sum_k x[t][k]^2`. `gridDim.y` is the number of splits.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProjParams {
    /// `[T, K]` bf16.
    pub x: *const u16,
    /// `[f1_words(n, K)]` (from `mhc_prep`).
    pub packed_f1: *const u32,
    /// `[splits, T, M]` f32.
    pub part_proj: *mut f32,
    /// `[splits, T]` f32.
    pub part_sumsq: *mut f32,
    /// Tokens.
    pub tokens: u32,
    /// `K = n C`.
    pub k: u32,
    /// Chunks of `F1_CHUNK` K values per split.
    pub chunks_per_split: u32,
}

// ---------------------------------------------------------------------------------------------
// Forward, step 2: coefficients (`mhc_fwd_coeff`).

/// Threads per block of `mhc_fwd_coeff` and `mhc_bwd_coeff` (16 tokens, 8 lanes each).
pub const COEFF_THREADS: u32 = 128;
/// Tokens per block of the coefficient kernels.
pub const COEFF_TOKENS: u32 = COEFF_THREADS / GROUP;

/// Parameters of `mhc_fwd_coeff`: sum the split partials (in split order), then per token
/// `r = sqrt(sumsq / K + eps)`, `h~ = proj / r`, `H_pre = sigmoid(a_pre h~_pre + b_pre)`,
/// `H_post = 2 sigmoid(a_post h~_post + b_post)`, `H_res = Sinkhorn(exp(a_res h~_res + b_res))`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FwdCoeffParams {
    /// `[splits, T, M]` f32.
    pub part_proj: *const f32,
    /// `[splits, T]` f32.
    pub part_sumsq: *const f32,
    /// `[3]` f32: `a_pre, a_post, a_res`.
    pub alpha: *const f32,
    /// `[M]` f32.
    pub bias: *const f32,
    /// `[T, n]` f32.
    pub h_pre: *mut f32,
    /// `[T, n]` f32.
    pub h_post: *mut f32,
    /// `[T, n, n]` f32.
    pub h_res: *mut f32,
    /// `[T, M]` f32: `h~` (saved for the backward).
    pub hproj: *mut f32,
    /// `[T]` f32: `r` (saved for the backward).
    pub rms: *mut f32,
    /// Tokens.
    pub tokens: u32,
    /// Streams.
    pub n: u32,
    /// `K = n C`.
    pub k: u32,
    /// Number of K splits of the partials.
    pub splits: u32,
    /// Sinkhorn iterations (`t_max`).
    pub iters: u32,
    /// RMS epsilon.
    pub eps: f32,
}

// ---------------------------------------------------------------------------------------------
// Forward, step 3 and 4: the applications (`mhc_fwd_pre_n{N}`, `mhc_fwd_post_n{N}`).

/// Threads per block of the application kernels (one 8-channel vector of one token each).
pub const APPLY_THREADS: u32 = 256;

/// Parameters of `mhc_fwd_pre_n{N}`: `x_in[t][c] = sum_i H_pre[t][i] x[t][i][c]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PreParams {
    /// `[T, n, C]` bf16.
    pub x: *const u16,
    /// `[T, n]` f32.
    pub h_pre: *const f32,
    /// `[T, C]` bf16.
    pub x_in: *mut u16,
    /// Tokens.
    pub tokens: u32,
    /// Channels.
    pub c: u32,
}

/// Parameters of `mhc_fwd_post_n{N}`:
/// `x_next[t][i][c] = sum_j H_res[t][i][j] x[t][j][c] + H_post[t][i] y[t][c]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PostParams {
    /// `[T, n, C]` bf16.
    pub x: *const u16,
    /// `[T, C]` bf16.
    pub y: *const u16,
    /// `[T, n]` f32.
    pub h_post: *const f32,
    /// `[T, n, n]` f32.
    pub h_res: *const f32,
    /// `[T, n, C]` bf16.
    pub x_next: *mut u16,
    /// Tokens.
    pub tokens: u32,
    /// Channels.
    pub c: u32,
}

// ---------------------------------------------------------------------------------------------
// Backward, step 1: gradients of the coefficients and of y (`mhc_bwd_dh_n{N}`).

/// Threads per block of `mhc_bwd_dh_n*` (one warp per token).
pub const DH_THREADS: u32 = 256;
/// Tokens per block of `mhc_bwd_dh_n*`.
pub const DH_TOKENS: u32 = DH_THREADS / WARP_SIZE;

/// Parameters of `mhc_bwd_dh_n{N}`: per token, `dH_pre[i] = <d_xin, x_i>`,
/// `dH_post[i] = <d_xnext_i, y>`, `dH_res[i][j] = <d_xnext_i, x_j>` (into `dh [T, M]`, in the
/// coefficient order) and `dy = sum_i H_post[i] d_xnext_i`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DhdvParams {
    /// `[T, n, C]` bf16.
    pub x: *const u16,
    /// `[T, C]` bf16.
    pub y: *const u16,
    /// `[T, C]` bf16.
    pub d_xin: *const u16,
    /// `[T, n, C]` bf16.
    pub d_xnext: *const u16,
    /// `[T, n]` f32.
    pub h_post: *const f32,
    /// `[T, M]` f32.
    pub dh: *mut f32,
    /// `[T, C]` bf16.
    pub dy: *mut u16,
    /// Tokens.
    pub tokens: u32,
    /// Channels.
    pub c: u32,
}

// ---------------------------------------------------------------------------------------------
// Backward, step 2: through the sigmoids, Sinkhorn and the norm (`mhc_bwd_coeff`).

/// Floats per token in the block reduction of `mhc_bwd_coeff`: `dbias` (`M`), then `dalpha`
/// (3), padded for the largest `n`.
pub const COEF_PARTIAL: u32 = m_of(MAX_N) + 3;

/// Byte offset of the block-reduction area in `mhc_bwd_coeff`'s shared memory (after the
/// Sinkhorn iterates: per iteration and thread, `u` then `v`).
#[inline]
pub const fn bwd_coeff_reduce_offset(iters: u32) -> usize {
    (iters * 2 * COEFF_THREADS * 4) as usize
}

/// Dynamic shared memory of `mhc_bwd_coeff`.
#[inline]
pub const fn bwd_coeff_smem_bytes(iters: u32) -> usize {
    bwd_coeff_reduce_offset(iters) + (COEFF_TOKENS * COEF_PARTIAL * 4) as usize + crate::SMEM_ALIGN
}

/// Parameters of `mhc_bwd_coeff`: from `dh` and the saved `h~`, `r`, per token
/// `u[m] = dL/d(x~ phi')[m] = alpha_g dz[m] / r` (zero for `M <= m < m16`),
/// `xcoef = -(sum_m alpha_g dz[m] h~[m]) / (K r^2)` (so `dx += xcoef x` is the gradient through
/// the norm), and block partials `part_coef[block] = (sum dz [M], sum dz h~ per group [3])`
/// over the block's tokens (`COEF_PARTIAL` floats per block).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BwdCoeffParams {
    /// `[T, M]` f32.
    pub dh: *const f32,
    /// `[T, M]` f32 (saved `h~`).
    pub hproj: *const f32,
    /// `[T]` f32 (saved `r`).
    pub rms: *const f32,
    /// `[3]` f32.
    pub alpha: *const f32,
    /// `[M]` f32.
    pub bias: *const f32,
    /// `[T, m16]` f32.
    pub u: *mut f32,
    /// `[T]` f32.
    pub xcoef: *mut f32,
    /// `[gridDim.x, COEF_PARTIAL]` f32.
    pub part_coef: *mut f32,
    /// Tokens.
    pub tokens: u32,
    /// Streams.
    pub n: u32,
    /// `K = n C`.
    pub k: u32,
    /// Sinkhorn iterations.
    pub iters: u32,
}

// ---------------------------------------------------------------------------------------------
// Backward, step 3: dx (`mhc_bwd_dx_n{N}`).

/// Warps per block of `mhc_bwd_dx_n*` (one m16 token tile each).
pub const DX_WARPS: u32 = 4;
/// Threads per block of `mhc_bwd_dx_n*`.
pub const DX_THREADS: u32 = DX_WARPS * WARP_SIZE;
/// Tokens per block of `mhc_bwd_dx_n*`.
pub const DX_TOKENS: u32 = DX_WARPS * 16;

/// Floats per token of the coefficient table in `mhc_bwd_dx`'s shared memory: `H_res` (`n^2`),
/// `H_pre` (`n`), `xcoef` (1); odd, so the 8 tokens a warp reads at once fall in 8 banks.
#[inline]
pub const fn dx_coef_stride(n: u32) -> u32 {
    n * n + n + 1
}

/// Dynamic shared memory of `mhc_bwd_dx_n*`.
#[inline]
pub const fn dx_smem_bytes(n: u32) -> usize {
    (DX_TOKENS * dx_coef_stride(n) * 4) as usize + crate::SMEM_ALIGN
}

/// Parameters of `mhc_bwd_dx_n{N}`:
/// `dx[t][i][c] = H_pre[i] d_xin[c] + sum_j H_res[j][i] d_xnext[j][c] + xcoef x[i][c]
///  + sum_m phi'[i C + c][m] u[m]` (the last term by tensor cores, from `packed_b2`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct DxParams {
    /// `[T, n, C]` bf16.
    pub x: *const u16,
    /// `[T, C]` bf16.
    pub d_xin: *const u16,
    /// `[T, n, C]` bf16.
    pub d_xnext: *const u16,
    /// `[T, n]` f32.
    pub h_pre: *const f32,
    /// `[T, n, n]` f32.
    pub h_res: *const f32,
    /// `[T]` f32.
    pub xcoef: *const f32,
    /// `[T, m16]` f32.
    pub u: *const f32,
    /// `[b2_words(n, C)]` (from `mhc_prep`).
    pub packed_b2: *const u32,
    /// `[T, n, C]` bf16.
    pub dx: *mut u16,
    /// Tokens.
    pub tokens: u32,
    /// Channels.
    pub c: u32,
}

// ---------------------------------------------------------------------------------------------
// Backward, step 4: W = x~^T u, partial over token splits (`mhc_bwd_wgrad_n{N}`).

/// Warps per block of `mhc_bwd_wgrad_n*`.
pub const WG_WARPS: u32 = 4;
/// Threads per block of `mhc_bwd_wgrad_n*`.
pub const WG_THREADS: u32 = WG_WARPS * WARP_SIZE;
/// Tokens per pipeline stage (two k16 steps of the token contraction).
pub const WG_STEP: u32 = 32;
/// Pipeline stages (cp.async ring).
pub const WG_STAGES: u32 = 3;
/// The weight gradient aims for at least this many blocks (K tiles x token splits).
pub const WG_TARGET_BLOCKS: u32 = 256;

/// m16 tiles of K rows per warp.
#[inline]
pub const fn wg_mt(n: u32) -> u32 {
    if n <= 4 { 4 } else { 2 }
}

/// K rows per block.
#[inline]
pub const fn wg_ktile(n: u32) -> u32 {
    WG_WARPS * wg_mt(n) * 16
}

/// Row pitch in bytes of the x tile in shared memory (`[WG_STEP tokens][ktile]` bf16 + 16 bytes,
/// so the 8 rows of an `ldmatrix` phase fall in distinct bank groups).
#[inline]
pub const fn wg_x_pitch(n: u32) -> u32 {
    wg_ktile(n) * 2 + 16
}

/// Bytes of one stage's x tile.
#[inline]
pub const fn wg_x_stage_bytes(n: u32) -> u32 {
    WG_STEP * wg_x_pitch(n)
}

/// Row pitch in f32 of the u tile in shared memory: `m16 + 4`, so the rows `2t` (t = 0..4) that
/// a B-fragment load reads at once fall in distinct banks (`2 (m16 + 4) = 8 mod 32`).
#[inline]
pub const fn wg_u_pitch(n: u32) -> u32 {
    m16_of(n) + 4
}

/// Bytes of one stage's u tile (`[WG_STEP][wg_u_pitch]` f32).
#[inline]
pub const fn wg_u_stage_bytes(n: u32) -> u32 {
    WG_STEP * wg_u_pitch(n) * 4
}

/// Offset of stage `s`'s x tile.
#[inline]
pub const fn wg_x_offset(n: u32, s: u32) -> usize {
    (s * (wg_x_stage_bytes(n) + wg_u_stage_bytes(n))) as usize
}

/// Offset of stage `s`'s u tile.
#[inline]
pub const fn wg_u_offset(n: u32, s: u32) -> usize {
    wg_x_offset(n, s) + wg_x_stage_bytes(n) as usize
}

/// Dynamic shared memory of `mhc_bwd_wgrad_n*`.
#[inline]
pub const fn wg_smem_bytes(n: u32) -> usize {
    wg_x_offset(n, WG_STAGES) + crate::SMEM_ALIGN
}

/// Parameters of `mhc_bwd_wgrad_n{N}`: for the K rows of block `blockIdx.x` and the tokens
/// `[blockIdx.y * tokens_per_split, +tokens_per_split)`,
/// `part_w[split][k][m] = sum_t x[t][k] u[t][m]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WgradParams {
    /// `[T, K]` bf16.
    pub x: *const u16,
    /// `[T, m16]` f32.
    pub u: *const f32,
    /// `[splits, K, M]` f32.
    pub part_w: *mut f32,
    /// Tokens.
    pub tokens: u32,
    /// `K = n C`.
    pub k: u32,
    /// Tokens per split (a multiple of `WG_STEP`).
    pub tokens_per_split: u32,
}

// ---------------------------------------------------------------------------------------------
// Backward, step 5: the second, deterministic pass of every reduction (`mhc_bwd_finalize`).

/// Threads per block of `mhc_bwd_finalize_n*` (row blocks: one K row per thread; column blocks:
/// one of the `M + 3` coefficient outputs per block).
pub const FIN_THREADS: u32 = 128;

/// Parameters of `mhc_bwd_finalize_n{N}`: `W = sum_s part_w[s]` (split order), `dphi = diag(gamma) W`
/// (or `W`), `dgamma[k] = sum_m phi[k][m] W[k][m]`, `dbias = sum_b part_coef[b][0..M]`,
/// `dalpha = sum_b part_coef[b][M..M + 3]` (block order).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct FinalizeParams {
    /// `[w_splits, K, M]` f32.
    pub part_w: *const f32,
    /// `[coef_blocks, COEF_PARTIAL]` f32.
    pub part_coef: *const f32,
    /// `[K, M]` f32.
    pub phi: *const f32,
    /// `[K]` f32, or null.
    pub gamma: *const f32,
    /// `[K, M]` f32.
    pub dphi: *mut f32,
    /// `[K]` f32, or null (when `gamma` is null).
    pub dgamma: *mut f32,
    /// `[M]` f32.
    pub dbias: *mut f32,
    /// `[3]` f32.
    pub dalpha: *mut f32,
    /// Streams.
    pub n: u32,
    /// `K = n C`.
    pub k: u32,
    /// Token splits of `part_w`.
    pub w_splits: u32,
    /// Blocks of `part_coef`.
    pub coef_blocks: u32,
}

/// Blocks of `mhc_bwd_finalize_n*`: the row blocks for `K` rows, then one block per
/// coefficient output (`M + 3`).
#[inline]
pub const fn finalize_blocks(n: u32, k: u32) -> u32 {
    k.div_ceil(FIN_THREADS) + m_of(n) + 3
}

/// Dynamic shared memory of `mhc_bwd_finalize_n*` (one f32 per warp).
#[inline]
pub const fn finalize_smem_bytes() -> usize {
    (FIN_THREADS / WARP_SIZE) as usize * 4 + crate::SMEM_ALIGN
}

// ---------------------------------------------------------------------------------------------
// The kernel handles.

// Dynamic shared memory of the per-`n` kernels, as functions of `N` for `per_n!`.

fn no_smem<const N: u32>(_: ()) -> usize {
    0
}

fn proj_smem<const N: u32>(_: ()) -> usize {
    proj_config(N).smem_bytes(N)
}

fn dx_smem<const N: u32>(_: ()) -> usize {
    dx_smem_bytes(N)
}

fn wg_smem<const N: u32>(_: ()) -> usize {
    wg_smem_bytes(N)
}

fn finalize_smem<const N: u32>(_: ()) -> usize {
    finalize_smem_bytes()
}

/// The handles of one kernel for every `n` from `MIN_N` to `MAX_N` (index `n - MIN_N`): entry
/// `{prefix}{n}`, `threads` per block, `min` resident blocks per SM (one per `n`), dynamic
/// shared memory `smem::<n>`.
macro_rules! per_n {
    ($prefix:literal, $threads:expr, [$($n:literal: $min:expr),*], $smem:ident) => {
        &[$(Kernel::new(concat!($prefix, $n), $threads, $min, $smem::<$n>)),*]
    };
}

/// `mhc_prep`: one packed word per thread.
pub const PREP: Kernel<PrepParams> = Kernel::new("mhc_prep", PREP_THREADS, 1, |()| 0);

/// `mhc_fwd_proj_n{n}` (index `n - MIN_N`): the default pipeline `proj_config(n)`.
pub const FWD_PROJ: &[Kernel<ProjParams>] =
    per_n!("mhc_fwd_proj_n", PROJ_THREADS, [2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1], proj_smem);

/// `mhc_fwd_coeff`.
pub const FWD_COEFF: Kernel<FwdCoeffParams> =
    Kernel::new("mhc_fwd_coeff", COEFF_THREADS, 1, |()| 0);

/// `mhc_fwd_pre_n{n}` (index `n - MIN_N`).
pub const FWD_PRE: &[Kernel<PreParams>] =
    per_n!("mhc_fwd_pre_n", APPLY_THREADS, [2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1], no_smem);

/// `mhc_fwd_post_n{n}` (index `n - MIN_N`): for `n <= 4`, 3 resident blocks per SM (which caps
/// the registers).
pub const FWD_POST: &[Kernel<PostParams>] =
    per_n!("mhc_fwd_post_n", APPLY_THREADS, [2: 3, 3: 3, 4: 3, 5: 1, 6: 1, 7: 1, 8: 1], no_smem);

/// `mhc_bwd_dh_n{n}` (index `n - MIN_N`).
pub const BWD_DH: &[Kernel<DhdvParams>] =
    per_n!("mhc_bwd_dh_n", DH_THREADS, [2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1], no_smem);

/// `mhc_bwd_coeff`: its shared memory is a function of the Sinkhorn iterations.
pub const BWD_COEFF: Kernel<BwdCoeffParams, u32> =
    Kernel::new("mhc_bwd_coeff", COEFF_THREADS, 1, bwd_coeff_smem_bytes);

/// `mhc_bwd_dx_n{n}` (index `n - MIN_N`).
pub const BWD_DX: &[Kernel<DxParams>] =
    per_n!("mhc_bwd_dx_n", DX_THREADS, [2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1], dx_smem);

/// `mhc_bwd_wgrad_n{n}` (index `n - MIN_N`).
pub const BWD_WGRAD: &[Kernel<WgradParams>] =
    per_n!("mhc_bwd_wgrad_n", WG_THREADS, [2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1], wg_smem);

/// `mhc_bwd_finalize_n{n}` (index `n - MIN_N`).
pub const BWD_FINALIZE: &[Kernel<FinalizeParams>] = per_n!(
    "mhc_bwd_finalize_n",
    FIN_THREADS,
    [2: 1, 3: 1, 4: 1, 5: 1, 6: 1, 7: 1, 8: 1],
    finalize_smem
);

/// The handle of `n` streams in a per-`n` table (`FWD_PRE`, ...), if `n` is supported.
pub fn for_n<P, S>(table: &'static [Kernel<P, S>], n: u32) -> Option<&'static Kernel<P, S>> {
    table.get(n.checked_sub(MIN_N)? as usize)
}

/// Kernels per `n`.
const PER_N: usize = (MAX_N - MIN_N + 1) as usize;

/// Every kernel of the family.
const ALL: [KernelDecl; 3 + 7 * PER_N + 3] = {
    let mut all = [PREP.info(); 3 + 7 * PER_N + 3];
    all[1] = FWD_COEFF.info();
    all[2] = BWD_COEFF.info();
    let mut i = 0;
    while i < PER_N {
        all[3 + 7 * i] = FWD_PROJ[i].info();
        all[4 + 7 * i] = FWD_PRE[i].info();
        all[5 + 7 * i] = FWD_POST[i].info();
        all[6 + 7 * i] = BWD_DH[i].info();
        all[7 + 7 * i] = BWD_DX[i].info();
        all[8 + 7 * i] = BWD_WGRAD[i].info();
        all[9 + 7 * i] = BWD_FINALIZE[i].info();
        i += 1;
    }
    let mut v = 0;
    while v < PROJ_VARIANTS.len() {
        all[3 + 7 * PER_N + v] = PROJ_VARIANTS[v].kernel.info();
        v += 1;
    }
    all
};

/// The family's kernels.
pub const KERNELS: &[KernelDecl] = &ALL;

const _: () = {
    assert!(m_of(MAX_N) + 3 == COEF_PARTIAL);
    assert!(COEF_PARTIAL <= FIN_THREADS);
    assert!(COEFF_THREADS.is_multiple_of(WARP_SIZE) && WARP_SIZE.is_multiple_of(GROUP));
    assert!(MAX_N <= GROUP);
    assert!(!dx_coef_stride(4).is_multiple_of(2) && !dx_coef_stride(8).is_multiple_of(2));
    assert!(FWD_PROJ.len() == PER_N && FWD_PRE.len() == PER_N && FWD_POST.len() == PER_N);
    assert!(BWD_DH.len() == PER_N && BWD_DX.len() == PER_N);
    assert!(BWD_WGRAD.len() == PER_N && BWD_FINALIZE.len() == PER_N);
    assert!(PROJ_VARIANTS.len() == 3);
    // Every variant's kernel is `mhc_fwd_proj_n{n}_{name}`.
    let mut v = 0;
    while v < PROJ_VARIANTS.len() {
        let var = &PROJ_VARIANTS[v];
        let (kn, base, name) = (
            var.kernel.name.as_bytes(),
            FWD_PROJ[(var.n - MIN_N) as usize].name.as_bytes(),
            var.name.as_bytes(),
        );
        assert!(kn.len() == base.len() + 1 + name.len() && kn[base.len()] == b'_');
        let mut i = 0;
        while i < base.len() {
            assert!(kn[i] == base[i]);
            i += 1;
        }
        let mut i = 0;
        while i < name.len() {
            assert!(kn[base.len() + 1 + i] == name[i]);
            i += 1;
        }
        v += 1;
    }
};
