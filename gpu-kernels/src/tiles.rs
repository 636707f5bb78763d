//! Tile loaders shared by the `cp.async` kernels (attention's `mma.sync` path, GLA).

use crate::arch::{cp_async, index};

/// Issue the `cp.async` copies of a `[ROWS, D]` bf16/f16 tile whose row `r` starts at global
/// element `base + first_row_offset + r * stride`, to shared byte address `dst + place(r, c)`
/// for its 16-byte chunk `c` (the caller's layout: swizzled, padded, ...); rows at or past
/// `valid` are zero-filled (nothing is read for them). When `D / 8` divides `THREADS`, thread `t`
/// copies chunk `t % (D / 8)` of rows `t / (D / 8) + k (THREADS / (D / 8))`: a compile-time trip
/// count and one address add per copy; else chunks `t + k THREADS` of the tile in row-major
/// order (the last round partial when `THREADS` does not divide the tile's chunks).
///
/// The caller guarantees: rows `< valid` are readable over `D` elements from a 16-byte aligned
/// address (aligned base and strides), and `place(r, c)` stays inside the tile for `r < ROWS`,
/// `c < D / 8`, 16-byte aligned.
#[inline(always)]
pub fn load_rows<const D: u32, const ROWS: u32, const THREADS: u32>(
    dst: u32,
    place: impl Fn(u32, u32) -> u32,
    base: *const u16,
    first_row_offset: u64,
    stride: u64,
    valid: u32,
) {
    const { assert!(!THREADS.is_multiple_of(D / 8) || ROWS.is_multiple_of(THREADS / (D / 8))) };
    let chunks = D / 8;
    let tid = index::thread_idx_x();
    if !THREADS.is_multiple_of(chunks) {
        // A thread's chunk changes from copy to copy: copy `k` is chunk `tid + k THREADS` of
        // the tile in row-major order.
        let total = ROWS * chunks;
        for k in 0..total.div_ceil(THREADS) {
            let i = tid + k * THREADS;
            if !total.is_multiple_of(THREADS) && i >= total {
                break;
            }
            let (r, chunk) = (i / chunks, i % chunks);
            copy_chunk(
                dst + place(r, chunk),
                base,
                first_row_offset,
                stride,
                r,
                chunk,
                valid,
            );
        }
        return;
    }
    let row_step = THREADS / chunks;
    let (row0, chunk) = (tid / chunks, tid % chunks);
    let mut src =
        base.wrapping_add((first_row_offset + row0 as u64 * stride + 8 * chunk as u64) as usize);
    let step = (row_step as u64 * stride) as usize;
    for k in 0..ROWS / row_step {
        let r = row0 + k * row_step;
        let addr = dst + place(r, chunk);
        if r < valid {
            // SAFETY: r < valid rows, chunk < D / 8: 16 readable bytes, 16-byte aligned (the
            // caller's contract); addr is inside the tile (r < ROWS, the caller's `place`).
            unsafe { cp_async::copy_16(addr, src as *const u8) };
        } else {
            // SAFETY: nothing is read (0 source bytes); addr is inside the tile.
            unsafe { cp_async::copy_16_zfill(addr, base as *const u8, 0) };
        }
        src = src.wrapping_add(step);
    }
}

/// One copy of [`load_rows`]: chunk `chunk` of row `r` to `addr` (zero-filled at or past
/// `valid`), under its contract.
#[inline(always)]
fn copy_chunk(
    addr: u32,
    base: *const u16,
    first_row_offset: u64,
    stride: u64,
    r: u32,
    chunk: u32,
    valid: u32,
) {
    if r < valid {
        let src =
            base.wrapping_add((first_row_offset + r as u64 * stride + 8 * chunk as u64) as usize);
        // SAFETY: r < valid rows, chunk < D / 8: 16 readable bytes, 16-byte aligned (the
        // caller's contract of `load_rows`); addr is inside the tile.
        unsafe { cp_async::copy_16(addr, src as *const u8) };
    } else {
        // SAFETY: nothing is read (0 source bytes); addr is inside the tile.
        unsafe { cp_async::copy_16_zfill(addr, base as *const u8, 0) };
    }
}
