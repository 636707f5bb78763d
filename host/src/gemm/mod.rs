//! bf16 GEMM on Hopper (`gemm_bf16_tn`): `C [M, N] = A [M, K] B [N, K]^T`, f32 accumulation,
//! bf16 output.
//!
//! The family's three steps: a [`GemmProblem`] (validated sizes) is planned for the tensors'
//! addresses into a [`GemmPlan`] (pure: grid, parameters, tensor-map descriptions; no GPU
//! needed), which runs on a stream ([`GemmPlan::run`]). [`gemm_bf16`] does the three on `cust`
//! buffers. The f64 reference is in [`reference`].

pub mod reference;

pub use reference::{reference, tolerance};

use crate::error::{Error, Result};
use crate::exec::{DevView, Exec, OnStream};
use crate::gpu::Gpu;
use crate::launch::Launch;
use crate::ptx::Arch;
use crate::tensor_map::{MapDtype, MapSpec, MapSwizzle, TiledMap};
use cust::memory::DeviceBuffer;
use cust::stream::Stream;
use half::bf16;
use kernel_abi::TensorMap;
use kernel_abi::gemm::{self as abi, BK, BM, BN, DIM_MULTIPLE, GEMM_BF16_TN, GemmParams};

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

/// The tensors of a GEMM launch.
#[derive(Clone, Copy)]
pub struct GemmTensors<'a> {
    /// A `[m, k]`.
    pub a: DevView<'a, bf16>,
    /// B `[n, k]`.
    pub b: DevView<'a, bf16>,
    /// C `[m, n]` (written).
    pub c: DevView<'a, bf16>,
}

/// A planned GEMM: the launch of `gemm_bf16_tn` with its tensor maps still to be encoded by
/// the driver.
#[derive(Clone, Copy, Debug)]
pub struct GemmPlan {
    /// Blocks of the grid (one-dimensional).
    pub grid: (u32, u32, u32),
    /// A and B as the kernel's tensor maps describe them.
    pub maps: [MapSpec; 2],
    /// The parameters, with the tensor maps zero until [`GemmPlan::launch`] encodes them.
    pub params: GemmParams,
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

    /// Plan the launch on `tensors` for PTX target `arch`: validates the sizes, the tensors'
    /// lengths and the tensor maps (without the driver).
    pub fn plan(&self, arch: Arch, tensors: &GemmTensors<'_>) -> Result<GemmPlan> {
        self.validate()?;
        if !arch.has_hopper_kernels() {
            return Err(Error::unsupported(
                "GEMM",
                format!("needs the sm_90a kernels (TMA, wgmma); this GPU runs {arch}"),
            ));
        }
        let GemmProblem { m, n, k } = *self;
        check_len("A", m * k, tensors.a.len())?;
        check_len("B", n * k, tensors.b.len())?;
        check_len("C", m * n, tensors.c.len())?;
        let map = |view: &DevView<'_, bf16>, rows: usize, box_rows: u32| {
            TiledMap {
                address: view.addr(),
                dtype: MapDtype::Bf16,
                dims: &[k as u64, rows as u64],
                strides_bytes: &[k as u64 * 2],
                box_dims: &[BK, box_rows],
                swizzle: MapSwizzle::B128,
            }
            .spec()
        };
        Ok(GemmPlan {
            grid: (abi::grid_blocks(m as u32, n as u32), 1, 1),
            maps: [map(&tensors.a, m, BM)?, map(&tensors.b, n, BN)?],
            params: GemmParams {
                tmap_a: TensorMap::ZEROED,
                tmap_b: TensorMap::ZEROED,
                c: tensors.c.addr() as *mut u16,
                m: m as u32,
                n: n as u32,
                k: k as u32,
                ldc: n as u32,
            },
        })
    }
}

impl GemmPlan {
    /// The launch, with the tensor maps encoded (needs the driver).
    pub fn launch(&self) -> Result<Launch<GemmParams>> {
        let params = GemmParams {
            tmap_a: self.maps[0].encode()?,
            tmap_b: self.maps[1].encode()?,
            ..self.params
        };
        Ok(Launch::new(&GEMM_BF16_TN, self.grid, (), params))
    }

    /// Run the plan (asynchronous on a stream: synchronize before reading C).
    ///
    /// # Safety
    /// The tensors the plan was made for are live device memory of `exec` for the whole run.
    pub unsafe fn run(&self, exec: &impl Exec) -> Result<()> {
        let launch = self.launch()?;
        // SAFETY: the maps describe A [m, k] and B [n, k] (lengths checked by the plan), C holds
        // m x n with ldc = n; sizes validated (n, k multiples of 8, all below 2^31); the memory
        // is live (the caller's contract).
        unsafe { exec.launch(&launch) }
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

/// Plan and run `gemm_bf16_tn` on `stream` (asynchronous: synchronize before reading `c`).
pub fn gemm_bf16(
    gpu: &Gpu,
    stream: &Stream,
    problem: &GemmProblem,
    a: &DeviceBuffer<bf16>,
    b: &DeviceBuffer<bf16>,
    c: &mut DeviceBuffer<bf16>,
) -> Result<()> {
    let tensors = GemmTensors {
        a: a.into(),
        b: b.into(),
        c: (&*c).into(),
    };
    let plan = problem.plan(gpu.arch(), &tensors)?;
    // SAFETY: the buffers are borrowed for the whole call, which enqueues the launch; `c` is
    // borrowed mutably, so the output aliases no input.
    unsafe { plan.run(&OnStream { gpu, stream }) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{LaunchConfig, check_kernel_launch};

    fn view<'a>(addr: u64, len: usize) -> DevView<'a, bf16> {
        // SAFETY: only planned, never dereferenced.
        unsafe { DevView::from_raw(addr, len) }
    }

    fn tensors<'a>(p: &GemmProblem) -> GemmTensors<'a> {
        GemmTensors {
            a: view(1 << 30, p.m * p.k),
            b: view(2 << 30, p.n * p.k),
            c: view(3 << 30, p.m * p.n),
        }
    }

    #[test]
    fn plan_covers_the_output_in_grouped_tiles() {
        let p = GemmProblem {
            m: 1000,
            n: 520,
            k: 72,
        };
        let plan = p.plan(Arch::Sm90a, &tensors(&p)).unwrap();
        assert_eq!(plan.grid, (8 * 3, 1, 1));
        assert_eq!(
            (plan.params.m, plan.params.n, plan.params.k, plan.params.ldc),
            (1000, 520, 72, 520)
        );
        assert_eq!(plan.params.c as u64, 3 << 30);
        assert_eq!(plan.maps[0].dims[..2], [72, 1000]);
        assert_eq!(plan.maps[1].box_dims[..2], [BK, BN]);
        let cfg = LaunchConfig::new(plan.grid, GEMM_BF16_TN.threads, GEMM_BF16_TN.smem_bytes(()));
        check_kernel_launch(Arch::Sm90a, &GEMM_BF16_TN.info(), &cfg, 227 * 1024).unwrap();
        let mut tiles: Vec<(u32, u32)> = (0..plan.grid.0)
            .map(|b| abi::tile_of_block(b, 1000, 520))
            .collect();
        tiles.sort();
        tiles.dedup();
        assert_eq!(
            tiles.len(),
            plan.grid.0 as usize,
            "every block its own tile"
        );
    }

    #[test]
    fn plan_refuses_what_the_kernel_cannot_do() {
        let p = GemmProblem {
            m: 64,
            n: 12,
            k: 64,
        };
        assert!(matches!(
            p.plan(Arch::Sm90a, &tensors(&p)),
            Err(Error::Unsupported { .. })
        ));
        let p = GemmProblem {
            m: 64,
            n: 64,
            k: 64,
        };
        assert!(matches!(
            p.plan(Arch::Sm80, &tensors(&p)),
            Err(Error::Unsupported { .. })
        ));
        let mut t = tensors(&p);
        t.c = view(3 << 30, 64 * 63);
        assert!(matches!(
            p.plan(Arch::Sm90a, &t),
            Err(Error::ShapeMismatch { .. })
        ));
        t = tensors(&p);
        t.a = view((1 << 30) + 8, 64 * 64);
        assert!(matches!(
            p.plan(Arch::Sm90a, &t),
            Err(Error::Misaligned { .. })
        ));
    }
}
