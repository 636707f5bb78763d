//! The pingpong kernels' shared-memory tiles: addressing of the 128-byte-swizzled TMA and
//! `wgmma` tiles (and the padded `ldmatrix` ones) for the element-wise phases, vector shared
//! accesses of 4 or 8 bf16, and the zeroing of v rows past a segment's end.

use super::super::chunk::{ChunkTiles, Raw, Var};
use crate::arch::convert;
use crate::arch::smem::SmemValue;
use kernel_abi::WARPGROUP_SIZE;
use kernel_abi::gla::GlaConfig;

/// Address of byte `col` of row `row` in a swizzled tile whose 128-byte column blocks are
/// `block` bytes apart (128-byte swizzle: the 16-byte chunk index XOR the row modulo 8; the
/// tile is 1024-byte aligned).
#[inline(always)]
pub(super) fn swizzled(base: u32, block: u32, row: u32, col: u32) -> u32 {
    base + (col / 128) * block + row * 128 + ((((col % 128) / 16) ^ (row % 8)) * 16) + col % 16
}

/// A consumer's tiles for one chunk of the current step (rows `r0 .. r0 + 16`).
pub(super) struct PingpongChunk<const DK: u32> {
    pub(super) q: u32,
    pub(super) k: u32,
    pub(super) g: u32,
    pub(super) q_inter: u32,
    pub(super) k_state: u32,
    pub(super) q_diag: u32,
    pub(super) k_half0: u32,
    pub(super) k_half1: u32,
    pub(super) decay: u32,
    pub(super) r0: u32,
    pub(super) block: u32,
}

impl<const DK: u32> ChunkTiles for PingpongChunk<DK> {
    #[inline(always)]
    fn raw(&self, t: Raw, row: u32, col: u32) -> u32 {
        swizzled(
            t.pick(self.q, self.k, self.g),
            self.block,
            self.r0 + row,
            col,
        )
    }

    #[inline(always)]
    fn var(&self, t: Var, row: u32, col: u32) -> u32 {
        let padded = |base: u32| base + (self.r0 + row) * const { GlaConfig::row_bytes(DK) } + col;
        match t {
            Var::QInter => swizzled(self.q_inter, self.block, self.r0 + row, col),
            Var::KState => swizzled(self.k_state, self.block, self.r0 + row, col),
            Var::QDiag => padded(self.q_diag),
            Var::KHalf0 => padded(self.k_half0),
            Var::KHalf1 => padded(self.k_half1),
        }
    }

    #[inline(always)]
    fn decay(&self) -> u32 {
        self.decay
    }
}

/// `ld.shared` of `CPT` consecutive bf16 (`CPT` = 8: 16 bytes; 4: 8 bytes) as packed words
/// (the first `CPT / 2` are used).
///
/// # Safety
/// `addr` is a shared-window address of `2 CPT` valid bytes, aligned to their size.
#[inline(always)]
pub(super) unsafe fn load_words<const CPT: usize>(addr: u32) -> [u32; 4] {
    if CPT == 8 {
        // SAFETY: forwarded to the caller (16 bytes, 16-byte aligned).
        unsafe { <[u32; 4]>::load(addr) }
    } else {
        // SAFETY: forwarded to the caller (8 bytes, 8-byte aligned).
        let v = unsafe { u64::load(addr) };
        [v as u32, (v >> 32) as u32, 0, 0]
    }
}

/// `st.shared` of the first `CPT / 2` packed words (see [`load_words`]).
///
/// # Safety
/// As for [`load_words`]; no other thread accesses the bytes before the next barrier.
#[inline(always)]
pub(super) unsafe fn store_words<const CPT: usize>(addr: u32, w: [u32; 4]) {
    if CPT == 8 {
        // SAFETY: forwarded to the caller.
        unsafe { <[u32; 4]>::store(addr, w) }
    } else {
        // SAFETY: forwarded to the caller.
        unsafe { u64::store(addr, (w[0] as u64) | ((w[1] as u64) << 32)) }
    }
}

/// The `CPT` bf16 of packed words as f32.
#[inline(always)]
pub(super) fn unpack<const CPT: usize>(w: [u32; 4]) -> [f32; CPT] {
    let mut x = [0.0f32; CPT];
    for j in 0..CPT / 2 {
        (x[2 * j], x[2 * j + 1]) = convert::unpack_bf16x2(w[j]);
    }
    x
}

/// `CPT` f32 packed to bf16 words.
#[inline(always)]
pub(super) fn pack<const CPT: usize>(x: &[f32; CPT]) -> [u32; 4] {
    let mut w = [0u32; 4];
    for j in 0..CPT / 2 {
        w[j] = convert::pack_bf16x2(x[2 * j], x[2 * j + 1]);
    }
    w
}

/// `CPT` f32 stored at `addr` (`4 CPT` bytes, 16-byte aligned).
///
/// # Safety
/// As for [`store_words`].
#[inline(always)]
pub(super) unsafe fn store_f32<const CPT: usize>(addr: u32, x: &[f32; CPT]) {
    for j in 0..CPT / 4 {
        let w = [
            x[4 * j].to_bits(),
            x[4 * j + 1].to_bits(),
            x[4 * j + 2].to_bits(),
            x[4 * j + 3].to_bits(),
        ];
        // SAFETY: forwarded to the caller (16 bytes of the row, 16-byte aligned).
        unsafe { <[u32; 4]>::store(addr + 16 * j as u32, w) };
    }
}

/// Zero rows `valid .. step` of a swizzled `[step, 64 blocks]` v tile at `v` (`blocks` column
/// blocks `block` bytes apart): the rows past a segment's end, where TMA loaded the next
/// sequence's tokens. The warpgroup's 128 threads share the 16-byte words (`ctid` is this
/// thread's index in it).
///
/// # Safety
/// The stage's full phase completed and no product reads it before the caller's next barrier
/// (with its proxy fence); no other thread writes these rows.
#[inline(always)]
pub(super) unsafe fn zero_rows_past(
    v: u32,
    block: u32,
    blocks: u32,
    step: u32,
    valid: u32,
    ctid: u32,
) {
    let row_words = 8u32; // 16-byte words per 128-byte row
    let words = (step - valid) * row_words * blocks;
    let mut w = ctid;
    while w < words {
        let (cb, rest) = (
            w / ((step - valid) * row_words),
            w % ((step - valid) * row_words),
        );
        let row = valid + rest / row_words;
        // SAFETY: a row >= valid of the tile, 16-byte aligned, one writer (the caller's
        // contract).
        unsafe { <[u32; 4]>::store(v + cb * block + row * 128 + (rest % row_words) * 16, [0; 4]) };
        w += WARPGROUP_SIZE;
    }
}
