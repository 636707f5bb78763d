//! Project tasks (matklad's cargo-xtask): `cargo xtask <task>`, or `./x <task>`, which also
//! installs the pinned toolchain first. `cargo xtask` alone lists the tasks.

mod bundle;
mod consumer;
mod ptx;
mod ptx_diff;
mod setup;
mod util;
mod wheel;

use std::process::{Command, ExitCode};
use util::Result;

const TASKS: &[(&str, &str)] = &[
    (
        "run",
        "the main job: every kernel on default sizes, validated and timed (CPU references only without a GPU)",
    ),
    (
        "test",
        "every test suite (GPU tests are counted as ignored without a GPU)",
    ),
    (
        "setup",
        "project-local tools: the CUDA driver library to link against, ptxas",
    ),
    (
        "build-ptx",
        "build the kernel crate to PTX for every target into target/ptx/",
    ),
    (
        "check-ptx",
        "assemble every PTX with ptxas; write gpu-kernels/RESOURCES.md; fail on stack frames, spills, perf warnings",
    ),
    (
        "clippy",
        "clippy on the host workspace and on the kernel crate (nvptx), warnings are errors",
    ),
    (
        "bundle",
        "build executables and lay out bundle/ with run.sh for a GPU machine without Rust",
    ),
    (
        "report",
        "turn bench/results/*.json into BENCHMARKS.md and bench/plots/*.{svg,png}",
    ),
    (
        "ptx-diff",
        "ptx-diff BASE: every kernel's PTX against commit BASE's, up to register and label names",
    ),
    (
        "wheel",
        "build the Python package (rustkernels: PyO3 + maturin) into target/wheels/",
    ),
    (
        "stable-consumer",
        "build and test fixtures/stable-consumer (a crate on stable Rust that depends on kernels)",
    ),
    (
        "ci",
        "what CI runs: test, fmt --check, clippy, wheel, stable-consumer, check-ptx",
    ),
];

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(task) = args.first() else {
        eprintln!("usage: cargo xtask <task> [args]   (or ./x <task>)\n\ntasks:");
        for (name, what) in TASKS {
            eprintln!("  {name:<10} {what}");
        }
        return ExitCode::SUCCESS;
    };
    let rest = &args[1..];
    let result = match task.as_str() {
        "setup" => setup::setup().map(|_| ()),
        "build-ptx" => ptx::build().map(|_| ()),
        "check-ptx" => ptx::check(),
        "ptx-diff" => ptx_diff::ptx_diff(rest),
        "test" => test(rest),
        "run" => run_main(rest),
        "clippy" => clippy(),
        "bundle" => bundle::bundle(),
        "wheel" => wheel::wheel().map(|_| ()),
        "stable-consumer" => consumer::check(),
        "report" => report(rest),
        "ci" => ci(),
        other => Err(format!(
            "unknown task {other:?}; run `cargo xtask` for the list"
        )),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {task}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn cargo_in_root() -> Command {
    let mut c = Command::new(util::cargo());
    c.current_dir(util::root());
    c
}

/// `cargo test --workspace --release` with the tool environment; extra args go to cargo.
fn test(extra: &[String]) -> Result {
    let (env, _) = setup::setup()?;
    let mut cmd = cargo_in_root();
    cmd.args(["test", "--workspace", "--release"]).args(extra);
    env.apply(&mut cmd);
    util::run(&mut cmd)
}

/// The main job (`kbench main`).
fn run_main(extra: &[String]) -> Result {
    let (env, _) = setup::setup()?;
    let mut cmd = cargo_in_root();
    cmd.args([
        "run",
        "--release",
        "--quiet",
        "--package",
        "kernel-bench",
        "--bin",
        "kbench",
        "--",
        "main",
    ])
    .args(extra);
    env.apply(&mut cmd);
    util::run(&mut cmd)
}

fn clippy() -> Result {
    let (env, _) = setup::setup()?;
    let mut host = cargo_in_root();
    host.args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--release",
        "--",
        "-D",
        "warnings",
    ]);
    env.apply(&mut host);
    util::run(&mut host)?;
    for target in ptx_builder::TARGETS {
        let mut k = cargo_in_root();
        k.args([
            "clippy",
            "--release",
            "--target",
            ptx_builder::TRIPLE,
            "-Zbuild-std=core",
        ])
        .arg("--manifest-path")
        .arg(util::root().join("gpu-kernels/Cargo.toml"))
        .arg("--target-dir")
        .arg(util::root().join("target/ptx-clippy").join(target.cpu))
        .args(["--", "-D", "warnings"])
        .env("RUSTFLAGS", ptx_builder::kernel_rustflags(&target))
        .env_remove("CARGO_TARGET_DIR");
        util::run(&mut k)?;
    }
    Ok(())
}

fn report(_extra: &[String]) -> Result {
    let mut cmd = cargo_in_root();
    cmd.args([
        "run",
        "--release",
        "--quiet",
        "--package",
        "kernel-bench",
        "--bin",
        "kbench",
        "--",
        "report",
    ]);
    let (env, _) = setup::setup()?;
    env.apply(&mut cmd);
    util::run(&mut cmd)
}

/// Everything CI checks. The resource table must be up to date (committed).
fn ci() -> Result {
    test(&[])?;
    util::run(cargo_in_root().args(["fmt", "--all", "--", "--check"]))?;
    util::run(
        cargo_in_root()
            .args(["fmt", "--manifest-path"])
            .arg(util::root().join("gpu-kernels/Cargo.toml"))
            .args(["--", "--check"]),
    )?;
    clippy()?;
    wheel::wheel()?;
    consumer::check()?;
    ptx::check()?;
    let table = ptx::table_path();
    let diff = Command::new("git")
        .current_dir(util::root())
        .args(["diff", "--exit-code", "--stat", "--"])
        .arg(&table)
        .status();
    if let Ok(s) = diff
        && !s.success()
    {
        return Err(format!(
            "{} changed: commit the regenerated table (`cargo xtask check-ptx`)",
            table.display()
        ));
    }
    eprintln!(
        "ci: all checks passed (PTX targets: {})",
        ptx::target_names()
    );
    Ok(())
}
