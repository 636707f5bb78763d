//! The forward pass over packed sequences of different lengths (FlashAttention's
//! `flash_attn_varlen_func`): Q `[total_q, heads_q, D]`, K and V `[total_k, heads_kv, D]`,
//! sequence `b` owning query rows `cu_seqlens_q[b] .. cu_seqlens_q[b + 1]` and key rows
//! `cu_seqlens_k[b] .. cu_seqlens_k[b + 1]`. Each sequence is attended as a dense problem of its
//! own lengths: the mask options apply per sequence (causal aligned to each sequence's
//! bottom-right corner), grouped-query heads, the scale. O is `[total_q, heads_q, D]`, LSE
//! `[heads_q, total_q]` f32 (FlashAttention's varlen layout). Empty sequences (no query or no
//! key rows) are allowed; a query row with no allowed key gets `O = 0` and `LSE = -inf`.
//!
//! The same three steps as the dense forward: [`CuSeqlens`] (the boundaries, checked on the
//! host) gives an [`AttentionVarlenProblem`] (sizes and options), planned on its tensors
//! ([`AttentionVarlenTensors`]) into an [`AttentionVarlenPlan`] (pure), which runs on any
//! executor. [`forward_varlen`] does it on `cust` buffers with boundaries uploaded once
//! ([`DeviceCuSeqlens`]).
//!
//! Paths, as the dense forward's: the Hopper kernels (`attention_fwd_hopper_varlen_*`, the dense
//! Hopper kernels' body on packed tensor maps, one block per query tile) where the target has
//! them ([`Path::Auto`] on sm_90a, or [`Path::Hopper`]), the `mma.sync` kernels
//! (`attention_fwd_varlen_*`, the dense kernels' body on the packed layout) on every GPU
//! ([`Path::MmaSync`], and [`Path::Auto`] where the Hopper path cannot take the problem: no key
//! row at all, or a view a tensor map cannot describe).

use super::plan::{
    AttentionPlan, HOPPER_MAX_TILES, Target, check_sinks, check_tile_counter, packed_tile_map,
};
use super::problem::{AttentionElem, AttentionProblem, Dtype, Path, View};
use crate::error::{Error, Result};
use crate::exec::{DevView, Exec, OnStream};
use crate::gpu::{Gpu, LaunchConfig};
use crate::launch::Launch;
use crate::memory::upload;
use cust::memory::DeviceBuffer;
use cust::stream::Stream;
use kernel_abi::KernelDecl;
use kernel_abi::attention::{
    AttentionParams, AttentionVarlenParams, HOPPER_BLOCK_M, HopperKernel, HopperParams,
    MmaVarlenKernel, UNBOUNDED, hopper_value_dim_kernel, hopper_varlen_kernel, hopper_varlen_slots,
    mma_varlen_kernel, mma_varlen_value_dim_kernel,
};

/// The boundaries of a batch of packed sequences, as FlashAttention takes them: `[batch + 1]`
/// offsets each for the query rows and the key rows, checked (at least one sequence, both of
/// the same batch, starting at 0, non-decreasing, below 2^30).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CuSeqlens {
    q: Vec<i32>,
    k: Vec<i32>,
}

impl CuSeqlens {
    /// Check `cu_seqlens_q` and `cu_seqlens_k`.
    pub fn new(cu_seqlens_q: &[i32], cu_seqlens_k: &[i32]) -> Result<CuSeqlens> {
        for (what, cu) in [
            ("cu_seqlens_q", cu_seqlens_q),
            ("cu_seqlens_k", cu_seqlens_k),
        ] {
            if cu.len() < 2 {
                return Err(Error::invalid(
                    what,
                    "needs batch + 1 >= 2 entries (at least one sequence)",
                ));
            }
            if cu[0] != 0 {
                return Err(Error::invalid(what, format!("starts at {}, not 0", cu[0])));
            }
            if let Some(i) = (1..cu.len()).find(|&i| cu[i] < cu[i - 1]) {
                return Err(Error::invalid(
                    what,
                    format!("decreases at entry {i} ({} after {})", cu[i], cu[i - 1]),
                ));
            }
            if cu[cu.len() - 1] >= 1 << 30 {
                return Err(Error::invalid(what, "totals must be below 2^30"));
            }
        }
        if cu_seqlens_q.len() != cu_seqlens_k.len() {
            return Err(Error::shape(
                "cu_seqlens_k length",
                cu_seqlens_q.len(),
                cu_seqlens_k.len(),
            ));
        }
        Ok(CuSeqlens {
            q: cu_seqlens_q.to_vec(),
            k: cu_seqlens_k.to_vec(),
        })
    }

    /// Boundaries of sequences of `(seq_q, seq_k)` rows each, in order.
    pub fn from_lens(lens: &[(usize, usize)]) -> Result<CuSeqlens> {
        let offsets = |f: fn(&(usize, usize)) -> usize| {
            let mut cu = vec![0i32];
            for l in lens {
                let next = *cu.last().expect("non-empty") as usize + f(l);
                cu.push(i32::try_from(next).unwrap_or(i32::MAX));
            }
            cu
        };
        CuSeqlens::new(&offsets(|l| l.0), &offsets(|l| l.1))
    }

    /// The query offsets (`[batch + 1]`).
    pub fn q(&self) -> &[i32] {
        &self.q
    }

    /// The key offsets (`[batch + 1]`).
    pub fn k(&self) -> &[i32] {
        &self.k
    }

    /// Sequences.
    pub fn batch(&self) -> usize {
        self.q.len() - 1
    }

    /// Query rows of sequence `b`.
    pub fn seq_q(&self, b: usize) -> usize {
        (self.q[b + 1] - self.q[b]) as usize
    }

    /// Key rows of sequence `b`.
    pub fn seq_k(&self, b: usize) -> usize {
        (self.k[b + 1] - self.k[b]) as usize
    }

    /// First query row of sequence `b`.
    pub fn q_start(&self, b: usize) -> usize {
        self.q[b] as usize
    }

    /// First key row of sequence `b`.
    pub fn k_start(&self, b: usize) -> usize {
        self.k[b] as usize
    }

    /// Query rows in all.
    pub fn total_q(&self) -> usize {
        self.q[self.batch()] as usize
    }

    /// Key rows in all.
    pub fn total_k(&self) -> usize {
        self.k[self.batch()] as usize
    }

    /// The longest sequence's query rows.
    pub fn max_seqlen_q(&self) -> usize {
        (0..self.batch()).map(|b| self.seq_q(b)).max().unwrap_or(0)
    }

    /// The longest sequence's key rows.
    pub fn max_seqlen_k(&self) -> usize {
        (0..self.batch()).map(|b| self.seq_k(b)).max().unwrap_or(0)
    }

    /// Upload the boundaries for [`forward_varlen`] (with a tile counter of their own).
    pub fn upload(&self) -> Result<DeviceCuSeqlens> {
        Ok(DeviceCuSeqlens {
            host: self.clone(),
            q: upload(&self.q)?,
            k: upload(&self.k)?,
            tile_counter: upload(&[0u32])?,
        })
    }
}

/// [`CuSeqlens`] in device memory, with their host copy (what [`forward_varlen`] checks the
/// problem against) and the tile counter of the Hopper forward's persistent grid
/// ([`AttentionVarlenTensors::tile_counter`]): the forward writes it, so forward passes over
/// one `DeviceCuSeqlens` must run one after the other (one stream, or ordered by events); give
/// passes that run concurrently boundaries of their own.
pub struct DeviceCuSeqlens {
    host: CuSeqlens,
    q: DeviceBuffer<i32>,
    k: DeviceBuffer<i32>,
    tile_counter: DeviceBuffer<u32>,
}

impl DeviceCuSeqlens {
    /// The host copy.
    pub fn host(&self) -> &CuSeqlens {
        &self.host
    }

    /// The device offsets: `cu_seqlens_q`, `cu_seqlens_k` (for a plan's tensors).
    pub fn device(&self) -> (DevView<'_, i32>, DevView<'_, i32>) {
        ((&self.q).into(), (&self.k).into())
    }

    /// The tile counter (zero between launches; for [`AttentionVarlenTensors::tile_counter`]).
    pub fn tile_counter(&mut self) -> DevView<'_, u32> {
        (&self.tile_counter).into()
    }
}

/// A forward pass over packed sequences: sizes and options. The sizes are what the kernel
/// needs; [`AttentionVarlenProblem::new`] derives them from the boundaries.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionVarlenProblem {
    /// Sequences.
    pub batch: usize,
    /// Query rows of Q and O.
    pub total_q: usize,
    /// Key rows of K and V.
    pub total_k: usize,
    /// Query rows of the longest sequence (sizes the grid; a sequence longer than this leaves
    /// its rows past it unwritten, which the host's checks of the boundaries exclude).
    pub max_seqlen_q: usize,
    /// Key rows of the longest sequence.
    pub max_seqlen_k: usize,
    /// Query heads.
    pub heads_q: usize,
    /// Key/value heads (divides `heads_q`).
    pub heads_kv: usize,
    /// Head dimension of Q and K ([`super::HEAD_DIMS`]: a multiple of 16 from 32 to 256).
    pub head_dim: usize,
    /// Head dimension of V and O, as [`AttentionProblem::value_dim`].
    pub value_dim: Option<usize>,
    /// Element type.
    pub dtype: Dtype,
    /// Softmax scale; `None` is `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Causal masking (aligned to each sequence's bottom-right corner).
    pub causal: bool,
    /// Sliding window `(left, right)` per sequence; `None` on a side is unbounded.
    pub window: (Option<usize>, Option<usize>),
    /// Which kernel to use.
    pub path: Path,
    /// Softcap, as [`AttentionProblem::softcap`].
    pub softcap: Option<f32>,
    /// Attention sinks, as [`AttentionProblem::sinks`] (`[heads_q]` f32 with the tensors).
    pub sinks: bool,
}

impl AttentionVarlenProblem {
    /// The problem of the sequences `seqlens`, without masking.
    pub fn new(
        seqlens: &CuSeqlens,
        heads_q: usize,
        heads_kv: usize,
        head_dim: usize,
        dtype: Dtype,
    ) -> Self {
        AttentionVarlenProblem {
            batch: seqlens.batch(),
            total_q: seqlens.total_q(),
            total_k: seqlens.total_k(),
            max_seqlen_q: seqlens.max_seqlen_q(),
            max_seqlen_k: seqlens.max_seqlen_k(),
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

    /// With an explicit softmax scale.
    pub fn scale(mut self, scale: f32) -> Self {
        self.scale = Some(scale);
        self
    }

    /// With an explicit kernel choice.
    pub fn path(mut self, path: Path) -> Self {
        self.path = path;
        self
    }

    /// With V and O of head dimension `value_dim`, as [`AttentionProblem::value_dim`].
    pub fn value_dim(mut self, value_dim: usize) -> Self {
        self.value_dim = Some(value_dim);
        self
    }

    /// The head dimension of V and O.
    pub fn v_dim(&self) -> usize {
        self.value_dim.unwrap_or(self.head_dim)
    }

    /// The dense problem of one sequence of `seq_q` query and `seq_k` key rows (batch 1), with
    /// this problem's heads and options: what the sequence computes.
    pub fn sequence(&self, seq_q: usize, seq_k: usize) -> AttentionProblem {
        AttentionProblem {
            batch: 1,
            seq_q,
            seq_k,
            heads_q: self.heads_q,
            heads_kv: self.heads_kv,
            head_dim: self.head_dim,
            value_dim: self.value_dim,
            dtype: self.dtype,
            scale: self.scale,
            causal: self.causal,
            window: self.window,
            path: self.path,
            softcap: self.softcap,
            sinks: self.sinks,
        }
    }

    /// The shape of Q (and of O when `D_v = D`): `[total_q, heads_q, D]`.
    pub fn q_shape(&self) -> [usize; 3] {
        [self.total_q, self.heads_q, self.head_dim]
    }

    /// The shape of K (and of V when `D_v = D`): `[total_k, heads_kv, D]`.
    pub fn kv_shape(&self) -> [usize; 3] {
        [self.total_k, self.heads_kv, self.head_dim]
    }

    /// The shape of V: `[total_k, heads_kv, D_v]`.
    pub fn v_shape(&self) -> [usize; 3] {
        [self.total_k, self.heads_kv, self.v_dim()]
    }

    /// The shape of O: `[total_q, heads_q, D_v]`.
    pub fn o_shape(&self) -> [usize; 3] {
        [self.total_q, self.heads_q, self.v_dim()]
    }

    /// Elements of LSE: `heads_q * total_q`.
    pub fn lse_len(&self) -> usize {
        self.heads_q * self.total_q
    }

    /// Check sizes and options.
    pub fn validate(&self) -> Result<()> {
        for (what, v, min) in [
            ("batch", self.batch, 1),
            ("total_q", self.total_q, 0),
            ("total_k", self.total_k, 0),
            ("max_seqlen_q", self.max_seqlen_q, 0),
            ("max_seqlen_k", self.max_seqlen_k, 0),
            ("heads_q", self.heads_q, 1),
            ("heads_kv", self.heads_kv, 1),
            ("head_dim", self.head_dim, 1),
            ("value_dim", self.v_dim(), 1),
        ] {
            if v < min {
                return Err(Error::invalid(what, "must be at least 1"));
            }
            if v >= 1 << 30 {
                return Err(Error::invalid(what, "must be below 2^30"));
            }
        }
        self.sequence(1, 1).validate_options()?;
        if self.batch > 65535 || self.heads_q > 65535 {
            return Err(Error::unsupported(
                "grid",
                "batch and heads_q must be at most 65535",
            ));
        }
        for (what, max, total) in [
            ("max_seqlen_q", self.max_seqlen_q, self.total_q),
            ("max_seqlen_k", self.max_seqlen_k, self.total_k),
        ] {
            // Each sequence has at most `max` rows, so together at most `batch * max`.
            if max > total || total as u128 > self.batch as u128 * max as u128 {
                return Err(Error::invalid(
                    what,
                    format!(
                        "{max} is not a possible longest length of {} sequences of {total} rows",
                        self.batch
                    ),
                ));
            }
        }
        if self.heads_q as u128 * self.total_q as u128 > u32::MAX as u128 {
            return Err(Error::unsupported(
                "problem size",
                "heads_q * total_q must be below 2^32",
            ));
        }
        Ok(())
    }

    /// Check that `seqlens` are the boundaries of this problem: the same batch, totals and
    /// longest lengths.
    pub fn check_seqlens(&self, seqlens: &CuSeqlens) -> Result<()> {
        for (what, want, got) in [
            ("batch of cu_seqlens", self.batch, seqlens.batch()),
            ("total_q of cu_seqlens_q", self.total_q, seqlens.total_q()),
            ("total_k of cu_seqlens_k", self.total_k, seqlens.total_k()),
            (
                "max_seqlen_q of cu_seqlens_q",
                self.max_seqlen_q,
                seqlens.max_seqlen_q(),
            ),
            (
                "max_seqlen_k of cu_seqlens_k",
                self.max_seqlen_k,
                seqlens.max_seqlen_k(),
            ),
        ] {
            if want != got {
                return Err(Error::shape(what, want, got));
            }
        }
        Ok(())
    }

    /// Plan the forward pass on `tensors` for `target`: validates the problem and the tensors
    /// against it (views as in [`AttentionProblem::plan`], the boundaries' lengths; their
    /// contents are device data, clamped by the kernels) and picks the path (module docs).
    pub fn plan<T: AttentionElem>(
        &self,
        target: Target,
        tensors: &AttentionVarlenTensors<'_, T>,
    ) -> Result<AttentionVarlenPlan> {
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
        let packed = |[n, h, d]: [usize; 3]| [1, n, h, d];
        check_packed(&tensors.q, "Q", packed(self.q_shape()))?;
        check_packed(&tensors.k, "K", packed(self.kv_shape()))?;
        check_packed(&tensors.v, "V", packed(self.v_shape()))?;
        check_packed(&tensors.o, "O", packed(self.o_shape()))?;
        if self.total_q > 0 {
            tensors.o.check_distinct("O")?;
        }
        if tensors.lse.len() != self.lse_len() {
            return Err(Error::shape(
                "LSE",
                format!("{} elements", self.lse_len()),
                tensors.lse.len(),
            ));
        }
        for (what, cu) in [
            ("cu_seqlens_q", tensors.cu_seqlens_q),
            ("cu_seqlens_k", tensors.cu_seqlens_k),
        ] {
            if cu.len() != self.batch + 1 {
                return Err(Error::shape(
                    format!("{what} length"),
                    self.batch + 1,
                    cu.len(),
                ));
            }
        }
        check_sinks(self.sinks, self.heads_q, tensors.sinks.as_ref())?;
        check_tile_counter(tensors.tile_counter.as_ref())?;
        let dense = self.sequence(self.max_seqlen_q, self.max_seqlen_k);
        let hopper = match self.path {
            Path::Hopper if !target.arch.has_hopper_kernels() => {
                return Err(Error::unsupported(
                    "attention path Hopper",
                    format!("needs sm_90a, the target is {}", target.arch),
                ));
            }
            Path::Hopper => true,
            Path::Auto => target.arch.has_hopper_kernels(),
            Path::MmaSync => false,
        };
        // No query row: nothing to write, no launch (on any path).
        if hopper && self.max_seqlen_q > 0 {
            match self.hopper_plan(&dense, tensors, target.multiprocessors) {
                Ok(plan) => return Ok(plan),
                Err(e) if self.path == Path::Hopper => return Err(e),
                Err(_) => {}
            }
        }
        let kernel = if dense.has_value_dim() {
            mma_varlen_value_dim_kernel(self.dtype, self.head_dim as u32, self.v_dim() as u32)
                .expect("validated pair of head dimensions")
        } else {
            mma_varlen_kernel(self.dtype, self.head_dim as u32, dense.has_logit_options())
                .expect("validated head dimension")
        };
        let tiles = &kernel.tiles;
        let grid = (
            (self.max_seqlen_q as u32).div_ceil(tiles.block_m),
            self.heads_q as u32,
            self.batch as u32,
        );
        let (left, right) = dense.effective_window();
        let (scale_log2, logits) = dense.logit_params(tensors.sinks.as_ref());
        let params = AttentionVarlenParams {
            base: AttentionParams {
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
                seq_q: self.max_seqlen_q as u32,
                seq_k: self.max_seqlen_k as u32,
                heads_q: self.heads_q as u32,
                heads_kv: self.heads_kv as u32,
                scale_log2,
                window_left: left.map_or(UNBOUNDED, |l| l as i32),
                window_right: right.map_or(UNBOUNDED, |r| r as i32),
                num_m_blocks: grid.0,
                reverse_m: u32::from(self.causal),
                logits,
            },
            cu_seqlens_q: tensors.cu_seqlens_q.addr() as *const i32,
            cu_seqlens_k: tensors.cu_seqlens_k.addr() as *const i32,
            total_q: self.total_q as u32,
            total_k: self.total_k as u32,
        };
        Ok(AttentionVarlenPlan::MmaSync {
            kernel,
            // No query row: nothing to write, no launch.
            launch: (grid.0 > 0).then(|| Launch::new(&kernel.kernel, grid, *tiles, params)),
        })
    }

    /// The Hopper launch on the checked `tensors` (`dense`: the problem of the longest
    /// sequence) over the query slots, `(floor(total_q / 128) + batch) heads_q` of them
    /// ([`hopper_varlen_slots`]): one block per multiprocessor with a tile counter, else one
    /// block per slot; an
    /// error if there is no key row (a tensor map needs one), too many tiles for one launch, or
    /// a view a tensor map cannot describe.
    fn hopper_plan<T>(
        &self,
        dense: &AttentionProblem,
        tensors: &AttentionVarlenTensors<'_, T>,
        multiprocessors: u32,
    ) -> Result<AttentionVarlenPlan> {
        let kernel: &'static HopperKernel = if dense.has_value_dim() {
            hopper_value_dim_kernel(self.dtype, self.head_dim as u32, self.v_dim() as u32, true)
                .expect("validated pair of head dimensions")
        } else {
            hopper_varlen_kernel(self.dtype, self.head_dim as u32, dense.has_logit_options())
                .expect("validated head dimension")
        };
        if self.total_k == 0 {
            return Err(Error::unsupported(
                "attention path Hopper",
                "no key row in the batch (a tensor map needs one); Path::Auto takes mma.sync",
            ));
        }
        // Query slots per head: every sequence's query blocks, without the blocks past a short
        // sequence's end that a `max_seqlen_q` grid would launch.
        let num_m_blocks = hopper_varlen_slots(self.total_q as u32, self.batch as u32);
        let tiles = u64::from(num_m_blocks) * self.heads_q as u64;
        if tiles > u64::from(HOPPER_MAX_TILES) {
            return Err(Error::unsupported(
                "attention path Hopper",
                format!("{tiles} query tiles; one launch takes at most {HOPPER_MAX_TILES}"),
            ));
        }
        let maps = [
            packed_tile_map(self.dtype, &tensors.q, HOPPER_BLOCK_M)?,
            packed_tile_map(self.dtype, &tensors.k, kernel.cfg.block_n)?,
            packed_tile_map(self.dtype, &tensors.v, kernel.cfg.block_n)?,
        ];
        let tiles = u32::try_from(tiles).expect("checked above");
        // The longest sequence's problem with `batch` sequences: the sizes the kernels read.
        let params = HopperParams {
            num_m_blocks,
            num_tiles: tiles,
            cu_seqlens_q: tensors.cu_seqlens_q.addr() as *const i32,
            cu_seqlens_k: tensors.cu_seqlens_k.addr() as *const i32,
            total_q: self.total_q as u32,
            total_k: self.total_k as u32,
            tile_counter: tensors
                .tile_counter
                .map_or(std::ptr::null_mut(), |c| c.addr() as *mut u32),
            ..AttentionProblem {
                batch: self.batch,
                ..dense.clone()
            }
            .hopper_params(&tensors.o, &tensors.lse, tensors.sinks.as_ref())
        };
        // The lengths differ, so the work is balanced at run time: by the blocks drawing their
        // tiles from the counter, or by the hardware's block scheduler with one block per tile
        // (a persistent grid walking the tiles in a fixed order measured 0.89-0.96x at D 128;
        // bench/NOTES.md).
        let blocks = if tensors.tile_counter.is_some() {
            tiles.min(multiprocessors.max(1))
        } else {
            tiles
        };
        Ok(AttentionVarlenPlan::Hopper(AttentionPlan::Hopper {
            kernel,
            grid: (blocks, 1, 1),
            maps,
            params,
        }))
    }
}

/// Check a packed tensor's view (`[1, rows, heads, D]`), as the dense views are checked; an
/// empty one (no rows) only by its shape.
pub(super) fn check_packed<T>(view: &View<'_, T>, what: &str, shape: [usize; 4]) -> Result<()> {
    if shape[1] == 0 {
        return if view.shape() == shape {
            Ok(())
        } else {
            Err(Error::shape(
                format!("{what} shape"),
                format!("{:?}", &shape[1..]),
                format!("{:?}", &view.shape()[1..]),
            ))
        };
    }
    view.check(what, shape)
}

/// The tensors of a forward pass over packed sequences.
pub struct AttentionVarlenTensors<'a, T> {
    /// Q `[total_q, heads_q, D]`, as a view of shape `[1, total_q, heads_q, D]`
    /// ([`View::packed`]).
    pub q: View<'a, T>,
    /// K `[total_k, heads_kv, D]`, as Q.
    pub k: View<'a, T>,
    /// V `[total_k, heads_kv, D_v]`, as K (`D_v` = D but for a problem with
    /// [`AttentionVarlenProblem::value_dim`]).
    pub v: View<'a, T>,
    /// O `[total_q, heads_q, D_v]`, as Q (written; must not overlap the inputs).
    pub o: View<'a, T>,
    /// LSE `[heads_q, total_q]` f32, contiguous (written).
    pub lse: DevView<'a, f32>,
    /// `[batch + 1]` query offsets.
    pub cu_seqlens_q: DevView<'a, i32>,
    /// `[batch + 1]` key offsets.
    pub cu_seqlens_k: DevView<'a, i32>,
    /// The sink logits `[heads_q]` f32, when the problem has sinks.
    pub sinks: Option<DevView<'a, f32>>,
    /// The tile counter of the Hopper path's persistent grid, or `None` for one block per query
    /// tile: one u32, zero when the launch starts (the kernel leaves it zero), which no other
    /// launch uses while this one runs. With it the Hopper kernel runs one block per
    /// multiprocessor, each drawing its next tile from the counter as it finishes one (the
    /// lengths differ, so tiles are claimed as blocks free up); the `mma.sync` path does not
    /// read it.
    pub tile_counter: Option<DevView<'a, u32>>,
}

impl<T> Clone for AttentionVarlenTensors<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for AttentionVarlenTensors<'_, T> {}

impl<'a, T> View<'a, T> {
    /// A packed `[rows, heads, head_dim]` tensor from element `offset` with element `strides`
    /// (rank 3), as the view of shape `[1, rows, heads, head_dim]` the packed plans take.
    pub fn packed(
        buffer: impl Into<DevView<'a, T>>,
        offset: usize,
        shape: &[usize],
        strides: &[usize],
    ) -> Result<Self> {
        let shape: [usize; 3] = shape
            .try_into()
            .map_err(|_| Error::shape("packed tensor rank", 3, shape.len()))?;
        let strides: [usize; 3] = strides
            .try_into()
            .map_err(|_| Error::shape("packed stride count", 3, strides.len()))?;
        // The batch stride is never used (one batch entry); any multiple of 8 keeps the
        // alignment checks quiet.
        View::new(
            buffer,
            offset,
            &[1, shape[0], shape[1], shape[2]],
            &[0, strides[0], strides[1], strides[2]],
        )
    }

    /// A contiguous packed `[rows, heads, head_dim]` tensor filling `buffer` from its start.
    pub fn packed_contiguous(buffer: impl Into<DevView<'a, T>>, shape: [usize; 3]) -> Self {
        let [_, h, d] = shape;
        View::packed(buffer, 0, &shape, &[h * d, d, 1]).expect("rank 3 shape and strides")
    }
}

/// A planned forward pass over packed sequences: one launch on one of the two paths, or none
/// when there is no query row.
#[allow(clippy::large_enum_variant)]
pub enum AttentionVarlenPlan {
    /// The `mma.sync` path.
    MmaSync {
        /// The kernel.
        kernel: &'static MmaVarlenKernel,
        /// Its launch: grid `(ceil(max_seqlen_q / block_m), heads_q, batch)`; `None` without
        /// query rows.
        launch: Option<Launch<AttentionVarlenParams>>,
    },
    /// The Hopper path: the dense forward's plan of the `varlen` kernel (same parameters, the
    /// boundaries in `cu_seqlens_*`; a persistent grid drawing the tiles from the tile counter,
    /// or one block per query tile).
    Hopper(AttentionPlan),
}

impl AttentionVarlenPlan {
    /// What the kernel's handle declares.
    pub fn kernel(&self) -> KernelDecl {
        match self {
            AttentionVarlenPlan::MmaSync { kernel, .. } => kernel.kernel.info(),
            AttentionVarlenPlan::Hopper(plan) => plan.kernel(),
        }
    }

    /// Whether the plan takes the Hopper path.
    pub fn is_hopper(&self) -> bool {
        matches!(self, AttentionVarlenPlan::Hopper(_))
    }

    /// Grid, block and shared memory of the launch, if any.
    pub fn config(&self) -> Option<LaunchConfig> {
        match self {
            AttentionVarlenPlan::MmaSync { launch, .. } => launch.as_ref().map(|l| *l.config()),
            AttentionVarlenPlan::Hopper(plan) => Some(plan.config()),
        }
    }

    /// Run the plan (asynchronous on a stream: synchronize before reading O and LSE).
    ///
    /// # Safety
    /// The tensors the plan was made for are live memory of `exec` for the whole run, and O and
    /// LSE overlap neither each other nor the inputs; the tile counter, if any, is zero, and no
    /// other launch uses it until this one has completed.
    pub unsafe fn run(&self, exec: &impl Exec) -> Result<()> {
        match self {
            AttentionVarlenPlan::MmaSync { launch: None, .. } => Ok(()),
            // SAFETY: the plan checked every view against its memory, LSE's length
            // (heads_q * total_q) and the boundaries' lengths (batch + 1), validated the sizes
            // and window; the kernel clamps the boundaries' contents to the totals, so every row
            // it touches is inside the checked views; the grid is (num_m_blocks, heads_q,
            // batch); the memory is live and the outputs alias nothing (the caller's contract).
            AttentionVarlenPlan::MmaSync {
                launch: Some(launch),
                ..
            } => {
                // SAFETY: as stated above.
                unsafe { exec.launch(launch) }
            }
            // SAFETY: as above, the tensor maps describing the checked packed views (TMA reads
            // past a map's rows are filled with zeros, never performed), the grid at most one
            // block per tile of the `num_tiles` the kernel walks, the tile counter as the
            // caller guarantees.
            AttentionVarlenPlan::Hopper(plan) => unsafe { plan.run(exec) },
        }
    }
}

/// Launch the forward pass over packed sequences on `stream` (asynchronous): O into `o`
/// (`[total_q, heads_q, D]`, [`View::packed`]), LSE `[heads_q, total_q]` into `lse`. The problem
/// must be the one of `seqlens` ([`AttentionVarlenProblem::new`]). The output must not overlap
/// the inputs. The Hopper path draws its tiles from the tile counter of `seqlens` (borrowed
/// mutably: see [`DeviceCuSeqlens`] on passes that run concurrently).
#[allow(clippy::too_many_arguments)]
pub fn forward_varlen<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionVarlenProblem,
    seqlens: &mut DeviceCuSeqlens,
    q: &View<T>,
    k: &View<T>,
    v: &View<T>,
    o: &mut View<T>,
    lse: &mut DeviceBuffer<f32>,
) -> Result<()> {
    launch_varlen(gpu, stream, problem, seqlens, (q, k, v), o, lse, None)
}

/// [`forward_varlen`] of a problem with attention sinks ([`AttentionVarlenProblem::sinks`]):
/// their logits `[heads_q]` f32 in `sinks`.
#[allow(clippy::too_many_arguments)]
pub fn forward_varlen_with_sinks<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionVarlenProblem,
    seqlens: &mut DeviceCuSeqlens,
    q: &View<T>,
    k: &View<T>,
    v: &View<T>,
    o: &mut View<T>,
    lse: &mut DeviceBuffer<f32>,
    sinks: &DeviceBuffer<f32>,
) -> Result<()> {
    launch_varlen(
        gpu,
        stream,
        problem,
        seqlens,
        (q, k, v),
        o,
        lse,
        Some(sinks),
    )
}

#[allow(clippy::too_many_arguments)]
fn launch_varlen<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionVarlenProblem,
    seqlens: &mut DeviceCuSeqlens,
    (q, k, v): (&View<T>, &View<T>, &View<T>),
    o: &mut View<T>,
    lse: &mut DeviceBuffer<f32>,
    sinks: Option<&DeviceBuffer<f32>>,
) -> Result<()> {
    problem.validate()?;
    problem.check_seqlens(&seqlens.host)?;
    let tensors = AttentionVarlenTensors {
        q: *q,
        k: *k,
        v: *v,
        o: *o,
        lse: (&*lse).into(),
        cu_seqlens_q: (&seqlens.q).into(),
        cu_seqlens_k: (&seqlens.k).into(),
        sinks: sinks.map(Into::into),
        tile_counter: Some((&seqlens.tile_counter).into()),
    };
    let plan = problem.plan(Target::of(gpu), &tensors)?;
    // SAFETY: the views, `lse` and `seqlens` are borrowed for the whole call, which enqueues the
    // launch; `o`, `lse` and the tile counter are borrowed mutably (the caller keeps O apart
    // from the inputs and orders the passes over one `DeviceCuSeqlens`, as documented); the
    // counter was uploaded as zero and every launch leaves it zero.
    unsafe { plan.run(&OnStream { gpu, stream }) }
}
