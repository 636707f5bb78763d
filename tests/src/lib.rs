//! Support for the project's test suites (`tests/*.rs`): GPU detection with skip accounting, a
//! watchdog exit on timeouts, tolerance checks that print the measured error.
//!
//! Test binaries use `libtest-mimic` (harness = false) so GPU tests can be registered at run
//! time: on a machine without a usable GPU they are reported as *ignored* (counted in the
//! summary) after one line that says why.

pub mod emu;

use kernels::{Arch, Error, Gpu};
use libtest_mimic::{Arguments, Failed, Trial};
use std::sync::OnceLock;

pub use libtest_mimic::Failed as TestFailure;

/// The result of one test.
pub type TestResult = Result<(), Failed>;

/// The process's GPU (target chosen as `Gpu::new` does), or why there is none.
pub fn gpu() -> Result<&'static Gpu, &'static str> {
    static GPU: OnceLock<Result<Gpu, String>> = OnceLock::new();
    GPU.get_or_init(|| Gpu::new().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| e.as_str())
}

/// A second handle on the same device with the portable `sm_80` PTX loaded, when the default
/// target is a different one (on Hopper), so the portable kernels are tested there too.
pub fn portable_gpu() -> Option<&'static Gpu> {
    static GPU: OnceLock<Option<Gpu>> = OnceLock::new();
    GPU.get_or_init(|| match gpu() {
        Ok(g) if g.arch() != Arch::Sm80 => Gpu::with_arch(0, Some(Arch::Sm80)).ok(),
        _ => None,
    })
    .as_ref()
}

/// What a GPU test needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Needs {
    /// Any supported GPU.
    Gpu,
    /// The sm_90a kernels (a Hopper GPU).
    Hopper,
}

/// A list of tests being assembled by a test binary.
#[derive(Default)]
pub struct Suite {
    trials: Vec<Trial>,
    skipped: Vec<(String, String)>,
}

impl Suite {
    /// An empty suite.
    pub fn new() -> Self {
        Suite::default()
    }

    /// A test that runs everywhere.
    pub fn cpu(&mut self, name: &str, f: impl FnOnce() -> TestResult + Send + 'static) {
        self.trials.push(Trial::test(name, f));
    }

    /// A test that runs on a GPU; ignored, with its reason counted, where there is none.
    /// A watchdog timeout ends the process (exit code 124): the context is unusable after one.
    pub fn gpu(
        &mut self,
        name: &str,
        needs: Needs,
        f: impl FnOnce(&'static Gpu) -> TestResult + Send + 'static,
    ) {
        let skip = match gpu() {
            Err(reason) => Some(reason.to_string()),
            Ok(g) if needs == Needs::Hopper && !g.arch().has_hopper_kernels() => {
                Some(format!("needs sm_90a kernels; this GPU runs {}", g.arch()))
            }
            Ok(_) => None,
        };
        match skip {
            Some(reason) => {
                self.skipped.push((name.to_string(), reason));
                self.trials
                    .push(Trial::test(name, || Ok(())).with_ignored_flag(true));
            }
            None => {
                let g = gpu().expect("checked above");
                self.trials.push(Trial::test(name, move || f(g)));
            }
        }
    }

    /// Run the suite with the command-line arguments and exit.
    pub fn run(self) -> ! {
        let args = Arguments::from_args();
        if !self.skipped.is_empty() {
            let mut reasons: Vec<&str> = self.skipped.iter().map(|(_, r)| r.as_str()).collect();
            reasons.dedup();
            println!(
                "SKIP {} GPU test(s), reported as ignored: {}",
                self.skipped.len(),
                reasons.join("; ")
            );
        }
        libtest_mimic::run(&args, self.trials).exit()
    }
}

/// The environment variable through which the sweep scripts (`bundle/reliability.sh`,
/// `bundle/run.sh`) tell a test process which compute-sanitizer tool it runs under.
pub const SANITIZER_ENV: &str = "KERNELS_SANITIZER";

/// The compute-sanitizer tool this process runs under, as [`SANITIZER_ENV`] says (unset
/// outside the sanitizer passes).
pub fn sanitizer() -> Option<String> {
    std::env::var(SANITIZER_ENV).ok().filter(|s| !s.is_empty())
}

/// The size of a dimension that does not change any kernel's shared-memory protocol: `full`,
/// or `small` under racecheck (`KERNELS_SANITIZER=racecheck`). Racecheck looks for hazards on
/// shared memory, which depend on the tiles a block walks through and on its barriers, not on
/// where in global memory the data lies or on how many tiles there are beyond a few; it slows
/// every shared-memory access by orders of magnitude, so the largest problems would not finish
/// under it. memcheck and initcheck (which check the global addresses) run the full size.
/// Prints which size ran, and why.
pub fn racecheck_size(what: &str, full: usize, small: usize) -> usize {
    if sanitizer().as_deref() == Some("racecheck") {
        println!(
            "{what}: {small} instead of {full} ({SANITIZER_ENV}=racecheck: the shared-memory \
             protocol is the same; memcheck and initcheck run the full size)"
        );
        small
    } else {
        println!("{what}: {full} (full size)");
        full
    }
}

/// Turn a library error into a test failure; a watchdog timeout ends the process at once.
pub fn gpu_ok<T>(r: kernels::Result<T>) -> Result<T, Failed> {
    match r {
        Ok(v) => Ok(v),
        Err(e @ Error::Timeout { .. }) => {
            eprintln!("WATCHDOG: {e}; aborting the test binary");
            std::process::exit(124);
        }
        Err(e) => Err(Failed::from(format!("{e}"))),
    }
}

/// Compare `got` to the f64 reference `want` element by element with a per-element tolerance
/// `tol(i)`; print the maximum error and the worst element, fail on any excess or NaN.
pub fn check_close(
    what: &str,
    got: &[f32],
    want: &[f64],
    tol: impl Fn(usize) -> f64,
) -> TestResult {
    if got.len() != want.len() {
        return Err(format!("{what}: {} values, expected {}", got.len(), want.len()).into());
    }
    let mut worst: Option<(usize, f64, f64)> = None;
    let mut max_err = 0.0f64;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let err = (g as f64 - w).abs();
        let t = tol(i);
        if !approx::abs_diff_eq!(g as f64, w, epsilon = t)
            && worst.is_none_or(|(_, e, tt)| err / t > e / tt)
        {
            worst = Some((i, err, t));
        }
        if err.is_finite() {
            max_err = max_err.max(err);
        } else {
            max_err = f64::INFINITY;
        }
    }
    println!(
        "{what}: max |err| = {max_err:.3e} over {} values",
        got.len()
    );
    match worst {
        None => Ok(()),
        Some((i, err, t)) => Err(format!(
            "{what}: element {i}: got {}, want {}, |err| {err:.3e} > tol {t:.3e}",
            got[i], want[i]
        )
        .into()),
    }
}

/// Fail unless `cond`, with a message.
pub fn ensure(cond: bool, msg: impl FnOnce() -> String) -> TestResult {
    if cond { Ok(()) } else { Err(msg().into()) }
}

/// Unit roundoff of f32 (2^-24).
pub const F32_EPS: f64 = 1.0 / (1u64 << 24) as f64;
