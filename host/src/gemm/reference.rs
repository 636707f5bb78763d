//! The f64 reference of the GEMM, and the error bound the tests use.

use half::bf16;

/// `c[i][j] = sum_k a[i][k] b[j][k]` in f64 (`a [m, k]`, `b [n, k]`, row-major), together with
/// `sum_k |a[i][k] b[j][k]|` for error bounds.
pub fn reference(a: &[bf16], b: &[bf16], m: usize, n: usize, k: usize) -> (Vec<f64>, Vec<f64>) {
    let a: Vec<f64> = a.iter().map(|x| x.to_f64()).collect();
    let b: Vec<f64> = b.iter().map(|x| x.to_f64()).collect();
    let mut c = vec![0.0; m * n];
    let mut abs = vec![0.0; m * n];
    for i in 0..m {
        let ar = &a[i * k..(i + 1) * k];
        for j in 0..n {
            let br = &b[j * k..(j + 1) * k];
            let (mut s, mut sa) = (0.0, 0.0);
            for (x, y) in ar.iter().zip(br) {
                s += x * y;
                sa += (x * y).abs();
            }
            c[i * n + j] = s;
            abs[i * n + j] = sa;
        }
    }
    (c, abs)
}

/// Error bound for one element of a bf16 GEMM output with f32 accumulation: rounding to bf16
/// (half an ulp, 2^-9 relative, bounded by 2^-8 |c|) plus `k` f32 additions (`k u sum|a b|`).
pub fn tolerance(reference: f64, abs_sum: f64, k: usize) -> f64 {
    reference.abs() / 256.0 + k as f64 * f64::from(f32::EPSILON) / 2.0 * abs_sum + 1e-30
}
