//! The PTX embedded at build time (by `build.rs`, through `ptx-builder`), and the choice of
//! target for a device.

use std::collections::BTreeMap;
use std::sync::OnceLock;

pub use ptx_builder::KernelInfo;

/// A PTX target of this build.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    /// `sm_90a`: Hopper (compute capability exactly 9.0); TMA, wgmma, warp specialization.
    Sm90a,
    /// `sm_80`: any device of compute capability 8.0 or newer; cp.async, ldmatrix, mma.sync.
    Sm80,
}

impl Arch {
    /// Every embedded target, most specific first.
    pub const ALL: [Arch; 2] = [Arch::Sm90a, Arch::Sm80];

    /// The target CPU name (`sm_90a`, `sm_80`).
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm90a => "sm_90a",
            Arch::Sm80 => "sm_80",
        }
    }

    /// Parse a target CPU name.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Whether PTX for this target loads on a device of compute capability `major.minor`.
    /// `sm_90a` code is architecture-specific: it runs on 9.0 only.
    pub fn runs_on(self, major: u32, minor: u32) -> bool {
        match self {
            Arch::Sm90a => (major, minor) == (9, 0),
            Arch::Sm80 => major >= 8,
        }
    }

    /// The best target for a device, if any.
    pub fn for_device(major: u32, minor: u32) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.runs_on(major, minor))
    }

    /// Whether Hopper-only kernels (TMA, wgmma) are in this target's PTX.
    pub fn has_hopper_kernels(self) -> bool {
        self == Arch::Sm90a
    }

    /// The PTX text of this target.
    pub fn ptx(self) -> &'static str {
        match self {
            Arch::Sm90a => include_str!(concat!(env!("OUT_DIR"), "/gpu_kernels.sm_90a.ptx")),
            Arch::Sm80 => include_str!(concat!(env!("OUT_DIR"), "/gpu_kernels.sm_80.ptx")),
        }
    }

    /// The kernels of this target's PTX with their declared parameters and launch bounds
    /// (parsed once).
    pub fn kernels(self) -> &'static BTreeMap<String, KernelInfo> {
        static SM90A: OnceLock<BTreeMap<String, KernelInfo>> = OnceLock::new();
        static SM80: OnceLock<BTreeMap<String, KernelInfo>> = OnceLock::new();
        let cell = match self {
            Arch::Sm90a => &SM90A,
            Arch::Sm80 => &SM80,
        };
        cell.get_or_init(|| ptx_builder::kernel_signatures(self.ptx()))
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
