//! The plan of a forward pass: which kernel, its grid and its parameters (tensor maps as
//! [`MapSpec`]s), decided without a GPU.
//!
//! The path: the Hopper kernels (TMA, wgmma) when the target has them and the problem's tensors
//! fit a TMA tensor map ([`Path::Auto`]), else the `mma.sync` kernels; [`Path`] can force either.
//! On the Hopper path the kernel follows the problem: the dynamic grid for short causal problems
//! given a tile counter ([`DYNAMIC_GRID_KEY_ELEMS`]), longer key steps on long keys
//! ([`LONG_KEY_STEPS_KEYS`]), else the default configuration of the head dimension. A tuning
//! variant (by name, for benchmarks) picks its path by the table it comes from
//! ([`kernel_abi::attention::HOPPER_VARIANTS`] or [`kernel_abi::attention::TUNING_VARIANTS`]).

use super::problem::{AttentionElem, AttentionProblem, Dtype, Path, View};
use crate::error::{Error, Result};
use crate::exec::DevView;
use crate::gpu::{Gpu, LaunchConfig};
use crate::launch::Launch;
use crate::ptx::Arch;
use crate::tensor_map::{MapDtype, MapSpec, MapSwizzle, TiledMap};
use kernel_abi::attention::{
    AttentionParams, HOPPER_ATOM, HOPPER_BLOCK_M, HOPPER_LONG_KEYS_VARIANT, HopperConfig,
    HopperGrid, HopperKernel, HopperParams, LogitOptions, MmaKernel, TileConfig, UNBOUNDED,
    hopper_capsink_kernel, hopper_dynamic_kernel, hopper_kernel, hopper_value_dim_kernel,
    hopper_variant, mma_capsink_kernel, mma_kernel, mma_value_dim_kernel,
};
use kernel_abi::{KernelDecl, TensorMap};

/// What a plan needs to know of the GPU it runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Target {
    /// The PTX target.
    pub arch: Arch,
    /// Streaming multiprocessors (the persistent grids of the Hopper path have one block each).
    pub multiprocessors: u32,
}

impl Target {
    /// The target of `gpu`.
    pub fn of(gpu: &Gpu) -> Target {
        Target {
            arch: gpu.arch(),
            multiprocessors: gpu.info().multiprocessors,
        }
    }
}

/// The tensors of a forward pass: Q, K, V, O as 4-dimensional views, LSE
/// `[batch, heads_q, seq_q]` f32, contiguous.
pub struct AttentionTensors<'a, T> {
    /// Q `[batch, seq_q, heads_q, D]`.
    pub q: View<'a, T>,
    /// K `[batch, seq_k, heads_kv, D]`.
    pub k: View<'a, T>,
    /// V `[batch, seq_k, heads_kv, D_v]` (`D_v` = D but for a problem with
    /// [`AttentionProblem::value_dim`]).
    pub v: View<'a, T>,
    /// O `[batch, seq_q, heads_q, D_v]` (written; must not overlap the inputs).
    pub o: View<'a, T>,
    /// LSE (written).
    pub lse: DevView<'a, f32>,
    /// The sink logits `[heads_q]` f32, when the problem has sinks
    /// ([`AttentionProblem::sinks`]).
    pub sinks: Option<DevView<'a, f32>>,
    /// A tile counter: one u32, zero before the launch and left zero by it. With one, a causal
    /// problem of `seq_k * head_dim` below [`DYNAMIC_GRID_KEY_ELEMS`] takes the Hopper kernel
    /// whose persistent grid draws its tiles from the counter at run time (where one was built:
    /// D = 64 and 128), as does a tuning variant of that grid; elsewhere it goes unused.
    pub tile_counter: Option<DevView<'a, u32>>,
}

/// The causal problems whose `seq_k * head_dim` is below this many elements take the dynamic
/// grid when given a tile counter ([`AttentionTensors::tile_counter`]): there one block per
/// multiprocessor that draws the next tile while finishing the last measured faster than one
/// block per tile, and slower from this bound up (bench/NOTES.md).
pub const DYNAMIC_GRID_KEY_ELEMS: usize = 1 << 19;

/// Problems with at least this many keys take the Hopper kernel in longer key steps where one
/// was built ([`HOPPER_LONG_KEYS_VARIANT`]: D = 64, steps of 192 keys): faster there, slower on
/// fewer keys, where the last step's unused keys and the diagonal's weigh more
/// (bench/NOTES.md).
pub const LONG_KEY_STEPS_KEYS: usize = 8192;

impl<T> Clone for AttentionTensors<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for AttentionTensors<'_, T> {}

/// A planned forward pass: one launch, on one of the two paths. (One plan per call, made and
/// run by value: the Hopper variant's size, its tensor maps, is not worth a box.)
#[allow(clippy::large_enum_variant)]
pub enum AttentionPlan {
    /// The `mma.sync` path: the launch, complete.
    MmaSync {
        /// The kernel.
        kernel: &'static MmaKernel,
        /// Its launch: grid `(num_m_blocks, heads_q, batch)`.
        launch: Launch<AttentionParams>,
    },
    /// The Hopper path: the launch, with the tensor maps still to be encoded by the driver.
    Hopper {
        /// The kernel.
        kernel: &'static HopperKernel,
        /// Blocks (one-dimensional; each walks the tiles `b, b + grid, ...`).
        grid: (u32, u32, u32),
        /// Q, K, V as the kernel's tensor maps describe them.
        maps: [MapSpec; 3],
        /// The parameters, with the tensor maps zero until [`AttentionPlan::run`] encodes them.
        params: HopperParams,
    },
}

impl AttentionProblem {
    /// Plan the forward pass on `tensors` for `target`, with the default kernels or the tuning
    /// variant `variant` (by its name in [`kernel_abi::attention::TUNING_VARIANTS`] or
    /// [`kernel_abi::attention::HOPPER_VARIANTS`]; bf16 only). Validates the problem, the
    /// tensors against it and the tensor maps (without the driver).
    pub fn plan<T: AttentionElem>(
        &self,
        target: Target,
        tensors: &AttentionTensors<'_, T>,
        variant: Option<&str>,
    ) -> Result<AttentionPlan> {
        self.validate()?;
        if T::DTYPE != self.dtype {
            return Err(Error::invalid(
                "dtype",
                format!(
                    "the problem is {:?} but the tensors are {:?}",
                    self.dtype,
                    T::DTYPE
                ),
            ));
        }
        tensors.q.check("Q", self.q_shape())?;
        tensors.k.check("K", self.kv_shape())?;
        tensors.v.check("V", self.v_shape())?;
        tensors.o.check("O", self.o_shape())?;
        tensors.o.check_distinct("O")?;
        if tensors.lse.len() != self.lse_len() {
            return Err(Error::shape(
                "LSE",
                format!("{} elements", self.lse_len()),
                tensors.lse.len(),
            ));
        }
        check_sinks(self.sinks, self.heads_q, tensors.sinks.as_ref())?;
        check_tile_counter(tensors.tile_counter.as_ref())?;
        let arch = target.arch;
        let d = self.head_dim as u32;
        if self.has_value_dim() {
            return self.value_dim_plan(target, tensors, variant);
        }
        if self.has_logit_options() {
            if let Some(name) = variant {
                return Err(Error::unsupported(
                    format!("tuning variant {name} with a softcap or sinks"),
                    "the softcap and sinks run on the default kernels only",
                ));
            }
            return self.capsink_plan(target, tensors);
        }
        if let Some(name) = variant
            && hopper_variant(d, name).is_some()
        {
            // A tuning variant of the Hopper path (bf16 only).
            let kernel = hopper_kernel(self.dtype, d, Some(name))
                .filter(|_| arch.has_hopper_kernels())
                .ok_or_else(|| {
                    Error::unsupported(
                        format!("Hopper tuning variant {name}"),
                        format!(
                            "built for bf16 on sm_90a; this is {:?} on {arch}",
                            self.dtype
                        ),
                    )
                })?;
            return self.hopper_plan(kernel, target, tensors);
        }
        let hopper = match (self.path, variant) {
            (_, Some(_)) | (Path::MmaSync, None) => false,
            (Path::Hopper, None) => {
                if !arch.has_hopper_kernels() {
                    return Err(Error::unsupported(
                        "attention path Hopper",
                        format!("needs the sm_90a kernels; this GPU runs {arch}"),
                    ));
                }
                true
            }
            // Every head dimension it has kernels for: the Hopper path measured faster on an
            // H200 (bench/NOTES.md); the others run on the mma.sync path.
            (Path::Auto, None) => {
                arch.has_hopper_kernels() && hopper_kernel(self.dtype, d, None).is_some()
            }
        };
        if hopper {
            let dynamic = (tensors.tile_counter.is_some() && self.prefers_dynamic_grid())
                .then(|| hopper_dynamic_kernel(self.dtype, d))
                .flatten();
            let long = (self.seq_k >= LONG_KEY_STEPS_KEYS)
                .then(|| hopper_kernel(self.dtype, d, Some(HOPPER_LONG_KEYS_VARIANT)))
                .flatten();
            let kernel = dynamic
                .or(long)
                .or_else(|| hopper_kernel(self.dtype, d, None))
                .ok_or_else(|| {
                    Error::unsupported(
                        "attention path Hopper",
                        format!(
                            "no Hopper kernel for head dimension {d} (the mma.sync path has one)"
                        ),
                    )
                })?;
            match self.hopper_plan(kernel, target, tensors) {
                Ok(plan) => return Ok(plan),
                Err(e) if self.path == Path::Hopper => return Err(e),
                // Strides a tensor map cannot describe: the mma.sync path handles any.
                Err(_) => {}
            }
        }
        let kernel = match variant {
            None => mma_kernel(self.dtype, d, None).expect("validated head dimension"),
            Some(v) => mma_kernel(self.dtype, d, Some(v)).ok_or_else(|| {
                Error::unsupported(
                    format!("tuning variant {v}"),
                    "not built for this dtype and head dimension",
                )
            })?,
        };
        Ok(self.mma_plan(kernel, tensors))
    }

    /// The plan of a problem whose V and O have a head dimension of their own (a validated
    /// pair): the Hopper kernel of the pair on the path [`AttentionProblem::plan`] would take
    /// (with tensors a tensor map describes), else its `mma.sync` kernel.
    fn value_dim_plan<T>(
        &self,
        target: Target,
        tensors: &AttentionTensors<'_, T>,
        variant: Option<&str>,
    ) -> Result<AttentionPlan> {
        if let Some(name) = variant {
            return Err(Error::unsupported(
                format!("tuning variant {name} with a value head dimension of its own"),
                "the (D, D_v) pairs run on their default kernels only",
            ));
        }
        let (d, dv) = (self.head_dim as u32, self.v_dim() as u32);
        if self.path != Path::MmaSync {
            match self.value_dim_kernel(target.arch, false) {
                Ok(kernel) => match self.hopper_plan(kernel, target, tensors) {
                    Ok(plan) => return Ok(plan),
                    Err(e) if self.path == Path::Hopper => return Err(e),
                    Err(_) => {}
                },
                Err(e) if self.path == Path::Hopper => return Err(e),
                Err(_) => {}
            }
        }
        let kernel = mma_value_dim_kernel(self.dtype, d, dv).expect("validated pair");
        Ok(self.mma_plan(kernel, tensors))
    }

    /// The Hopper kernel of this problem's `(D, D_v)` pair (dense or `varlen`): an error off
    /// Hopper.
    pub(in crate::attention) fn value_dim_kernel(
        &self,
        arch: crate::ptx::Arch,
        varlen: bool,
    ) -> Result<&'static HopperKernel> {
        let (d, dv) = (self.head_dim as u32, self.v_dim() as u32);
        if !arch.has_hopper_kernels() {
            return Err(Error::unsupported(
                "attention path Hopper",
                format!("needs the sm_90a kernels; this GPU runs {arch}"),
            ));
        }
        hopper_value_dim_kernel(self.dtype, d, dv, varlen)
            .ok_or_else(|| Error::unsupported(format!("head dimensions ({d}, {dv})"), "no kernel"))
    }

    /// The plan of a problem with a softcap or sinks: the `capsink` kernels, on the path
    /// [`AttentionProblem::plan`] would take.
    fn capsink_plan<T>(
        &self,
        target: Target,
        tensors: &AttentionTensors<'_, T>,
    ) -> Result<AttentionPlan> {
        let (arch, d) = (target.arch, self.head_dim as u32);
        let hopper = match self.path {
            Path::MmaSync => false,
            Path::Hopper if !arch.has_hopper_kernels() => {
                return Err(Error::unsupported(
                    "attention path Hopper",
                    format!("needs the sm_90a kernels; this GPU runs {arch}"),
                ));
            }
            Path::Hopper => true,
            Path::Auto => arch.has_hopper_kernels(),
        };
        if hopper {
            let kernel = hopper_capsink_kernel(self.dtype, d).expect("validated head dimension");
            match self.hopper_plan(kernel, target, tensors) {
                Ok(plan) => return Ok(plan),
                Err(e) if self.path == Path::Hopper => return Err(e),
                Err(_) => {}
            }
        }
        let kernel = mma_capsink_kernel(self.dtype, d).expect("validated head dimension");
        Ok(self.mma_plan(kernel, tensors))
    }

    /// The softmax's `scale_log2` and the kernels' [`LogitOptions`] of this problem with the
    /// sink logits at `sinks`: under a softcap `c`, the kernels take `tanh(q.k scale / c)` and
    /// scale it by `c log2 e`.
    pub(crate) fn logit_params(&self, sinks: Option<&DevView<'_, f32>>) -> (f32, LogitOptions) {
        let scale = self.softmax_scale();
        let (scale_log2, softcap_scale) = match self.softcap {
            Some(c) => (c * std::f32::consts::LOG2_E, scale / c),
            None => (scale * std::f32::consts::LOG2_E, 0.0),
        };
        let sinks = sinks.map_or(std::ptr::null(), |s| s.addr() as *const f32);
        (
            scale_log2,
            LogitOptions {
                softcap_scale,
                sinks,
            },
        )
    }

    /// The `mma.sync` launch of `kernel` on the checked `tensors`.
    fn mma_plan<T>(
        &self,
        kernel: &'static MmaKernel,
        tensors: &AttentionTensors<'_, T>,
    ) -> AttentionPlan {
        let grid = mma_grid(self, &kernel.tiles);
        let (left, right) = self.effective_window();
        let (scale_log2, logits) = self.logit_params(tensors.sinks.as_ref());
        let params = AttentionParams {
            q: tensors.q.ptr() as *const u16,
            k: tensors.k.ptr() as *const u16,
            v: tensors.v.ptr() as *const u16,
            o: tensors.o.ptr() as *mut u16,
            lse: tensors.lse.addr() as *mut f32,
            q_strides: tensors.q.strides3(),
            k_strides: tensors.k.strides3(),
            v_strides: tensors.v.strides3(),
            o_strides: tensors.o.strides3(),
            batch: self.batch as u32,
            seq_q: self.seq_q as u32,
            seq_k: self.seq_k as u32,
            heads_q: self.heads_q as u32,
            heads_kv: self.heads_kv as u32,
            scale_log2,
            window_left: left.map_or(UNBOUNDED, |l| l as i32),
            window_right: right.map_or(UNBOUNDED, |r| r as i32),
            num_m_blocks: grid.0,
            reverse_m: u32::from(self.causal),
            logits,
        };
        AttentionPlan::MmaSync {
            kernel,
            launch: Launch::new(&kernel.kernel, grid, kernel.tiles, params),
        }
    }

    /// The Hopper launch of `kernel` on the checked `tensors`: an error if the problem has more
    /// tiles than one launch takes or a tensor map cannot describe a view.
    fn hopper_plan<T>(
        &self,
        kernel: &'static HopperKernel,
        target: Target,
        tensors: &AttentionTensors<'_, T>,
    ) -> Result<AttentionPlan> {
        let tiles = hopper_tiles(self);
        if tiles > u64::from(HOPPER_MAX_TILES) {
            return Err(Error::unsupported(
                "attention path Hopper",
                format!("{tiles} query tiles; one launch takes at most {HOPPER_MAX_TILES}"),
            ));
        }
        let maps = [
            tile_map(self.dtype, &tensors.q, HOPPER_BLOCK_M)?,
            tile_map(self.dtype, &tensors.k, kernel.cfg.block_n)?,
            tile_map(self.dtype, &tensors.v, kernel.cfg.block_n)?,
        ];
        let tile_counter = match tensors.tile_counter {
            Some(c) if kernel.cfg.grid.scheduled() => c.addr() as *mut u32,
            _ => std::ptr::null_mut(),
        };
        let params = HopperParams {
            num_tiles: u32::try_from(tiles).expect("checked above"),
            tile_counter,
            ..self.hopper_params(&tensors.o, &tensors.lse, tensors.sinks.as_ref())
        };
        Ok(AttentionPlan::Hopper {
            kernel,
            grid: hopper_grid(self, &kernel.cfg, target.multiprocessors),
            maps,
            params,
        })
    }
}

impl AttentionProblem {
    /// Whether the problem runs faster on the dynamic grid than one block per tile: causal, with
    /// `seq_k * head_dim` below [`DYNAMIC_GRID_KEY_ELEMS`].
    pub fn prefers_dynamic_grid(&self) -> bool {
        self.causal && self.seq_k.saturating_mul(self.head_dim) < DYNAMIC_GRID_KEY_ELEMS
    }

    /// The Hopper kernels' parameters of this problem with O in `o`, LSE in `lse` and the sinks
    /// `sinks`: the tensor maps zero (encoded when the plan runs), `num_tiles` 0 (the caller's),
    /// no packed sequences, no tile counter.
    pub(in crate::attention) fn hopper_params<T>(
        &self,
        o: &View<'_, T>,
        lse: &DevView<'_, f32>,
        sinks: Option<&DevView<'_, f32>>,
    ) -> HopperParams {
        let (left, right) = self.effective_window();
        let (scale_log2, logits) = self.logit_params(sinks);
        HopperParams {
            tmap_q: TensorMap::ZEROED,
            tmap_k: TensorMap::ZEROED,
            tmap_v: TensorMap::ZEROED,
            o: o.ptr() as *mut u16,
            lse: lse.addr() as *mut f32,
            o_strides: o.strides3(),
            seq_q: self.seq_q as u32,
            seq_k: self.seq_k as u32,
            heads_q: self.heads_q as u32,
            heads_kv: self.heads_kv as u32,
            scale_log2,
            window_left: left.map_or(UNBOUNDED, |l| l as i32),
            window_right: right.map_or(UNBOUNDED, |r| r as i32),
            num_m_blocks: (self.seq_q as u32).div_ceil(HOPPER_BLOCK_M),
            reverse_m: u32::from(self.causal),
            batch: self.batch as u32,
            num_tiles: 0,
            logits,
            cu_seqlens_q: std::ptr::null(),
            cu_seqlens_k: std::ptr::null(),
            total_q: 0,
            total_k: 0,
            o_scale: 1.0,
            tile_counter: std::ptr::null_mut(),
        }
    }
}

/// Check a tile counter ([`AttentionTensors::tile_counter`]): one u32, 4-byte aligned.
pub(in crate::attention) fn check_tile_counter(counter: Option<&DevView<'_, u32>>) -> Result<()> {
    match counter {
        Some(c) if c.len() != 1 => Err(Error::shape("tile counter", "1 element", c.len())),
        Some(c) if !c.addr().is_multiple_of(4) => Err(Error::Misaligned {
            what: "tile counter start".into(),
            required: 4,
            actual: c.addr() % 4,
        }),
        _ => Ok(()),
    }
}

/// Check the sink logits against a problem with (`expected`) or without sinks: present exactly
/// when expected, `heads_q` f32 values.
pub(in crate::attention) fn check_sinks(
    expected: bool,
    heads_q: usize,
    sinks: Option<&DevView<'_, f32>>,
) -> Result<()> {
    check_head_values("sinks", "sink tensor", expected, heads_q, sinks)
}

/// Check a per-query-head f32 tensor `what` (the sinks or their gradient) against a problem with
/// (`expected`) or without sinks: present exactly when expected, `heads_q` values, 4-byte
/// aligned.
pub(in crate::attention) fn check_head_values(
    what: &str,
    noun: &str,
    expected: bool,
    heads_q: usize,
    values: Option<&DevView<'_, f32>>,
) -> Result<()> {
    match (expected, values) {
        (false, None) => Ok(()),
        (true, None) => Err(Error::invalid(
            what,
            format!("the problem has sinks but no {noun} was given"),
        )),
        (false, Some(_)) => Err(Error::invalid(
            what,
            format!("a {noun} was given but the problem has no sinks"),
        )),
        (true, Some(s)) if s.len() != heads_q => Err(Error::shape(
            what,
            format!("{heads_q} elements (one per query head)"),
            s.len(),
        )),
        (true, Some(s)) if !s.addr().is_multiple_of(4) => Err(Error::Misaligned {
            what: format!("{what} start"),
            required: 4,
            actual: s.addr() % 4,
        }),
        (true, Some(_)) => Ok(()),
    }
}

/// The Hopper kernels' tensor map of a `[batch, seq, heads, D]` view: dims `[D, heads, seq,
/// batch]`, box `[64, 1, rows, 1]` (one 128-byte swizzled column block of `rows` rows); an error
/// if a tensor map cannot describe the view.
pub(in crate::attention) fn tile_map<T>(
    dtype: Dtype,
    view: &View<'_, T>,
    rows: u32,
) -> Result<MapSpec> {
    let [b, s, h, d] = view.shape();
    let st = view.strides();
    let dims = [d, h, s, b].map(|x| x as u64);
    hopper_map(dtype, view.ptr(), dims, [st[2], st[1], st[0]], rows)
}

/// [`tile_map`] of a packed `[1, total, heads, D]` view ([`View::packed`]): dims `[D, heads,
/// total, 1]`, the unused batch dimension given the row stride (a packed view's batch stride
/// is 0, which a tensor map does not take).
pub(in crate::attention) fn packed_tile_map<T>(
    dtype: Dtype,
    view: &View<'_, T>,
    rows: u32,
) -> Result<MapSpec> {
    let [_, s, h, d] = view.shape();
    let st = view.strides();
    let dims = [d as u64, h as u64, s as u64, 1];
    hopper_map(dtype, view.ptr(), dims, [st[2], st[1], st[1]], rows)
}

/// A Hopper tile map: `dims` innermost first, the element strides of dimensions 1 to 3, box
/// `[64, 1, rows, 1]`, 128-byte swizzle.
fn hopper_map(
    dtype: Dtype,
    address: u64,
    dims: [u64; 4],
    strides: [usize; 3],
    rows: u32,
) -> Result<MapSpec> {
    let dtype = match dtype {
        Dtype::Bf16 => MapDtype::Bf16,
        Dtype::F16 => MapDtype::F16,
    };
    TiledMap {
        address,
        dtype,
        dims: &dims,
        strides_bytes: &strides.map(|x| 2 * x as u64),
        box_dims: &[HOPPER_ATOM, 1, rows, 1],
        swizzle: MapSwizzle::B128,
    }
    .spec()
}

impl AttentionPlan {
    /// What the kernel's handle declares.
    pub fn kernel(&self) -> KernelDecl {
        match self {
            AttentionPlan::MmaSync { launch, .. } => *launch.kernel(),
            AttentionPlan::Hopper { kernel, .. } => kernel.kernel.info(),
        }
    }

    /// Whether the plan takes the Hopper path.
    pub fn is_hopper(&self) -> bool {
        matches!(self, AttentionPlan::Hopper { .. })
    }

    /// Grid, block and shared memory of the launch.
    pub fn config(&self) -> LaunchConfig {
        match self {
            AttentionPlan::MmaSync { launch, .. } => *launch.config(),
            AttentionPlan::Hopper {
                kernel,
                grid,
                params,
                ..
            } => *Launch::new(&kernel.kernel, *grid, kernel.cfg, *params).config(),
        }
    }

    /// The Hopper path's launch with the tensor maps encoded (needs the driver); `None` on the
    /// `mma.sync` path.
    pub fn hopper_launch(&self) -> Result<Option<Launch<HopperParams>>> {
        let AttentionPlan::Hopper {
            kernel,
            grid,
            maps,
            params,
        } = self
        else {
            return Ok(None);
        };
        let params = HopperParams {
            tmap_q: maps[0].encode()?,
            tmap_k: maps[1].encode()?,
            tmap_v: maps[2].encode()?,
            ..*params
        };
        Ok(Some(Launch::new(&kernel.kernel, *grid, kernel.cfg, params)))
    }
}

/// The `mma.sync` path's grid: one block per (query tile, head, batch).
fn mma_grid(problem: &AttentionProblem, tiles: &TileConfig) -> (u32, u32, u32) {
    (
        (problem.seq_q as u32).div_ceil(tiles.block_m),
        problem.heads_q as u32,
        problem.batch as u32,
    )
}

/// The Hopper path's grid: at most one block per query tile, capped by the configuration's
/// [`HopperGrid`] (one block per multiprocessor when persistent).
pub(in crate::attention) fn hopper_grid(
    problem: &AttentionProblem,
    cfg: &HopperConfig,
    multiprocessors: u32,
) -> (u32, u32, u32) {
    let tiles = hopper_tiles(problem).min(u64::from(HOPPER_MAX_TILES)) as u32;
    let uniform = problem.effective_window() == (None, None);
    let cap = match cfg.grid {
        HopperGrid::Auto if uniform => multiprocessors.max(1),
        HopperGrid::Auto | HopperGrid::PerTile => u32::MAX,
        HopperGrid::PerSm | HopperGrid::Dynamic => multiprocessors.max(1),
        HopperGrid::Blocks(n) => n,
    };
    (tiles.min(cap).max(1), 1, 1)
}

/// Query tiles of the Hopper path: `ceil(seq_q / 128) * heads_q * batch`.
pub(in crate::attention) fn hopper_tiles(problem: &AttentionProblem) -> u64 {
    (problem.seq_q as u64).div_ceil(u64::from(HOPPER_BLOCK_M))
        * problem.heads_q as u64
        * problem.batch as u64
}

/// Most tiles one launch of the Hopper kernels takes (tile indices stay below 2^31, so that
/// `index + grid` cannot wrap); larger problems take the `mma.sync` path.
pub(in crate::attention) const HOPPER_MAX_TILES: u32 = 1 << 30;
