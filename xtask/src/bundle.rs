//! `bundle`: a self-contained folder to run everything on a GPU machine that has no Rust.

use crate::setup;
use crate::util::{self, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The bundle's runner, copied into the bundle as `run.sh`.
const RUN_SH: &str = include_str!("../bundle-run.sh");
/// The reliability sweep (sanitizers and negative controls), copied as `reliability.sh`.
const RELIABILITY_SH: &str = include_str!("../bundle-reliability.sh");

/// Build release test and benchmark executables, the command-line tool (`kernels-cli`) and the
/// examples (`example-<name>`; `example-stable-<name>` for fixtures/stable-consumer's, built with
/// stable Rust), and lay out `bundle/`: `bin/` (executables), `ptx/`, `peers/`
/// (Python peer scripts), `wheels/` (the peers' packages, `setup::PEER_WHEELS`), `python/` (the
/// `rustkernels` wheel and its GPU check, `python/tests/*.py`; `python/e2e/*.py`), `run.sh`,
/// `reliability.sh`, `MANIFEST`; and a compressed copy, `target/bundle-pack/bundle.tar.xz`.
pub fn bundle() -> Result {
    let (env, _) = setup::setup()?;
    let root = util::root();
    let dir = root.join("bundle");
    let _ = std::fs::remove_dir_all(&dir);
    for sub in ["bin", "ptx", "peers"] {
        util::create_dir(&dir.join(sub))?;
    }

    let mut tests = Command::new(util::cargo());
    tests
        .current_dir(&root)
        .args(["test", "--release", "--no-run", "--package", "kernel-tests"])
        .arg("--message-format=json-render-diagnostics");
    env.apply(&mut tests);
    let mut bins = executables(&util::output(&mut tests)?, true);
    let mut bench = Command::new(util::cargo());
    bench
        .current_dir(&root)
        .args([
            "build",
            "--release",
            "--package",
            "kernel-bench",
            "--package",
            "kernels-cli",
            "--bins",
        ])
        .arg("--message-format=json-render-diagnostics");
    env.apply(&mut bench);
    bins.extend(executables(&util::output(&mut bench)?, false));
    // The examples (`cargo run --example <name>`), as `example-<name>`.
    let mut examples = Command::new(util::cargo());
    examples
        .current_dir(&root)
        .args(["build", "--release", "--package", "kernels", "--examples"])
        .arg("--message-format=json-render-diagnostics");
    env.apply(&mut examples);
    bins.extend(
        executables(&util::output(&mut examples)?, false)
            .into_iter()
            .map(|(name, path, _)| (format!("example-{name}"), path, false)),
    );
    // The stable-Rust consumer's example (attention on cudarc's memory), built with stable.
    let mut consumer = crate::consumer::stable(&[
        "cargo",
        "build",
        "--release",
        "--examples",
        "--message-format=json-render-diagnostics",
    ]);
    env.apply(&mut consumer);
    bins.extend(
        executables(&util::output(&mut consumer)?, false)
            .into_iter()
            .map(|(name, path, _)| (format!("example-stable-{name}"), path, false)),
    );
    for (name, path, is_test) in &bins {
        let dest = dir.join("bin").join(if *is_test {
            format!("test-{name}")
        } else {
            name.clone()
        });
        copy(path, &dest)?;
        util::run(Command::new("strip").arg("--strip-debug").arg(&dest))?;
    }
    for (t, path) in crate::ptx::build()? {
        copy(&path, &dir.join("ptx").join(ptx_builder::ptx_file_name(&t)))?;
    }
    copy_all(&root.join("bench").join("peers"), "py", &dir.join("peers"))?;
    // The peers' wheels, installed by run.sh on the GPU machine (no network there). Without
    // PyPI the bundle is still built: the peers that need them then record a note.
    util::create_dir(&dir.join("wheels"))?;
    match setup::peer_wheels() {
        Ok(wheels) => copy_all(&wheels, "whl", &dir.join("wheels"))?,
        Err(e) => eprintln!(
            "bundle: warning: the peers' wheels could not be downloaded ({e}); the bundle has \
             none, so fla, flash-semicrf and torch-struct rows will be missing (a note each)"
        ),
    }
    // The Python package and its GPU check (run.sh installs the wheel into the results
    // folder). Without maturin (no PyPI) the bundle is still built, without that section.
    util::create_dir(&dir.join("python"))?;
    match crate::wheel::wheel() {
        Ok(wheel) => {
            let name = wheel.file_name().expect("a wheel file");
            copy(&wheel, &dir.join("python").join(name))?;
            copy_all(
                &root.join("python").join("tests"),
                "py",
                &dir.join("python"),
            )?;
            // End-to-end checks against other people's code (transformers), results files.
            util::create_dir(&dir.join("python").join("e2e"))?;
            copy_all(
                &root.join("python").join("e2e"),
                "py",
                &dir.join("python").join("e2e"),
            )?;
        }
        Err(e) => eprintln!(
            "bundle: warning: the rustkernels wheel could not be built ({e}); run.sh skips the \
             Python check"
        ),
    }
    for (name, text) in [("run.sh", RUN_SH), ("reliability.sh", RELIABILITY_SH)] {
        let script = dir.join(name);
        util::write(&script, text)?;
        util::run(Command::new("chmod").arg("+x").arg(&script))?;
    }
    util::write(&dir.join("MANIFEST"), &manifest(&root)?)?;
    // A compressed copy for transfers. Every executable embeds the same PTX modules (~25 MB):
    // a dictionary larger than the whole archive lets xz store them once (74 MB -> 17 MB with
    // the default 8 MiB dictionary against 256 MiB), under the 64 MiB one device call carries.
    let pack = root.join("target").join("bundle-pack");
    util::create_dir(&pack)?;
    util::run(
        Command::new("tar")
            .env("XZ_OPT", "-T2 --lzma2=preset=6,dict=256MiB")
            .arg("-cJf")
            .arg(pack.join("bundle.tar.xz"))
            .arg("-C")
            .arg(&root)
            .arg("bundle"),
    )?;
    let size = util::output(Command::new("du").arg("-sh").arg(&dir))?;
    eprintln!(
        "bundle: {} executables in {} ({}), also target/bundle-pack/bundle.tar.xz; on the GPU \
         machine: tar -xJf bundle.tar.xz && bundle/run.sh <results-dir>",
        bins.len(),
        dir.display(),
        size.split_whitespace().next().unwrap_or("?")
    );
    Ok(())
}

/// (name, path, is_test) of the executables in cargo's JSON messages.
fn executables(json: &str, tests: bool) -> Vec<(String, PathBuf, bool)> {
    let mut out = Vec::new();
    for line in json.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let is_test = msg["profile"]["test"].as_bool().unwrap_or(false);
        let kind_is_test = msg["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|x| x == "test"));
        if tests && !kind_is_test {
            continue;
        }
        let name = msg["target"]["name"].as_str().unwrap_or("bin").to_string();
        out.push((name, PathBuf::from(exe), is_test));
    }
    out
}

/// Copy every file of `from` whose name ends in `.ext` into `to` (a missing `from` copies
/// nothing).
fn copy_all(from: &Path, ext: &str, to: &Path) -> Result {
    let Ok(entries) = std::fs::read_dir(from) else {
        return Ok(());
    };
    for e in entries.flatten() {
        if e.path().extension().is_some_and(|x| x == ext) {
            copy(&e.path(), &to.join(e.file_name()))?;
        }
    }
    Ok(())
}

fn copy(from: &Path, to: &Path) -> Result {
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))
}

fn manifest(root: &Path) -> Result<String> {
    let git = |args: &[&str]| {
        Command::new("git")
            .current_dir(root)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_else(|| "unknown".into())
    };
    let dirty = !git(&["status", "--porcelain", "--untracked-files=no"]).is_empty();
    let rustc = Command::new("rustc")
        .current_dir(root)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    Ok(format!(
        "commit={}{}\nbuilt={}\nrustc={rustc}\n",
        git(&["rev-parse", "HEAD"]),
        if dirty { "-dirty" } else { "" },
        util::output(Command::new("date").args(["-u", "+%Y-%m-%dT%H:%M:%SZ"]))?.trim(),
    ))
}
