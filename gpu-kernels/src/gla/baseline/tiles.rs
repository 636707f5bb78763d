//! The baseline's shared-memory tiles: the `cp.async` loads of the raw rows, the variant
//! (operand) buffers, and their addressing for the element-wise phase. Every row is padded to
//! `GlaConfig::row_bytes` (16 bytes more than the data), so `ldmatrix` is conflict-free.

use super::super::chunk::{ChunkTiles, Raw, Var};
use kernel_abi::gla::{GlaConfig, GlaLayout};

/// Issue the `cp.async` copies of a `[ROWS, D]` tile into rows of
/// `GlaConfig::row_bytes(D)` bytes ([`crate::tiles::load_rows`]; contiguous tensors, D a
/// multiple of 8, so every row starts 16-byte aligned).
#[inline(always)]
pub(in crate::gla) fn load_tile<const D: u32, const ROWS: u32, const THREADS: u32>(
    dst: u32,
    base: *const u16,
    first_row_offset: u64,
    stride: u64,
    valid: u32,
) {
    crate::tiles::load_rows::<D, ROWS, THREADS>(
        dst,
        |r, chunk| r * const { GlaConfig::row_bytes(D) } + (chunk << 4),
        base,
        first_row_offset,
        stride,
        valid,
    )
}

/// Shared-memory addresses of one variant buffer.
#[derive(Clone, Copy)]
pub(in crate::gla) struct Variants {
    pub(in crate::gla) q_inter: u32,
    pub(in crate::gla) q_diag: u32,
    pub(in crate::gla) k_half0: u32,
    pub(in crate::gla) k_half1: u32,
    pub(in crate::gla) k_state: u32,
    pub(in crate::gla) decay: u32,
}

impl Variants {
    #[inline(always)]
    pub(in crate::gla) fn new(base: u32, lay: &GlaLayout, b: u32) -> Variants {
        let base = base + b * lay.variant_bytes;
        Variants {
            q_inter: base + lay.q_inter,
            q_diag: base + lay.q_diag,
            k_half0: base + lay.k_half0,
            k_half1: base + lay.k_half1,
            k_state: base + lay.k_state,
            decay: base + lay.decay,
        }
    }
}

/// The baseline's tiles: raw rows of the chunk in a stage and one variant buffer, all in
/// padded rows.
pub(super) struct PaddedChunk<const DK: u32> {
    pub(super) q: u32,
    pub(super) k: u32,
    pub(super) g: u32,
    pub(super) var: Variants,
}

impl<const DK: u32> ChunkTiles for PaddedChunk<DK> {
    #[inline(always)]
    fn raw(&self, t: Raw, row: u32, col: u32) -> u32 {
        t.pick(self.q, self.k, self.g) + row * const { GlaConfig::row_bytes(DK) } + col
    }

    #[inline(always)]
    fn var(&self, t: Var, row: u32, col: u32) -> u32 {
        let base = match t {
            Var::QInter => self.var.q_inter,
            Var::QDiag => self.var.q_diag,
            Var::KHalf0 => self.var.k_half0,
            Var::KHalf1 => self.var.k_half1,
            Var::KState => self.var.k_state,
        };
        base + row * const { GlaConfig::row_bytes(DK) } + col
    }

    #[inline(always)]
    fn decay(&self) -> u32 {
        self.var.decay
    }
}
