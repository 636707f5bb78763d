//! Timing on the GPU with CUDA events: warm-up, then many timed runs, median.

use crate::error::{CudaContext, Result};
use crate::gpu::Gpu;
use cust::event::{Event, EventFlags};
use cust::stream::Stream;

/// Times of repeated runs of one piece of GPU work, in milliseconds.
#[derive(Clone, Debug)]
pub struct Timings {
    /// Each timed run, in order.
    pub samples_ms: Vec<f64>,
}

impl Timings {
    /// Median.
    pub fn median_ms(&self) -> f64 {
        let mut v = self.samples_ms.clone();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n == 0 {
            return f64::NAN;
        }
        if n % 2 == 1 {
            v[n / 2]
        } else {
            0.5 * (v[n / 2 - 1] + v[n / 2])
        }
    }

    /// Smallest.
    pub fn min_ms(&self) -> f64 {
        self.samples_ms
            .iter()
            .copied()
            .fold(f64::INFINITY, f64::min)
    }
}

/// Run `work` `warmup` times, then `runs` times each between two events on `stream`; the
/// stream is synchronized (with the watchdog) after each run.
pub fn time_on_stream(
    gpu: &Gpu,
    stream: &Stream,
    warmup: usize,
    runs: usize,
    mut work: impl FnMut() -> Result<()>,
) -> Result<Timings> {
    gpu.bind()?;
    for _ in 0..warmup {
        work()?;
    }
    gpu.sync(stream, "warm-up runs")?;
    let start = Event::new(EventFlags::DEFAULT).ctx("creating an event")?;
    let stop = Event::new(EventFlags::DEFAULT).ctx("creating an event")?;
    let mut samples_ms = Vec::with_capacity(runs);
    for _ in 0..runs {
        start.record(stream).ctx("recording an event")?;
        work()?;
        stop.record(stream).ctx("recording an event")?;
        gpu.sync(stream, "a timed run")?;
        samples_ms.push(stop.elapsed_time_f32(&start).ctx("reading an event")? as f64);
    }
    Ok(Timings { samples_ms })
}
