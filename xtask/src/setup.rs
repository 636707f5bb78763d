//! Fresh-machine set-up, project-local and idempotent:
//! - the CUDA driver library to link against (and, without a driver, to load): the machine's
//!   own `libcuda.so.1` where there is one, else Debian's non-free `libcuda1` package extracted
//!   into `.tools/` (a no-GPU machine then gets `CUDA_ERROR_NO_DEVICE` at run time, and GPU
//!   tests skip);
//! - `ptxas` for `check-ptx`: the machine's CUDA toolkit where there is one, else PyPI's
//!   `nvidia-cuda-nvcc` installed into `.tools/nvcc`.
//!
//! Nothing is installed system-wide: apt runs with a project-local configuration and state.

use crate::util::{self, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// PyPI version of `nvidia-cuda-nvcc` whose ptxas we use: CUDA 13.0, the toolkit of the GPU
/// machine (driver 580), so the resource table matches what the driver's JIT does there.
pub const NVCC_PYPI: &str = "nvidia-cuda-nvcc==13.0.88";

/// What the tasks must pass to cargo and to test processes.
pub struct ToolEnv {
    /// `CUDA_LIBRARY_PATH` for cust's build script (holds `lib64/libcuda.so`).
    pub cuda_library_path: PathBuf,
    /// A directory to prepend to `LD_LIBRARY_PATH`, when the driver library is Debian's copy.
    pub ld_library_path: Option<PathBuf>,
}

impl ToolEnv {
    /// Apply to a command that builds or runs the host code.
    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("CUDA_LIBRARY_PATH", &self.cuda_library_path);
        if let Some(dir) = &self.ld_library_path {
            let mut paths = vec![dir.clone()];
            if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
                paths.extend(std::env::split_paths(&old));
            }
            cmd.env(
                "LD_LIBRARY_PATH",
                std::env::join_paths(paths).expect("valid paths"),
            );
        }
    }
}

fn tools() -> PathBuf {
    util::root().join(".tools")
}

/// The machine's own driver library, if any.
fn system_libcuda() -> Option<PathBuf> {
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
        "/usr/lib64/libcuda.so.1",
        "/usr/lib/libcuda.so.1",
        "/usr/local/nvidia/lib64/libcuda.so.1",
        "/usr/lib/wsl/lib/libcuda.so.1",
    ];
    candidates.iter().map(PathBuf::from).find(|p| p.exists())
}

/// Make `.tools/cuda/lib64/libcuda.so` point at a driver library, fetching Debian's if needed.
pub fn ensure_libcuda() -> Result<ToolEnv> {
    let base = tools().join("cuda");
    let lib64 = base.join("lib64");
    util::create_dir(&lib64)?;
    let (target, ld) = match system_libcuda() {
        Some(sys) => (sys, None),
        None => (debian_libcuda()?, Some(lib64.clone())),
    };
    for name in ["libcuda.so", "libcuda.so.1"] {
        let link = lib64.join(name);
        if std::fs::read_link(&link).ok().as_deref() != Some(target.as_path()) {
            let _ = std::fs::remove_file(&link);
            std::os::unix::fs::symlink(&target, &link)
                .map_err(|e| format!("linking {}: {e}", link.display()))?;
        }
    }
    Ok(ToolEnv {
        cuda_library_path: base,
        ld_library_path: ld,
    })
}

/// Debian's `libcuda1` (non-free), downloaded with a project-local apt configuration and
/// extracted into `.tools/libcuda-pkg`. Returns the path of `libcuda.so.1`.
fn debian_libcuda() -> Result<PathBuf> {
    let pkg = tools().join("libcuda-pkg");
    let lib = pkg.join("usr/lib/x86_64-linux-gnu/nvidia/current/libcuda.so.1");
    if lib.exists() {
        return Ok(lib);
    }
    eprintln!("setup: no NVIDIA driver library here; fetching Debian's libcuda1 (link stub)");
    let apt = tools().join("apt");
    for d in ["lists/partial", "cache/archives/partial"] {
        util::create_dir(&apt.join(d))?;
    }
    let mirror = debian_mirror();
    let sources = apt.join("sources.list");
    util::write(
        &sources,
        &format!(
            "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {mirror} bookworm non-free\n"
        ),
    )?;
    let opts = |cmd: &mut Command| {
        cmd.arg("-q")
            .arg(format!("-oDir::Etc::SourceList={}", sources.display()))
            .arg("-oDir::Etc::SourceParts=/nonexistent")
            .arg(format!(
                "-oDir::State::Lists={}",
                apt.join("lists").display()
            ))
            .arg(format!("-oDir::Cache={}", apt.join("cache").display()))
            .arg("-oDebug::NoLocking=1")
            .arg("-oAPT::Sandbox::User=root");
    };
    let mut update = Command::new("apt-get");
    opts(&mut update);
    util::run(update.arg("update"))?;
    let mut download = Command::new("apt-get");
    opts(&mut download);
    util::run(download.current_dir(&apt).args(["download", "libcuda1"]))?;
    let deb = std::fs::read_dir(&apt)
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("libcuda1_"))
        })
        .ok_or("apt-get download libcuda1 produced no .deb")?;
    util::run(Command::new("dpkg").arg("-x").arg(&deb).arg(&pkg))?;
    if lib.exists() {
        Ok(lib)
    } else {
        Err(format!(
            "{} not found after extracting {}",
            lib.display(),
            deb.display()
        ))
    }
}

/// The Debian mirror this machine's apt uses (so the same network path works).
fn debian_mirror() -> String {
    let files = [
        "/etc/apt/sources.list.d/debian.sources",
        "/etc/apt/sources.list",
    ];
    for f in files {
        if let Ok(text) = std::fs::read_to_string(f) {
            for line in text.lines() {
                let line = line.trim();
                if let Some(uri) = line.strip_prefix("URIs:")
                    && let Some(u) = uri.split_whitespace().find(|u| !u.contains("security"))
                {
                    return u.to_string();
                }
                if line.starts_with("deb ")
                    && let Some(u) = line.split_whitespace().find(|w| w.starts_with("http"))
                    && !u.contains("security")
                {
                    return u.to_string();
                }
            }
        }
    }
    "http://deb.debian.org/debian".to_string()
}

/// A `ptxas` to assemble PTX with: the CUDA toolkit's, else PyPI's (installed on first use).
pub fn ensure_ptxas() -> Result<PathBuf> {
    for p in [
        util::which("ptxas"),
        Some(PathBuf::from("/usr/local/cuda/bin/ptxas")),
    ]
    .into_iter()
    .flatten()
    {
        if p.is_file() {
            return Ok(p);
        }
    }
    let dir = tools().join("nvcc");
    let ptxas = dir.join("nvidia/cu13/bin/ptxas");
    let stamp = dir.join(".installed");
    if ptxas.is_file() && util::read(&stamp).is_ok_and(|s| s.trim() == NVCC_PYPI) {
        return Ok(ptxas);
    }
    eprintln!(
        "setup: installing ptxas from PyPI ({NVCC_PYPI}) into {}",
        dir.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
    pip(&["install", "--target"], &dir, &[NVCC_PYPI])?;
    if !ptxas.is_file() {
        return Err(format!(
            "{} missing after installing {NVCC_PYPI}",
            ptxas.display()
        ));
    }
    util::write(&stamp, NVCC_PYPI)?;
    Ok(ptxas)
}

/// The peers' pure-Python packages, pinned (the GPU machine has PyTorch, Triton and
/// transformers but no network): fla's `chunk_gla` (with its `einops` and `packaging`), fla's
/// layers and models (`flash-linear-attention`: the GLA layer and model that
/// `python/e2e/fla_gla.py` runs with our `chunk_gla` swapped in), flash-semicrf and
/// torch-struct. `bundle` ships their wheels; `run.sh` installs them into the results folder.
pub const PEER_WHEELS: [&str; 6] = [
    "fla-core==0.6.0",
    "flash-linear-attention==0.6.0",
    "einops==0.8.2",
    "packaging==26.3",
    "flash-semicrf==0.2.0",
    "torch-struct==0.5",
];

/// The peers' wheels (`PEER_WHEELS`), downloaded from PyPI once into `.tools/peer-wheels`.
pub fn peer_wheels() -> Result<PathBuf> {
    let dir = tools().join("peer-wheels");
    let stamp = dir.join(".installed");
    let want = PEER_WHEELS.join(" ");
    if util::read(&stamp).is_ok_and(|s| s.trim() == want) {
        return Ok(dir);
    }
    eprintln!(
        "setup: downloading the peers' wheels ({want}) into {}",
        dir.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
    pip(
        &["download", "--no-deps", "--only-binary=:all:", "--dest"],
        &dir,
        &PEER_WHEELS,
    )?;
    util::write(&stamp, &want)?;
    Ok(dir)
}

/// PyPI version of maturin, the builder of the Python package's wheel (`./x wheel`).
pub const MATURIN_PYPI: &str = "maturin==1.16.0";

/// maturin, installed from PyPI into `.tools/maturin` on first use. Returns its executable.
pub fn ensure_maturin() -> Result<PathBuf> {
    let dir = tools().join("maturin");
    let exe = dir.join("bin/maturin");
    let stamp = dir.join(".installed");
    if exe.is_file() && util::read(&stamp).is_ok_and(|s| s.trim() == MATURIN_PYPI) {
        return Ok(exe);
    }
    eprintln!(
        "setup: installing {MATURIN_PYPI} from PyPI into {}",
        dir.display()
    );
    let _ = std::fs::remove_dir_all(&dir);
    pip(&["install", "--target"], &dir, &[MATURIN_PYPI])?;
    if !exe.is_file() {
        return Err(format!(
            "{} missing after installing {MATURIN_PYPI}",
            exe.display()
        ));
    }
    util::write(&stamp, MATURIN_PYPI)?;
    Ok(exe)
}

/// `python3 -m pip <args> <dir> <packages>`, quietly, into a project-local folder.
fn pip(args: &[&str], dir: &Path, packages: &[&str]) -> Result {
    let python = util::which("python3").ok_or("python3 is needed to fetch packages from PyPI")?;
    util::run(
        Command::new(python)
            .args(["-m", "pip", "--quiet", "--disable-pip-version-check"])
            .args(args)
            .arg(dir)
            .args(packages),
    )
}

/// Both, reporting what is in use.
pub fn setup() -> Result<(ToolEnv, PathBuf)> {
    let env = ensure_libcuda()?;
    let ptxas = ensure_ptxas()?;
    let lib =
        std::fs::read_link(env.cuda_library_path.join("lib64/libcuda.so")).unwrap_or_default();
    eprintln!(
        "setup: libcuda {} ; ptxas {}",
        lib.display(),
        ptxas.display()
    );
    Ok((env, ptxas))
}
