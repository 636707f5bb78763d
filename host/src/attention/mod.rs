//! Attention forward: `O = softmax(scale Q K^T + mask) V`, plus the row log-sum-exp.
//!
//! - Q `[batch, seq_q, heads_q, D]`, K and V `[batch, seq_k, heads_kv, D]` in bf16 or f16, any
//!   strides with the head dimension contiguous (so views into a packed QKV tensor work); O
//!   `[batch, seq_q, heads_q, D]` in the input type, LSE `[batch, heads_q, seq_q]` f32
//!   (natural log).
//! - D in {64, 128, 256}; grouped-query attention with `heads_q` a multiple of `heads_kv`.
//! - `scale` defaults to `1 / sqrt(D)`.
//! - Masking follows FlashAttention >= 2.1: with `seq_q != seq_k` the causal diagonal is
//!   aligned to the **bottom-right** corner, i.e. query `i` may attend key `j` iff
//!   `j <= i + seq_k - seq_q`. A sliding window `(left, right)` allows
//!   `i + seq_k - seq_q - left <= j <= i + seq_k - seq_q + right`; causal is `right = 0`.
//!   A row with no allowed key (possible when `seq_q > seq_k` under causal masking, or with a
//!   window) gets `O = 0` and `LSE = -inf`, never NaN.
//! - Softmax and accumulation in f32.
//!
//! [`reference`] is the f64 specification; [`naive_same_precision`] computes the same function
//! the way a straightforward implementation in the input precision would (for the tolerance
//! rule of the tests).

pub mod reference;

pub use reference::{naive_same_precision, reference, reference_rows};

use crate::error::{Error, Result};
use crate::gpu::{Gpu, LaunchConfig};
use crate::tensor_map::{MapDtype, MapSwizzle, TiledMap};
use cust::memory::{DeviceBuffer, DeviceCopy};
use cust::stream::Stream;
use half::{bf16, f16};
use kernel_abi::attention::{
    AttentionParams, HEAD_DIMS, HOPPER_ATOM, HOPPER_BLOCK_M, HOPPER_THREADS, HopperConfig,
    HopperGrid, HopperParams, TileConfig, UNBOUNDED, hopper_config, hopper_variant, tile_config,
    tuning_variant,
};

/// Element type of Q, K, V and O.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
}

impl Dtype {
    fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
        }
    }
}

/// A 16-bit element type the kernels take.
pub trait AttentionElem: DeviceCopy + Copy + Default + Send + Sync + 'static {
    /// Its [`Dtype`].
    const DTYPE: Dtype;
    /// To f32 (exact).
    fn to_f32(self) -> f32;
    /// From f32, rounding to nearest even.
    fn from_f32(x: f32) -> Self;
}

impl AttentionElem for bf16 {
    const DTYPE: Dtype = Dtype::Bf16;
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        bf16::from_f32(x)
    }
}

impl AttentionElem for f16 {
    const DTYPE: Dtype = Dtype::F16;
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
}

/// Which kernel computes the forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Path {
    /// The Hopper path on GPUs that have it (sm_90a: TMA, wgmma, warp specialization; measured
    /// faster at every head dimension), else the `mma.sync` path. If the tensors' strides
    /// cannot be described by a TMA tensor map, or the problem has more than 2^30 query tiles,
    /// the `mma.sync` path is used.
    #[default]
    Auto,
    /// The `mma.sync` tensor-core path (any GPU of compute capability >= 8.0).
    MmaSync,
    /// The Hopper path; an error on other GPUs.
    Hopper,
}

/// An attention problem: sizes and options. Tensors come as [`View`]s at launch.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionProblem {
    /// Batch size.
    pub batch: usize,
    /// Query length.
    pub seq_q: usize,
    /// Key/value length.
    pub seq_k: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads (divides `heads_q`; 1 is multi-query attention).
    pub heads_kv: usize,
    /// Head dimension (64, 128 or 256).
    pub head_dim: usize,
    /// Element type.
    pub dtype: Dtype,
    /// Softmax scale; `None` is `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Causal masking (bottom-right aligned).
    pub causal: bool,
    /// Sliding window `(left, right)`; `None` on a side is unbounded.
    pub window: (Option<usize>, Option<usize>),
    /// Which kernel to use.
    pub path: Path,
}

impl AttentionProblem {
    /// A problem without masking, contiguous tensors assumed by the convenience constructors.
    pub fn new(
        batch: usize,
        seq_q: usize,
        seq_k: usize,
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
        dtype: Dtype,
    ) -> Self {
        AttentionProblem {
            batch,
            seq_q,
            seq_k,
            heads_q,
            heads_kv,
            head_dim,
            dtype,
            scale: None,
            causal: false,
            window: (None, None),
            path: Path::Auto,
        }
    }

    /// With causal masking.
    pub fn causal(mut self) -> Self {
        self.causal = true;
        self
    }

    /// With a sliding window.
    pub fn window(mut self, left: Option<usize>, right: Option<usize>) -> Self {
        self.window = (left, right);
        self
    }

    /// With an explicit kernel choice.
    pub fn path(mut self, path: Path) -> Self {
        self.path = path;
        self
    }

    /// With an explicit softmax scale.
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// The softmax scale in effect.
    pub fn softmax_scale(&self) -> f32 {
        self.scale.unwrap_or(1.0 / (self.head_dim as f32).sqrt())
    }

    /// The window the kernel applies, combining `causal` and `window` (`None` = unbounded).
    pub fn effective_window(&self) -> (Option<usize>, Option<usize>) {
        let right = match (self.causal, self.window.1) {
            (true, _) => Some(0),
            (false, r) => r,
        };
        (self.window.0, right)
    }

    /// Whether query `i` may attend key `j` (the mask, for references and tests).
    pub fn allowed(&self, i: usize, j: usize) -> bool {
        let diag = i as i64 + self.seq_k as i64 - self.seq_q as i64;
        let (left, right) = self.effective_window();
        j < self.seq_k
            && left.is_none_or(|l| j as i64 >= diag - l as i64)
            && right.is_none_or(|r| j as i64 <= diag + r as i64)
    }

    /// Check sizes and options.
    pub fn validate(&self) -> Result<()> {
        let dims = [
            ("batch", self.batch),
            ("seq_q", self.seq_q),
            ("seq_k", self.seq_k),
            ("heads_q", self.heads_q),
            ("heads_kv", self.heads_kv),
            ("head_dim", self.head_dim),
        ];
        for (what, v) in dims {
            if v == 0 {
                return Err(Error::invalid(what, "must be at least 1"));
            }
            if v >= 1 << 30 {
                return Err(Error::invalid(what, "must be below 2^30"));
            }
        }
        if !HEAD_DIMS.contains(&(self.head_dim as u32)) {
            return Err(Error::unsupported(
                format!("head dimension {}", self.head_dim),
                format!("supported: {HEAD_DIMS:?}"),
            ));
        }
        if !self.heads_q.is_multiple_of(self.heads_kv) {
            return Err(Error::invalid(
                "heads",
                format!(
                    "heads_q = {} is not a multiple of heads_kv = {}",
                    self.heads_q, self.heads_kv
                ),
            ));
        }
        let scale = self.softmax_scale();
        if !scale.is_finite() || scale <= 0.0 {
            return Err(Error::invalid(
                "scale",
                format!("{scale} is not a positive finite number"),
            ));
        }
        for (side, w) in [("left", self.window.0), ("right", self.window.1)] {
            if w.is_some_and(|w| w > i32::MAX as usize / 2) {
                return Err(Error::invalid(
                    format!("window {side}"),
                    "must be below 2^30 (use None for unbounded)",
                ));
            }
        }
        if self.batch > 65535 || self.heads_q > 65535 {
            return Err(Error::unsupported(
                "grid",
                "batch and heads_q must be at most 65535",
            ));
        }
        let lse_len = self.batch as u128 * self.heads_q as u128 * self.seq_q as u128;
        if lse_len > u32::MAX as u128 {
            return Err(Error::unsupported(
                "problem size",
                "batch * heads_q * seq_q must be below 2^32",
            ));
        }
        Ok(())
    }

    /// Floating-point operations: `4 batch heads_q seq_q seq_k D`, halved under causal masking
    /// (the benchmark convention of FlashAttention).
    pub fn flops(&self) -> f64 {
        let f = 4.0
            * (self.batch * self.heads_q) as f64
            * self.seq_q as f64
            * self.seq_k as f64
            * self.head_dim as f64;
        if self.causal { f / 2.0 } else { f }
    }

    /// The shape of Q and O: `[batch, seq_q, heads_q, D]`.
    pub fn q_shape(&self) -> [usize; 4] {
        [self.batch, self.seq_q, self.heads_q, self.head_dim]
    }

    /// The shape of K and V: `[batch, seq_k, heads_kv, D]`.
    pub fn kv_shape(&self) -> [usize; 4] {
        [self.batch, self.seq_k, self.heads_kv, self.head_dim]
    }

    /// Elements of LSE: `batch * heads_q * seq_q`.
    pub fn lse_len(&self) -> usize {
        self.batch * self.heads_q * self.seq_q
    }
}

/// Element strides of a contiguous `[b, s, h, d]` tensor.
pub fn contiguous_strides(shape: [usize; 4]) -> [usize; 4] {
    [
        shape[1] * shape[2] * shape[3],
        shape[2] * shape[3],
        shape[3],
        1,
    ]
}

/// The index of the last element a view reaches, `offset + sum (shape[i] - 1) strides[i]`,
/// computed without overflow (`None` for an empty shape). [`View`]s are checked with it, so
/// no stride, however large, can make a view wrap around to an in-bounds index.
pub fn last_element(offset: usize, shape: [usize; 4], strides: [usize; 4]) -> Option<u128> {
    let mut last = offset as u128;
    for i in 0..4 {
        last += (shape[i].checked_sub(1)? as u128) * strides[i] as u128;
    }
    Some(last)
}

/// A 4-dimensional view `[batch, seq, heads, head_dim]` into a device buffer.
pub struct View<'a, T: DeviceCopy> {
    buffer: &'a DeviceBuffer<T>,
    offset: usize,
    shape: [usize; 4],
    strides: [usize; 4],
}

impl<'a, T: DeviceCopy> View<'a, T> {
    /// A view of `buffer` from element `offset` with `shape` and element `strides` (rank 4).
    pub fn new(
        buffer: &'a DeviceBuffer<T>,
        offset: usize,
        shape: &[usize],
        strides: &[usize],
    ) -> Result<Self> {
        let shape: [usize; 4] = shape
            .try_into()
            .map_err(|_| Error::shape("tensor rank", 4, shape.len()))?;
        let strides: [usize; 4] = strides
            .try_into()
            .map_err(|_| Error::shape("stride count", 4, strides.len()))?;
        Ok(View {
            buffer,
            offset,
            shape,
            strides,
        })
    }

    /// A contiguous view of the whole buffer with `shape`.
    pub fn contiguous(buffer: &'a DeviceBuffer<T>, shape: [usize; 4]) -> Self {
        View {
            buffer,
            offset: 0,
            shape,
            strides: contiguous_strides(shape),
        }
    }

    fn check(&self, what: &str, shape: [usize; 4]) -> Result<()> {
        if self.shape != shape {
            return Err(Error::shape(
                format!("{what} shape"),
                format!("{shape:?}"),
                format!("{:?}", self.shape),
            ));
        }
        if self.strides[3] != 1 {
            return Err(Error::unsupported(
                format!("{what} head-dimension stride {}", self.strides[3]),
                "the head dimension must be contiguous (stride 1)",
            ));
        }
        for i in 0..3 {
            if !self.strides[i].is_multiple_of(8) {
                return Err(Error::Misaligned {
                    what: format!(
                        "{what} stride of dimension {i} ({} elements)",
                        self.strides[i]
                    ),
                    required: 16,
                    actual: (self.strides[i] * 2 % 16) as u64,
                });
            }
        }
        let addr = self.buffer.as_device_ptr().as_raw() + 2 * self.offset as u64;
        if !addr.is_multiple_of(16) {
            return Err(Error::Misaligned {
                what: format!("{what} start"),
                required: 16,
                actual: addr % 16,
            });
        }
        let last = last_element(self.offset, self.shape, self.strides);
        if last.is_none_or(|last| last >= self.buffer.len() as u128) {
            return Err(Error::shape(
                format!("{what} buffer"),
                format!(
                    "at least {} elements for this view",
                    last.map_or("2^128".into(), |l| (l + 1).to_string())
                ),
                self.buffer.len(),
            ));
        }
        Ok(())
    }

    fn ptr(&self) -> u64 {
        self.buffer.as_device_ptr().as_raw() + 2 * self.offset as u64
    }

    fn strides3(&self) -> [u64; 3] {
        [
            self.strides[0] as u64,
            self.strides[1] as u64,
            self.strides[2] as u64,
        ]
    }
}

/// The kernel for a dtype and head dimension.
pub fn kernel_name(dtype: Dtype, head_dim: usize) -> String {
    format!("attention_fwd_{}_d{head_dim}", dtype.name())
}

/// Launch the forward pass on `stream` (asynchronous): O into `o`, LSE into `lse`.
///
/// `o` is a view like Q's (it may have its own strides). The output must not overlap the
/// inputs.
#[allow(clippy::too_many_arguments)]
pub fn forward<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionProblem,
    q: &View<T>,
    k: &View<T>,
    v: &View<T>,
    o: &mut View<T>,
    lse: &mut DeviceBuffer<f32>,
) -> Result<()> {
    forward_variant(gpu, stream, problem, q, k, v, o, lse, None)
}

/// [`forward`] with one of the tuning variants of the tile configuration
/// (`kernel_abi::attention::TUNING_VARIANTS`, bf16 only), for benchmarks.
#[allow(clippy::too_many_arguments)]
pub fn forward_variant<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionProblem,
    q: &View<T>,
    k: &View<T>,
    v: &View<T>,
    o: &mut View<T>,
    lse: &mut DeviceBuffer<f32>,
    variant: Option<&str>,
) -> Result<()> {
    problem.validate()?;
    if T::DTYPE != problem.dtype {
        return Err(Error::invalid(
            "dtype",
            format!(
                "the problem is {:?} but the tensors are {:?}",
                problem.dtype,
                T::DTYPE
            ),
        ));
    }
    q.check("Q", problem.q_shape())?;
    k.check("K", problem.kv_shape())?;
    v.check("V", problem.kv_shape())?;
    o.check("O", problem.q_shape())?;
    if lse.len() != problem.lse_len() {
        return Err(Error::shape(
            "LSE",
            format!("{} elements", problem.lse_len()),
            lse.len(),
        ));
    }
    if let Some(name) = variant
        && let Some(cfg) = hopper_variant(problem.head_dim as u32, name)
    {
        // A tuning variant of the Hopper path (bf16 only).
        if problem.dtype != Dtype::Bf16 || !gpu.arch().has_hopper_kernels() {
            return Err(Error::unsupported(
                format!("Hopper tuning variant {name}"),
                format!(
                    "built for bf16 on sm_90a; this is {:?} on {}",
                    problem.dtype,
                    gpu.arch()
                ),
            ));
        }
        let params = hopper_params(problem, &cfg, q, k, v, o, lse)?;
        let name = format!(
            "{}_{name}",
            hopper_kernel_name(problem.dtype, problem.head_dim)
        );
        return launch_hopper(gpu, stream, problem, &cfg, &name, &params);
    }
    let hopper = match (problem.path, variant) {
        (_, Some(_)) | (Path::MmaSync, None) => false,
        (Path::Hopper, None) => {
            if !gpu.arch().has_hopper_kernels() {
                return Err(Error::unsupported(
                    "attention path Hopper",
                    format!("needs the sm_90a kernels; this GPU runs {}", gpu.arch()),
                ));
            }
            true
        }
        // Every head dimension: the Hopper path measured faster on an H200 (bench/NOTES.md).
        (Path::Auto, None) => gpu.arch().has_hopper_kernels(),
    };
    if hopper {
        let cfg = hopper_config(problem.head_dim as u32).expect("validated head dimension");
        match hopper_params(problem, &cfg, q, k, v, o, lse) {
            Ok(params) => {
                let name = hopper_kernel_name(problem.dtype, problem.head_dim);
                return launch_hopper(gpu, stream, problem, &cfg, &name, &params);
            }
            Err(e) if problem.path == Path::Hopper => return Err(e),
            // Strides a tensor map cannot describe: the mma.sync path handles any.
            Err(_) => {}
        }
    }
    let tensors = MmaTensors {
        q: (q.ptr(), q.strides3()),
        k: (k.ptr(), k.strides3()),
        v: (v.ptr(), v.strides3()),
        o: (o.ptr(), o.strides3()),
        lse: lse.as_device_ptr().as_raw(),
    };
    let (name, launch, params) = mma_launch(problem, variant, &tensors)?;
    // SAFETY: every view was checked (shape, contiguous head dimension, 16-byte aligned rows,
    // in bounds of its buffer), LSE has batch * heads_q * seq_q elements, the sizes and window
    // were validated, and the grid is (num_m_blocks, heads_q, batch) as the kernel expects.
    unsafe { gpu.launch_by_name(stream, &name, &launch, &params) }
}

/// Addresses and element strides (batch, sequence, head) of the tensors of an `mma.sync`
/// launch: device memory, or the emulator's host buffers.
#[derive(Clone, Copy, Debug)]
pub struct MmaTensors {
    /// Q `[batch, seq_q, heads_q, D]`.
    pub q: (u64, [u64; 3]),
    /// K `[batch, seq_k, heads_kv, D]`.
    pub k: (u64, [u64; 3]),
    /// V, as K.
    pub v: (u64, [u64; 3]),
    /// O, as Q.
    pub o: (u64, [u64; 3]),
    /// LSE `[batch, heads_q, seq_q]` f32, contiguous.
    pub lse: u64,
}

/// The `mma.sync` kernel (the default tiles, or the tuning variant `variant`), its launch shape
/// and its parameters for `problem` on `tensors`, which the caller has checked against the
/// problem as [`forward_variant`] does.
pub fn mma_launch(
    problem: &AttentionProblem,
    variant: Option<&str>,
    tensors: &MmaTensors,
) -> Result<(String, LaunchConfig, AttentionParams)> {
    problem.validate()?;
    let (cfg, name): (TileConfig, String) = match variant {
        None => (
            tile_config(problem.head_dim as u32).expect("validated head dimension"),
            kernel_name(problem.dtype, problem.head_dim),
        ),
        Some(v) => {
            let cfg = tuning_variant(problem.head_dim as u32, v)
                .filter(|_| problem.dtype == Dtype::Bf16)
                .ok_or_else(|| {
                    Error::unsupported(
                        format!("tuning variant {v}"),
                        "not built for this dtype and head dimension",
                    )
                })?;
            (
                cfg,
                format!("{}_{v}", kernel_name(problem.dtype, problem.head_dim)),
            )
        }
    };
    let (left, right) = problem.effective_window();
    let launch = mma_launch_config(problem, &cfg);
    let num_m_blocks = launch.grid.0;
    let params = AttentionParams {
        q: tensors.q.0 as *const u16,
        k: tensors.k.0 as *const u16,
        v: tensors.v.0 as *const u16,
        o: tensors.o.0 as *mut u16,
        lse: tensors.lse as *mut f32,
        q_strides: tensors.q.1,
        k_strides: tensors.k.1,
        v_strides: tensors.v.1,
        o_strides: tensors.o.1,
        batch: problem.batch as u32,
        seq_q: problem.seq_q as u32,
        seq_k: problem.seq_k as u32,
        heads_q: problem.heads_q as u32,
        heads_kv: problem.heads_kv as u32,
        scale_log2: problem.softmax_scale() * std::f32::consts::LOG2_E,
        window_left: left.map_or(UNBOUNDED, |l| l as i32),
        window_right: right.map_or(UNBOUNDED, |r| r as i32),
        num_m_blocks,
        reverse_m: u32::from(problem.causal),
    };
    Ok((name, launch, params))
}

/// The `mma.sync` path's launch: one block per (query tile, head, batch).
fn mma_launch_config(problem: &AttentionProblem, cfg: &TileConfig) -> LaunchConfig {
    LaunchConfig::new(
        (
            (problem.seq_q as u32).div_ceil(cfg.block_m),
            problem.heads_q as u32,
            problem.batch as u32,
        ),
        cfg.threads(),
        cfg.smem_bytes(),
    )
}

/// The Hopper path's launch: one block per (query tile, head, batch).
fn hopper_launch_config(
    problem: &AttentionProblem,
    cfg: &HopperConfig,
    multiprocessors: u32,
) -> LaunchConfig {
    let tiles = hopper_tiles(problem).min(u64::from(HOPPER_MAX_TILES)) as u32;
    let uniform = problem.effective_window() == (None, None);
    let cap = match cfg.grid {
        HopperGrid::Auto if uniform => multiprocessors.max(1),
        HopperGrid::Auto | HopperGrid::PerTile => u32::MAX,
        HopperGrid::PerSm => multiprocessors.max(1),
        HopperGrid::Blocks(n) => n,
    };
    LaunchConfig::new(
        (tiles.min(cap).max(1), 1, 1),
        HOPPER_THREADS,
        cfg.smem_bytes(),
    )
}

/// Query tiles of the Hopper path: `ceil(seq_q / 128) * heads_q * batch`.
fn hopper_tiles(problem: &AttentionProblem) -> u64 {
    (problem.seq_q as u64).div_ceil(u64::from(HOPPER_BLOCK_M))
        * problem.heads_q as u64
        * problem.batch as u64
}

/// Most tiles one launch of the Hopper kernels takes (tile indices stay below 2^31, so that
/// `index + grid` cannot wrap); larger problems take the `mma.sync` path.
const HOPPER_MAX_TILES: u32 = 1 << 30;

/// The Hopper kernel for a dtype and head dimension.
pub fn hopper_kernel_name(dtype: Dtype, head_dim: usize) -> String {
    format!("attention_fwd_hopper_{}_d{head_dim}", dtype.name())
}

/// The kernel name, parameter-struct size and launch shape [`forward`] uses for a problem on
/// the `mma.sync` path (`hopper == false`) or the Hopper path; after validation. Tests check
/// them against the PTX and the device limits without a GPU ([`crate::gpu::check_launch`]).
pub fn launch_shape(
    problem: &AttentionProblem,
    hopper: bool,
) -> Result<(String, usize, LaunchConfig)> {
    problem.validate()?;
    let d = problem.head_dim;
    Ok(if hopper {
        (
            hopper_kernel_name(problem.dtype, d),
            std::mem::size_of::<HopperParams>(),
            // Without a GPU at hand: the grid of a GPU with one multiprocessor per tile.
            hopper_launch_config(
                problem,
                &hopper_config(d as u32).expect("validated head dimension"),
                u32::MAX,
            ),
        )
    } else {
        let cfg = tile_config(d as u32).expect("validated head dimension");
        (
            kernel_name(problem.dtype, d),
            std::mem::size_of::<AttentionParams>(),
            mma_launch_config(problem, &cfg),
        )
    })
}

/// The Hopper kernel's parameters: tensor maps over the (already checked) views.
fn hopper_params<T: AttentionElem>(
    problem: &AttentionProblem,
    cfg: &HopperConfig,
    q: &View<T>,
    k: &View<T>,
    v: &View<T>,
    o: &View<T>,
    lse: &DeviceBuffer<f32>,
) -> Result<HopperParams> {
    let tiles = hopper_tiles(problem);
    if tiles > u64::from(HOPPER_MAX_TILES) {
        return Err(Error::unsupported(
            "attention path Hopper",
            format!("{tiles} query tiles; one launch takes at most {HOPPER_MAX_TILES}"),
        ));
    }
    let dtype = match problem.dtype {
        Dtype::Bf16 => MapDtype::Bf16,
        Dtype::F16 => MapDtype::F16,
    };
    let map = |view: &View<T>, rows: u32| {
        let [b, s, h, d] = view.shape;
        let st = view.strides;
        TiledMap {
            address: view.ptr(),
            dtype,
            dims: &[d as u64, h as u64, s as u64, b as u64],
            strides_bytes: &[2 * st[2] as u64, 2 * st[1] as u64, 2 * st[0] as u64],
            box_dims: &[HOPPER_ATOM, 1, rows, 1],
            swizzle: MapSwizzle::B128,
        }
        .encode()
    };
    let (left, right) = problem.effective_window();
    Ok(HopperParams {
        tmap_q: map(q, HOPPER_BLOCK_M)?,
        tmap_k: map(k, cfg.block_n)?,
        tmap_v: map(v, cfg.block_n)?,
        o: o.ptr() as *mut u16,
        lse: lse.as_device_ptr().as_raw() as *mut f32,
        o_strides: o.strides3(),
        seq_q: problem.seq_q as u32,
        seq_k: problem.seq_k as u32,
        heads_q: problem.heads_q as u32,
        heads_kv: problem.heads_kv as u32,
        scale_log2: problem.softmax_scale() * std::f32::consts::LOG2_E,
        window_left: left.map_or(UNBOUNDED, |l| l as i32),
        window_right: right.map_or(UNBOUNDED, |r| r as i32),
        num_m_blocks: (problem.seq_q as u32).div_ceil(HOPPER_BLOCK_M),
        reverse_m: u32::from(problem.causal),
        batch: problem.batch as u32,
        num_tiles: u32::try_from(tiles).expect("checked above"),
    })
}

fn launch_hopper(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionProblem,
    cfg: &HopperConfig,
    name: &str,
    params: &HopperParams,
) -> Result<()> {
    let launch = hopper_launch_config(problem, cfg, gpu.info().multiprocessors);
    // SAFETY: the tensor maps describe the checked views of Q, K, V (shape, 16-byte aligned
    // rows and strides, in bounds), O and LSE were checked by the caller, the sizes and window
    // validated, `num_tiles` matches the problem, and any grid of at least one block covers
    // every tile (block b walks b, b + grid, ...).
    unsafe { gpu.launch_by_name(stream, name, &launch, params) }
}
