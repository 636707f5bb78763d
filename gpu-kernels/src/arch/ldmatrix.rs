//! `ldmatrix` (sm_75+): warp-cooperative loads of 8x8 matrices of 16-bit elements from shared
//! memory into the register fragments that `mma.sync` takes.
//!
//! For `.x4`, lane `i` supplies the address of row `i % 8` of matrix `i / 8` (16 contiguous
//! bytes, 16-byte aligned); register `j` of lane `l` receives elements `(l / 4, 2 (l % 4))` and
//! `(l / 4, 2 (l % 4) + 1)` of matrix `j`. `.x2` uses lanes 0..16, `.x1` lanes 0..8 for addresses.
//! `.trans` delivers the transposed matrices.
//!
//! # Safety (all functions)
//! The whole warp executes the call in uniform control flow, and every addressed row is 16
//! bytes of shared memory, 16-byte aligned, written before a barrier that precedes the call.

use core::arch::asm;

/// `ldmatrix.sync.aligned.m8n8.x4.shared.b16`.
///
/// # Safety
/// See the module documentation.
#[inline(always)]
pub unsafe fn x4(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: forwarded to the caller (module contract).
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {{{0}, {1}, {2}, {3}}}, [{4}];",
             out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg32) addr,
             options(readonly, nostack))
    };
    [a, b, c, d]
}

/// `ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16`.
///
/// # Safety
/// See the module documentation.
#[inline(always)]
pub unsafe fn x4_trans(addr: u32) -> [u32; 4] {
    let (a, b, c, d): (u32, u32, u32, u32);
    // SAFETY: forwarded to the caller (module contract).
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {{{0}, {1}, {2}, {3}}}, [{4}];",
             out(reg32) a, out(reg32) b, out(reg32) c, out(reg32) d, in(reg32) addr,
             options(readonly, nostack))
    };
    [a, b, c, d]
}

/// `ldmatrix.sync.aligned.m8n8.x2.shared.b16`.
///
/// # Safety
/// See the module documentation.
#[inline(always)]
pub unsafe fn x2(addr: u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: forwarded to the caller (module contract).
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {{{0}, {1}}}, [{2}];",
             out(reg32) a, out(reg32) b, in(reg32) addr, options(readonly, nostack))
    };
    [a, b]
}

/// `ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16`.
///
/// # Safety
/// See the module documentation.
#[inline(always)]
pub unsafe fn x2_trans(addr: u32) -> [u32; 2] {
    let (a, b): (u32, u32);
    // SAFETY: forwarded to the caller (module contract).
    unsafe {
        asm!("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {{{0}, {1}}}, [{2}];",
             out(reg32) a, out(reg32) b, in(reg32) addr, options(readonly, nostack))
    };
    [a, b]
}
