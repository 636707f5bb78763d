//! bf16 GEMM on Hopper (`gemm_bf16_tn`): `C [M, N] = A [M, K] B [N, K]^T`, f32 accumulation,
//! bf16 output; and the f64 reference.

use crate::error::{Error, Result};
use crate::gpu::{Gpu, LaunchConfig};
use crate::tensor_map::{MapDtype, MapSwizzle, TiledMap};
use cust::memory::DeviceBuffer;
use cust::stream::Stream;
use half::bf16;
use kernel_abi::gemm::{self as abi, BK, BM, BN, DIM_MULTIPLE, GemmParams, THREADS};

/// A GEMM problem: `C [m, n] = A [m, k] B [n, k]^T`, all row-major and contiguous.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmProblem {
    /// Rows of A and C.
    pub m: usize,
    /// Rows of B, columns of C (a multiple of 8).
    pub n: usize,
    /// Columns of A and B (a multiple of 8).
    pub k: usize,
}

impl GemmProblem {
    /// Check the sizes the kernel supports.
    pub fn validate(&self) -> Result<()> {
        for (what, v) in [("m", self.m), ("n", self.n), ("k", self.k)] {
            if v == 0 {
                return Err(Error::invalid(format!("GEMM {what}"), "must be at least 1"));
            }
            if v > i32::MAX as usize {
                return Err(Error::invalid(format!("GEMM {what}"), "must be below 2^31"));
            }
        }
        for (what, v) in [("n", self.n), ("k", self.k)] {
            if v % DIM_MULTIPLE as usize != 0 {
                return Err(Error::unsupported(
                    format!("GEMM {what} = {v}"),
                    format!("must be a multiple of {DIM_MULTIPLE} (16-byte TMA strides)"),
                ));
            }
        }
        Ok(())
    }

    /// Floating-point operations (`2 m n k`).
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
}

fn check_len(what: &str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::shape(
            what,
            format!("{expected} elements"),
            format!("{got}"),
        ))
    }
}

/// Launch `gemm_bf16_tn` on `stream` (asynchronous: synchronize before reading `c`).
pub fn gemm_bf16(
    gpu: &Gpu,
    stream: &Stream,
    problem: &GemmProblem,
    a: &DeviceBuffer<bf16>,
    b: &DeviceBuffer<bf16>,
    c: &mut DeviceBuffer<bf16>,
) -> Result<()> {
    problem.validate()?;
    if !gpu.arch().has_hopper_kernels() {
        return Err(Error::unsupported(
            "GEMM",
            format!(
                "needs the sm_90a kernels (TMA, wgmma); this GPU runs {}",
                gpu.arch()
            ),
        ));
    }
    let GemmProblem { m, n, k } = *problem;
    check_len("A", m * k, a.len())?;
    check_len("B", n * k, b.len())?;
    check_len("C", m * n, c.len())?;
    let map = |buf: &DeviceBuffer<bf16>, rows: usize, box_rows: u32| {
        TiledMap {
            address: buf.as_device_ptr().as_raw(),
            dtype: MapDtype::Bf16,
            dims: &[k as u64, rows as u64],
            strides_bytes: &[k as u64 * 2],
            box_dims: &[BK, box_rows],
            swizzle: MapSwizzle::B128,
        }
        .encode()
    };
    let params = GemmParams {
        tmap_a: map(a, m, BM)?,
        tmap_b: map(b, n, BN)?,
        c: c.as_device_ptr().as_raw() as *mut u16,
        m: m as u32,
        n: n as u32,
        k: k as u32,
        ldc: n as u32,
    };
    let blocks = abi::grid_blocks(m as u32, n as u32);
    let cfg = LaunchConfig::new((blocks, 1, 1), THREADS, abi::smem_bytes());
    // SAFETY: the maps describe A [m, k] and B [n, k] (lengths checked), C holds m x n with
    // ldc = n; sizes validated (n, k multiples of 8, all below 2^31).
    unsafe { gpu.launch(stream, "gemm_bf16_tn", &cfg, &params) }
}

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
