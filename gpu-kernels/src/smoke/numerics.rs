//! `smoke_numerics`: the device's arithmetic on chosen values, to compare with what the CPU
//! emulator assumes: `ex2.approx.ftz.f32` (flushes below `2^-126`), `cvt.rn.bf16x2.f32` (round
//! to nearest even; subnormals?) and bf16 `mma.sync.m16n8k16` (exact products, f32 sums; bf16
//! subnormal inputs? operands of `2^+-101`? rows whose products overflow next to rows that do
//! not?).
//!
//! # Parameters
//! [`NumericsParams`]: scalar inputs and outputs, and `tiles` independent mma problems.
//!
//! # Thread mapping
//! One warp. Lane `l` computes scalars `l, l + 32, ...`; then, per tile, the warp loads the
//! fragments of A, B and C from global memory (layouts of `arch::mma`) and issues one `mma`.
//!
//! No shared memory, no barrier.

use crate::arch::{convert, index, math, mma};
use kernel_abi::smoke::{NUMERICS_THREADS, NumericsParams};

/// See the module documentation.
///
/// # Safety
/// One block of `NUMERICS_THREADS` threads; the buffers hold the lengths [`NumericsParams`]
/// documents, 4-byte aligned.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn smoke_numerics(p: NumericsParams) {
    crate::launch_bounds!(smoke_numerics in kernel_abi::smoke::KERNELS);
    let lane = index::lane_id();
    let mut i = lane;
    while i < p.scalars {
        // SAFETY: i < scalars, the length of x, ex2 and bf16.
        unsafe {
            let x = *p.x.add(i as usize);
            *p.ex2.add(i as usize) = math::exp2(x);
            *p.bf16.add(i as usize) = convert::pack_bf16x2(x, 0.0) as u16;
        }
        i += NUMERICS_THREADS;
    }
    let (g, t) = (lane / 4, lane % 4);
    for m in 0..p.tiles as usize {
        // Word (two bf16) at row `r`, column `k` (even) of a row-major bf16 matrix of `cols`.
        let word = |base: *const u16, r: u32, k: u32, cols: u32| {
            // SAFETY: r, k inside the tile (r < 16, k + 1 < 16); even element offset of a
            // 4-byte-aligned buffer, so the u32 read is aligned.
            unsafe { *(base.add((r * cols + k) as usize) as *const u32) }
        };
        let a = p.a.wrapping_add(m * 256);
        let b = p.b.wrapping_add(m * 128);
        let af = [
            word(a, g, 2 * t, 16),
            word(a, g + 8, 2 * t, 16),
            word(a, g, 2 * t + 8, 16),
            word(a, g + 8, 2 * t + 8, 16),
        ];
        let bf = [word(b, g, 2 * t, 16), word(b, g, 2 * t + 8, 16)];
        let at = |r: u32, col: u32| (m * 128) + (r * 8 + col) as usize;
        let idx = [
            at(g, 2 * t),
            at(g, 2 * t + 1),
            at(g + 8, 2 * t),
            at(g + 8, 2 * t + 1),
        ];
        let mut d = [0.0f32; 4];
        for e in 0..4 {
            // SAFETY: idx[e] < tiles * 128, the length of c.
            d[e] = unsafe { *p.c.add(idx[e]) };
        }
        // SAFETY: the whole warp, uniform control flow (tiles is a kernel parameter).
        unsafe { mma::m16n8k16_bf16(&mut d, af, bf) };
        for e in 0..4 {
            // SAFETY: idx[e] < tiles * 128, the length of d; one writer per element.
            unsafe { *p.d.add(idx[e]) = d[e] };
        }
    }
}
