//! `kbench report`'s plots: `bench/results/*.json` -> `bench/plots/*.svg` and `*.png`, the
//! same drawing through plotters' SVG backend (text drawn by the viewer) and its bitmap backend
//! (text rasterized by `ab_glyph` with DejaVu Sans, embedded from the `dejavu` crate). Nothing
//! comes from the system (no fontconfig, freetype or installed fonts), so a fresh machine draws
//! the same pixels, and the output depends only on the results files: the report regenerates
//! both byte for byte.
//!
//! | file | what | from |
//! |---|---|---|
//! | `attention_d<D>.{svg,png}` | TFLOP/s vs sequence length (log2), non-causal and causal panels | `attention_fwd` rows, one file per head dim |
//! | `attention_bwd_d<D>.{svg,png}`, `attention_fwd_bwd_d<D>.{svg,png}` | the same for the backward alone and for forward + backward | `attention_bwd`, `attention_fwd_bwd` rows |
//! | `gla.{svg,png}` | tokens/s vs T, one panel per configuration | `gla_fwd` rows |
//! | `semicrf_{time,memory}.{svg,png}` | median time and peak device memory vs T, one panel per kernel and configuration | every kernel's rows |
//! | `mhc.{svg,png}` | achieved GB/s per kernel (bars), the measured copy bandwidth as a reference line | rows with GB/s; `memcpy_dtod` is the reference |
//!
//! Every implementation present in the rows is a series: ours (`ours`, `ours-<variant>`) solid
//! with round markers, peers dashed with triangles. A line plot follows one *sweep*: the rows of
//! one kernel whose configurations differ only in the x key (and in the keys that the family
//! scales with it, such as the batch that keeps `batch * seq` fixed). A sweep with fewer than two
//! x values, rows without the plotted value, and results files that are missing are skipped, each
//! with a message; nothing about the data is assumed beyond the key names.

use crate::harness::{ResultsFile, Row};
use plotters::coord::Shift;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, KeyPointWeight, Ranged};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::ops::Range;
use std::path::Path;

/// One plot written by [`render_all`].
#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    /// Family (the results file's `family`).
    pub family: String,
    /// File name of the SVG inside the plots directory.
    pub file: String,
    /// File name of the PNG (the same drawing) inside the plots directory.
    pub png: String,
    /// What it shows (also the markdown alt text).
    pub title: String,
}

/// What [`render_all`] did.
#[derive(Debug, Default)]
pub struct Rendered {
    /// The plots written, in report order.
    pub plots: Vec<Plot>,
    /// Skipped files, sweeps and rows, and stale plots removed: one line each.
    pub messages: Vec<String>,
}

/// The font plotters draws text with in PNGs (registered once per process as [`FONT`]).
fn register_font() -> Result<(), String> {
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    ok.then_some(())
        .ok_or_else(|| "the embedded DejaVu Sans font could not be loaded".to_string())
}

/// Draw every plot the results allow into `out_dir` (created if missing), each as SVG and PNG.
/// SVG and PNG files in `out_dir` that this run did not write are stale (their results are
/// gone) and are removed.
pub fn render_all(files: &[ResultsFile], out_dir: &Path) -> Result<Rendered, String> {
    std::fs::create_dir_all(out_dir).map_err(|e| format!("creating {}: {e}", out_dir.display()))?;
    register_font()?;
    let mut out = Rendered::default();
    for (family, build) in FAMILIES {
        let Some(file) = files.iter().find(|f| f.family == *family) else {
            out.messages.push(format!(
                "{family}: no results file ({family}.json), its plots are skipped"
            ));
            continue;
        };
        for figure in build(file, &mut out.messages) {
            let svg = figure.file().to_string();
            let png = Path::new(&svg)
                .with_extension("png")
                .to_string_lossy()
                .into_owned();
            let path = out_dir.join(&svg);
            figure
                .draw(&path, &out_dir.join(&png))
                .map_err(|e| format!("drawing {}: {e}", path.display()))?;
            out.plots.push(Plot {
                family: family.to_string(),
                file: svg,
                png,
                title: figure.title().to_string(),
            });
        }
    }
    let written: BTreeSet<&str> = out
        .plots
        .iter()
        .flat_map(|p| [p.file.as_str(), p.png.as_str()])
        .collect();
    let mut stale: Vec<_> = std::fs::read_dir(out_dir)
        .map_err(|e| format!("reading {}: {e}", out_dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "svg" || x == "png"))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_none_or(|n| !written.contains(n))
        })
        .collect();
    stale.sort();
    for path in stale {
        std::fs::remove_file(&path).map_err(|e| format!("removing {}: {e}", path.display()))?;
        out.messages
            .push(format!("removed stale plot {}", path.display()));
    }
    Ok(out)
}

/// What turns a family's results into figures (messages go to the vector).
type Figures = fn(&ResultsFile, &mut Vec<String>) -> Vec<Figure>;

/// The families that have plots, in report order.
const FAMILIES: &[(&str, Figures)] = &[
    ("attention", attention),
    ("attention-backward", attention),
    ("gla", gla),
    ("semicrf", semicrf),
    ("mhc", mhc),
];

// ---- families ------------------------------------------------------------------------------

/// The attention kinds that are plotted: kernel, file name prefix, title.
const ATTENTION_KINDS: &[(&str, &str, &str)] = &[
    ("attention_fwd", "attention", "attention forward"),
    ("attention_bwd", "attention_bwd", "attention backward"),
    (
        "attention_fwd_bwd",
        "attention_fwd_bwd",
        "attention forward + backward",
    ),
];

/// TFLOP/s vs sequence length, per kind (forward, backward, both) one file per head dim, a
/// panel for non-causal and for causal.
fn attention(f: &ResultsFile, msgs: &mut Vec<String>) -> Vec<Figure> {
    let kernels: Vec<&str> = ATTENTION_KINDS.iter().map(|k| k.0).collect();
    let rows = rows_of(f, &kernels, msgs);
    let mut figures = Vec::new();
    for &(kernel, prefix, what) in ATTENTION_KINDS {
        let of_kind: Vec<&Row> = rows
            .iter()
            .copied()
            .filter(|r| r.kernel == kernel)
            .collect();
        figures.extend(attention_kind(f, &of_kind, prefix, what, msgs));
    }
    figures
}

/// [`attention`]'s figures of one kind.
fn attention_kind(
    f: &ResultsFile,
    rows: &[&Row],
    prefix: &str,
    what: &str,
    msgs: &mut Vec<String>,
) -> Vec<Figure> {
    let all = sweeps(rows, "seq", &["batch"], msgs);
    for s in &all {
        if int(&s.fixed, "d").is_none() || s.fixed.get("causal").and_then(Value::as_bool).is_none()
        {
            msgs.push(format!(
                "{}: no integer d or boolean causal, not plotted",
                s.describe()
            ));
        }
    }
    // Per head dim (numerically), the longest sweep per causal setting.
    let mut dims: Vec<i64> = all.iter().filter_map(|s| int(&s.fixed, "d")).collect();
    dims.sort_unstable();
    dims.dedup();
    let mut figures = Vec::new();
    for d in dims {
        let mut panels = Vec::new();
        for causal in [false, true] {
            let candidates: Vec<&Sweep> = all
                .iter()
                .filter(|s| int(&s.fixed, "d") == Some(d))
                .filter(|s| s.fixed.get("causal").and_then(Value::as_bool) == Some(causal))
                .collect();
            let Some(best) = longest(&candidates, msgs) else {
                continue;
            };
            let mode = if causal { "causal" } else { "non-causal" };
            panels.push(Panel {
                title: format!(
                    "{mode} ({})",
                    join([
                        config_text(&best.fixed, &["d", "causal"]),
                        best.covarying(&["batch"])
                    ])
                ),
                x: AxisSpec::log("sequence length"),
                y: AxisSpec::linear("TFLOP/s"),
                series: best.series(|r| r.tflops),
            });
        }
        if panels.is_empty() {
            continue;
        }
        figures.push(Figure::Lines(LineFigure {
            file: format!("{prefix}_d{d}.svg"),
            title: format!("{what}, D = {d}: TFLOP/s vs sequence length"),
            subtitle: provenance(f),
            panels,
            cols: 2,
        }));
    }
    figures
}

/// Tokens/s vs T, a panel per configuration.
fn gla(f: &ResultsFile, msgs: &mut Vec<String>) -> Vec<Figure> {
    let rows = rows_of(f, &["gla_fwd"], msgs);
    let panels: Vec<Panel> = sweeps(&rows, "T", &["B"], msgs)
        .iter()
        .filter(|s| enough_points(s, msgs))
        .map(|s| Panel {
            title: join([config_text(&s.fixed, &[]), s.covarying(&["B"])]),
            x: AxisSpec::log("T (tokens per sequence)"),
            y: AxisSpec::log("tokens/s"),
            series: s.series(tokens_per_s),
        })
        .collect();
    line_figure(
        f,
        "gla.svg",
        "GLA forward (chunkwise): tokens/s vs T".into(),
        panels,
        msgs,
    )
}

/// Time and peak device memory vs T, a panel per kernel and configuration.
fn semicrf(f: &ResultsFile, msgs: &mut Vec<String>) -> Vec<Figure> {
    let kernels: Vec<&str> = first_seen(f.rows.iter().map(|r| r.kernel.as_str()));
    let rows = rows_of(f, &kernels, msgs);
    let sweeps: Vec<Sweep> = sweeps(&rows, "T", &["B", "checkpoint"], msgs)
        .into_iter()
        .filter(|s| enough_points(s, msgs))
        .collect();
    let panels = |y: AxisSpec, metric: fn(&Row) -> Option<f64>| -> Vec<Panel> {
        sweeps
            .iter()
            .map(|s| Panel {
                title: join([
                    s.kernel.clone(),
                    config_text(&s.fixed, &[]),
                    s.covarying(&["B"]),
                ]),
                x: AxisSpec::log("T (sequence length)"),
                y: y.clone(),
                series: s.series(metric),
            })
            .collect()
    };
    let mut figures = line_figure(
        f,
        "semicrf_time.svg",
        "semi-CRF: median time vs T".into(),
        panels(AxisSpec::log("median time (ms)"), |r| Some(r.median_ms)),
        msgs,
    );
    figures.extend(line_figure(
        f,
        "semicrf_memory.svg",
        "semi-CRF: peak device memory vs T (inputs included)".into(),
        panels(AxisSpec::log("peak device memory (MiB)"), peak_mib),
        msgs,
    ));
    figures
}

/// Achieved GB/s per kernel, bars per implementation, the measured copy bandwidth as a line.
fn mhc(f: &ResultsFile, msgs: &mut Vec<String>) -> Vec<Figure> {
    const COPY_KERNEL: &str = "memcpy_dtod";
    let reference = f
        .rows
        .iter()
        .find(|r| r.kernel == COPY_KERNEL)
        .and_then(|r| r.gbps)
        .map(|g| (format!("device copy, measured ({g:.0} GB/s)"), g));
    if reference.is_none() {
        msgs.push(format!(
            "mhc: no {COPY_KERNEL} row with GB/s, the copy reference line is left out"
        ));
    }
    let rows: Vec<&Row> = f
        .rows
        .iter()
        .filter(|r| r.kernel != COPY_KERNEL)
        .filter(|r| {
            let ok = r.gbps.is_some_and(|g| g.is_finite() && g > 0.0);
            if !ok {
                msgs.push(format!(
                    "mhc: {} {} has no GB/s, not plotted",
                    r.kernel, r.implementation
                ));
            }
            ok
        })
        .collect();
    let configs = first_seen(rows.iter().map(|r| config_text(&r.config, &[])));
    let one_config = configs.len() == 1;
    let group_of = |r: &Row| {
        if one_config {
            r.kernel.clone()
        } else {
            format!("{} {}", r.kernel, config_text(&r.config, &[]))
        }
    };
    let groups = first_seen(rows.iter().map(|r| group_of(r)));
    if groups.is_empty() {
        msgs.push("mhc: no rows with GB/s, mhc.svg is not drawn".into());
        return Vec::new();
    }
    let series = first_seen(rows.iter().map(|r| r.implementation.clone()))
        .into_iter()
        .map(|name| Series {
            points: rows
                .iter()
                .filter(|r| r.implementation == name)
                .filter_map(|r| {
                    let g = groups.iter().position(|g| *g == group_of(r))?;
                    Some((g as f64, r.gbps?))
                })
                .collect(),
            name,
        })
        .collect();
    let config = if one_config {
        format!(" ({})", configs[0])
    } else {
        String::new()
    };
    vec![Figure::Bars(BarFigure {
        file: "mhc.svg".into(),
        title: format!("mHC: achieved bandwidth{config}"),
        subtitle: provenance(f),
        groups,
        y_label: "GB/s (least bytes each pass must move / time)".into(),
        series,
        reference,
    })]
}

// ---- rows, sweeps, series ------------------------------------------------------------------

/// The rows of the given kernels; the others are reported once per kernel.
fn rows_of<'a>(f: &'a ResultsFile, kernels: &[&str], msgs: &mut Vec<String>) -> Vec<&'a Row> {
    for k in first_seen(f.rows.iter().map(|r| r.kernel.as_str())) {
        if !kernels.contains(&k) {
            msgs.push(format!(
                "{}: kernel {k} has no plot, its rows are skipped",
                f.family
            ));
        }
    }
    f.rows
        .iter()
        .filter(|r| kernels.contains(&r.kernel.as_str()))
        .collect()
}

/// Rows of one kernel whose configurations differ only in `x` and the `covary` keys.
struct Sweep<'a> {
    kernel: String,
    /// The configuration less `x` and the `covary` keys.
    fixed: Map<String, Value>,
    x: String,
    rows: Vec<&'a Row>,
}

/// Group rows into sweeps (first-seen order). Rows without a positive numeric `x` are skipped.
fn sweeps<'a>(
    rows: &[&'a Row],
    x: &str,
    covary: &[&str],
    msgs: &mut Vec<String>,
) -> Vec<Sweep<'a>> {
    let mut out: Vec<Sweep> = Vec::new();
    for &r in rows {
        if x_of(r, x).is_none() {
            msgs.push(format!(
                "{} {} ({}): no positive {x}, not plotted",
                r.kernel,
                r.implementation,
                config_text(&r.config, &[])
            ));
            continue;
        }
        let mut fixed = r.config.clone();
        fixed.remove(x);
        for k in covary {
            fixed.remove(*k);
        }
        match out
            .iter_mut()
            .find(|s| s.kernel == r.kernel && s.fixed == fixed)
        {
            Some(s) => s.rows.push(r),
            None => out.push(Sweep {
                kernel: r.kernel.clone(),
                fixed,
                x: x.to_string(),
                rows: vec![r],
            }),
        }
    }
    out
}

fn x_of(r: &Row, x: &str) -> Option<f64> {
    r.config
        .get(x)
        .and_then(Value::as_f64)
        .filter(|v| v.is_finite() && *v > 0.0)
}

impl Sweep<'_> {
    /// The distinct x values, ascending.
    fn xs(&self) -> Vec<f64> {
        let mut xs: Vec<f64> = self.rows.iter().filter_map(|r| x_of(r, &self.x)).collect();
        xs.sort_by(f64::total_cmp);
        xs.dedup();
        xs
    }

    fn describe(&self) -> String {
        join([self.kernel.clone(), config_text(&self.fixed, &[])])
    }

    /// How the keys `keys` (scaled with x) go with x: `B=4` (constant), `B·T=16384` (constant
    /// product), or the values in x order (`B=16/4/4`).
    fn covarying(&self, keys: &[&str]) -> String {
        let xs = self.xs();
        let mut parts = Vec::new();
        for k in keys {
            let at: Vec<f64> = xs
                .iter()
                .filter_map(|&x| {
                    self.rows
                        .iter()
                        .find(|r| x_of(r, &self.x) == Some(x))
                        .and_then(|r| r.config.get(*k))
                        .and_then(Value::as_f64)
                })
                .collect();
            if at.len() != xs.len() || at.is_empty() {
                continue;
            }
            let products: Vec<f64> = at.iter().zip(&xs).map(|(v, x)| v * x).collect();
            if at.iter().all(|v| *v == at[0]) {
                parts.push(format!("{k}={}", fmt_num(at[0])));
            } else if products.iter().all(|p| *p == products[0]) {
                parts.push(format!("{k}·{}={}", self.x, fmt_num(products[0])));
            } else {
                let vals: Vec<String> = at.iter().map(|v| fmt_num(*v)).collect();
                parts.push(format!("{k}={}", vals.join("/")));
            }
        }
        parts.join(" ")
    }

    /// One series per implementation (first-seen order): (x, metric) sorted by x; rows without
    /// the metric are left out, a second row at the same x is ignored.
    fn series(&self, metric: impl Fn(&Row) -> Option<f64>) -> Vec<Series> {
        first_seen(self.rows.iter().map(|r| r.implementation.clone()))
            .into_iter()
            .filter_map(|name| {
                let mut points: Vec<(f64, f64)> = Vec::new();
                for r in self.rows.iter().filter(|r| r.implementation == name) {
                    let (Some(x), Some(y)) = (x_of(r, &self.x), metric(r)) else {
                        continue;
                    };
                    if y.is_finite() && y > 0.0 && !points.iter().any(|p| p.0 == x) {
                        points.push((x, y));
                    }
                }
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                (!points.is_empty()).then_some(Series { name, points })
            })
            .collect()
    }
}

/// A sweep needs two x values to be a line; otherwise it is reported.
fn enough_points(s: &Sweep, msgs: &mut Vec<String>) -> bool {
    let n = s.xs().len();
    if n < 2 {
        msgs.push(format!(
            "{}: one {} value only, not plotted",
            s.describe(),
            s.x
        ));
    }
    n >= 2
}

/// The sweep with the most x values among those with at least two (first on ties); the others
/// are reported.
fn longest<'s, 'a>(candidates: &[&'s Sweep<'a>], msgs: &mut Vec<String>) -> Option<&'s Sweep<'a>> {
    let usable: Vec<&Sweep> = candidates
        .iter()
        .copied()
        .filter(|s| enough_points(s, msgs))
        .collect();
    let best = usable.iter().copied().reduce(|best, s| {
        if s.xs().len() > best.xs().len() {
            s
        } else {
            best
        }
    })?;
    for s in usable.iter().filter(|s| !std::ptr::eq(**s, best)) {
        msgs.push(format!(
            "{}: a longer sweep is plotted instead",
            s.describe()
        ));
    }
    Some(best)
}

fn line_figure(
    f: &ResultsFile,
    file: &str,
    title: String,
    panels: Vec<Panel>,
    msgs: &mut Vec<String>,
) -> Vec<Figure> {
    if panels.is_empty() {
        msgs.push(format!(
            "{}: nothing to plot, {file} is not drawn",
            f.family
        ));
        return Vec::new();
    }
    vec![Figure::Lines(LineFigure {
        file: file.into(),
        title,
        subtitle: provenance(f),
        panels,
        cols: 2,
    })]
}

fn tokens_per_s(r: &Row) -> Option<f64> {
    r.extra
        .get("tokens_per_s")
        .and_then(Value::as_f64)
        .or_else(|| {
            let tokens = r.config.get("B")?.as_f64()? * r.config.get("T")?.as_f64()?;
            Some(tokens / (r.median_ms * 1e-3))
        })
}

fn peak_mib(r: &Row) -> Option<f64> {
    r.extra
        .get("peak_bytes")
        .and_then(Value::as_f64)
        .map(|b| b / 1048576.0)
}

fn int(m: &Map<String, Value>, k: &str) -> Option<i64> {
    m.get(k).and_then(Value::as_i64)
}

/// `k=v` pairs (keys sorted, as serde_json's map keeps them), less `skip`.
fn config_text(m: &Map<String, Value>, skip: &[&str]) -> String {
    m.iter()
        .filter(|(k, _)| !skip.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}={}", v.as_str().map_or(v.to_string(), str::to_string)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn join<const N: usize>(parts: [String; N]) -> String {
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Distinct items in first-seen order.
fn first_seen<T: PartialEq>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut out = Vec::new();
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

fn provenance(f: &ResultsFile) -> String {
    let commit: String = f.commit.chars().take(10).collect();
    format!(
        "{} (driver {}), commit {commit}, {}",
        f.device, f.driver, f.date
    )
}

// ---- figures -------------------------------------------------------------------------------

/// Points of one implementation.
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

#[derive(Clone)]
enum Scale {
    Linear,
    Log,
}

#[derive(Clone)]
struct AxisSpec {
    label: String,
    scale: Scale,
}

impl AxisSpec {
    fn linear(label: &str) -> AxisSpec {
        AxisSpec {
            label: label.into(),
            scale: Scale::Linear,
        }
    }
    fn log(label: &str) -> AxisSpec {
        AxisSpec {
            label: format!("{label}, log scale"),
            scale: Scale::Log,
        }
    }
}

struct Panel {
    title: String,
    x: AxisSpec,
    y: AxisSpec,
    series: Vec<Series>,
}

struct LineFigure {
    file: String,
    title: String,
    subtitle: String,
    panels: Vec<Panel>,
    cols: usize,
}

struct BarFigure {
    file: String,
    title: String,
    subtitle: String,
    /// Bar groups (x labels); a series' point is (group index, value).
    groups: Vec<String>,
    y_label: String,
    series: Vec<Series>,
    reference: Option<(String, f64)>,
}

enum Figure {
    Lines(LineFigure),
    Bars(BarFigure),
}

impl Figure {
    fn file(&self) -> &str {
        match self {
            Figure::Lines(f) => &f.file,
            Figure::Bars(f) => &f.file,
        }
    }

    fn title(&self) -> &str {
        match self {
            Figure::Lines(f) => &f.title,
            Figure::Bars(f) => &f.title,
        }
    }

    /// Width and height in pixels.
    fn size(&self) -> (u32, u32) {
        match self {
            Figure::Lines(f) => line_size(f),
            Figure::Bars(f) => bar_size(f),
        }
    }

    fn paint<DB: DrawingBackend>(&self, root: &DrawingArea<DB, Shift>) -> Result<(), String> {
        match self {
            Figure::Lines(f) => draw_lines(f, root)?,
            Figure::Bars(f) => draw_bars(f, root)?,
        }
        root.present().map_err(err)
    }

    /// Draw the figure as SVG at `svg` and as PNG (the same drawing, rasterized by plotters'
    /// bitmap backend with the embedded font, RGB, compressed at the encoder's best level) at
    /// `png`.
    fn draw(&self, svg: &Path, png: &Path) -> Result<(), String> {
        use image::ImageEncoder;
        use image::codecs::png::{CompressionType, FilterType, PngEncoder};
        let (w, h) = self.size();
        self.paint(&SVGBackend::new(svg, (w, h)).into_drawing_area())?;
        let mut pixels = vec![0u8; w as usize * h as usize * 3];
        self.paint(&BitMapBackend::with_buffer(&mut pixels, (w, h)).into_drawing_area())?;
        let file = std::fs::File::create(png).map_err(err)?;
        PngEncoder::new_with_quality(
            std::io::BufWriter::new(file),
            CompressionType::Best,
            FilterType::Adaptive,
        )
        .write_image(&pixels, w, h, image::ColorType::Rgb8)
        .map_err(err)
    }
}

// ---- drawing -------------------------------------------------------------------------------

const FONT: &str = "sans-serif";
const PANEL_W: u32 = 620;
const PANEL_H: u32 = 430;
const BAR_W: u32 = 900;
const HEADER_H: u32 = 64;
const LEGEND_ROW_H: u32 = 24;
/// Extra room around the data on each axis, as a fraction of its span.
const PAD: f64 = 0.06;
/// Ours: warm colors (tableau). Peers: cool ones.
const OURS_COLORS: [RGBColor; 5] = [
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
];
const PEER_COLORS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(23, 190, 207),
    RGBColor(127, 127, 127),
];

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// How an implementation is drawn: one style per name across all panels of a figure.
struct Style {
    name: String,
    color: RGBColor,
    ours: bool,
}

fn is_ours(name: &str) -> bool {
    name == "ours" || name.starts_with("ours-")
}

/// Ours first (`ours`, then variants), then peers, each in first-seen order.
fn styles<'a>(names: impl Iterator<Item = &'a str>) -> Vec<Style> {
    let names = first_seen(names);
    let ours = names.iter().filter(|n| is_ours(n));
    let peers = names.iter().filter(|n| !is_ours(n));
    let mut ours: Vec<&&str> = ours.collect();
    ours.sort_by_key(|n| **n != "ours");
    ours.into_iter()
        .enumerate()
        .map(|(i, n)| Style {
            name: n.to_string(),
            color: OURS_COLORS[i % OURS_COLORS.len()],
            ours: true,
        })
        .chain(peers.enumerate().map(|(i, n)| Style {
            name: n.to_string(),
            color: PEER_COLORS[i % PEER_COLORS.len()],
            ours: false,
        }))
        .collect()
}

fn style_of<'s>(styles: &'s [Style], name: &str) -> &'s Style {
    styles
        .iter()
        .find(|s| s.name == name)
        .expect("every series has a style")
}

/// An axis with the ticks we choose: linear, or logarithmic (the map is linear in ln).
#[derive(Clone)]
struct Axis {
    lo: f64,
    hi: f64,
    log: bool,
    ticks: Vec<f64>,
}

impl Ranged for Axis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let t = |x: f64| if self.log { x.ln() } else { x };
        let frac = (t(*v) - t(self.lo)) / (t(self.hi) - t(self.lo));
        limit.0 + (frac * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        match hint.weight() {
            KeyPointWeight::Bold => self.ticks.clone(),
            KeyPointWeight::Any => Vec::new(),
        }
    }

    fn range(&self) -> Range<f64> {
        self.lo..self.hi
    }
}

impl Axis {
    /// An axis over `values` (positive, finite; at least one).
    fn new(values: &[f64], scale: &Scale, from_zero: bool) -> Axis {
        let min = values.iter().copied().fold(f64::INFINITY, f64::min);
        let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        match scale {
            Scale::Linear => {
                let lo = if from_zero { 0.0 } else { min };
                let span = if max > lo {
                    max - lo
                } else {
                    max.abs().max(1.0)
                };
                let (lo, hi) = (
                    if from_zero { 0.0 } else { lo - PAD * span },
                    max + 2.0 * PAD * span,
                );
                let step = nice_step((hi - lo) / 6.0);
                let ticks = (0..)
                    .map(|i| (lo / step).ceil() * step + f64::from(i) * step)
                    .take_while(|t| *t <= hi)
                    .collect();
                Axis {
                    lo,
                    hi,
                    log: false,
                    ticks,
                }
            }
            Scale::Log => {
                let span = (max / min).ln().max(2f64.ln());
                let (lo, hi) = (min * (-PAD * span).exp(), max * (PAD * span).exp());
                // Powers of two where every value is one (sequence lengths), else decades, with
                // 2 and 5 multiples (then all multiples) while fewer than three ticks fall inside.
                let pow2 = values.iter().all(|v| v.log2().fract() == 0.0);
                let ticks = if pow2 {
                    powers(2.0, lo, hi, &[1.0])
                } else {
                    [
                        &[1.0][..],
                        &[1.0, 2.0, 5.0],
                        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0],
                    ]
                    .iter()
                    .map(|m| powers(10.0, lo, hi, m))
                    .find(|t| t.len() >= 3)
                    .unwrap_or_else(|| {
                        powers(10.0, lo, hi, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])
                    })
                };
                Axis {
                    lo,
                    hi,
                    log: true,
                    ticks,
                }
            }
        }
    }
}

/// `m * base^k` inside [lo, hi], ascending.
fn powers(base: f64, lo: f64, hi: f64, multiples: &[f64]) -> Vec<f64> {
    let k0 = lo.log(base).floor() as i32 - 1;
    let k1 = hi.log(base).ceil() as i32 + 1;
    let mut out: Vec<f64> = (k0..=k1)
        .flat_map(|k| multiples.iter().map(move |m| m * base.powi(k)))
        .filter(|t| *t >= lo && *t <= hi)
        .collect();
    out.sort_by(f64::total_cmp);
    out
}

/// 1, 2 or 5 times a power of ten, at least `raw`.
fn nice_step(raw: f64) -> f64 {
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

/// A tick or value label: `16384`, `0.25`, `10k`, `56M`.
fn fmt_num(v: f64) -> String {
    let trim = |x: f64| {
        let s = format!("{x:.3}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    };
    let a = v.abs();
    if a >= 1e9 {
        format!("{}G", trim(v / 1e9))
    } else if a >= 1e6 {
        format!("{}M", trim(v / 1e6))
    } else if a >= 1e4 && (v / 1e3).fract() == 0.0 {
        format!("{}k", trim(v / 1e3))
    } else if a >= 10.0 {
        format!("{v:.0}")
    } else {
        trim(v)
    }
}

/// Width of a text in pixels (an estimate a little above sans-serif's, like plotters' own).
fn text_w(text: &str, size: u32) -> u32 {
    (text.chars().count() as f64 * f64::from(size) * 0.5).ceil() as u32
}

/// Title and provenance on top; returns the area below.
fn header<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    subtitle: &str,
) -> Result<DrawingArea<DB, Shift>, String> {
    let (top, rest) = root.split_vertically(HEADER_H);
    let w = top.dim_in_pixel().0 as i32;
    let centered =
        |size| TextStyle::from((FONT, size).into_font()).pos(Pos::new(HPos::Center, VPos::Center));
    top.draw(&Text::new(title, (w / 2, 22), centered(24).color(&BLACK)))
        .map_err(err)?;
    top.draw(&Text::new(
        subtitle,
        (w / 2, 48),
        centered(15).color(&RGBColor(90, 90, 90)),
    ))
    .map_err(err)?;
    Ok(rest)
}

/// Legend entries laid out in rows across `width`: (entry index, x, row).
fn legend_layout(labels: &[String], width: u32) -> (Vec<(usize, i32, i32)>, u32) {
    const SAMPLE: u32 = 48;
    let mut out = Vec::new();
    let (mut x, mut row) = (20u32, 0i32);
    for (i, l) in labels.iter().enumerate() {
        let w = SAMPLE + text_w(l, 15) + 28;
        if x + w > width && x > 20 {
            x = 20;
            row += 1;
        }
        out.push((i, x as i32, row));
        x += w;
    }
    let rows = out.last().map_or(0, |e| e.2 as u32 + 1);
    (out, rows * LEGEND_ROW_H + 12)
}

/// The legend: a line sample (solid for ours, dashed for peers), a marker, the name; then the
/// reference line, if any.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    styles: &[Style],
    reference: Option<&str>,
    line_markers: bool,
) -> Result<(), String> {
    let mut labels: Vec<String> = styles.iter().map(|s| s.name.clone()).collect();
    labels.extend(reference.map(str::to_string));
    let (layout, _) = legend_layout(&labels, area.dim_in_pixel().0);
    let text = TextStyle::from((FONT, 15).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, x, row) in layout {
        let y = 6 + row * LEGEND_ROW_H as i32 + LEGEND_ROW_H as i32 / 2;
        let (color, ours) = match styles.get(i) {
            Some(s) => (s.color, s.ours),
            None => (BLACK, false),
        };
        let line = color.stroke_width(2);
        if !line_markers && i < styles.len() {
            area.draw(&Rectangle::new(
                [(x + 12, y - 7), (x + 36, y + 7)],
                color.filled(),
            ))
            .map_err(err)?;
        } else if ours {
            area.draw(&PathElement::new(vec![(x, y), (x + 48, y)], line))
                .map_err(err)?;
        } else {
            for s in [0, 17, 34] {
                area.draw(&PathElement::new(vec![(x + s, y), (x + s + 12, y)], line))
                    .map_err(err)?;
            }
        }
        if line_markers && i < styles.len() {
            draw_marker_px(area, (x + 24, y), color, ours)?;
        }
        area.draw(&Text::new(labels[i].clone(), (x + 56, y), text.clone()))
            .map_err(err)?;
    }
    Ok(())
}

fn draw_marker_px<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    at: (i32, i32),
    color: RGBColor,
    ours: bool,
) -> Result<(), String> {
    if ours {
        area.draw(&Circle::new(at, 4, color.filled())).map_err(err)
    } else {
        area.draw(&TriangleMarker::new(at, 6, color.filled()))
            .map_err(err)
    }
}

/// The styles of a line figure's series, across its panels.
fn line_styles(f: &LineFigure) -> Vec<Style> {
    styles(
        f.panels
            .iter()
            .flat_map(|p| p.series.iter().map(|s| s.name.as_str())),
    )
}

/// Columns and rows of a line figure's panel grid.
fn grid_shape(f: &LineFigure) -> (usize, usize) {
    let cols = f.cols.min(f.panels.len()).max(1);
    (cols, f.panels.len().div_ceil(cols))
}

/// Width and height of a line figure in pixels.
fn line_size(f: &LineFigure) -> (u32, u32) {
    let (cols, rows) = grid_shape(f);
    let width = PANEL_W * cols as u32;
    let labels: Vec<String> = line_styles(f).iter().map(|s| s.name.clone()).collect();
    let (_, legend_h) = legend_layout(&labels, width);
    (width, HEADER_H + PANEL_H * rows as u32 + legend_h)
}

fn draw_lines<DB: DrawingBackend>(
    f: &LineFigure,
    root: &DrawingArea<DB, Shift>,
) -> Result<(), String> {
    let styles = line_styles(f);
    let (cols, rows) = grid_shape(f);
    root.fill(&WHITE).map_err(err)?;
    let body = header(root, &f.title, &f.subtitle)?;
    let (grid, legend) = body.split_vertically(PANEL_H * rows as u32);
    for (area, panel) in grid.split_evenly((rows, cols)).iter().zip(&f.panels) {
        draw_panel(area, panel, &styles)?;
    }
    draw_legend(&legend, &styles, None, true)
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    p: &Panel,
    styles: &[Style],
) -> Result<(), String> {
    let xs: Vec<f64> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|q| q.0))
        .collect();
    let ys: Vec<f64> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|q| q.1))
        .collect();
    if xs.is_empty() {
        return Ok(());
    }
    let x = Axis::new(&xs, &p.x.scale, false);
    let y = Axis::new(&ys, &p.y.scale, true);
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, (FONT, 17))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc(p.x.label.as_str())
        .y_desc(p.y.label.as_str())
        .x_label_formatter(&|v| fmt_num(*v))
        .y_label_formatter(&|v| fmt_num(*v))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .bold_line_style(BLACK.mix(0.12))
        .draw()
        .map_err(err)?;
    // Peers first, `ours` last: on top where lines coincide.
    let mut order: Vec<&Series> = p.series.iter().collect();
    order.sort_by_key(|s| std::cmp::Reverse(styles.iter().position(|st| st.name == s.name)));
    for s in order {
        let st = style_of(styles, &s.name);
        let line = st.color.stroke_width(2);
        let pts = s.points.iter().copied();
        if st.ours {
            chart
                .draw_series(LineSeries::new(pts.clone(), line))
                .map_err(err)?;
            chart
                .draw_series(pts.map(|q| Circle::new(q, 4, st.color.filled())))
                .map_err(err)?;
        } else {
            chart
                .draw_series(DashedLineSeries::new(pts.clone(), 9, 5, line))
                .map_err(err)?;
            chart
                .draw_series(pts.map(|q| TriangleMarker::new(q, 6, st.color.filled())))
                .map_err(err)?;
        }
    }
    Ok(())
}

/// Width and height of a bar figure in pixels.
fn bar_size(f: &BarFigure) -> (u32, u32) {
    let labels: Vec<String> = styles(f.series.iter().map(|s| s.name.as_str()))
        .iter()
        .map(|s| s.name.clone())
        .chain(f.reference.as_ref().map(|r| r.0.clone()))
        .collect();
    let (_, legend_h) = legend_layout(&labels, BAR_W);
    (BAR_W, HEADER_H + PANEL_H + legend_h)
}

fn draw_bars<DB: DrawingBackend>(
    f: &BarFigure,
    root: &DrawingArea<DB, Shift>,
) -> Result<(), String> {
    let styles = styles(f.series.iter().map(|s| s.name.as_str()));
    let reference = f.reference.as_ref().map(|r| r.0.as_str());
    root.fill(&WHITE).map_err(err)?;
    let body = header(root, &f.title, &f.subtitle)?;
    let (plot, legend) = body.split_vertically(PANEL_H);
    let n = f.groups.len();
    let x = Axis {
        lo: -0.5,
        hi: n as f64 - 0.5,
        log: false,
        ticks: (0..n).map(|i| i as f64).collect(),
    };
    let mut ys: Vec<f64> = f
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|q| q.1))
        .collect();
    ys.extend(f.reference.as_ref().map(|r| r.1));
    let y = Axis::new(&ys, &Scale::Linear, true);
    let mut chart = ChartBuilder::on(&plot)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)
        .map_err(err)?;
    let group_label = |v: &f64| {
        f.groups
            .get(v.round() as usize)
            .cloned()
            .unwrap_or_default()
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(f.y_label.as_str())
        .x_label_formatter(&group_label)
        .y_label_formatter(&|v| fmt_num(*v))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 15))
        .bold_line_style(BLACK.mix(0.12))
        .draw()
        .map_err(err)?;
    // Bars of a group side by side, centered on the group, as wide as the fullest group allows.
    let per_group = |g: usize| {
        f.series
            .iter()
            .filter(move |s| s.points.iter().any(|q| q.0 as usize == g))
    };
    let widest = (0..n)
        .map(|g| per_group(g).count())
        .max()
        .unwrap_or(1)
        .max(1);
    let bar = 0.8 / widest as f64;
    let value = TextStyle::from((FONT, 13).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
    for g in 0..n {
        let here: Vec<&Series> = per_group(g).collect();
        let left = g as f64 - bar * here.len() as f64 / 2.0;
        for (i, s) in here.iter().enumerate() {
            let Some(&(_, v)) = s.points.iter().find(|q| q.0 as usize == g) else {
                continue;
            };
            let x0 = left + bar * i as f64;
            let color = style_of(&styles, &s.name).color;
            chart
                .draw_series([Rectangle::new(
                    [(x0 + 0.01, 0.0), (x0 + bar - 0.01, v)],
                    color.filled(),
                )])
                .map_err(err)?;
            chart
                .draw_series([Text::new(
                    format!("{v:.0}"),
                    (x0 + bar / 2.0, v),
                    value.clone(),
                )])
                .map_err(err)?;
        }
    }
    if let Some((_, r)) = &f.reference {
        chart
            .draw_series(DashedLineSeries::new(
                [(-0.5, *r), (n as f64 - 0.5, *r)],
                10,
                6,
                BLACK.stroke_width(2),
            ))
            .map_err(err)?;
    }
    draw_legend(&legend, &styles, reference, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn row(kernel: &str, imp: &str, config: Value, ms: f64, extra: Value) -> Row {
        let mut r: Row = serde_json::from_value(json!({
            "kernel": kernel, "impl": imp, "config": config, "median_ms": ms,
        }))
        .unwrap();
        if let Value::Object(m) = extra {
            for (k, v) in m {
                match k.as_str() {
                    "tflops" => r.tflops = v.as_f64(),
                    "gbps" => r.gbps = v.as_f64(),
                    _ => {
                        r.extra.insert(k, v);
                    }
                }
            }
        }
        r
    }

    fn file(family: &str, rows: Vec<Row>) -> ResultsFile {
        ResultsFile {
            device: "Test GPU".into(),
            driver: "1.0".into(),
            commit: "0123456789abcdef".into(),
            date: "2026-01-01T00:00:00Z".into(),
            family: family.into(),
            ptx_target: "sm_90a".into(),
            notes: Vec::new(),
            rows,
        }
    }

    /// A tiny results set: attention at D = 64 (ours, a variant and a peer, both causal modes,
    /// plus a one-point sweep), GLA, semi-CRF and mHC with a copy reference.
    fn synthetic() -> Vec<ResultsFile> {
        let mut att = Vec::new();
        for (seq, batch) in [(512, 8), (1024, 4), (2048, 2)] {
            for causal in [false, true] {
                let c = json!({"batch": batch, "causal": causal, "d": 64, "dtype": "bf16", "heads": 4, "seq": seq});
                att.push(row(
                    "attention_fwd",
                    "ours",
                    c.clone(),
                    1.0,
                    json!({"tflops": seq as f64 / 10.0}),
                ));
                att.push(row(
                    "attention_fwd",
                    "ours-mma",
                    c.clone(),
                    1.1,
                    json!({"tflops": seq as f64 / 11.0}),
                ));
                att.push(row(
                    "attention_fwd",
                    "peer-flash",
                    c,
                    1.2,
                    json!({"tflops": seq as f64 / 12.0}),
                ));
            }
        }
        let lone =
            json!({"batch": 1, "causal": true, "d": 64, "dtype": "bf16", "heads": 2, "seq": 4096});
        att.push(row(
            "attention_fwd",
            "ours",
            lone,
            1.0,
            json!({"tflops": 300.0}),
        ));
        let mut gla = Vec::new();
        for t in [1024, 2048, 4096] {
            let c = json!({"B": 2, "H": 4, "T": t, "dk": 64, "dv": 64, "dtype": "bf16"});
            gla.push(row(
                "gla_fwd",
                "ours",
                c.clone(),
                0.1,
                json!({"tokens_per_s": 1e7 * t as f64}),
            ));
            gla.push(row("gla_fwd", "fla-peer", c.clone(), 0.5, json!({})));
            gla.push(row(
                "gla_fwd",
                "torch-ref",
                c,
                50.0,
                json!({"tokens_per_s": 3e5}),
            ));
        }
        let mut crf = Vec::new();
        for (t, b) in [(1000, 16), (10000, 4)] {
            let c = json!({"B": b, "C": 4, "K": 8, "T": t, "checkpoint": 10, "lengths": "T"});
            for k in ["semicrf_forward", "semicrf_forward_backward"] {
                crf.push(row(
                    k,
                    "ours",
                    c.clone(),
                    0.001 * t as f64,
                    json!({"peak_bytes": 1e6}),
                ));
                crf.push(row(
                    k,
                    "crf-peer",
                    c.clone(),
                    0.01 * t as f64,
                    json!({"peak_bytes": 4e7}),
                ));
            }
        }
        let c = json!({"B": 1, "S": 64});
        let mhc = vec![
            row(
                "memcpy_dtod",
                "ours",
                json!({"bytes": 1e9}),
                0.3,
                json!({"gbps": 4000.0}),
            ),
            row("mhc_fwd", "ours", c.clone(), 1.0, json!({"gbps": 2400.0})),
            row(
                "mhc_fwd",
                "eager-peer",
                c.clone(),
                9.0,
                json!({"gbps": 250.0}),
            ),
            row("mhc_bwd", "ours", c.clone(), 1.0, json!({"gbps": 1400.0})),
            row("mhc_bwd", "compiled-peer", c, 3.0, json!({"gbps": 500.0})),
        ];
        vec![
            file("attention", att),
            file("gla", gla),
            file("semicrf", crf),
            file("mhc", mhc),
        ]
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("kbench-plots-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// The contents of the SVG's text elements.
    fn texts(svg: &str) -> Vec<&str> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| Some(t.split_once('>')?.1.split_once("</text>")?.0.trim()))
            .collect()
    }

    fn read(dir: &Path, file: &str) -> String {
        std::fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
    }

    fn bytes(dir: &Path, file: &str) -> Vec<u8> {
        std::fs::read(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
    }

    /// The value of attribute `name` of the `<svg>` element.
    fn svg_attr(svg: &str, name: &str) -> u32 {
        let head = &svg[..svg.find('>').unwrap()];
        let at = head.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        head[at..at + head[at..].find('"').unwrap()]
            .parse()
            .unwrap()
    }

    /// The PNG of every plot is the SVG's drawing in pixels: same size, white background, and
    /// text rasterized with the embedded font (the title band holds dark, anti-aliased pixels
    /// where the title is, and none where it is not).
    #[test]
    fn png_next_to_every_svg() {
        let dir = temp_dir("png");
        let out = render_all(&synthetic(), &dir).unwrap();
        assert_eq!(out.plots.len(), 5);
        for p in &out.plots {
            assert_eq!(p.png, p.file.replace(".svg", ".png"));
            let svg = read(&dir, &p.file);
            let img =
                image::load_from_memory_with_format(&bytes(&dir, &p.png), image::ImageFormat::Png)
                    .unwrap_or_else(|e| panic!("{}: {e}", p.png))
                    .to_rgb8();
            let (w, h) = img.dimensions();
            assert_eq!(
                (w, h),
                (svg_attr(&svg, "width"), svg_attr(&svg, "height")),
                "{}",
                p.png
            );
            assert_eq!(img.get_pixel(0, 0).0, [255, 255, 255], "{}", p.png);
            // The title (24 px, centered at y = 22): dark pixels around the center line, a
            // range of grays at the glyph edges, and blank margins at both ends of the band.
            let band: Vec<u8> = (10..34)
                .flat_map(|y| (0..w).map(move |x| (x, y)))
                .map(|(x, y)| img.get_pixel(x, y).0[1])
                .collect();
            let dark = band.iter().filter(|v| **v < 96).count();
            let gray = band.iter().filter(|v| **v >= 96 && **v < 224).count();
            assert!(
                dark > 200 && gray > 50,
                "{}: title band {dark} dark, {gray} gray",
                p.png
            );
            for y in 10..34 {
                for x in (0..8).chain(w - 8..w) {
                    assert_eq!(
                        img.get_pixel(x, y).0,
                        [255, 255, 255],
                        "{} ({x}, {y})",
                        p.png
                    );
                }
            }
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn renders_every_family_with_its_series() {
        let dir = temp_dir("all");
        let out = render_all(&synthetic(), &dir).unwrap();
        let files: Vec<&str> = out.plots.iter().map(|p| p.file.as_str()).collect();
        assert_eq!(
            files,
            [
                "attention_d64.svg",
                "gla.svg",
                "semicrf_time.svg",
                "semicrf_memory.svg",
                "mhc.svg"
            ]
        );
        // (file, legend entries, words in titles and labels)
        let expect: [(&str, &[&str], &[&str]); 5] = [
            (
                "attention_d64.svg",
                &["ours", "ours-mma", "peer-flash"],
                &[
                    "non-causal (",
                    "causal (",
                    "batch·seq=4096",
                    "sequence length",
                ],
            ),
            (
                "gla.svg",
                &["ours", "fla-peer", "torch-ref"],
                &["H=4 dk=64 dtype=bf16 dv=64, B=2", "tokens/s"],
            ),
            (
                "semicrf_time.svg",
                &["ours", "crf-peer"],
                &[
                    "semicrf_forward_backward, C=4 K=8 lengths=T, B=16/4",
                    "median time",
                ],
            ),
            (
                "semicrf_memory.svg",
                &["ours", "crf-peer"],
                &["peak device memory"],
            ),
            (
                "mhc.svg",
                &[
                    "ours",
                    "eager-peer",
                    "compiled-peer",
                    "device copy, measured (4000 GB/s)",
                ],
                &["mhc_fwd", "mhc_bwd", "2400", "250"],
            ),
        ];
        for (file, legend, words) in expect {
            let svg = read(&dir, file);
            assert!(svg.starts_with("<svg"), "{file} is not an SVG");
            let texts = texts(&svg);
            for name in legend {
                assert!(
                    texts.contains(name),
                    "{file}: no legend entry {name:?} in {texts:?}"
                );
            }
            for w in words {
                assert!(
                    texts.iter().any(|t| t.contains(w)),
                    "{file}: no text with {w:?} in {texts:?}"
                );
            }
        }
        // Data drawn, not only the legend: in each of two panels, a line for each of the two
        // series of ours through three markers.
        let circles = read(&dir, "attention_d64.svg").matches("<circle").count();
        assert!(circles >= 2 * 2 * 3, "{circles} round markers");
        // The one-point sweep (heads = 2) is reported, not drawn.
        assert!(
            out.messages
                .iter()
                .any(|m| m.contains("heads=2") && m.contains("one seq value")),
            "{:?}",
            out.messages
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The GLA benchmark's own configurations (`gla::CONFIGS`) plot as two panels, one per head
    /// dimension: D = 64 at B = 4 and D = 128 with B T constant; every configuration's point
    /// drawn, none reported as left out.
    #[test]
    fn gla_configurations_plot_one_panel_per_head_dimension() {
        let dir = temp_dir("gla-configs");
        let mut rows = Vec::new();
        for (b, t, h, d) in crate::gla::CONFIGS {
            let c = json!({"B": b, "H": h, "T": t, "dk": d, "dv": d, "dtype": "bf16"});
            rows.push(row(
                "gla_fwd",
                "ours",
                c,
                1.0,
                json!({"tokens_per_s": (b * t) as f64 * 1e3}),
            ));
        }
        let out = render_all(&[file("gla", rows)], &dir).unwrap();
        assert_eq!(out.plots.len(), 1);
        let svg = read(&dir, "gla.svg");
        let texts = texts(&svg);
        for w in [
            "H=32 dk=64 dtype=bf16 dv=64, B=4",
            "H=16 dk=128 dtype=bf16 dv=128, B·T=16384",
        ] {
            assert!(
                texts.iter().any(|t| t.contains(w)),
                "no panel titled {w:?} in {texts:?}"
            );
        }
        assert!(
            out.messages.iter().all(|m| !m.contains("not plotted")),
            "{:?}",
            out.messages
        );
        let circles = svg.matches("<circle").count();
        assert!(
            circles >= crate::gla::CONFIGS.len(),
            "{circles} markers for {} configurations",
            crate::gla::CONFIGS.len()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn deterministic_and_skips_missing_families() {
        let (a, b) = (temp_dir("det-a"), temp_dir("det-b"));
        let mut files = synthetic();
        files.retain(|f| f.family != "gla");
        let first = render_all(&files, &a).unwrap();
        render_all(&files, &b).unwrap();
        for p in &first.plots {
            assert_eq!(
                read(&a, &p.file),
                read(&b, &p.file),
                "{} differs between runs",
                p.file
            );
            assert!(
                bytes(&a, &p.png) == bytes(&b, &p.png),
                "{} differs between runs",
                p.png
            );
        }
        assert!(
            first
                .messages
                .iter()
                .any(|m| m.starts_with("gla: no results file"))
        );
        // A stale plot (its results gone) is removed.
        std::fs::write(a.join("gla.svg"), "<svg/>").unwrap();
        std::fs::write(a.join("gla.png"), "").unwrap();
        let again = render_all(&files, &a).unwrap();
        assert!(!a.join("gla.svg").exists() && !a.join("gla.png").exists());
        assert!(
            again
                .messages
                .iter()
                .any(|m| m.contains("stale") && m.contains("gla.svg"))
        );
        std::fs::remove_dir_all(&a).unwrap();
        std::fs::remove_dir_all(&b).unwrap();
    }

    #[test]
    fn ticks() {
        let x = Axis::new(&[512.0, 16384.0], &Scale::Log, false);
        assert_eq!(x.ticks, [512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0]);
        let y = Axis::new(&[3e5, 6e7], &Scale::Log, true);
        assert_eq!(
            y.ticks,
            [5e5, 1e6, 2e6, 5e6, 1e7, 2e7, 5e7],
            "1-2-5 with two decades inside"
        );
        let y = Axis::new(&[3.0, 6.0], &Scale::Log, true);
        assert_eq!(
            y.ticks,
            [3.0, 4.0, 5.0, 6.0],
            "multiples where few decades fall inside"
        );
        let y = Axis::new(&[160.0, 440.0], &Scale::Linear, true);
        assert_eq!(y.ticks, [0.0, 100.0, 200.0, 300.0, 400.0]);
        assert_eq!(fmt_num(16384.0), "16384");
        assert_eq!(fmt_num(250000.0), "250k");
        assert_eq!(fmt_num(5.6e7), "56M");
        assert_eq!(fmt_num(0.25), "0.25");
    }
}
