//! `wheel`: the Python package (`python/`: PyO3 extension + Python sources) as one wheel,
//! built by maturin into `target/wheels/`.
//!
//! The wheel is abi3 (CPython >= 3.9) and tagged `manylinux_2_34` (the newest glibc symbol
//! version the extension uses, as maturin's audit finds it). The audit's repair step is skipped:
//! it would copy the CUDA driver library (`libcuda.so.1`, which the extension links) into the
//! wheel, and that library must come from the machine's driver. The wheel is then installed
//! into `target/wheel-check` and `python/tests/check_no_gpu.py` runs on it (no GPU needed).

use crate::setup;
use crate::util::{self, Result};
use std::path::PathBuf;
use std::process::Command;

/// The wheel's platform tag.
const COMPATIBILITY: &str = "manylinux_2_34";

/// Build the wheel; returns its path.
pub fn wheel() -> Result<PathBuf> {
    let env = setup::ensure_libcuda()?;
    let maturin = setup::ensure_maturin()?;
    let root = util::root();
    let out = root.join("target").join("wheels");
    let _ = std::fs::remove_dir_all(&out);
    let mut cmd = Command::new(maturin);
    cmd.current_dir(&root)
        .args(["build", "--release", "--strip", "--auditwheel", "skip"])
        .args(["--compatibility", COMPATIBILITY])
        .arg("--manifest-path")
        .arg(root.join("python").join("Cargo.toml"))
        .arg("--out")
        .arg(&out);
    env.apply(&mut cmd);
    util::run(&mut cmd)?;
    let wheel = std::fs::read_dir(&out)
        .map_err(|e| format!("reading {}: {e}", out.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| format!("maturin wrote no wheel into {}", out.display()))?;
    eprintln!("wheel: {}", wheel.display());
    check_no_gpu(&wheel, &env)?;
    Ok(wheel)
}

/// Install `wheel` into `target/wheel-check` (offline, without dependencies: PyTorch must be
/// installed) and run `python/tests/check_no_gpu.py` there: the import, the ops' registration
/// and the argument checks that need no GPU.
fn check_no_gpu(wheel: &std::path::Path, env: &setup::ToolEnv) -> Result<()> {
    let root = util::root();
    let site = root.join("target").join("wheel-check");
    let _ = std::fs::remove_dir_all(&site);
    let python = util::which("python3").ok_or("python3 is needed to check the wheel")?;
    let mut install = Command::new(&python);
    install
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--target",
        ])
        .arg(&site)
        .arg(wheel);
    util::run(&mut install)?;
    let mut check = Command::new(&python);
    check
        .arg(root.join("python").join("tests").join("check_no_gpu.py"))
        .env("PYTHONPATH", &site);
    env.apply(&mut check);
    util::run(&mut check)
}
