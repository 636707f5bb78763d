//! `wheel`: the Python package (`python/`: PyO3 extension + Python sources) as one wheel,
//! built by maturin into `target/wheels/`.
//!
//! The wheel is abi3 (CPython >= 3.9) and tagged `manylinux_2_34` (the newest glibc symbol
//! version the extension uses, as maturin's audit finds it). The audit's repair step is skipped:
//! it would copy the CUDA driver library (`libcuda.so.1`, which the extension links) into the
//! wheel, and that library must come from the machine's driver.

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
    Ok(wheel)
}
