//! An attention problem: sizes, options and the tensors' views, validated before any launch.

use crate::error::{Error, Result};
use crate::exec::DevView;
use half::{bf16, f16};
use kernel_abi::attention::{HEAD_DIMS, VALUE_DIMS};

pub use kernel_abi::attention::Dtype;

/// A 16-bit element type the kernels take.
pub trait AttentionElem: cust::memory::DeviceCopy + Copy + Default + Send + Sync + 'static {
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
    /// Head dimension of Q and K ([`HEAD_DIMS`]: a multiple of 16 from 32 to 256).
    pub head_dim: usize,
    /// Head dimension of V and O when it differs from `head_dim` (a pair of [`VALUE_DIMS`],
    /// the forward on both paths); `None`: `head_dim`.
    pub value_dim: Option<usize>,
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
    /// Softcap (Gemma 2): every logit `l` becomes `softcap tanh(l / softcap)`; `None` for none.
    pub softcap: Option<f32>,
    /// Attention sinks (gpt-oss): one logit per query head joins every row's softmax and
    /// contributes no value; the values come with the tensors (`[heads_q]` f32).
    pub sinks: bool,
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
            value_dim: None,
            dtype,
            scale: None,
            causal: false,
            window: (None, None),
            path: Path::Auto,
            softcap: None,
            sinks: false,
        }
    }

    /// With V and O of head dimension `value_dim` (which may differ from Q's and K's).
    pub fn value_dim(mut self, value_dim: usize) -> Self {
        self.value_dim = Some(value_dim);
        self
    }

    /// The head dimension of V and O.
    pub fn v_dim(&self) -> usize {
        self.value_dim.unwrap_or(self.head_dim)
    }

    /// Whether V and O have a head dimension of their own (different from Q's and K's).
    pub fn has_value_dim(&self) -> bool {
        self.v_dim() != self.head_dim
    }

    /// With a softcap (`softcap tanh(l / softcap)` on every logit `l`).
    pub fn softcap(mut self, softcap: f32) -> Self {
        self.softcap = Some(softcap);
        self
    }

    /// With attention sinks (their values come with the tensors).
    pub fn with_sinks(mut self) -> Self {
        self.sinks = true;
        self
    }

    /// Whether the problem needs the `capsink` kernels (a softcap or sinks).
    pub fn has_logit_options(&self) -> bool {
        self.softcap.is_some() || self.sinks
    }

    /// The final logit of the raw product `x = q . k` (scale and softcap; the reference's
    /// definition).
    pub fn logit(&self, x: f64) -> f64 {
        let l = self.softmax_scale() as f64 * x;
        match self.softcap {
            Some(c) => c as f64 * (l / c as f64).tanh(),
            None => l,
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
            ("value_dim", self.v_dim()),
        ];
        for (what, v) in dims {
            if v == 0 {
                return Err(Error::invalid(what, "must be at least 1"));
            }
            if v >= 1 << 30 {
                return Err(Error::invalid(what, "must be below 2^30"));
            }
        }
        self.validate_options()?;
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

    /// Check the head dimension, the heads' grouping, the scale and the window (the sizes'
    /// checks are the caller's).
    pub(crate) fn validate_options(&self) -> Result<()> {
        if !HEAD_DIMS.contains(&(self.head_dim as u32)) {
            return Err(Error::unsupported(
                format!("head dimension {}", self.head_dim),
                format!("supported: {HEAD_DIMS:?}"),
            ));
        }
        if self.has_value_dim() {
            let pair = (self.head_dim as u32, self.v_dim() as u32);
            if !VALUE_DIMS.contains(&pair) {
                return Err(Error::unsupported(
                    format!(
                        "value head dimension {} with query/key head dimension {}",
                        self.v_dim(),
                        self.head_dim
                    ),
                    format!("supported (D, D_v) pairs: {VALUE_DIMS:?}"),
                ));
            }
            if self.has_logit_options() {
                return Err(Error::unsupported(
                    "a softcap or sinks with a value head dimension of its own",
                    "the (D, D_v) kernels have neither",
                ));
            }
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
        if let Some(c) = self.softcap
            && !(c.is_finite() && c > 0.0)
        {
            return Err(Error::invalid(
                "softcap",
                format!("{c} is not a positive finite number"),
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
        Ok(())
    }

    /// Floating-point operations: `2 batch heads_q seq_q seq_k (D + D_v)` (`4 ... D` when the
    /// two are equal), halved under causal masking (the benchmark convention of
    /// FlashAttention).
    pub fn flops(&self) -> f64 {
        let f = 2.0
            * (self.batch * self.heads_q) as f64
            * self.seq_q as f64
            * self.seq_k as f64
            * (self.head_dim + self.v_dim()) as f64;
        if self.causal { f / 2.0 } else { f }
    }

    /// The shape of Q (and of O when `D_v = D`): `[batch, seq_q, heads_q, D]`.
    pub fn q_shape(&self) -> [usize; 4] {
        [self.batch, self.seq_q, self.heads_q, self.head_dim]
    }

    /// The shape of K (and of V when `D_v = D`): `[batch, seq_k, heads_kv, D]`.
    pub fn kv_shape(&self) -> [usize; 4] {
        [self.batch, self.seq_k, self.heads_kv, self.head_dim]
    }

    /// The shape of V: `[batch, seq_k, heads_kv, D_v]`.
    pub fn v_shape(&self) -> [usize; 4] {
        [self.batch, self.seq_k, self.heads_kv, self.v_dim()]
    }

    /// The shape of O: `[batch, seq_q, heads_q, D_v]`.
    pub fn o_shape(&self) -> [usize; 4] {
        [self.batch, self.seq_q, self.heads_q, self.v_dim()]
    }

    /// Elements of LSE: `batch * heads_q * seq_q` (saturating at `usize::MAX` for sizes that
    /// [`AttentionProblem::validate`] refuses).
    pub fn lse_len(&self) -> usize {
        self.batch
            .saturating_mul(self.heads_q)
            .saturating_mul(self.seq_q)
    }
}

/// Element strides of a contiguous `[b, s, h, d]` tensor. Products past `usize::MAX` saturate
/// (a shape with a zero dimension may still have others whose product overflows): such a view
/// fails its checks with a typed error, never a panic.
pub fn contiguous_strides(shape: [usize; 4]) -> [usize; 4] {
    let hd = shape[2].saturating_mul(shape[3]);
    [shape[1].saturating_mul(hd), hd, shape[3], 1]
}

/// The index of the last element a view reaches, `offset + sum (shape[i] - 1) strides[i]`,
/// computed without overflow (`None` for an empty shape; saturating at `u128::MAX`, past any
/// memory). [`View`]s are checked with it, so no stride, however large, can make a view wrap
/// around to an in-bounds index.
pub fn last_element(offset: usize, shape: [usize; 4], strides: [usize; 4]) -> Option<u128> {
    let mut last = offset as u128;
    for i in 0..4 {
        // At most (2^64 - 1)^2: no overflow of the product.
        last = last.saturating_add((shape[i].checked_sub(1)? as u128) * strides[i] as u128);
    }
    Some(last)
}

/// A 4-dimensional view `[batch, seq, heads, head_dim]` into device memory: a device buffer
/// (`&DeviceBuffer`) or any [`DevView`] (e.g. the emulator's host buffers).
pub struct View<'a, T> {
    buffer: DevView<'a, T>,
    offset: usize,
    shape: [usize; 4],
    strides: [usize; 4],
}

impl<T> Clone for View<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for View<'_, T> {}

impl<'a, T> View<'a, T> {
    /// A view of `buffer` from element `offset` with `shape` and element `strides` (rank 4).
    pub fn new(
        buffer: impl Into<DevView<'a, T>>,
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
            buffer: buffer.into(),
            offset,
            shape,
            strides,
        })
    }

    /// A contiguous view of the whole buffer with `shape`.
    pub fn contiguous(buffer: impl Into<DevView<'a, T>>, shape: [usize; 4]) -> Self {
        View {
            buffer: buffer.into(),
            offset: 0,
            shape,
            strides: contiguous_strides(shape),
        }
    }

    /// The shape `[batch, seq, heads, head_dim]`.
    pub fn shape(&self) -> [usize; 4] {
        self.shape
    }

    /// The element strides.
    pub fn strides(&self) -> [usize; 4] {
        self.strides
    }

    /// Check the view against the tensor `what` of shape `shape`: the shape, a contiguous head
    /// dimension, 16-byte aligned start and strides, and every element inside the memory.
    pub(crate) fn check(&self, what: &str, shape: [usize; 4]) -> Result<()> {
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
        let size = std::mem::size_of::<T>();
        for i in 0..3 {
            if !(self.strides[i].wrapping_mul(size)).is_multiple_of(16) {
                return Err(Error::Misaligned {
                    what: format!(
                        "{what} stride of dimension {i} ({} elements)",
                        self.strides[i]
                    ),
                    required: 16,
                    actual: (self.strides[i].wrapping_mul(size) % 16) as u64,
                });
            }
        }
        let addr = self.ptr();
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

    /// Check that no two elements of the view share an address (for outputs): ordered by
    /// stride, each dimension of size above 1 steps past everything the smaller ones span.
    pub(crate) fn check_distinct(&self, what: &str) -> Result<()> {
        let mut dims: Vec<(usize, usize)> = (0..4)
            .filter(|&i| self.shape[i] > 1)
            .map(|i| (self.strides[i], self.shape[i]))
            .collect();
        dims.sort_unstable();
        let mut span = 1u128;
        for (stride, n) in dims {
            if (stride as u128) < span {
                return Err(Error::unsupported(
                    format!("{what} strides {:?}", self.strides),
                    "an output's elements must not share memory",
                ));
            }
            span += (n as u128 - 1) * stride as u128;
        }
        Ok(())
    }

    /// The address of element 0.
    pub(crate) fn ptr(&self) -> u64 {
        self.buffer.addr() + (std::mem::size_of::<T>() * self.offset) as u64
    }

    /// The element strides of batch, sequence and head.
    pub(crate) fn strides3(&self) -> [u64; 3] {
        [
            self.strides[0] as u64,
            self.strides[1] as u64,
            self.strides[2] as u64,
        ]
    }
}
