//! `stable-consumer`: the crate in `fixtures/stable-consumer/` (its own workspace, on stable
//! Rust by its `rust-toolchain.toml`) depends on `kernels` by path; build it and run its tests
//! with the stable toolchain, as a user's crate would be. `kernels`' build script compiles the
//! kernels with the pinned nightly through rustup.

use crate::setup;
use crate::util::{self, Result};
use std::path::PathBuf;
use std::process::Command;

/// The fixture's directory.
pub fn dir() -> PathBuf {
    util::root().join("fixtures").join("stable-consumer")
}

/// `rustup run stable <args>` in the fixture's directory, with nothing of an enclosing cargo or
/// rustup invocation (xtask itself runs under the pinned nightly) in its environment.
pub fn stable(args: &[&str]) -> Command {
    let mut cmd = Command::new("rustup");
    cmd.current_dir(dir()).args(["run", "stable"]).args(args);
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if (key.starts_with("CARGO") && key != "CARGO_HOME")
            || key.starts_with("RUSTC")
            || key.starts_with("RUSTUP_TOOLCHAIN")
            || key == "RUSTFLAGS"
            || key == "RUSTDOCFLAGS"
        {
            cmd.env_remove(key);
        }
    }
    cmd
}

/// Build the fixture and run its tests (its GPU test reports a skip without a GPU).
pub fn check() -> Result {
    let (env, _) = setup::setup()?;
    let version = stable(&["rustc", "--version"]).output();
    if !version.as_ref().is_ok_and(|o| o.status.success()) {
        util::run(Command::new("rustup").args([
            "toolchain",
            "install",
            "stable",
            "--profile",
            "minimal",
        ]))?;
    }
    let version = util::output(&mut stable(&["rustc", "--version"]))?;
    eprintln!("stable-consumer: {}", version.trim());
    if !version.contains(" 1.") || version.contains("nightly") || version.contains("beta") {
        return Err(format!("expected a stable rustc, got {}", version.trim()));
    }
    let mut test = stable(&["cargo", "test", "--all-targets"]);
    env.apply(&mut test);
    util::run(&mut test)
}
