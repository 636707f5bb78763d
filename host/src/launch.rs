//! One launch of a kernel, built from its typed handle in `kernel_abi`.

use crate::gpu::LaunchConfig;
use kernel_abi::{Kernel, KernelDecl};

/// A launch of one kernel: what its handle declares, the launch shape, and the parameter struct
/// of the handle's type. Built only from a handle ([`Launch::new`]), so the block size is the
/// kernel's and the parameters have the kernel's type; run it with [`crate::Gpu::launch`] or
/// any [`crate::exec::Exec`].
#[derive(Clone, Copy, Debug)]
pub struct Launch<P> {
    kernel: KernelDecl,
    cfg: LaunchConfig,
    params: P,
}

impl<P: Copy> Launch<P> {
    /// Kernel `kernel` on `grid` blocks, with the dynamic shared memory of `shape`, on `params`.
    pub fn new<S>(kernel: &Kernel<P, S>, grid: (u32, u32, u32), shape: S, params: P) -> Self {
        Launch {
            kernel: kernel.info(),
            cfg: LaunchConfig::new(grid, kernel.threads, kernel.smem_bytes(shape)),
            params,
        }
    }

    /// The same launch, overlapping the previous kernel on its stream
    /// ([`LaunchConfig::overlap_previous`]: the kernel waits for it with `griddepcontrol.wait`).
    pub fn overlapping_previous(self) -> Self {
        Launch {
            cfg: self.cfg.overlapping_previous(),
            ..self
        }
    }

    /// What the kernel's handle declares.
    pub fn kernel(&self) -> &KernelDecl {
        &self.kernel
    }

    /// The kernel's PTX entry name.
    pub fn name(&self) -> &'static str {
        self.kernel.name
    }

    /// Grid, block and shared memory.
    pub fn config(&self) -> &LaunchConfig {
        &self.cfg
    }

    /// The parameter struct.
    pub fn params(&self) -> &P {
        &self.params
    }
}
