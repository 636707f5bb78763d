//! Where the rows of one (sequence, head) live: in a dense `[batch, seq, heads, D]` batch
//! ([`Dense`]), or in packed tensors `[total, heads, D]` whose sequences `cu_seqlens` marks
//! ([`Packed`], [`kernel_abi::attention::AttentionVarlenParams`]). A kernel body generic over
//! [`Layout`] locates its sequence once and indexes its rows through it, so the dense and the
//! packed kernels run the same code. The dense layout computes each offset where it is used
//! (its kernels compile as they did before the packed layout existed).

use kernel_abi::attention::{AttentionParams, AttentionVarlenParams};

/// A layout of Q, K, V, O and LSE: how a block finds its (sequence, head)'s rows. The methods
/// take the parameters the layout was located from.
pub(crate) trait Layout: Copy {
    /// The kernel's parameter struct.
    type Params;
    /// Whether a block may find no query row of its sequence in its query block (the grid is
    /// sized for the longest sequence) and must return at once.
    const MAY_BE_PAST_END: bool;

    /// The dense parameters inside `p` (sizes, strides and options; see the layout's
    /// documentation for how it reads them).
    fn base(p: &Self::Params) -> &AttentionParams;

    /// The rows of sequence `batch`, query head `head` and its key/value head `head_kv`.
    ///
    /// # Safety
    /// `p` satisfies its type's contract and `batch`, `head` are inside the grid it was made for.
    unsafe fn locate(p: &Self::Params, batch: u32, head: u32, head_kv: u32) -> Self;

    /// Query rows of the sequence.
    fn seq_q(&self, p: &Self::Params) -> u32;
    /// Key rows of the sequence.
    fn seq_k(&self, p: &Self::Params) -> u32;
    /// Element offset of Q's row 0 (this query head) from `q`.
    fn q_offset(&self, p: &Self::Params) -> u64;
    /// Element offset of K's row 0 (the key/value head) from `k`.
    fn k_offset(&self, p: &Self::Params) -> u64;
    /// Element offset of V's row 0 (the key/value head) from `v`.
    fn v_offset(&self, p: &Self::Params) -> u64;
    /// Element offset of O's row 0 (this query head) from `o`.
    fn o_offset(&self, p: &Self::Params) -> u64;
    /// Index in LSE of query row `i` (this query head).
    fn lse_index(&self, p: &Self::Params, i: u32) -> u64;
}

/// Batch entry `batch` of the dense layout of [`AttentionParams`] (LSE `[batch, heads_q,
/// seq_q]`).
#[derive(Clone, Copy)]
pub(crate) struct Dense {
    batch: u32,
    head: u32,
    head_kv: u32,
}

impl Layout for Dense {
    type Params = AttentionParams;
    const MAY_BE_PAST_END: bool = false;

    #[inline(always)]
    fn base(p: &AttentionParams) -> &AttentionParams {
        p
    }

    #[inline(always)]
    unsafe fn locate(_: &AttentionParams, batch: u32, head: u32, head_kv: u32) -> Self {
        Dense {
            batch,
            head,
            head_kv,
        }
    }

    #[inline(always)]
    fn seq_q(&self, p: &AttentionParams) -> u32 {
        p.seq_q
    }
    #[inline(always)]
    fn seq_k(&self, p: &AttentionParams) -> u32 {
        p.seq_k
    }
    #[inline(always)]
    fn q_offset(&self, p: &AttentionParams) -> u64 {
        self.batch as u64 * p.q_strides[0] + self.head as u64 * p.q_strides[2]
    }
    #[inline(always)]
    fn k_offset(&self, p: &AttentionParams) -> u64 {
        self.batch as u64 * p.k_strides[0] + self.head_kv as u64 * p.k_strides[2]
    }
    #[inline(always)]
    fn v_offset(&self, p: &AttentionParams) -> u64 {
        self.batch as u64 * p.v_strides[0] + self.head_kv as u64 * p.v_strides[2]
    }
    #[inline(always)]
    fn o_offset(&self, p: &AttentionParams) -> u64 {
        self.batch as u64 * p.o_strides[0] + self.head as u64 * p.o_strides[2]
    }
    #[inline(always)]
    fn lse_index(&self, p: &AttentionParams, i: u32) -> u64 {
        (self.batch as u64 * p.heads_q as u64 + self.head as u64) * p.seq_q as u64 + i as u64
    }
}

/// Sequence `batch` of the packed layout of [`AttentionVarlenParams`] (LSE `[heads_q,
/// total_q]`): its bounds read from `cu_seqlens_*` and clamped into `0 ..= total` (each end at
/// least its start), so that every row it names lies inside the tensors whatever their
/// contents. Only the first rows and lengths are kept; the offsets are computed where used, as
/// in [`Dense`] (fewer live registers through the main loop).
#[derive(Clone, Copy)]
pub(crate) struct Packed {
    seq_q: u32,
    seq_k: u32,
    /// First query row.
    q0: u32,
    /// First key row.
    k0: u32,
    head: u32,
    head_kv: u32,
}

impl Layout for Packed {
    type Params = AttentionVarlenParams;
    const MAY_BE_PAST_END: bool = true;

    #[inline(always)]
    fn base(p: &AttentionVarlenParams) -> &AttentionParams {
        &p.base
    }

    #[inline(always)]
    unsafe fn locate(p: &AttentionVarlenParams, batch: u32, head: u32, head_kv: u32) -> Self {
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
            head,
            head_kv,
        }
    }

    #[inline(always)]
    fn seq_q(&self, _: &AttentionVarlenParams) -> u32 {
        self.seq_q
    }
    #[inline(always)]
    fn seq_k(&self, _: &AttentionVarlenParams) -> u32 {
        self.seq_k
    }
    #[inline(always)]
    fn q_offset(&self, p: &AttentionVarlenParams) -> u64 {
        let s = &p.base.q_strides;
        self.q0 as u64 * s[1] + self.head as u64 * s[2]
    }
    #[inline(always)]
    fn k_offset(&self, p: &AttentionVarlenParams) -> u64 {
        let s = &p.base.k_strides;
        self.k0 as u64 * s[1] + self.head_kv as u64 * s[2]
    }
    #[inline(always)]
    fn v_offset(&self, p: &AttentionVarlenParams) -> u64 {
        let s = &p.base.v_strides;
        self.k0 as u64 * s[1] + self.head_kv as u64 * s[2]
    }
    #[inline(always)]
    fn o_offset(&self, p: &AttentionVarlenParams) -> u64 {
        let s = &p.base.o_strides;
        self.q0 as u64 * s[1] + self.head as u64 * s[2]
    }
    #[inline(always)]
    fn lse_index(&self, p: &AttentionVarlenParams, i: u32) -> u64 {
        self.head as u64 * p.total_q as u64 + self.q0 as u64 + i as u64
    }
}

/// `start .. end` read from `cu_seqlens`, clamped: `0 <= start <= end <= total`.
#[inline(always)]
pub(crate) fn clamp_range(start: i32, end: i32, total: u32) -> (u32, u32) {
    let start = (start.max(0) as u32).min(total);
    let end = (end.max(0) as u32).min(total).max(start);
    (start, end)
}
