//! Builds the kernel crate to PTX (for every target in `ptx_builder::TARGETS`) so that a plain
//! `cargo build` of the host embeds up-to-date kernels. Same builder as `cargo xtask build-ptx`.
//! The kernels build with the nightly pinned by the workspace's `rust-toolchain.toml` (through
//! rustup, installed on first use), so the host itself builds on any toolchain, stable included.

use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let workspace = manifest
        .parent()
        .expect("host/ lives in the workspace root")
        .to_path_buf();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo"));
    let builder = ptx_builder::Builder::new(workspace, cargo);
    if let Ok(b) = &builder {
        for input in b.inputs() {
            println!("cargo::rerun-if-changed={}", input.display());
        }
    }
    if let Err(e) = builder.and_then(|b| b.build_all(&out)) {
        for line in e.to_string().lines() {
            println!("cargo::error={line}");
        }
        std::process::exit(1);
    }
}
