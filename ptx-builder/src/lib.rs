//! Builds the kernel crate (`gpu-kernels`) to PTX with rustc's own NVPTX backend.
//!
//! This is the job rust-cuda's `cuda_builder` would do; that crate cannot be built on our
//! machines (it needs LLVM 7, see the README). Both the host crate's build script and
//! `cargo xtask build-ptx` call [`Builder::build`], so there is one way to make PTX.
//!
//! Steps, per target ([`TARGETS`]):
//! 1. a nested `cargo rustc --release --target nvptx64-nvidia-cuda -Zbuild-std=core -- --emit=asm`
//!    with its own target directory (one per target CPU) and a scrubbed environment: nothing of
//!    the outer build (`RUSTFLAGS`, wrappers such as clippy-driver, `CARGO_TARGET_DIR`, ...) leaks
//!    into the kernel build, and `RUSTFLAGS` is exactly [`kernel_rustflags`]. The nested cargo is
//!    the nightly pinned by the workspace's `rust-toolchain.toml`, run through rustup
//!    ([`Toolchain`]) and installed by it on first use, whatever toolchain builds the host: a
//!    crate on stable Rust can depend on the host crate;
//! 2. the emitted `.s` file (which is PTX) is post-processed by [`postprocess`];
//! 3. the result is written to `<out_dir>/gpu_kernels.<cpu>.ptx`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A PTX target: which GPUs it runs on and how it is compiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// `-C target-cpu` (and the `.target` line of the PTX).
    pub cpu: &'static str,
    /// The PTX ISA version's target feature (`-C target-feature`), where the target needs one
    /// above the lowest its CPU allows.
    pub ptx: Option<&'static str>,
    /// What the target is for, for humans.
    pub role: &'static str,
}

/// Hopper: wgmma, setmaxnreg, TMA, mbarrier transaction counts. `sm_90a` code loads only on
/// devices of compute capability exactly 9.0.
pub const SM_90A: Target = Target {
    cpu: "sm_90a",
    ptx: Some("+ptx81"),
    role: "Hopper (compute capability 9.0): TMA, wgmma, warp specialization",
};

/// The portable path: `cp.async`, `ldmatrix`, `mma.sync`; loads on any device of compute
/// capability 8.0 or newer.
pub const SM_80: Target = Target {
    cpu: "sm_80",
    ptx: None,
    role: "Ampere or newer (compute capability >= 8.0): cp.async, ldmatrix, mma.sync",
};

/// Every target the project builds, most specific first.
pub const TARGETS: [Target; 2] = [SM_90A, SM_80];

/// The rustc target triple of the kernel crate.
pub const TRIPLE: &str = "nvptx64-nvidia-cuda";

/// Name of the PTX file written for `target` in the output directory.
pub fn ptx_file_name(target: &Target) -> String {
    format!("gpu_kernels.{}.ptx", target.cpu)
}

/// A failed build, with what was being done.
#[derive(Debug)]
pub struct BuildError(pub String);

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BuildError {}

fn err(msg: impl Into<String>) -> BuildError {
    BuildError(msg.into())
}

/// The cargo of the nested kernel builds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Toolchain {
    /// `rustup run <channel> cargo`: the channel pinned by the workspace's `rust-toolchain.toml`
    /// (installed with its components if missing), whichever toolchain runs the outer build.
    Rustup {
        /// The pinned channel.
        channel: String,
        /// Its components (`rust-src` for `-Zbuild-std`).
        components: Vec<String>,
    },
    /// This cargo binary as it is (where rustup is not installed: it must be the pinned
    /// nightly, or one that builds the kernels as well).
    Cargo(PathBuf),
}

/// The channel and components of a `rust-toolchain.toml` (`[toolchain]` `channel = "..."`,
/// `components = [...]`; other keys ignored).
pub fn parse_toolchain_file(text: &str) -> Result<(String, Vec<String>), BuildError> {
    let value = |key: &str| {
        text.lines()
            .map(str::trim)
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == key).then(|| v.trim().to_string())
            })
    };
    let strings = |v: &str| -> Vec<String> {
        v.split('"')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect()
    };
    let channel = value("channel")
        .map(|v| strings(&v))
        .and_then(|v| v.into_iter().next())
        .ok_or_else(|| err("rust-toolchain.toml has no `channel = \"...\"`"))?;
    let components = value("components").map_or_else(Vec::new, |v| strings(&v));
    Ok((channel, components))
}

/// Where the kernel crate is and where its builds go.
#[derive(Clone, Debug)]
pub struct Builder {
    /// The workspace root (holds `gpu-kernels/`, `abi/`, `rust-toolchain.toml`).
    pub workspace: PathBuf,
    /// The cargo of the nested builds.
    pub toolchain: Toolchain,
    /// Target directory of the nested builds (one sub-directory per target CPU).
    pub target_dir: PathBuf,
    /// Forward the nested cargo's progress output (xtask) or keep it quiet (build script).
    pub verbose: bool,
}

impl Builder {
    /// A builder for the workspace at `workspace`, building under `<workspace>/target/ptx-build`
    /// with the pinned nightly through rustup where rustup is installed, else with `cargo`.
    pub fn new(
        workspace: impl Into<PathBuf>,
        cargo: impl Into<PathBuf>,
    ) -> Result<Self, BuildError> {
        let workspace = workspace.into();
        let target_dir = workspace.join("target").join("ptx-build");
        let rustup = Command::new("rustup")
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        let toolchain = if rustup {
            let file = workspace.join("rust-toolchain.toml");
            let text = std::fs::read_to_string(&file)
                .map_err(|e| err(format!("reading {}: {e}", file.display())))?;
            let (channel, components) =
                parse_toolchain_file(&text).map_err(|e| err(format!("{}: {e}", file.display())))?;
            Toolchain::Rustup {
                channel,
                components,
            }
        } else {
            Toolchain::Cargo(cargo.into())
        };
        Ok(Builder {
            workspace,
            toolchain,
            target_dir,
            verbose: false,
        })
    }

    /// Install the pinned toolchain with its components if rustup does not have it yet.
    fn ensure_toolchain(&self) -> Result<(), BuildError> {
        let Toolchain::Rustup {
            channel,
            components,
        } = &self.toolchain
        else {
            return Ok(());
        };
        let list = Command::new("rustup")
            .args(["toolchain", "list"])
            .output()
            .map_err(|e| err(format!("could not run rustup: {e}")))?;
        let listed = String::from_utf8_lossy(&list.stdout).lines().any(|l| {
            l.split_whitespace().next() == Some(channel.as_str())
                || l.starts_with(&format!("{channel}-"))
        });
        if listed {
            return Ok(());
        }
        let mut cmd = Command::new("rustup");
        cmd.args(["toolchain", "install", channel, "--profile", "minimal"]);
        for c in components {
            cmd.args(["--component", c]);
        }
        let out = cmd
            .output()
            .map_err(|e| err(format!("could not run rustup: {e}")))?;
        if !out.status.success() {
            return Err(err(format!(
                "installing the kernels' toolchain {channel} with rustup failed ({}):\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(())
    }

    /// The kernel crate's directory.
    pub fn kernel_dir(&self) -> PathBuf {
        self.workspace.join("gpu-kernels")
    }

    /// Files and directories whose change must trigger a rebuild of the PTX.
    pub fn inputs(&self) -> Vec<PathBuf> {
        vec![
            self.kernel_dir().join("src"),
            self.kernel_dir().join("Cargo.toml"),
            self.workspace.join("abi").join("src"),
            self.workspace.join("abi").join("Cargo.toml"),
            self.workspace.join("rust-toolchain.toml"),
        ]
    }

    /// Build every target in [`TARGETS`] and write the PTX files into `out_dir`.
    pub fn build_all(&self, out_dir: &Path) -> Result<Vec<(Target, PathBuf)>, BuildError> {
        self.ensure_toolchain()?;
        TARGETS
            .iter()
            .map(|t| self.build(t, out_dir).map(|p| (*t, p)))
            .collect()
    }

    /// Build one target and write `<out_dir>/gpu_kernels.<cpu>.ptx`.
    pub fn build(&self, target: &Target, out_dir: &Path) -> Result<PathBuf, BuildError> {
        let target_dir = self.target_dir.join(target.cpu);
        let mut cmd = match &self.toolchain {
            Toolchain::Rustup { channel, .. } => {
                let mut c = Command::new("rustup");
                c.args(["run", channel, "cargo"]);
                c
            }
            Toolchain::Cargo(cargo) => Command::new(cargo),
        };
        cmd.current_dir(self.kernel_dir())
            .args(["rustc", "--release", "--target", TRIPLE, "-Zbuild-std=core"])
            .arg("--manifest-path")
            .arg(self.kernel_dir().join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target_dir)
            .args(["--", "--emit=asm"]);
        scrub_env(&mut cmd);
        cmd.env("RUSTFLAGS", kernel_rustflags(target));
        let output = cmd
            .output()
            .map_err(|e| err(format!("could not run {:?}: {e}", cmd.get_program())))?;
        if self.verbose {
            eprint!("{}", String::from_utf8_lossy(&output.stderr));
        }
        if !output.status.success() {
            return Err(err(format!(
                "building the kernel crate for {} failed ({}):\n{}",
                target.cpu,
                output.status,
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        let deps = target_dir.join(TRIPLE).join("release").join("deps");
        let asm = newest_file(&deps, "gpu_kernels-", ".s")?;
        let text = std::fs::read_to_string(&asm)
            .map_err(|e| err(format!("reading {}: {e}", asm.display())))?;
        let ptx = postprocess(&text).map_err(|e| err(format!("{}: {e}", asm.display())))?;
        check_launch_bounds(&ptx).map_err(|e| err(format!("{}: {e}", asm.display())))?;
        std::fs::create_dir_all(out_dir)
            .map_err(|e| err(format!("creating {}: {e}", out_dir.display())))?;
        let dest = out_dir.join(ptx_file_name(target));
        write_if_changed(&dest, &ptx)?;
        Ok(dest)
    }
}

/// The `RUSTFLAGS` of a kernel build (applied to `core` as well as the kernel crate):
/// - `-C target-cpu`: the target; LLVM emits the lowest PTX ISA version that supports it (7.0
///   for `sm_80`), or the target's `ptx` feature's: 8.1 for `sm_90a` (8.0 has wgmma,
///   setmaxnreg and TMA; 8.1 adds the vector reductions `red.global.add.v4.f32`);
/// - `-C panic=immediate-abort`: a panic (a failed bounds check) becomes an inline `trap`
///   instead of a call into `core`'s panic machinery, which is not part of the emitted PTX;
/// - `-C llvm-args=-unroll-threshold=2000`: fully unroll loops with constant trip counts (what
///   `#pragma unroll` does in CUDA), so per-thread fragment arrays indexed by loop counters stay
///   in registers. `cargo xtask check-ptx` fails on any kernel with a stack frame, which is how
///   a loop that did not unroll shows up.
pub fn kernel_rustflags(target: &Target) -> String {
    let ptx = target
        .ptx
        .map_or(String::new(), |f| format!(" -C target-feature={f}"));
    format!(
        "-C target-cpu={}{ptx} -Zunstable-options -C panic=immediate-abort \
         -C llvm-args=-unroll-threshold=2000",
        target.cpu
    )
}

/// Remove everything of an enclosing cargo invocation from the environment of the nested one.
fn scrub_env(cmd: &mut Command) {
    const KEEP_CARGO: [&str; 5] = [
        "CARGO_HOME",
        "CARGO_NET_",
        "CARGO_HTTP_",
        "CARGO_REGISTRIES_",
        "CARGO_TERM_",
    ];
    const DROP_EXACT: [&str; 12] = [
        "RUSTFLAGS",
        "RUSTDOCFLAGS",
        "OUT_DIR",
        "TARGET",
        "HOST",
        "NUM_JOBS",
        "OPT_LEVEL",
        "PROFILE",
        "DEBUG",
        "MAKEFLAGS",
        "MFLAGS",
        "CARGO",
    ];
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        let cargo_var = key.starts_with("CARGO_") && !KEEP_CARGO.iter().any(|k| key.starts_with(k));
        let rustc_var = key.starts_with("RUSTC") || key.starts_with("RUSTDOC");
        if cargo_var || rustc_var || DROP_EXACT.contains(&key) || key.starts_with("__CARGO") {
            cmd.env_remove(key);
        }
    }
}

fn newest_file(dir: &Path, prefix: &str, suffix: &str) -> Result<PathBuf, BuildError> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| err(format!("reading {}: {e}", dir.display())))?;
    let mut best: Option<(std::time::SystemTime, PathBuf)> = None;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if !(name.starts_with(prefix) && name.ends_with(suffix)) {
            continue;
        }
        let modified = entry
            .metadata()
            .and_then(|m| m.modified())
            .map_err(|e| err(format!("stat {}: {e}", entry.path().display())))?;
        if best.as_ref().is_none_or(|(t, _)| modified > *t) {
            best = Some((modified, entry.path()));
        }
    }
    best.map(|(_, p)| p)
        .ok_or_else(|| err(format!("no {prefix}*{suffix} in {}", dir.display())))
}

fn write_if_changed(path: &Path, text: &str) -> Result<(), BuildError> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == text) {
        return Ok(());
    }
    std::fs::write(path, text).map_err(|e| err(format!("writing {}: {e}", path.display())))
}

/// Marker that the device layer writes (as a PTX comment, from inline asm) when a kernel takes
/// the address of a tensor map inside one of its parameters.
pub const TENSORMAP_MARKER: &str = "// @tensormap-param ";

/// Alignment the hardware requires for a tensor map in the parameter space.
pub const TENSORMAP_PARAM_ALIGN: u32 = 64;

/// Marker that the device layer's `launch_bounds!` writes: `// @launch-bounds <kernel> <max
/// threads> <min blocks per SM>`.
pub const LAUNCH_BOUNDS_MARKER: &str = "// @launch-bounds ";

/// Post-process PTX emitted by rustc:
/// - raise the alignment of every kernel parameter named by a [`TENSORMAP_MARKER`] to
///   [`TENSORMAP_PARAM_ALIGN`] bytes: rustc's PTX kernel ABI cannot declare a parameter
///   alignment above 16 (it ICEs), while TMA needs the tensor map 64-byte aligned (nvcc
///   declares `__grid_constant__ CUtensorMap` parameters `.align 64`);
/// - give every kernel named by a [`LAUNCH_BOUNDS_MARKER`] its `.maxntid` and `.minnctapersm`
///   directives (CUDA's `__launch_bounds__`, which rustc cannot express).
///
/// Fails if a marker names a parameter or kernel that does not exist, if a tensor-map parameter
/// is too small, or if a kernel has two different launch bounds.
pub fn postprocess(ptx: &str) -> Result<String, String> {
    let mut params: BTreeMap<String, bool> = BTreeMap::new();
    let mut bounds: BTreeMap<String, (u32, u32, bool)> = BTreeMap::new();
    for line in ptx.lines() {
        if let Some(pos) = line.find(TENSORMAP_MARKER) {
            let sym = line[pos + TENSORMAP_MARKER.len()..].trim();
            params.insert(sym.to_string(), false);
        }
        if let Some(pos) = line.find(LAUNCH_BOUNDS_MARKER) {
            let fields: Vec<&str> = line[pos + LAUNCH_BOUNDS_MARKER.len()..]
                .split_whitespace()
                .collect();
            let parsed = match fields.as_slice() {
                [k, t, b] => t
                    .parse()
                    .ok()
                    .zip(b.parse().ok())
                    .map(|(t, b)| (k.to_string(), t, b)),
                _ => None,
            };
            let Some((kernel, threads, blocks)) = parsed else {
                return Err(format!("malformed launch-bounds marker: {}", line.trim()));
            };
            if let Some(&(t, b, _)) = bounds.get(&kernel)
                && (t, b) != (threads, blocks)
            {
                return Err(format!(
                    "kernel {kernel} declares two different launch bounds"
                ));
            }
            bounds.insert(kernel, (threads, blocks, false));
        }
    }
    if params.is_empty() && bounds.is_empty() {
        return Ok(ptx.to_string());
    }
    let mut out = String::with_capacity(ptx.len() + 64 * bounds.len());
    let mut in_entry: Option<String> = None;
    for line in ptx.split_inclusive('\n') {
        let t = line.trim();
        if let Some(rest) = t
            .strip_prefix(".visible .entry ")
            .or(t.strip_prefix(".entry "))
        {
            in_entry = Some(rest.split('(').next().unwrap_or("").trim().to_string());
        }
        match parse_param_decl(line) {
            Some(decl) if params.contains_key(decl.name) => {
                if decl.bytes < 128 {
                    return Err(format!(
                        "parameter {} holds {} bytes, too few for a tensor map",
                        decl.name, decl.bytes
                    ));
                }
                params.insert(decl.name.to_string(), true);
                out.push_str(&line.replacen(
                    &format!(".align {}", decl.align),
                    &format!(".align {TENSORMAP_PARAM_ALIGN}"),
                    1,
                ));
            }
            _ => out.push_str(line),
        }
        // The parameter list of an entry ends with a line holding `)` (or `()` on the entry line).
        let closes =
            t == ")" || (t.ends_with(')') && in_entry.is_some() && !t.starts_with(".param"));
        if closes
            && let Some(kernel) = in_entry.take()
            && let Some((threads, blocks, seen)) = bounds.get_mut(&kernel)
        {
            out.push_str(&format!(
                ".maxntid {threads}, 1, 1\n.minnctapersm {blocks}\n"
            ));
            *seen = true;
        }
    }
    if let Some((missing, _)) = params.iter().find(|(_, found)| !**found) {
        return Err(format!(
            "a tensor-map marker names parameter {missing}, which no kernel declares"
        ));
    }
    if let Some((missing, _)) = bounds.iter().find(|(_, (_, _, seen))| !*seen) {
        return Err(format!(
            "a launch-bounds marker names kernel {missing}, which does not exist"
        ));
    }
    Ok(out)
}

/// Check that every kernel of post-processed PTX declares launch bounds (`.maxntid` and
/// `.minnctapersm`): the kernel crate's `launch_bounds!` writes them from the kernel's handle in
/// `kernel_abi`, so an entry without them was written without a handle.
pub fn check_launch_bounds(ptx: &str) -> Result<(), String> {
    let missing: Vec<String> = kernel_signatures(ptx)
        .into_iter()
        .filter(|(_, info)| info.max_threads.is_none() || info.min_blocks.is_none())
        .map(|(name, _)| name)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "kernels without launch bounds (every entry expands `launch_bounds!(name in \
             kernel_abi::<family>::KERNELS)`): {}",
            missing.join(", ")
        ))
    }
}

/// A `.param .align A .b8 NAME[BYTES]` kernel-parameter declaration.
#[derive(Debug, PartialEq, Eq)]
pub struct ParamDecl<'a> {
    pub name: &'a str,
    pub align: u32,
    pub bytes: usize,
}

/// Parse one line of a kernel's parameter list, if it declares a byte-array parameter.
pub fn parse_param_decl(line: &str) -> Option<ParamDecl<'_>> {
    let rest = line.trim().strip_prefix(".param .align ")?;
    let (align, rest) = rest.split_once(' ')?;
    let rest = rest.strip_prefix(".b8 ")?;
    let (name, rest) = rest.split_once('[')?;
    let (bytes, _) = rest.split_once(']')?;
    Some(ParamDecl {
        name: name.trim(),
        align: align.parse().ok()?,
        bytes: bytes.parse().ok()?,
    })
}

/// What the PTX declares about one kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelInfo {
    /// Byte size of each parameter, in order (scalars by their width).
    pub params: Vec<usize>,
    /// `.maxntid` (threads per block, x), if declared.
    pub max_threads: Option<u32>,
    /// `.minnctapersm` (resident blocks per SM the launch bounds ask for), if declared.
    pub min_blocks: Option<u32>,
}

/// The kernels (`.entry`) of a PTX module, with their parameters and launch bounds.
pub fn kernel_signatures(ptx: &str) -> BTreeMap<String, KernelInfo> {
    let mut map: BTreeMap<String, KernelInfo> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut in_params = false;
    for line in ptx.lines() {
        let t = line.trim();
        if let Some(rest) = t
            .strip_prefix(".visible .entry ")
            .or(t.strip_prefix(".entry "))
        {
            let name = rest.split('(').next().unwrap_or("").trim().to_string();
            map.insert(name.clone(), KernelInfo::default());
            in_params = !rest.trim_end().ends_with("()");
            current = Some(name);
            continue;
        }
        let Some(name) = current.as_ref() else {
            continue;
        };
        let info = map.get_mut(name).expect("inserted above");
        if in_params {
            if let Some(decl) = parse_param_decl(t) {
                info.params.push(decl.bytes);
            } else if let Some(rest) = t.strip_prefix(".param .") {
                let ty = rest.split_whitespace().next().unwrap_or("");
                let bits: usize = ty.get(1..).and_then(|b| b.parse().ok()).unwrap_or(0);
                info.params.push(bits / 8);
            }
            if t.ends_with(')') {
                in_params = false;
            }
            continue;
        }
        if let Some(rest) = t.strip_prefix(".maxntid ") {
            info.max_threads = rest.split(',').next().and_then(|x| x.trim().parse().ok());
        }
        if let Some(rest) = t.strip_prefix(".minnctapersm ") {
            info.min_blocks = rest.trim().parse().ok();
        }
        if t.starts_with('{') {
            current = None;
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "\
.visible .entry k(
\t.param .align 16 .b8 k_param_0[144]
)
{
\t// begin inline asm
\t// @tensormap-param k_param_0
\t// end inline asm
}
.visible .entry j(
\t.param .align 8 .b8 j_param_0[24],
\t.param .u32 j_param_1
)
{
}
";

    #[test]
    fn reads_the_pinned_toolchain() {
        let text = "# why\n[toolchain]\nchannel = \"nightly-2026-05-20\"\n\
                    components = [\"rust-src\", \"llvm-tools\"]\nprofile = \"minimal\"\n";
        let (channel, components) = parse_toolchain_file(text).unwrap();
        assert_eq!(channel, "nightly-2026-05-20");
        assert_eq!(components, ["rust-src", "llvm-tools"]);
        let ours = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../rust-toolchain.toml"),
        )
        .unwrap();
        let (channel, components) = parse_toolchain_file(&ours).unwrap();
        assert!(channel.starts_with("nightly-"), "{channel}");
        assert!(components.iter().any(|c| c == "rust-src"));
        assert!(parse_toolchain_file("[toolchain]\nprofile = \"minimal\"\n").is_err());
    }

    #[test]
    fn raises_marked_param_alignment_only() {
        let out = postprocess(PTX).unwrap();
        assert!(out.contains(".param .align 64 .b8 k_param_0[144]"));
        assert!(out.contains(".param .align 8 .b8 j_param_0[24]"));
    }

    #[test]
    fn marker_without_param_is_an_error() {
        let bad = PTX.replace("k_param_0[144]", "k_param_1[144]");
        assert!(postprocess(&bad).unwrap_err().contains("k_param_0"));
    }

    #[test]
    fn too_small_param_is_an_error() {
        let bad = PTX.replace("k_param_0[144]", "k_param_0[64]");
        assert!(postprocess(&bad).unwrap_err().contains("too few"));
    }

    #[test]
    fn reads_kernel_signatures() {
        let sigs = kernel_signatures(PTX);
        assert_eq!(sigs["k"].params, vec![144]);
        assert_eq!(sigs["j"].params, vec![24, 4]);
        assert_eq!(sigs["j"].max_threads, None);
    }

    #[test]
    fn writes_launch_bounds() {
        let marked = PTX.replace(
            "\t// @tensormap-param k_param_0\n",
            "\t// @tensormap-param k_param_0\n\t// @launch-bounds k 384 1\n",
        );
        let out = postprocess(&marked).unwrap();
        assert!(
            out.contains(")\n.maxntid 384, 1, 1\n.minnctapersm 1\n{"),
            "{out}"
        );
        assert_eq!(kernel_signatures(&out)["k"].max_threads, Some(384));
        let twice = marked.replace(
            "@launch-bounds k 384 1",
            "@launch-bounds k 384 1\n// @launch-bounds k 256 1",
        );
        assert!(postprocess(&twice).unwrap_err().contains("two different"));
        let unknown = marked.replace("@launch-bounds k ", "@launch-bounds q ");
        assert!(postprocess(&unknown).unwrap_err().contains("kernel q"));
        // `j` has no marker: the build refuses it; with one, it passes.
        assert!(check_launch_bounds(&out).unwrap_err().contains(": j"));
        let both = marked.replace(
            "@launch-bounds k 384 1",
            "@launch-bounds k 384 1\n// @launch-bounds j 128 2",
        );
        let out = postprocess(&both).unwrap();
        check_launch_bounds(&out).unwrap();
        assert_eq!(kernel_signatures(&out)["j"].min_blocks, Some(2));
    }
}
