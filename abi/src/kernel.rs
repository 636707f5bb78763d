//! Typed kernel handles: each kernel of the PTX module declared once, with everything a launch
//! of it must agree on.
//!
//! A [`Kernel<P, S>`] names a PTX entry point, the `#[repr(C)]` parameter struct `P` it takes
//! (by value, as its only parameter), its block size and launch bounds, and its dynamic
//! shared-memory size as a function of a shape `S` (`()` when the size is fixed). The host
//! launches only through handles, so a parameter struct of the wrong type does not compile and
//! no kernel name is written at a launch site.
//!
//! Each family lists its handles' declarations in a table `KERNELS: &[KernelDecl]`. The kernel
//! crate's `launch_bounds!(name in TABLE)` takes an entry's launch bounds from the handle of the
//! entry's own name (an entry without a handle does not compile; see
//! `gpu-kernels/src/arch/mod.rs`), the PTX builder checks that every launch-bounds marker names
//! an entry of the module, and the host checks the tables against the PTX (every handle has its
//! entry with the declared parameter size and bounds) and every launch once more when it runs.

use core::marker::PhantomData;

/// A kernel of the PTX module (see the [module documentation](self)).
pub struct Kernel<P, S = ()> {
    /// The PTX entry name.
    pub name: &'static str,
    /// Threads per block (one-dimensional blocks), the entry's `.maxntid`.
    pub threads: u32,
    /// Resident blocks per SM that the launch bounds ask for, the entry's `.minnctapersm`.
    pub min_blocks: u32,
    /// Dynamic shared memory in bytes (including `SMEM_ALIGN` slack) for a shape.
    smem: fn(S) -> usize,
    _params: PhantomData<fn(P)>,
}

impl<P, S> Kernel<P, S> {
    /// Declare a kernel: entry `name`, `threads` per block, `min_blocks` resident blocks per SM,
    /// dynamic shared memory `smem(shape)`.
    pub const fn new(
        name: &'static str,
        threads: u32,
        min_blocks: u32,
        smem: fn(S) -> usize,
    ) -> Self {
        Kernel {
            name,
            threads,
            min_blocks,
            smem,
            _params: PhantomData,
        }
    }

    /// Dynamic shared memory in bytes of a launch for `shape`.
    pub fn smem_bytes(&self, shape: S) -> usize {
        (self.smem)(shape)
    }

    /// Bytes of the parameter struct, the size of the entry's only parameter.
    pub const fn param_bytes(&self) -> usize {
        core::mem::size_of::<P>()
    }

    /// The facts of this kernel that do not depend on its types.
    pub const fn info(&self) -> KernelDecl {
        KernelDecl {
            name: self.name,
            threads: self.threads,
            min_blocks: self.min_blocks,
            param_bytes: core::mem::size_of::<P>(),
        }
    }
}

/// What a handle declares of its kernel, without its types: for tables of every kernel and for
/// the host's checks against the PTX.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelDecl {
    /// The PTX entry name.
    pub name: &'static str,
    /// Threads per block.
    pub threads: u32,
    /// Resident blocks per SM of the launch bounds.
    pub min_blocks: u32,
    /// Bytes of the parameter struct.
    pub param_bytes: usize,
}

/// The handle named `name` in `table`; a compile-time error (a panic in a constant) if there is
/// none.
pub const fn find(table: &[KernelDecl], name: &str) -> KernelDecl {
    let mut i = 0;
    while i < table.len() {
        if str_eq(table[i].name, name) {
            return table[i];
        }
        i += 1;
    }
    panic!("no kernel handle of this name in the table")
}

/// Whether two strings are equal, in a constant expression (the kernel crate checks an entry's
/// name against its handle's with it).
pub const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

const _: () = assert!(str_eq("gemm", "gemm") && !str_eq("gemm", "gemn") && !str_eq("a", "ab"));
