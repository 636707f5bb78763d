//! Builds the kernel crate to PTX (for every target in `ptx_builder::TARGETS`) so that a plain
//! `cargo build` of the host embeds up-to-date kernels. Same builder as `cargo xtask build-ptx`.
//! Each target's PTX is embedded zstd-compressed (`<out>/gpu_kernels.<cpu>.ptx.zst`, level
//! [`ZSTD_LEVEL`]); `src/ptx.rs` decompresses it on first use.
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
    let built = builder
        .and_then(|b| b.build_all(&out))
        .map_err(|e| e.to_string())
        .and_then(|targets| {
            for (target, ptx) in targets {
                compress(&ptx).map_err(|e| format!("compressing {} PTX: {e}", target.cpu))?;
            }
            Ok(())
        });
    if let Err(e) = built {
        for line in e.lines() {
            println!("cargo::error={line}");
        }
        std::process::exit(1);
    }
}

/// zstd level of the embedded PTX: 15x smaller in under a second per target (19 gains 40% more
/// in 40 s).
const ZSTD_LEVEL: i32 = 9;

/// Write `<ptx>.zst` beside `ptx`.
fn compress(ptx: &std::path::Path) -> std::io::Result<()> {
    let text = std::fs::read(ptx)?;
    let packed = zstd::bulk::compress(&text, ZSTD_LEVEL)?;
    let mut name = ptx.as_os_str().to_owned();
    name.push(".zst");
    std::fs::write(name, packed)
}
