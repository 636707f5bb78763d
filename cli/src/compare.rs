//! Errors of the kernel's outputs against the f64 reference's (`--check`).

use crate::tensors::Outputs;

/// How far one output of the kernel is from the reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Diff {
    /// Output name.
    pub name: String,
    /// Values compared.
    pub values: usize,
    /// Largest `|kernel - reference|` (infinite if a value is non-finite where the reference's
    /// is not, or differs from it).
    pub max_abs: f64,
    /// `||kernel - reference|| / ||reference||` over the finite pairs (the absolute norm when
    /// the reference is all zeros).
    pub rel_l2: f64,
    /// Values where one side is NaN or infinite and the other is not the same value.
    pub nonfinite: usize,
}

/// Compare `got` with `want` element by element. Equal infinities (an attention row with no
/// allowed key has LSE = -inf on both sides) count as exact.
pub fn diff(name: &str, got: &[f64], want: &[f64]) -> Diff {
    let (mut num, mut den, mut max_abs) = (0.0f64, 0.0f64, 0.0f64);
    let mut nonfinite = 0;
    for (&g, &w) in got.iter().zip(want) {
        if g == w {
            den += if w.is_finite() { w * w } else { 0.0 };
            continue;
        }
        if !g.is_finite() || !w.is_finite() {
            nonfinite += 1;
            max_abs = f64::INFINITY;
            continue;
        }
        let e = g - w;
        num += e * e;
        den += w * w;
        max_abs = max_abs.max(e.abs());
    }
    if got.len() != want.len() {
        nonfinite += got.len().abs_diff(want.len());
        max_abs = f64::INFINITY;
    }
    let rel_l2 = if den > 0.0 {
        (num / den).sqrt()
    } else {
        num.sqrt()
    };
    Diff {
        name: name.to_string(),
        values: got.len().min(want.len()),
        max_abs,
        rel_l2,
        nonfinite,
    }
}

/// Every output of `kernel` against the output of the same name in `reference`, in the
/// kernel's order (outputs the reference lacks are skipped).
pub fn compare(kernel: &Outputs, reference: &Outputs) -> Vec<Diff> {
    kernel
        .0
        .iter()
        .filter_map(|k| {
            let r = reference.get(&k.name)?;
            Some(diff(&k.name, &k.data.to_f64(), &r.data.to_f64()))
        })
        .collect()
}

/// The table `--check` prints.
pub fn table(diffs: &[Diff]) -> Vec<String> {
    let mut lines = vec![format!(
        "{:<16} {:>12} {:>12} {:>12} {:>10}",
        "output", "values", "max abs", "rel L2", "nonfinite"
    )];
    for d in diffs {
        lines.push(format!(
            "{:<16} {:>12} {:>12.3e} {:>12.3e} {:>10}",
            d.name, d.values, d.max_abs, d.rel_l2, d.nonfinite
        ));
    }
    lines
}
