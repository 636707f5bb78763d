//! `wgmma` (sm_90a): warpgroup-wide asynchronous tensor-core products, `m64nNk16` with bf16/f16
//! inputs and `m64nNk32` with e4m3 inputs, f32 accumulators in registers.
//!
//! Protocol, per warpgroup: [`fence`] before the first `wgmma` that reads accumulator registers
//! written by ordinary instructions; issue one or more `mma_*`; [`commit_group`]; later
//! [`wait_group`] before reading the accumulators or releasing the shared memory they read,
//! followed by `fence_operands_*` on the accumulators so the compiler cannot move their uses
//! above the wait.
//!
//! Accumulator layout (m64nN, f32, 128 threads, N/2 registers each): warp `w` of the warpgroup
//! owns rows `16w..16w+16`; lane `l` (`g = l / 4`, `t = l % 4`) holds, for each 8-column block
//! `j`, `acc[4j..4j+2]` = D[16w + g][8j + 2t..+2] and `acc[4j+2..4j+4]` = D[16w + g + 8][8j + 2t..+2].
//!
//! Operands in shared memory are described by 64-bit [matrix descriptors](Descriptor). For the
//! K-major, 128-byte-swizzled tiles TMA writes with `CU_TENSOR_MAP_SWIZZLE_128B` (rows of 64
//! 16-bit elements, 8-row groups 1024 bytes apart, tile base 1024-byte aligned),
//! [`Descriptor::k_major_sw128`] describes the 16-wide K slice at column `16 k` when given the
//! tile base plus `32 k` bytes.
//!
//! # Safety (all `mma_*` functions)
//! All 128 threads of a warpgroup (4 consecutive warps, the first a multiple of 4) execute the
//! call in uniform control flow; the descriptors describe shared memory that holds the operands,
//! written before a barrier (and, if written by ordinary stores, after a
//! `fence_proxy_async_shared` by each writer), and not overwritten before the [`wait_group`]
//! that retires this product.

use core::arch::asm;

/// A wgmma shared-memory matrix descriptor.
///
/// Bits: 0..14 start address >> 4; 16..30 leading-dimension byte offset >> 4; 32..46 stride
/// byte offset >> 4; 49..52 base offset; 62..64 swizzle mode (0 none, 1 128B, 2 64B, 3 32B).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Descriptor(pub u64);

/// Swizzle modes of a [`Descriptor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Swizzle {
    /// No swizzle (8x8 core matrices, "interleaved").
    None = 0,
    /// 128-byte swizzle (pattern repeats every 8 rows of 128 bytes).
    B128 = 1,
    /// 64-byte swizzle.
    B64 = 2,
    /// 32-byte swizzle.
    B32 = 3,
}

impl Descriptor {
    /// A descriptor from its fields (byte values; offsets must be multiples of 16).
    #[inline(always)]
    pub const fn new(
        start: u32,
        leading_byte_offset: u32,
        stride_byte_offset: u32,
        swizzle: Swizzle,
    ) -> Self {
        let start = ((start & 0x3_ffff) >> 4) as u64;
        let lbo = ((leading_byte_offset & 0x3_ffff) >> 4) as u64;
        let sbo = ((stride_byte_offset & 0x3_ffff) >> 4) as u64;
        Descriptor(start | (lbo << 16) | (sbo << 32) | ((swizzle as u64) << 62))
    }

    /// K-major operand, 128-byte swizzle: rows of 128 bytes (64 16-bit elements along K),
    /// 8-row core groups 1024 bytes apart (the stride byte offset); the leading byte offset is
    /// unused in this mode. `start` is the tile base (1024-byte aligned) plus `32 k` bytes for
    /// the k-th 16-element K slice, plus `1024 r` for a sub-tile starting at row `8 r`.
    #[inline(always)]
    pub const fn k_major_sw128(start: u32) -> Self {
        Descriptor::new(start, 16, 1024, Swizzle::B128)
    }

    /// MN-major operand (M or N contiguous; `imm-trans = 1`), 128-byte swizzle: each K row of a
    /// swizzle atom holds 64 16-bit elements along M/N (128 bytes), 8-row K groups are 1024
    /// bytes apart (stride byte offset), and consecutive 64-element atoms along M/N are
    /// `atom_stride` bytes apart (leading byte offset). `start` is the first atom's base plus
    /// `2048 k` bytes for the k-th 16-row K slice.
    #[inline(always)]
    pub const fn mn_major_sw128(start: u32, atom_stride: u32) -> Self {
        Descriptor::new(start, atom_stride, 1024, Swizzle::B128)
    }

    /// The descriptor advanced by `bytes` (a multiple of 16) of start address.
    #[inline(always)]
    pub const fn offset(self, bytes: u32) -> Self {
        Descriptor(self.0 + (bytes as u64 >> 4))
    }
}

/// `wgmma.fence.sync.aligned`: order earlier register and shared-memory accesses of the
/// warpgroup before the next `wgmma`.
///
/// # Safety
/// All threads of the warpgroup execute it in uniform control flow.
#[inline(always)]
pub unsafe fn fence() {
    // SAFETY: forwarded to the caller (whole warpgroup).
    unsafe { asm!("wgmma.fence.sync.aligned;", options(nostack)) };
}

/// `wgmma.commit_group.sync.aligned`: close the group of `wgmma`s issued since the last commit.
///
/// # Safety
/// All threads of the warpgroup execute it in uniform control flow.
#[inline(always)]
pub unsafe fn commit_group() {
    // SAFETY: forwarded to the caller (whole warpgroup).
    unsafe { asm!("wgmma.commit_group.sync.aligned;", options(nostack)) };
}

/// `wgmma.wait_group.sync.aligned N`: wait until at most `N` committed groups are pending.
///
/// # Safety
/// All threads of the warpgroup execute it in uniform control flow.
#[inline(always)]
pub unsafe fn wait_group<const N: u32>() {
    // SAFETY: forwarded to the caller (whole warpgroup).
    unsafe { asm!("wgmma.wait_group.sync.aligned {n};", n = const N, options(nostack)) };
}

/// Pin a register A fragment of a `wgmma` until after its `wait_group` (call it after the
/// wait): the registers of an in-flight `wgmma` must not be reused, and the compiler does not
/// know they are still being read.
#[inline(always)]
pub fn pin_fragment(a: &mut [u32; 4]) {
    // SAFETY: an asm statement that is only a comment naming the registers (no instruction, no
    // memory).
    unsafe {
        asm!("// wgmma pin fragment {0} {1} {2} {3}", inout(reg32) a[0], inout(reg32) a[1],
             inout(reg32) a[2], inout(reg32) a[3], options(nomem, nostack))
    };
}

macro_rules! fence_operands {
    ($(#[$doc:meta])* $name:ident, $regs:literal, [$($i:literal),*]) => {
        $(#[$doc])*
        #[inline(always)]
        pub fn $name(acc: &mut [f32; $regs]) {
            // SAFETY: an asm statement that is only a comment naming the registers: it claims to
            // read and write them, which pins them (no memory, no instruction).
            unsafe {
                asm!(concat!("// wgmma fence operands", $(" {", $i, "}",)*),
                     $(inout(reg32) acc[$i],)* options(nomem, nostack))
            };
        }
    };
}

macro_rules! wgmma_ss {
    ($(#[$doc:meta])* $name:ident, $n:literal, $ty:literal, $regs:literal, [$first:literal $(, $i:literal)*]) => {
        $(#[$doc])*
        ///
        /// `TRANS_A`/`TRANS_B` are the instruction's `imm-trans` operands: 0 for K-major
        /// operands, 1 for M/N-major ones. With `ACC == false` the product overwrites `acc`
        /// (`scale-d = 0`). The flag is an immediate, not a register: a register defined between
        /// the `wgmma`s of one batch would make ptxas serialize them.
        ///
        /// # Safety
        /// See the module documentation.
        #[inline(always)]
        pub unsafe fn $name<const TRANS_A: u32, const TRANS_B: u32, const ACC: bool>(
            acc: &mut [f32; $regs], a: Descriptor, b: Descriptor,
        ) {
            // SAFETY: forwarded to the caller (module contract).
            unsafe {
                asm!(
                    "{{",
                    ".reg .pred p;",
                    "setp.ne.b32 p, {scale_d}, 0;",
                    concat!("wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $ty, ".", $ty, " {{",
                            "{", $first, "}", $(", {", $i, "}",)*
                            "}}, {desc_a}, {desc_b}, p, 1, 1, {ta}, {tb};"),
                    "}}",
                    inout(reg32) acc[$first], $(inout(reg32) acc[$i],)*
                    desc_a = in(reg64) a.0, desc_b = in(reg64) b.0,
                    scale_d = const ACC as u32,
                    ta = const TRANS_A, tb = const TRANS_B,
                    options(nostack)
                )
            };
        }
    };
}

macro_rules! wgmma_rs {
    ($(#[$doc:meta])* $name:ident, $n:literal, $ty:literal, $regs:literal, [$first:literal $(, $i:literal)*]) => {
        $(#[$doc])*
        ///
        /// A comes from registers: `a` is this thread's fragment of the 64x16 A tile, laid out
        /// as the `mma.sync` m16n8k16 A fragment of its warp's 16 rows. `TRANS_B` and `ACC` as
        /// for the shared-memory form.
        ///
        /// # Safety
        /// See the module documentation.
        #[inline(always)]
        pub unsafe fn $name<const TRANS_B: u32, const ACC: bool>(
            acc: &mut [f32; $regs], a: [u32; 4], b: Descriptor,
        ) {
            // SAFETY: forwarded to the caller (module contract).
            unsafe {
                asm!(
                    "{{",
                    ".reg .pred p;",
                    "setp.ne.b32 p, {scale_d}, 0;",
                    concat!("wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $ty, ".", $ty, " {{",
                            "{", $first, "}", $(", {", $i, "}",)*
                            "}}, {{{a0}, {a1}, {a2}, {a3}}}, {desc_b}, p, 1, 1, {tb};"),
                    "}}",
                    inout(reg32) acc[$first], $(inout(reg32) acc[$i],)*
                    a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                    desc_b = in(reg64) b.0,
                    scale_d = const ACC as u32,
                    tb = const TRANS_B,
                    options(nostack)
                )
            };
        }
    };
}

macro_rules! wgmma_ss_zero {
    ($(#[$doc:meta])* $name:ident, $n:literal, $ty:literal, $regs:literal, [$first:literal $(, $i:literal)*]) => {
        $(#[$doc])*
        ///
        /// `D = A B` with `scale-d = 0`: the accumulators are outputs only, so nothing has to be
        /// written to them before (a zero-initialized `inout` operand would put instructions
        /// that define `wgmma` inputs into the pipeline, which serializes it).
        ///
        /// # Safety
        /// See the module documentation.
        #[inline(always)]
        pub unsafe fn $name<const TRANS_A: u32, const TRANS_B: u32>(
            acc: &mut [f32; $regs], a: Descriptor, b: Descriptor,
        ) {
            // SAFETY: forwarded to the caller (module contract).
            unsafe {
                asm!(
                    "{{",
                    ".reg .pred p;",
                    "setp.ne.b32 p, 0, 0;",
                    concat!("wgmma.mma_async.sync.aligned.m64n", $n, "k16.f32.", $ty, ".", $ty, " {{",
                            "{", $first, "}", $(", {", $i, "}",)*
                            "}}, {desc_a}, {desc_b}, p, 1, 1, {ta}, {tb};"),
                    "}}",
                    out(reg32) acc[$first], $(out(reg32) acc[$i],)*
                    desc_a = in(reg64) a.0, desc_b = in(reg64) b.0,
                    ta = const TRANS_A, tb = const TRANS_B,
                    options(nostack)
                )
            };
        }
    };
}

fence_operands!(
    /// Pin a 64x64 accumulator (see the module documentation).
    fence_operands_32, 32, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]
);

fence_operands!(
    /// Pin a 64x128 accumulator (see the module documentation).
    fence_operands_64, 64, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63]
);

fence_operands!(
    /// Pin a 64x96 accumulator (see the module documentation).
    fence_operands_48, 48, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47]
);

fence_operands!(
    /// Pin a 64x192 accumulator (see the module documentation).
    fence_operands_96, 96, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95]
);

fence_operands!(
    /// Pin a 64x256 accumulator (see the module documentation).
    fence_operands_128, 128, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127]
);

wgmma_ss!(
    /// `D (+)= A B`, m64n64k16, bf16, both operands in shared memory.
    m64n64k16_bf16_ss, 64, "bf16", 32, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]
);
wgmma_rs!(
    /// `D (+)= A B`, m64n64k16, bf16, A in registers.
    m64n64k16_bf16_rs, 64, "bf16", 32, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]
);

wgmma_ss!(
    /// `D (+)= A B`, m64n64k16, f16, both operands in shared memory.
    m64n64k16_f16_ss, 64, "f16", 32, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]
);
wgmma_rs!(
    /// `D (+)= A B`, m64n64k16, f16, A in registers.
    m64n64k16_f16_rs, 64, "f16", 32, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]
);

wgmma_ss!(
    /// `D (+)= A B`, m64n128k16, bf16, both operands in shared memory.
    m64n128k16_bf16_ss, 128, "bf16", 64, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63]
);
wgmma_rs!(
    /// `D (+)= A B`, m64n128k16, bf16, A in registers.
    m64n128k16_bf16_rs, 128, "bf16", 64, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63]
);

wgmma_ss!(
    /// `D (+)= A B`, m64n128k16, f16, both operands in shared memory.
    m64n128k16_f16_ss, 128, "f16", 64, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63]
);
wgmma_rs!(
    /// `D (+)= A B`, m64n128k16, f16, A in registers.
    m64n128k16_f16_rs, 128, "f16", 64, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n96k16, bf16, A in registers.
    m64n96k16_bf16_rs, 96, "bf16", 48, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47]
);
wgmma_rs!(
    /// `D (+)= A B`, m64n96k16, f16, A in registers.
    m64n96k16_f16_rs, 96, "f16", 48, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47]
);
wgmma_rs!(
    /// `D (+)= A B`, m64n192k16, bf16, A in registers.
    m64n192k16_bf16_rs, 192, "bf16", 96, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95]
);
wgmma_rs!(
    /// `D (+)= A B`, m64n192k16, f16, A in registers.
    m64n192k16_f16_rs, 192, "f16", 96, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95]
);

wgmma_ss!(
    /// `D (+)= A B`, m64n256k16, bf16, both operands in shared memory.
    m64n256k16_bf16_ss, 256, "bf16", 128, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127]
);
wgmma_rs!(
    /// `D (+)= A B`, m64n256k16, bf16, A in registers.
    m64n256k16_bf16_rs, 256, "bf16", 128, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127]
);

wgmma_ss!(
    /// `D (+)= A B`, m64n256k16, f16, both operands in shared memory.
    m64n256k16_f16_ss, 256, "f16", 128, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127]
);
wgmma_rs!(
    /// `D (+)= A B`, m64n256k16, f16, A in registers.
    m64n256k16_f16_rs, 256, "f16", 128, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127]
);

wgmma_ss_zero!(
    /// `D = A B`, m64n64k16, bf16, both operands in shared memory, accumulators overwritten.
    m64n64k16_bf16_ss_zero, 64, "bf16", 32, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]
);

wgmma_ss_zero!(
    /// `D = A B`, m64n64k16, f16, both operands in shared memory, accumulators overwritten.
    m64n64k16_f16_ss_zero, 64, "f16", 32, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31]
);

wgmma_ss_zero!(
    /// `D = A B`, m64n128k16, bf16, both operands in shared memory, accumulators overwritten.
    m64n128k16_bf16_ss_zero, 128, "bf16", 64, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63]
);

wgmma_ss_zero!(
    /// `D = A B`, m64n128k16, f16, both operands in shared memory, accumulators overwritten.
    m64n128k16_f16_ss_zero, 128, "f16", 64, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63]
);

wgmma_ss_zero!(
    /// `D = A B`, m64n256k16, bf16, both operands in shared memory, accumulators overwritten.
    m64n256k16_bf16_ss_zero, 256, "bf16", 128, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127]
);

wgmma_ss_zero!(
    /// `D = A B`, m64n256k16, f16, both operands in shared memory, accumulators overwritten.
    m64n256k16_f16_ss_zero, 256, "f16", 128, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127]
);

fence_operands!(
    /// Pin a 64x16 accumulator (see the module documentation).
    fence_operands_8, 8, [0, 1, 2, 3, 4, 5, 6, 7]
);

wgmma_ss!(
    /// `D (+)= A B`, m64n16k16, bf16, both operands in shared memory.
    m64n16k16_bf16_ss, 16, "bf16", 8, [0, 1, 2, 3, 4, 5, 6, 7]
);
wgmma_rs!(
    /// `D (+)= A B`, m64n16k16, bf16, A in registers.
    m64n16k16_bf16_rs, 16, "bf16", 8, [0, 1, 2, 3, 4, 5, 6, 7]
);

fence_operands!(
    /// Pin a 64x176 accumulator (see the module documentation).
    fence_operands_88, 88, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87]
);

wgmma_ss!(
    /// `D (+)= A B`, m64n176k16, bf16, both operands in shared memory.
    m64n176k16_bf16_ss, 176, "bf16", 88, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87]
);

wgmma_ss_zero!(
    /// `D = A B`, m64n176k16, bf16, both operands in shared memory, accumulators overwritten.
    m64n176k16_bf16_ss_zero, 176, "bf16", 88, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87]
);

// S = Q K^T in key steps of 192 (the D = 64 forward's long-key kernels).
wgmma_ss!(
    /// `D (+)= A B`, m64n192k16, bf16, both operands in shared memory.
    m64n192k16_bf16_ss, 192, "bf16", 96, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95]
);

wgmma_ss_zero!(
    /// `D = A B`, m64n192k16, bf16, both operands in shared memory, accumulator zeroed.
    m64n192k16_bf16_ss_zero, 192, "bf16", 96, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95]
);

wgmma_ss!(
    /// `D (+)= A B`, m64n192k16, f16, both operands in shared memory.
    m64n192k16_f16_ss, 192, "f16", 96, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95]
);

wgmma_ss_zero!(
    /// `D = A B`, m64n192k16, f16, both operands in shared memory, accumulator zeroed.
    m64n192k16_f16_ss_zero, 192, "f16", 96, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95]
);

// dQ = dS K of the D = 64 dK/dV/dQ kernel (each consumer computes 32 columns).
wgmma_ss!(
    /// `D (+)= A B`, m64n32k16, bf16, both operands in shared memory.
    m64n32k16_bf16_ss, 32, "bf16", 16, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
);
wgmma_ss!(
    /// `D (+)= A B`, m64n32k16, f16, both operands in shared memory.
    m64n32k16_f16_ss, 32, "f16", 16, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
);
wgmma_ss_zero!(
    /// `D = A B`, m64n32k16, bf16, both operands in shared memory, accumulators overwritten.
    m64n32k16_bf16_ss_zero, 32, "bf16", 16, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
);
wgmma_ss_zero!(
    /// `D = A B`, m64n32k16, f16, both operands in shared memory, accumulators overwritten.
    m64n32k16_f16_ss_zero, 32, "f16", 16, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
);
// The O += P V shapes of the remaining head dimensions (every multiple of 16 from 32 to 256)
// and their accumulators' fences.

fence_operands!(
    /// Pin a 64x32 accumulator (see the module documentation).
    fence_operands_16, 16, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
);

fence_operands!(
    /// Pin a 64x48 accumulator (see the module documentation).
    fence_operands_24, 24, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]
);

fence_operands!(
    /// Pin a 64x80 accumulator (see the module documentation).
    fence_operands_40, 40, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39]
);

fence_operands!(
    /// Pin a 64x112 accumulator (see the module documentation).
    fence_operands_56, 56, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55]
);

fence_operands!(
    /// Pin a 64x144 accumulator (see the module documentation).
    fence_operands_72, 72, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71]
);

fence_operands!(
    /// Pin a 64x160 accumulator (see the module documentation).
    fence_operands_80, 80, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79]
);

fence_operands!(
    /// Pin a 64x208 accumulator (see the module documentation).
    fence_operands_104, 104, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103]
);

fence_operands!(
    /// Pin a 64x224 accumulator (see the module documentation).
    fence_operands_112, 112, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111]
);

fence_operands!(
    /// Pin a 64x240 accumulator (see the module documentation).
    fence_operands_120, 120, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n32k16, bf16, A in registers.
    m64n32k16_bf16_rs, 32, "bf16", 16, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n32k16, f16, A in registers.
    m64n32k16_f16_rs, 32, "f16", 16, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n48k16, bf16, A in registers.
    m64n48k16_bf16_rs, 48, "bf16", 24, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n48k16, f16, A in registers.
    m64n48k16_f16_rs, 48, "f16", 24, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n80k16, bf16, A in registers.
    m64n80k16_bf16_rs, 80, "bf16", 40, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n80k16, f16, A in registers.
    m64n80k16_f16_rs, 80, "f16", 40, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n112k16, bf16, A in registers.
    m64n112k16_bf16_rs, 112, "bf16", 56, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n112k16, f16, A in registers.
    m64n112k16_f16_rs, 112, "f16", 56, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n144k16, bf16, A in registers.
    m64n144k16_bf16_rs, 144, "bf16", 72, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n144k16, f16, A in registers.
    m64n144k16_f16_rs, 144, "f16", 72, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n160k16, bf16, A in registers.
    m64n160k16_bf16_rs, 160, "bf16", 80, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n160k16, f16, A in registers.
    m64n160k16_f16_rs, 160, "f16", 80, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n176k16, bf16, A in registers.
    m64n176k16_bf16_rs, 176, "bf16", 88, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n176k16, f16, A in registers.
    m64n176k16_f16_rs, 176, "f16", 88, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n208k16, bf16, A in registers.
    m64n208k16_bf16_rs, 208, "bf16", 104, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n208k16, f16, A in registers.
    m64n208k16_f16_rs, 208, "f16", 104, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n224k16, bf16, A in registers.
    m64n224k16_bf16_rs, 224, "bf16", 112, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n224k16, f16, A in registers.
    m64n224k16_f16_rs, 224, "f16", 112, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n240k16, bf16, A in registers.
    m64n240k16_bf16_rs, 240, "bf16", 120, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119]
);

wgmma_rs!(
    /// `D (+)= A B`, m64n240k16, f16, A in registers.
    m64n240k16_f16_rs, 240, "f16", 120, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119]
);

// The S = Q K^T shapes of steps of 80 and 112 keys (above D = 128).

wgmma_ss!(
    /// `D (+)= A B`, m64n80k16, bf16, both operands in shared memory.
    m64n80k16_bf16_ss, 80, "bf16", 40, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39]
);

wgmma_ss_zero!(
    /// `D = A B`, m64n80k16, bf16, both operands in shared memory, accumulators overwritten.
    m64n80k16_bf16_ss_zero, 80, "bf16", 40, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39]
);

wgmma_ss!(
    /// `D (+)= A B`, m64n112k16, bf16, both operands in shared memory.
    m64n112k16_bf16_ss, 112, "bf16", 56, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55]
);

wgmma_ss_zero!(
    /// `D = A B`, m64n112k16, bf16, both operands in shared memory, accumulators overwritten.
    m64n112k16_bf16_ss_zero, 112, "bf16", 56, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55]
);

wgmma_ss!(
    /// `D (+)= A B`, m64n80k16, f16, both operands in shared memory.
    m64n80k16_f16_ss, 80, "f16", 40, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39]
);

wgmma_ss_zero!(
    /// `D = A B`, m64n80k16, f16, both operands in shared memory, accumulators overwritten.
    m64n80k16_f16_ss_zero, 80, "f16", 40, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39]
);

wgmma_ss!(
    /// `D (+)= A B`, m64n112k16, f16, both operands in shared memory.
    m64n112k16_f16_ss, 112, "f16", 56, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55]
);

wgmma_ss_zero!(
    /// `D = A B`, m64n112k16, f16, both operands in shared memory, accumulators overwritten.
    m64n112k16_f16_ss_zero, 112, "f16", 56, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55]
);

// FP8 (e4m3) products, k32: both operands K-major (FP8 `wgmma` has no `imm-trans` operands).
// The register A fragment of a k32 slice holds, per thread, four e4m3 per register: rows
// `16w + g` (registers 0, 2) and `16w + g + 8` (1, 3), k positions `4t .. 4t + 4` (registers
// 0, 1) and `16 + 4t .. 16 + 4t + 4` (2, 3), the lowest byte first.

macro_rules! wgmma_fp8 {
    (ss $(#[$doc:meta])* $name:ident, $n:literal, $regs:literal, [$first:literal $(, $i:literal)*]) => {
        $(#[$doc])*
        ///
        /// With `ACC == false` the product overwrites `acc` (`scale-d = 0`).
        ///
        /// # Safety
        /// See the module documentation.
        #[inline(always)]
        pub unsafe fn $name<const ACC: bool>(acc: &mut [f32; $regs], a: Descriptor, b: Descriptor) {
            // SAFETY: forwarded to the caller (module contract).
            unsafe {
                asm!(
                    "{{",
                    ".reg .pred p;",
                    "setp.ne.b32 p, {scale_d}, 0;",
                    concat!("wgmma.mma_async.sync.aligned.m64n", $n, "k32.f32.e4m3.e4m3 {{",
                            "{", $first, "}", $(", {", $i, "}",)*
                            "}}, {desc_a}, {desc_b}, p, 1, 1;"),
                    "}}",
                    inout(reg32) acc[$first], $(inout(reg32) acc[$i],)*
                    desc_a = in(reg64) a.0, desc_b = in(reg64) b.0,
                    scale_d = const ACC as u32,
                    options(nostack)
                )
            };
        }
    };
    (ss_zero $(#[$doc:meta])* $name:ident, $n:literal, $regs:literal, [$first:literal $(, $i:literal)*]) => {
        $(#[$doc])*
        ///
        /// `D = A B` with `scale-d = 0`, the accumulators outputs only (as the 16-bit
        /// `_ss_zero` forms).
        ///
        /// # Safety
        /// See the module documentation.
        #[inline(always)]
        pub unsafe fn $name(acc: &mut [f32; $regs], a: Descriptor, b: Descriptor) {
            // SAFETY: forwarded to the caller (module contract).
            unsafe {
                asm!(
                    "{{",
                    ".reg .pred p;",
                    "setp.ne.b32 p, 0, 0;",
                    concat!("wgmma.mma_async.sync.aligned.m64n", $n, "k32.f32.e4m3.e4m3 {{",
                            "{", $first, "}", $(", {", $i, "}",)*
                            "}}, {desc_a}, {desc_b}, p, 1, 1;"),
                    "}}",
                    out(reg32) acc[$first], $(out(reg32) acc[$i],)*
                    desc_a = in(reg64) a.0, desc_b = in(reg64) b.0,
                    options(nostack)
                )
            };
        }
    };
    (rs $(#[$doc:meta])* $name:ident, $n:literal, $regs:literal, [$first:literal $(, $i:literal)*]) => {
        $(#[$doc])*
        ///
        /// A comes from registers: `a` is this thread's fragment of the 64x32 A tile (see the
        /// FP8 layout above). `ACC` as for the shared-memory form.
        ///
        /// # Safety
        /// See the module documentation.
        #[inline(always)]
        pub unsafe fn $name<const ACC: bool>(acc: &mut [f32; $regs], a: [u32; 4], b: Descriptor) {
            // SAFETY: forwarded to the caller (module contract).
            unsafe {
                asm!(
                    "{{",
                    ".reg .pred p;",
                    "setp.ne.b32 p, {scale_d}, 0;",
                    concat!("wgmma.mma_async.sync.aligned.m64n", $n, "k32.f32.e4m3.e4m3 {{",
                            "{", $first, "}", $(", {", $i, "}",)*
                            "}}, {{{a0}, {a1}, {a2}, {a3}}}, {desc_b}, p, 1, 1;"),
                    "}}",
                    inout(reg32) acc[$first], $(inout(reg32) acc[$i],)*
                    a0 = in(reg32) a[0], a1 = in(reg32) a[1], a2 = in(reg32) a[2], a3 = in(reg32) a[3],
                    desc_b = in(reg64) b.0,
                    scale_d = const ACC as u32,
                    options(nostack)
                )
            };
        }
    };
}

wgmma_fp8!(
    ss
    /// `D (+)= A B`, m64n128k32, e4m3, both operands in shared memory (K-major).
    m64n128k32_e4m3_ss, 128, 64, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63]
);
wgmma_fp8!(
    ss_zero
    /// `D = A B`, m64n128k32, e4m3, both operands in shared memory (K-major), accumulators
    /// overwritten.
    m64n128k32_e4m3_ss_zero, 128, 64, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63]
);
wgmma_fp8!(
    rs
    /// `D (+)= A B`, m64n128k32, e4m3, A in registers, B K-major in shared memory.
    m64n128k32_e4m3_rs, 128, 64, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63]
);
wgmma_fp8!(
    rs
    /// `D (+)= A B`, m64n256k32, e4m3, A in registers, B K-major in shared memory.
    m64n256k32_e4m3_rs, 256, 128, [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89, 90, 91, 92, 93, 94, 95, 96, 97, 98, 99, 100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127]
);
