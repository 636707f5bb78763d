//! What every family's benchmark uses: timing, result rows, the results file, and the peers.
//!
//! Results format (`bench/results/<family>.json`): top-level `device`, `driver`, `commit`,
//! `date`, `family`, `notes` and `rows`; each row `{ kernel, impl, config, median_ms,
//! tflops | gbps, max_err, max_diff_vs_ours }` (absent fields omitted). `impl` is `ours` (or
//! `ours-<variant>`) or the peer's name.
//!
//! Peers: for each case the runner writes `<work>/<case>/case.json` (kernel, config, flop and
//! byte counts) and `<work>/<case>/tensors.safetensors` (inputs and our outputs), then runs
//! `python3 <peers>/<family>.py <work>`, which times the peers on the same inputs and writes
//! `<work>/peer_rows.json` (rows in the format above, with `max_diff_vs_ours`; a row of kernel
//! `note` with a `note` field becomes a note of the results file).

use half::bf16;
use kernels::timing::{Timings, time_on_stream};
use kernels::{Gpu, Result};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};

/// A run longer than this (ms) is timed on a budget ([`Bench::time`]).
pub const SLOW_RUN_MS: f64 = 20.0;
/// Time budget of the timed runs of slow work (ms).
pub const SLOW_BUDGET_MS: f64 = 2000.0;
/// One measured implementation on one configuration.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Row {
    /// Operation, e.g. `gemm_bf16`.
    pub kernel: String,
    /// `ours`, `ours-<variant>` or the peer's name.
    #[serde(rename = "impl")]
    pub implementation: String,
    /// Problem configuration (sizes, options).
    pub config: Map<String, Value>,
    /// Median time of the timed runs, in milliseconds.
    pub median_ms: f64,
    /// Achieved TFLOP/s, where the operation is counted in floating-point operations.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tflops: Option<f64>,
    /// Achieved GB/s (bytes read + written once), where counted in bytes.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub gbps: Option<f64>,
    /// Maximum absolute error against the f64 reference (where computed).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub max_err: Option<f64>,
    /// Maximum absolute difference from our output on the same inputs (peers).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub max_diff_vs_ours: Option<f64>,
    /// Anything else worth keeping (peak memory, error kind, ...).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

impl Row {
    /// A row of ours with work counts: `flops` and/or `bytes` turn into TFLOP/s and GB/s.
    pub fn ours(kernel: &str, config: Map<String, Value>, t: &Timings) -> Row {
        Row {
            kernel: kernel.to_string(),
            implementation: "ours".to_string(),
            config,
            median_ms: t.median_ms(),
            tflops: None,
            gbps: None,
            max_err: None,
            max_diff_vs_ours: None,
            extra: Map::new(),
        }
    }

    /// Set TFLOP/s from a FLOP count.
    pub fn flops(mut self, flops: f64) -> Row {
        self.tflops = Some(flops / (self.median_ms * 1e-3) / 1e12);
        self
    }

    /// Set GB/s from a byte count.
    pub fn bytes(mut self, bytes: f64) -> Row {
        self.gbps = Some(bytes / (self.median_ms * 1e-3) / 1e9);
        self
    }

    /// Set the maximum error against the reference.
    pub fn err(mut self, max_err: f64) -> Row {
        self.max_err = Some(max_err);
        self
    }
}

/// A JSON object from pairs, for configs.
#[macro_export]
macro_rules! config {
    ($($key:literal : $value:expr),* $(,)?) => {{
        let mut m = serde_json::Map::new();
        $( m.insert($key.to_string(), serde_json::json!($value)); )*
        m
    }};
}

/// The results file of one family.
#[derive(Debug, Serialize, Deserialize)]
pub struct ResultsFile {
    /// GPU name.
    pub device: String,
    /// Driver version.
    pub driver: String,
    /// Git commit the runner was built from.
    pub commit: String,
    /// UTC date and time of the run.
    pub date: String,
    /// Family.
    pub family: String,
    /// PTX target the kernels ran from.
    #[serde(default)]
    pub ptx_target: String,
    /// Free-form notes (e.g. a peer that could not run).
    #[serde(default)]
    pub notes: Vec<String>,
    /// The measurements.
    pub rows: Vec<Row>,
}

/// A tensor for the peers' case file (add variants as families need other dtypes).
pub enum Tensor<'a> {
    /// bf16 data with a shape.
    Bf16(&'a [bf16], Vec<usize>),
    /// f32 data with a shape.
    F32(&'a [f32], Vec<usize>),
    /// i64 data with a shape.
    I64(&'a [i64], Vec<usize>),
}

/// A running benchmark of one family.
///
/// Fields drop in declaration order: the stream before the GPU (its context).
pub struct Bench {
    /// The stream everything runs on.
    pub stream: kernels::Stream,
    /// The GPU.
    pub gpu: Gpu,
    /// Fewer runs and smaller problems (smoke runs of the runner itself).
    pub quick: bool,
    family: String,
    peer_script: String,
    work: PathBuf,
    rows: Vec<Row>,
    notes: Vec<String>,
    cases: usize,
    progress: indicatif::ProgressBar,
}

impl Bench {
    /// Start a benchmark of `family` on the default GPU.
    pub fn new(family: &str, quick: bool) -> Result<Bench> {
        let gpu = Gpu::new()?;
        let stream = gpu.stream()?;
        let work = std::env::var_os("KBENCH_WORK")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir)
            .join(format!("kbench-{family}"));
        let _ = std::fs::remove_dir_all(&work);
        std::fs::create_dir_all(&work).map_err(|e| io_err(&work, e))?;
        eprintln!(
            "kbench {family}: {} ({}, {} SMs, driver {}), PTX {}",
            gpu.info().name,
            format_args!(
                "cc {}.{}",
                gpu.info().compute_capability.0,
                gpu.info().compute_capability.1
            ),
            gpu.info().multiprocessors,
            gpu.info().driver,
            gpu.arch()
        );
        Ok(Bench {
            stream,
            gpu,
            quick,
            family: family.to_string(),
            peer_script: family.to_string(),
            work,
            rows: Vec::new(),
            notes: Vec::new(),
            cases: 0,
            progress: kernels::progress::spinner(&format!("kbench {family}")),
        })
    }

    /// Time `work` (enqueued on [`Bench::stream`]): 10 warm-up runs and 50 timed ones (2 and 5
    /// with `quick`), each between CUDA events; returns all samples (use the median). Work
    /// whose first run takes more than [`SLOW_RUN_MS`] gets 1 more warm-up run and as many timed
    /// runs as fit in [`SLOW_BUDGET_MS`], at least 10 (a 500 ms scan: 10 runs, not 50).
    pub fn time(&self, mut work: impl FnMut() -> Result<()>) -> Result<Timings> {
        if self.quick {
            return time_on_stream(&self.gpu, &self.stream, 2, 5, work);
        }
        let probe = time_on_stream(&self.gpu, &self.stream, 0, 1, &mut work)?;
        let first = probe.samples_ms[0];
        let (warmup, runs) = if first > SLOW_RUN_MS {
            (1, ((SLOW_BUDGET_MS / first) as usize).clamp(10, 50))
        } else {
            (9, 50)
        };
        time_on_stream(&self.gpu, &self.stream, warmup, runs, work)
    }

    /// Record a row and print it.
    pub fn push(&mut self, row: Row) {
        let line = format_row(&row);
        // Printed above the spinner (plainly when stderr is not a terminal).
        if self.progress.is_hidden() {
            eprintln!("  {line}");
        } else {
            self.progress.println(format!("  {line}"));
        }
        self.progress.inc(1);
        self.rows.push(row);
    }

    /// Record a note (printed, and kept in the results file).
    pub fn note(&mut self, note: impl Into<String>) {
        let note = note.into();
        eprintln!("  note: {note}");
        self.notes.push(note);
    }

    /// Write a case for the peers: its spec and its tensors (inputs and our outputs).
    pub fn case(
        &mut self,
        kernel: &str,
        config: &Map<String, Value>,
        counts: Map<String, Value>,
        tensors: &[(&str, Tensor)],
    ) -> Result<()> {
        let dir = self.work.join(format!("case{:03}", self.cases));
        self.cases += 1;
        std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        let spec = serde_json::json!({ "kernel": kernel, "config": config, "counts": counts });
        let spec_path = dir.join("case.json");
        std::fs::write(
            &spec_path,
            serde_json::to_string_pretty(&spec).expect("json"),
        )
        .map_err(|e| io_err(&spec_path, e))?;
        write_tensors(&dir.join("tensors.safetensors"), tensors)
    }

    /// Write a case for the peers with the tensors of the previous case (hard-linked, or copied
    /// where the file system cannot link): another kind of the same configuration.
    pub fn case_again(
        &mut self,
        kernel: &str,
        config: &Map<String, Value>,
        counts: Map<String, Value>,
    ) -> Result<()> {
        let Some(previous) = self.cases.checked_sub(1) else {
            return Err(kernels::Error::invalid(
                "benchmark case",
                "no previous case to take the tensors of",
            ));
        };
        let from = self
            .work
            .join(format!("case{previous:03}"))
            .join("tensors.safetensors");
        let dir = self.work.join(format!("case{:03}", self.cases));
        self.cases += 1;
        std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        let spec = serde_json::json!({ "kernel": kernel, "config": config, "counts": counts });
        let spec_path = dir.join("case.json");
        std::fs::write(
            &spec_path,
            serde_json::to_string_pretty(&spec).expect("json"),
        )
        .map_err(|e| io_err(&spec_path, e))?;
        let to = dir.join("tensors.safetensors");
        std::fs::hard_link(&from, &to)
            .or_else(|_| std::fs::copy(&from, &to).map(|_| ()))
            .map_err(|e| io_err(&to, e))
    }

    /// Write tensors that several cases share to `<work>/shared.safetensors` (peers load it
    /// once; a case's spec may refer to its tensors by name). The file holds the last call's
    /// tensors only: write every shared tensor in one call.
    pub fn shared(&mut self, tensors: &[(&str, Tensor)]) -> Result<()> {
        let path = self.work.join("shared.safetensors");
        write_tensors(&path, tensors)
    }

    /// The rows recorded so far.
    pub fn rows(&self) -> &[Row] {
        &self.rows
    }

    /// Take the peers from `<peers>/<script>.py` instead of the family's own script (families
    /// that are parts of another share its peers).
    pub fn peers_from(&mut self, script: &str) {
        self.peer_script = script.to_string();
    }

    /// Run the family's Python peers over the cases written so far and record their rows.
    /// A missing interpreter or peer is recorded as a note, not a failure of our rows;
    /// `KBENCH_PEERS=0` skips them (for profiling runs).
    pub fn run_peers(&mut self) {
        if self.cases == 0 {
            return;
        }
        if std::env::var_os("KBENCH_PEERS").is_some_and(|v| v == "0") {
            self.note("peers skipped (KBENCH_PEERS=0)".to_string());
            return;
        }
        let script = peers_dir().join(format!("{}.py", self.peer_script));
        if !script.is_file() {
            self.note(format!("no peer script at {}", script.display()));
            return;
        }
        eprintln!(
            "kbench {}: running peers ({})",
            self.family,
            script.display()
        );
        let status = std::process::Command::new("python3")
            .arg(&script)
            .arg(&self.work)
            .env("PYTHONUNBUFFERED", "1")
            .status();
        match status {
            Ok(s) if s.success() => {}
            Ok(s) => {
                self.note(format!("peer script {} failed ({s})", script.display()));
                return;
            }
            Err(e) => {
                self.note(format!("could not run python3 for the peers: {e}"));
                return;
            }
        }
        let path = self.work.join("peer_rows.json");
        match std::fs::read_to_string(&path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str::<Vec<Row>>(&t).map_err(|e| e.to_string()))
        {
            Ok(rows) => {
                for r in rows {
                    // A peer script reports a peer it could not run as a row of kernel "note".
                    match (
                        r.kernel.as_str(),
                        r.extra.get("note").and_then(|n| n.as_str()),
                    ) {
                        ("note", Some(n)) => self.note(n.to_string()),
                        _ => self.push(r),
                    }
                }
            }
            Err(e) => self.note(format!("reading {}: {e}", path.display())),
        }
    }

    /// Write `<out>/<family>.json`, print the table, and clean the scratch directory.
    pub fn finish(self, out: &Path) -> Result<PathBuf> {
        self.progress.finish_and_clear();
        let info = self.gpu.info();
        let file = ResultsFile {
            device: info.name.clone(),
            driver: info.driver.clone(),
            commit: env!("KBENCH_COMMIT").to_string(),
            date: utc_now(),
            family: self.family.clone(),
            ptx_target: self.gpu.arch().to_string(),
            notes: self.notes,
            rows: self.rows,
        };
        std::fs::create_dir_all(out).map_err(|e| io_err(out, e))?;
        let path = out.join(format!("{}.json", self.family));
        let text = serde_json::to_string_pretty(&file).expect("json") + "\n";
        std::fs::write(&path, text).map_err(|e| io_err(&path, e))?;
        let _ = std::fs::remove_dir_all(&self.work);
        println!("== table ({}, {}, {})", file.family, file.device, file.date);
        for row in &file.rows {
            println!("{}", format_row(row));
        }
        for n in &file.notes {
            println!("note: {n}");
        }
        Ok(path)
    }
}

fn write_tensors(path: &Path, tensors: &[(&str, Tensor)]) -> Result<()> {
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(name, t)| {
            let (dtype, shape, bytes): (_, &Vec<usize>, &[u8]) = match t {
                Tensor::Bf16(d, s) => (safetensors::Dtype::BF16, s, bytemuck_bytes(d)),
                Tensor::F32(d, s) => (safetensors::Dtype::F32, s, bytemuck_bytes(d)),
                Tensor::I64(d, s) => (safetensors::Dtype::I64, s, bytemuck_bytes(d)),
            };
            let view = safetensors::tensor::TensorView::new(dtype, shape.clone(), bytes)
                .expect("shape matches data");
            (name.to_string(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, &None, path)
        .map_err(|e| kernels::Error::invalid("peer case file", format!("{}: {e}", path.display())))
}

fn bytemuck_bytes<T: Copy>(data: &[T]) -> &[u8] {
    // SAFETY: bf16, f32 and i64 are plain old data without padding; the byte view covers
    // exactly the slice's memory and lives as long as the slice.
    unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, std::mem::size_of_val(data)) }
}

fn io_err(path: &Path, e: std::io::Error) -> kernels::Error {
    kernels::Error::invalid("benchmark output", format!("{}: {e}", path.display()))
}

/// Where the Python peer scripts are: `KERNELS_PEERS_DIR`, else `bench/peers` of the source tree.
pub fn peers_dir() -> PathBuf {
    std::env::var_os("KERNELS_PEERS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("peers"))
}

/// One line for a row: kernel, config, impl, time, rate, errors.
pub fn format_row(r: &Row) -> String {
    let config: Vec<String> = r.config.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let mut s = format!(
        "{:<18} {:<44} {:<24} {:>10.4} ms",
        r.kernel,
        config.join(" "),
        r.implementation,
        r.median_ms
    );
    if let Some(t) = r.tflops {
        s.push_str(&format!(" {t:>8.1} TFLOP/s"));
    }
    if let Some(g) = r.gbps {
        s.push_str(&format!(" {g:>8.1} GB/s"));
    }
    if let Some(e) = r.max_err {
        s.push_str(&format!("  max_err {e:.2e}"));
    }
    if let Some(d) = r.max_diff_vs_ours {
        s.push_str(&format!("  diff_vs_ours {d:.2e}"));
    }
    s
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil-from-days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
