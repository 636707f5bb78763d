//! The decode kernel's loads: the block's query rows (the tokens and heads of one key/value
//! head's group) and the K/V tiles gathered from the pages of a paged cache.

use super::super::mma::mainloop::tile_offset;
use crate::arch::{cp_async, index};
use kernel_abi::attention::decode::{AttentionDecodeParams, DECODE_BLOCK_M, DECODE_BLOCK_N};

/// 16-key slices of a K/V tile (a slice lies in one page: pages hold a multiple of 16 keys).
pub(super) const SLICES: usize = (DECODE_BLOCK_N / 16) as usize;

/// Where a block works: its sequence, key/value head, query rows and keys.
#[derive(Clone, Copy)]
pub(super) struct Place {
    /// Sequence.
    pub(super) b: u32,
    /// Key/value head.
    pub(super) hkv: u32,
    /// Query heads per key/value head.
    pub(super) group: u32,
    /// The block's first row (`token * group + head in group`).
    pub(super) row0: u32,
    /// Rows of the block that exist (`<= DECODE_BLOCK_M`).
    pub(super) rows_valid: u32,
    /// The sequence's context, clamped into `0 ..= max_pages * page_size`.
    pub(super) len: u32,
}

impl Place {
    /// Token and query head of the block's row `r` (`r < rows_valid`).
    #[inline(always)]
    pub(super) fn row(&self, r: u32) -> (u32, u32) {
        let gr = self.row0 + r;
        (gr / self.group, self.hkv * self.group + gr % self.group)
    }
}

/// Where the 16-key slices of a K/V tile lie in the cache.
#[derive(Clone, Copy)]
pub(super) struct TilePages {
    /// The page of each slice, read from the block table and clamped into `0 .. num_pages` (0
    /// for slices past the context, not read).
    pages: [u32; SLICES],
    /// The slot of each slice's first key in its page.
    slots: [u32; SLICES],
}

/// The pages and slots of the 16-key slices of the tile of keys `n0 .. n0 + DECODE_BLOCK_N`
/// (`n0` a multiple of 16). One division per tile: a slice's page and slot follow from the
/// one before it (pages hold a multiple of 16 keys, so a slot steps by 16 and wraps to the
/// next page at `page_size`).
#[inline(always)]
pub(super) fn tile_pages(p: &AttentionDecodeParams, at: &Place, n0: u32) -> TilePages {
    let mut t = TilePages {
        pages: [0; SLICES],
        slots: [0; SLICES],
    };
    let row = p
        .block_table
        .wrapping_add((at.b as u64 * p.max_pages as u64) as usize);
    // `idx`, `slot`: page-table index and slot of key `n0 + 16 s` (`idx page_size + slot`).
    let mut idx = n0 / p.page_size;
    let mut slot = n0 - idx * p.page_size;
    for s in 0..SLICES {
        let key = n0 + 16 * s as u32;
        if key < at.len {
            // SAFETY: idx = key / page_size and key < len <= max_pages * page_size, so idx <
            // max_pages: inside the block table's row b (b < batch: the grid).
            let raw = unsafe { *row.add(idx as usize) };
            t.pages[s] = (raw.max(0) as u32).min(p.num_pages - 1);
            t.slots[s] = slot;
        }
        slot += 16;
        if slot == p.page_size {
            slot = 0;
            idx += 1;
        }
    }
    t
}

/// `pages[i]` with a runtime `i` as a chain of selects (an indexed load would put the array in
/// local memory).
#[inline(always)]
fn pick(pages: &[u32; SLICES], i: u32) -> u32 {
    let mut v = pages[0];
    for (s, &x) in pages.iter().enumerate().skip(1) {
        if i == s as u32 {
            v = x;
        }
    }
    v
}

/// Issue the `cp.async` copies of the K and V tiles of keys `n0 .. n0 + DECODE_BLOCK_N` into
/// `k_s`, `v_s` (the padded row layout of [`tile_offset`]), their slices' places `pages`
/// ([`tile_pages`]); keys at or past the context are zero-filled (nothing is read for them).
#[inline(always)]
pub(super) fn load_kv<const D: u32, const THREADS: u32>(
    p: &AttentionDecodeParams,
    at: &Place,
    k_s: u32,
    v_s: u32,
    n0: u32,
    pages: &TilePages,
) {
    let chunks = D / 8;
    const { assert!((DECODE_BLOCK_N * (D / 8)).is_multiple_of(THREADS)) };
    let tid = index::thread_idx_x();
    let (ks, vs) = (&p.k_strides, &p.v_strides);
    let head_k = at.hkv as u64 * ks[2];
    let head_v = at.hkv as u64 * vs[2];
    for k in 0..DECODE_BLOCK_N * chunks / THREADS {
        // Copy k is chunk `tid + k THREADS` of the tile in row-major order (a thread keeps its
        // chunk where D / 8 divides THREADS).
        let i = tid + k * THREADS;
        let (r, c) = (i / chunks, i % chunks);
        let key = n0 + r;
        let off = tile_offset::<D>(r, c);
        if key < at.len {
            let page = pick(&pages.pages, r / 16) as u64;
            // The slot of key n0 + r: its slice's first slot, plus r % 16 (a slice lies in one
            // page).
            let slot = (pick(&pages.slots, r / 16) + r % 16) as u64;
            let src_k = p
                .k_cache
                .wrapping_add((page * ks[0] + slot * ks[1] + head_k + 8 * c as u64) as usize);
            let src_v = p
                .v_cache
                .wrapping_add((page * vs[0] + slot * vs[1] + head_v + 8 * c as u64) as usize);
            // SAFETY: page < num_pages, slot < page_size (key < len), the head < heads_kv and chunk c < D / 8:
            // 16 readable, 16-byte aligned bytes of each cache (host-checked views); the
            // destinations are inside the stage's tiles (r < DECODE_BLOCK_N).
            unsafe {
                cp_async::copy_16(k_s + off, src_k as *const u8);
                cp_async::copy_16(v_s + off, src_v as *const u8);
            }
        } else {
            // SAFETY: nothing is read (0 source bytes); the destinations are inside the tiles.
            unsafe {
                cp_async::copy_16_zfill(k_s + off, p.k_cache as *const u8, 0);
                cp_async::copy_16_zfill(v_s + off, p.v_cache as *const u8, 0);
            }
        }
    }
}

/// Issue the `cp.async` copies of the block's query rows into the Q tile at `q_s` (rows past
/// `rows_valid` zero-filled).
#[inline(always)]
pub(super) fn load_q<const D: u32, const THREADS: u32>(
    p: &AttentionDecodeParams,
    at: &Place,
    q_s: u32,
) {
    let chunks = D / 8;
    let tid = index::thread_idx_x();
    for k in 0..(DECODE_BLOCK_M * chunks).div_ceil(THREADS) {
        let i = tid + k * THREADS;
        if i >= DECODE_BLOCK_M * chunks {
            break;
        }
        let (r, c) = (i / chunks, i % chunks);
        let dst = q_s + tile_offset::<D>(r, c);
        if r < at.rows_valid {
            let (token, head) = at.row(r);
            let src = p.q.wrapping_add(
                (at.b as u64 * p.q_strides[0]
                    + token as u64 * p.q_strides[1]
                    + head as u64 * p.q_strides[2]
                    + 8 * c as u64) as usize,
            );
            // SAFETY: token < seq_q, head < heads_q, b < batch, chunk < D / 8: 16 readable,
            // aligned bytes of Q (host-checked view); dst is inside the Q tile.
            unsafe { cp_async::copy_16(dst, src as *const u8) };
        } else {
            // SAFETY: nothing is read; dst is inside the Q tile.
            unsafe { cp_async::copy_16_zfill(dst, p.q as *const u8, 0) };
        }
    }
}
