//! The `kernels-cli` executable itself: exit status, one-line errors on stderr, results on
//! stdout, no output file on error. (`tests/cli.rs` of the workspace covers every subcommand
//! through the library entry point.)

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn exe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_kernels-cli"))
}

/// A scratch directory, removed on drop.
struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let p = std::env::temp_dir().join(format!("kernels-cli-bin-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch directory");
        Dir(p)
    }

    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A small semi-CRF input: B = 2, T = 5, K = 2, C = 3, f32 scores.
fn write_crf(path: &Path, lengths: &[i64]) {
    let f32s = |n: usize, scale: f32| -> Vec<u8> {
        (0..n)
            .flat_map(|i| (((i * 37 % 11) as f32 - 5.0) * scale).to_le_bytes())
            .collect()
    };
    let data = [
        (
            "scores",
            vec![2, 5, 3],
            safetensors::Dtype::F32,
            f32s(30, 0.2),
        ),
        ("dur", vec![2, 3], safetensors::Dtype::F32, f32s(6, 0.1)),
        ("trans", vec![3, 3], safetensors::Dtype::F32, f32s(9, 0.1)),
        (
            "lengths",
            vec![2],
            safetensors::Dtype::I64,
            lengths.iter().flat_map(|l| l.to_le_bytes()).collect(),
        ),
    ];
    let views: Vec<_> = data
        .iter()
        .map(|(n, s, d, b)| {
            let v = safetensors::tensor::TensorView::new(*d, s.clone(), b).expect("view");
            (n.to_string(), v)
        })
        .collect();
    safetensors::serialize_to_file(views, &None, path).expect("writing the input");
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("running kernels-cli")
}

#[test]
fn reference_run_writes_the_output() {
    let d = Dir::new("ok");
    write_crf(&d.path("in.safetensors"), &[5, 3]);
    let out = run(exe()
        .arg("semicrf-backward")
        .arg(d.path("in.safetensors"))
        .arg("-o")
        .arg(d.path("out.safetensors"))
        .arg("--reference"));
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("wrote"),
        "stdout: {}",
        text(&out.stdout)
    );
    let bytes = std::fs::read(d.path("out.safetensors")).expect("output written");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors file");
    let mut names = st.names();
    names.sort();
    assert_eq!(
        names,
        [
            "grad_cumsum",
            "grad_dur",
            "grad_scores",
            "grad_trans",
            "log_z"
        ]
    );
    assert_eq!(
        st.tensor("grad_scores").expect("grad_scores").shape(),
        [2, 5, 3]
    );
}

#[test]
fn bad_input_is_one_line_and_exit_1() {
    let d = Dir::new("bad");
    write_crf(&d.path("in.safetensors"), &[5, 9]);
    let out = run(exe()
        .arg("semicrf")
        .arg(d.path("in.safetensors"))
        .arg("-o")
        .arg(d.path("out.safetensors"))
        .arg("--reference"));
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "stderr: {err}");
    assert!(err.starts_with("kernels-cli: error: "), "stderr: {err}");
    assert!(err.contains("lengths[1] = 9"), "stderr: {err}");
    assert!(!d.path("out.safetensors").exists());
    let left: Vec<_> = std::fs::read_dir(&d.0).expect("dir").flatten().collect();
    assert_eq!(left.len(), 1, "only the input may remain: {left:?}");
}

#[test]
fn missing_file_is_one_line_and_exit_1() {
    let d = Dir::new("missing");
    let out = run(exe()
        .arg("mhc")
        .arg(d.path("nope.safetensors"))
        .arg("-o")
        .arg(d.path("out.safetensors"))
        .arg("--reference"));
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "stderr: {err}");
    assert!(
        err.contains("cannot read") && err.contains("nope.safetensors"),
        "{err}"
    );
    assert!(!d.path("out.safetensors").exists());
}

#[test]
fn usage_errors_exit_2() {
    let out = run(exe().args(["attention", "in", "-o", "out", "--reference", "--check"]));
    assert_eq!(out.status.code(), Some(2), "stderr: {}", text(&out.stderr));
}

#[test]
fn info_exits_0() {
    let out = run(exe().arg("info"));
    assert!(out.status.success(), "stderr: {}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(
        s.contains("sm_90a") && s.contains("sm_80") && s.contains("gpu"),
        "{s}"
    );
}
