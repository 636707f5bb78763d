//! `gla_bwd_combine`: the gradient at the end of every segment of a split sequence but the
//! last, from the reverse pass's per-segment workspace.

use crate::arch::{index, math};
use kernel_abi::gla::{CombineEntry, CombineParams};

/// `gla_bwd_combine`: per split sequence, head and state element, walking the sequence's
/// segments from its last, `seg_end_{i-1} = 2^{D_i} seg_end_i + delta_i` from `seg_end_last` =
/// the final-state gradient (or 0), in f32 ([`CombineParams`] read backward: `init_state` is
/// the final-state gradient, `seg_init` the written `seg_end`).
///
/// # Thread mapping
/// Block `(entry, head, z)`, thread `tid`: state element `e = z * COMBINE_THREADS + tid` of
/// `[dk, dv]`. No barrier: threads share nothing.
///
/// # Safety
/// Grid `(entries, heads, ceil(dk dv / COMBINE_THREADS))`, `COMBINE_THREADS` threads,
/// parameters satisfying [`CombineParams`]'s contract, `delta` and `decay_log2` written by
/// `gla_bwd_states` for every segment that is not first.
#[cfg(target_arch = "nvptx64")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn gla_bwd_combine(p: CombineParams) {
    crate::launch_bounds!(gla_bwd_combine in kernel_abi::gla::KERNELS);
    // SAFETY: forwarded to the caller.
    unsafe { combine(p) }
}

/// The body of [`gla_bwd_combine`].
///
/// # Safety
/// As for [`gla_bwd_combine`].
#[inline(always)]
pub(super) unsafe fn combine(p: CombineParams) {
    let head = index::block_idx_y() as u64;
    let e = index::block_idx_z() * kernel_abi::gla::COMBINE_THREADS + index::thread_idx_x();
    let state_len = p.dk * p.dv;
    if e >= state_len {
        return;
    }
    // SAFETY: blockIdx.x < gridDim.x = entries.
    let entry: CombineEntry = unsafe { *p.entries.add(index::block_idx_x() as usize) };
    let heads = p.heads as u64;
    let elem = |slot: u64| ((slot * heads + head) * state_len as u64 + e as u64) as usize;
    let mut s = if p.has_init != 0 {
        // SAFETY: (seq, head, e) inside the final-state gradients (host-checked size).
        unsafe { *p.init_state.add(elem(entry.seq as u64)) }
    } else {
        0.0
    };
    let channel = (e / p.dv) as u64;
    for i in (1..entry.count).rev() {
        let slot = (entry.first + i) as u64;
        // SAFETY: slot - 1 and slot < segments (the entry's consecutive segments); element and
        // channel inside the workspace slices.
        unsafe {
            let d = *p
                .decay_log2
                .add(((slot * heads + head) * p.dk as u64 + channel) as usize);
            s = math::fma(math::exp2(d), s, *p.delta.add(elem(slot)));
            *p.seg_init.add(elem(slot - 1)) = s;
        }
    }
}
