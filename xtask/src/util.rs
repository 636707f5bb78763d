//! Small helpers: running commands, paths, the environment tasks pass to cargo.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

pub type Result<T = ()> = std::result::Result<T, String>;

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask/ is in the workspace root")
        .to_path_buf()
}

/// The cargo binary running us (the pinned toolchain's).
pub fn cargo() -> PathBuf {
    std::env::var_os("CARGO")
        .map(PathBuf::from)
        .unwrap_or_else(|| "cargo".into())
}

/// Run `cmd`, echoing it, failing on a non-zero exit.
pub fn run(cmd: &mut Command) -> Result {
    let status = status(cmd)?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{} failed ({status})", describe(cmd)))
    }
}

/// Run `cmd`, echoing it, returning its status.
pub fn status(cmd: &mut Command) -> Result<ExitStatus> {
    eprintln!("+ {}", describe(cmd));
    cmd.status()
        .map_err(|e| format!("could not start {}: {e}", describe(cmd)))
}

/// Run `cmd` and capture stdout (stderr passes through); fail on a non-zero exit.
pub fn output(cmd: &mut Command) -> Result<String> {
    eprintln!("+ {}", describe(cmd));
    let out = cmd
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("could not start {}: {e}", describe(cmd)))?;
    if !out.status.success() {
        return Err(format!("{} failed ({})", describe(cmd), out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Whether an executable named `name` is on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

pub fn create_dir(p: &Path) -> Result {
    std::fs::create_dir_all(p).map_err(|e| format!("creating {}: {e}", p.display()))
}

pub fn write(p: &Path, text: &str) -> Result {
    std::fs::write(p, text).map_err(|e| format!("writing {}: {e}", p.display()))
}

pub fn read(p: &Path) -> Result<String> {
    std::fs::read_to_string(p).map_err(|e| format!("reading {}: {e}", p.display()))
}
