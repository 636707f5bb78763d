//! `mma.sync` (sm_80+): warp-level tensor-core products, `m16n8k16`, 16-bit inputs, f32
//! accumulators.
//!
//! Fragments (lane `l`, `g = l / 4`, `t = l % 4`; pairs of 16-bit values packed low-first):
//! - A (16x16, row-major): `a[0]` = A[g][2t..2t+2], `a[1]` = A[g+8][2t..], `a[2]` = A[g][2t+8..],
//!   `a[3]` = A[g+8][2t+8..].
//! - B (16x8, "col": stored as B^T, i.e. `[n][k]`): `b[0]` = B[2t..2t+2][g], `b[1]` = B[2t+8..][g].
//! - C/D (16x8, f32): `d[0..2]` = D[g][2t..2t+2], `d[2..4]` = D[g+8][2t..2t+2].
//!
//! # Safety (all functions)
//! The whole warp executes the call in uniform control flow (`.aligned`).
//!
//! The asm is deliberately not `pure`: a pure asm may be sunk by LLVM into the (possibly
//! divergent) branch that uses its result, or be removed when unused by some lanes' paths;
//! without `pure` it stays where the source puts it, in uniform control flow. It touches no
//! memory (`nomem`), so loads and stores still move freely around it.

use core::arch::asm;

macro_rules! mma_m16n8k16 {
    ($(#[$doc:meta])* $name:ident, $ty:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// See the module documentation.
        #[inline(always)]
        pub unsafe fn $name(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
            // SAFETY: forwarded to the caller (module contract); registers only.
            unsafe {
                asm!(
                    concat!("mma.sync.aligned.m16n8k16.row.col.f32.", $ty, ".", $ty, ".f32 ",
                            "{{{0}, {1}, {2}, {3}}}, {{{4}, {5}, {6}, {7}}}, {{{8}, {9}}}, ",
                            "{{{0}, {1}, {2}, {3}}};"),
                    inout(reg32) d[0], inout(reg32) d[1], inout(reg32) d[2], inout(reg32) d[3],
                    in(reg32) a[0], in(reg32) a[1], in(reg32) a[2], in(reg32) a[3],
                    in(reg32) b[0], in(reg32) b[1],
                    options(nomem, nostack)
                )
            };
        }
    };
}

mma_m16n8k16!(
    /// `D += A B` with bf16 inputs: `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`.
    m16n8k16_bf16, "bf16"
);
mma_m16n8k16!(
    /// `D += A B` with f16 inputs: `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`.
    m16n8k16_f16, "f16"
);
