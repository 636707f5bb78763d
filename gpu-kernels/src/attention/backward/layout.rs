//! Where the rows of one sequence live for the backward kernels: in dense `[batch, seq, heads,
//! D]` tensors ([`Dense`], [`AttentionBwdParams`]), or in packed `[total, heads, D]` tensors
//! whose sequences `cu_seqlens` marks ([`Packed`], [`AttentionBwdVarlenParams`]). A kernel body
//! generic over [`BwdLayout`] locates its sequence once and indexes its rows through it, so the
//! dense and the packed kernels run the same code. The dense layout computes each offset with
//! the expressions its kernels used before the packed layout existed (they compile as before).

use super::super::seq::clamp_range;
use kernel_abi::attention::backward::{AttentionBwdParams, AttentionBwdVarlenParams};
use kernel_abi::attention::hopper_bwd::{dq_accum_row0, dq_accum_varlen_row0};

/// A layout of the backward's tensors: how a block finds its sequence's rows. The methods take
/// the parameters the layout was located from.
pub(crate) trait BwdLayout: Copy {
    /// The kernel's parameter struct.
    type Params;
    /// Whether a block may start past its sequence's rows (the grid is sized for the longest
    /// sequence) and must return at once.
    const MAY_BE_PAST_END: bool;

    /// The dense parameters inside `p` (sizes, strides, pointers and options; see the
    /// parameter type's documentation for how it reads them).
    fn base(p: &Self::Params) -> &AttentionBwdParams;

    /// The rows of sequence `batch`.
    ///
    /// # Safety
    /// `p` satisfies its type's contract and `batch` is inside the grid it was made for.
    unsafe fn locate(p: &Self::Params, batch: u32) -> Self;

    /// Query rows of the sequence.
    fn seq_q(&self, p: &Self::Params) -> u32;
    /// Key rows of the sequence.
    fn seq_k(&self, p: &Self::Params) -> u32;
    /// Element offset of query row 0 of head `h` in a tensor of query rows (Q, O, dO, dQ) with
    /// `strides`.
    fn q_head(&self, strides: &[u64; 3], h: u32) -> u64;
    /// Element offset of key row 0 of head `h` in a tensor of key rows (K, V, dK, dV).
    fn k_head(&self, strides: &[u64; 3], h: u32) -> u64;
    /// Element offset of query row `i` of head `h` in a tensor of query rows.
    fn q_row(&self, strides: &[u64; 3], h: u32, i: u32) -> u64;
    /// Index of query row 0 of head `h` in LSE, dLSE and `delta'` (row `i` is this plus `i`;
    /// times `D`, the row's first element in the dQ accumulator).
    fn lse_base(&self, p: &Self::Params, h: u32) -> u64;
    /// The first row of query head `h` of the sequence in the Hopper path's tiled dQ
    /// accumulator (dense: [`dq_accum_row0`]; packed: [`dq_accum_varlen_row0`]).
    fn accum_row0(&self, p: &Self::Params, h: u32) -> u64;
}

/// Batch entry `batch` of the dense layout of [`AttentionBwdParams`] (LSE `[batch, heads_q,
/// seq_q]`).
#[derive(Clone, Copy)]
pub(crate) struct Dense {
    batch: u32,
}

impl BwdLayout for Dense {
    type Params = AttentionBwdParams;
    const MAY_BE_PAST_END: bool = false;

    #[inline(always)]
    fn base(p: &AttentionBwdParams) -> &AttentionBwdParams {
        p
    }

    #[inline(always)]
    unsafe fn locate(_: &AttentionBwdParams, batch: u32) -> Self {
        Dense { batch }
    }

    #[inline(always)]
    fn seq_q(&self, p: &AttentionBwdParams) -> u32 {
        p.seq_q
    }
    #[inline(always)]
    fn seq_k(&self, p: &AttentionBwdParams) -> u32 {
        p.seq_k
    }
    #[inline(always)]
    fn q_head(&self, s: &[u64; 3], h: u32) -> u64 {
        self.batch as u64 * s[0] + h as u64 * s[2]
    }
    #[inline(always)]
    fn k_head(&self, s: &[u64; 3], h: u32) -> u64 {
        self.batch as u64 * s[0] + h as u64 * s[2]
    }
    #[inline(always)]
    fn q_row(&self, s: &[u64; 3], h: u32, i: u32) -> u64 {
        self.batch as u64 * s[0] + i as u64 * s[1] + h as u64 * s[2]
    }
    #[inline(always)]
    fn lse_base(&self, p: &AttentionBwdParams, h: u32) -> u64 {
        (self.batch as u64 * p.heads_q as u64 + h as u64) * p.seq_q as u64
    }
    #[inline(always)]
    fn accum_row0(&self, p: &AttentionBwdParams, h: u32) -> u64 {
        dq_accum_row0(self.batch, h, p.heads_q, p.seq_q)
    }
}

/// Sequence `batch` of the packed layout of [`AttentionBwdVarlenParams`] (LSE, dLSE and
/// `delta'` `[heads_q, total_q]`, the dQ accumulator `[heads_q, total_q, D]`): its bounds read
/// from `cu_seqlens_*` and clamped into `0 ..= total` (each end at least its start), so that
/// every row it names lies inside the tensors whatever their contents.
#[derive(Clone, Copy)]
pub(crate) struct Packed {
    seq_q: u32,
    seq_k: u32,
    /// First query row.
    q0: u32,
    /// First key row.
    k0: u32,
    /// The sequence's index.
    batch: u32,
}

impl BwdLayout for Packed {
    type Params = AttentionBwdVarlenParams;
    const MAY_BE_PAST_END: bool = true;

    #[inline(always)]
    fn base(p: &AttentionBwdVarlenParams) -> &AttentionBwdParams {
        &p.base
    }

    #[inline(always)]
    unsafe fn locate(p: &AttentionBwdVarlenParams, batch: u32) -> Self {
        // SAFETY: `batch < p.base.batch` (the grid) and both arrays have `batch + 1` entries
        // (the parameters' contract).
        let (q0, q1, k0, k1) = unsafe {
            (
                *p.cu_seqlens_q.add(batch as usize),
                *p.cu_seqlens_q.add(batch as usize + 1),
                *p.cu_seqlens_k.add(batch as usize),
                *p.cu_seqlens_k.add(batch as usize + 1),
            )
        };
        let (q0, q1) = clamp_range(q0, q1, p.total_q);
        let (k0, k1) = clamp_range(k0, k1, p.total_k);
        Packed {
            seq_q: q1 - q0,
            seq_k: k1 - k0,
            q0,
            k0,
            batch,
        }
    }

    #[inline(always)]
    fn seq_q(&self, _: &AttentionBwdVarlenParams) -> u32 {
        self.seq_q
    }
    #[inline(always)]
    fn seq_k(&self, _: &AttentionBwdVarlenParams) -> u32 {
        self.seq_k
    }
    #[inline(always)]
    fn q_head(&self, s: &[u64; 3], h: u32) -> u64 {
        self.q0 as u64 * s[1] + h as u64 * s[2]
    }
    #[inline(always)]
    fn k_head(&self, s: &[u64; 3], h: u32) -> u64 {
        self.k0 as u64 * s[1] + h as u64 * s[2]
    }
    #[inline(always)]
    fn q_row(&self, s: &[u64; 3], h: u32, i: u32) -> u64 {
        (self.q0 + i) as u64 * s[1] + h as u64 * s[2]
    }
    #[inline(always)]
    fn lse_base(&self, p: &AttentionBwdVarlenParams, h: u32) -> u64 {
        h as u64 * p.total_q as u64 + self.q0 as u64
    }
    #[inline(always)]
    fn accum_row0(&self, p: &AttentionBwdVarlenParams, h: u32) -> u64 {
        dq_accum_varlen_row0(self.q0, self.batch, h, p.total_q, p.base.batch)
    }
}
