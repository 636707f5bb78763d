//! The PTX embedded at build time (by `build.rs`, through `ptx-builder`; zstd-compressed,
//! decompressed on first use), the choice of target for a device, and the module of one kernel
//! ([`Arch::entry_module`]).

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
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

    /// The PTX text of this target (decompressed once, on the first call: about 0.05 s).
    pub fn ptx(self) -> &'static str {
        static SM90A: OnceLock<String> = OnceLock::new();
        static SM80: OnceLock<String> = OnceLock::new();
        let (cell, packed): (_, &[u8]) = match self {
            Arch::Sm90a => (
                &SM90A,
                include_bytes!(concat!(env!("OUT_DIR"), "/gpu_kernels.sm_90a.ptx.zst")),
            ),
            Arch::Sm80 => (
                &SM80,
                include_bytes!(concat!(env!("OUT_DIR"), "/gpu_kernels.sm_80.ptx.zst")),
            ),
        };
        cell.get_or_init(|| {
            // The build script wrote this frame from the PTX text: an error here is a broken
            // build, not an input this library can meet at run time.
            let text = zstd::stream::decode_all(packed).expect("the embedded PTX decompresses");
            String::from_utf8(text).expect("the embedded PTX is UTF-8 text")
        })
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

    /// A PTX module holding kernel `name` alone: the module's shared declarations (header,
    /// external shared memory, device functions, globals) and the kernel's entry. The driver
    /// JIT-compiles a module whole when it is loaded, so loading each kernel's own module on
    /// its first launch compiles only the kernels a process uses (the whole `sm_90a` module
    /// takes tens of seconds).
    pub fn entry_module(self, name: &str) -> Option<String> {
        static SM90A: OnceLock<PtxIndex> = OnceLock::new();
        static SM80: OnceLock<PtxIndex> = OnceLock::new();
        let cell = match self {
            Arch::Sm90a => &SM90A,
            Arch::Sm80 => &SM80,
        };
        let ptx = self.ptx();
        let index = cell.get_or_init(|| PtxIndex::new(ptx));
        let range = index.entries.get(name)?;
        Some(format!("{}\n{}", index.shared, &ptx[range.clone()]))
    }
}

/// A PTX module split into what every kernel needs and each entry's text.
#[derive(Debug)]
struct PtxIndex {
    /// Everything outside the entries: the header and every top-level declaration that is not
    /// a kernel (device functions, globals, external shared memory).
    shared: String,
    /// Each entry's text (from its `.entry` line to the next top-level directive).
    entries: HashMap<String, Range<usize>>,
}

impl PtxIndex {
    /// Split `ptx` at its top-level directives (lines starting at column 0 with one of the
    /// PTX module directives that open a declaration); inline assembly inside a body never
    /// starts a line with one of them.
    fn new(ptx: &str) -> PtxIndex {
        const OPENERS: [&str; 7] = [
            ".visible", ".entry", ".func", ".global", ".const", ".extern", ".weak",
        ];
        let mut starts = Vec::new();
        let mut pos = 0;
        for line in ptx.split_inclusive('\n') {
            if OPENERS.iter().any(|o| line.starts_with(o)) {
                starts.push(pos);
            }
            pos += line.len();
        }
        let first = starts.first().copied().unwrap_or(ptx.len());
        let mut shared = ptx[..first].to_string();
        let mut entries = HashMap::new();
        for (i, &start) in starts.iter().enumerate() {
            let end = starts.get(i + 1).copied().unwrap_or(ptx.len());
            let chunk = &ptx[start..end];
            let head = chunk.strip_prefix(".visible ").unwrap_or(chunk);
            match head.strip_prefix(".entry ") {
                Some(rest) => {
                    let name = rest.split(['(', '\n']).next().unwrap_or("").trim();
                    entries.insert(name.to_string(), start..end);
                }
                None => shared.push_str(chunk),
            }
        }
        PtxIndex { shared, entries }
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "//\n.version 8.0\n.target sm_90a\n.address_size 64\n\
.extern .shared .align 1024 .b8 DYN_SMEM[];\n\
\t// .globl\tf\n.visible .func f(\n\t.param .b64 f_param_0\n)\n{\n\ttrap;\n}\n\
\t// .globl\tk1\n.visible .entry k1(\n\t.param .b64 k1_param_0\n)\n{\n\t{\n.reg .pred p;\n}\n\tret;\n}\n\
.global .align 4 .u32 g;\n\
.visible .entry k2(\n\t.param .b64 k2_param_0\n)\n{\n\tret;\n}\n";

    #[test]
    fn an_entry_module_holds_the_shared_declarations_and_one_entry() {
        let index = PtxIndex::new(PTX);
        assert_eq!(index.entries.len(), 2);
        for name in ["k1", "k2"] {
            let text = &PTX[index.entries[name].clone()];
            assert!(text.contains(&format!(".entry {name}(")));
            assert_eq!(text.matches(".entry").count(), 1);
        }
        for decl in [
            ".version 8.0",
            "DYN_SMEM",
            ".visible .func f(",
            ".global .align 4 .u32 g;",
        ] {
            assert!(index.shared.contains(decl), "{decl} missing");
        }
        assert!(!index.shared.contains(".entry"));
    }

    #[test]
    fn every_embedded_kernel_has_a_module_of_its_own() {
        for arch in Arch::ALL {
            for name in arch.kernels().keys() {
                let module = arch.entry_module(name).expect("indexed");
                assert_eq!(module.matches(".entry ").count(), 1, "{arch} {name}");
                assert!(module.contains(&format!(".entry {name}(")), "{arch} {name}");
                assert!(module.contains(&format!(".target {arch}")), "{arch} {name}");
            }
            assert!(arch.entry_module("no_such_kernel").is_none());
        }
    }
}
