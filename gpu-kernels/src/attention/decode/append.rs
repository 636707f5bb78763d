//! `attention_kv_append`: new keys and values written into a paged KV cache before a decode
//! step ([`KvAppendParams`] documents the layout and the clamping). One thread per 16-byte
//! chunk of one row of K and the same chunk of V; any 16-bit element type and head dimension
//! that is a multiple of `APPEND_CHUNK`.
//!
//! No barrier: each thread writes only its own chunks, and the host keeps the positions of
//! different (sequence, token) apart (the tables it checks; contents that send two tokens to
//! one slot leave either token's values there, never memory outside the caches).

use crate::arch::{global, index};
use kernel_abi::attention::decode::{APPEND_CHUNK, APPEND_THREADS, KvAppendParams};

/// The kernel's body.
///
/// # Safety
/// Launched with `ceil(batch seq_new heads_kv head_dim / (APPEND_CHUNK APPEND_THREADS))`
/// blocks (one dimension) of `APPEND_THREADS` threads on parameters satisfying
/// [`KvAppendParams`]' contract.
#[inline(always)]
pub(super) unsafe fn append(p: &KvAppendParams) {
    let chunks = (p.head_dim / APPEND_CHUNK) as u64;
    let i = index::block_idx_x() as u64 * APPEND_THREADS as u64 + index::thread_idx_x() as u64;
    let total = p.batch as u64 * p.seq_new as u64 * p.heads_kv as u64 * chunks;
    if i >= total {
        return;
    }
    let c = i % chunks;
    let row = i / chunks;
    let h = row % p.heads_kv as u64;
    let t = (row / p.heads_kv as u64) % p.seq_new as u64;
    let b = row / (p.heads_kv as u64 * p.seq_new as u64);
    let context = p.max_pages as u64 * p.page_size as u64;
    // SAFETY: b < batch: inside `cache_seqlens`.
    let len = unsafe { *p.cache_seqlens.add(b as usize) };
    let pos = (len.max(0) as u64).min(context) + t;
    if pos >= context {
        return;
    }
    let page_size = p.page_size as u64;
    // SAFETY: b < batch and pos / page_size < max_pages: inside the block table.
    let page = unsafe {
        *p.block_table
            .add((b * p.max_pages as u64 + pos / page_size) as usize)
    };
    if page < 0 || page as u32 >= p.num_pages {
        return;
    }
    let (page, slot, col) = (page as u64, pos % page_size, c * APPEND_CHUNK as u64);
    let src = |s: &[u64; 3]| b * s[0] + t * s[1] + h * s[2] + col;
    let dst = |s: &[u64; 3]| page * s[0] + slot * s[1] + h * s[2] + col;
    // SAFETY: every index is inside its tensor (the coordinates are below the sizes the host
    // checked the views against); rows, strides and chunks are 16-byte aligned (the contract);
    // this thread alone writes these destination bytes.
    unsafe {
        let k = global::load_nc_v4(p.k_new.add(src(&p.k_new_strides) as usize) as *const u32);
        let v = global::load_nc_v4(p.v_new.add(src(&p.v_new_strides) as usize) as *const u32);
        global::store_v4(p.k_cache.add(dst(&p.k_strides) as usize) as *mut u32, k);
        global::store_v4(p.v_cache.add(dst(&p.v_strides) as usize) as *mut u32, v);
    }
}

/// See the module documentation.
///
/// # Safety
/// As [`append`].
#[cfg(target_arch = "nvptx64")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn attention_kv_append(p: KvAppendParams) {
    crate::launch_bounds!(attention_kv_append in kernel_abi::attention::KERNELS);
    // SAFETY: forwarded to the caller.
    unsafe { append(&p) }
}

/// The append kernel, for the CPU emulator (`crate::emu`).
#[cfg(not(target_arch = "nvptx64"))]
pub const APPEND_EMU_KERNELS: &[crate::emu::EmuKernel] = &[crate::emu::EmuKernel {
    name: "attention_kv_append",
    params: core::mem::size_of::<KvAppendParams>(),
    threads: APPEND_THREADS,
    run: {
        unsafe fn run(p: *const u8) {
            // SAFETY: the emulator passes a parameter struct of this kernel's type (it checks
            // the size), whose contract the caller upholds.
            unsafe {
                let p = core::ptr::read_unaligned(p as *const KvAppendParams);
                append(&p)
            }
        }
        run
    },
}];
