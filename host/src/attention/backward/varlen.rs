//! The backward pass over packed sequences (FlashAttention's `flash_attn_varlen_func`
//! backward): dQ, dK, dV of the forward over packed sequences
//! ([`super::super::forward_varlen`]), as [`super::super::reference::backward_varlen`]
//! specifies them. Q, O, dO, dQ `[total_q, heads_q, D]`, K, V, dK, dV `[total_k, heads_kv, D]`,
//! LSE and dLSE `[heads_q, total_q]`; each sequence is the dense backward of its own lengths.
//!
//! The same steps as the dense backward, on the `_varlen_` kernels (the dense kernels' bodies
//! on the packed layout): [`AttentionVarlenProblem::plan_backward`] on
//! [`AttentionVarlenBackwardTensors`] gives an [`AttentionVarlenBackwardPlan`] (pure), which
//! runs on any executor with a [`BackwardWorkspace`] (`delta'` `[heads_q, total_q]`, the dQ
//! accumulator); [`backward_varlen`] does it all on `cust` buffers.
//! The grids are sized for the longest sequence; blocks past their sequence's rows return at
//! once. A launch with an empty grid (no query rows, or no key rows) is left out; the others
//! still write every gradient row (zeros for rows that see no key or no query).
//!
//! Paths, as the dense backward's: on sm_90a ([`Path::Auto`], or [`Path::Hopper`]) the Hopper
//! dK/dV/dQ kernel over packed sequences (`attention_bwd_hopper_dkdvq_varlen_*`, the dense
//! kernel's body on tensor maps of the packed tensors) and its conversion, in both modes (in
//! deterministic mode with its dQ additions ordered); head dimensions without a kernel of
//! their own run the next one of 64, 128, 256 on zero-padded columns. Elsewhere, and where a
//! tensor map cannot describe a view or the batch has no query or no key row, the `mma.sync`
//! kernels. The accumulator has the Hopper kernel's packed tiled layout
//! ([`kernel_abi::attention::hopper_bwd::dq_accum_varlen_row0`]) whatever the path, so that
//! its size does not depend on the GPU.

use super::super::plan::{Target, packed_tile_map};
use super::super::problem::{AttentionElem, Path, View};
use super::super::varlen::{AttentionVarlenProblem, DeviceCuSeqlens, check_packed};
use super::plan::{
    AttentionBackwardTensors, BackwardOptions, BackwardPath, BackwardWorkspace,
    BackwardWorkspaceLens, check_outputs_apart, order_group, workspace_pointers,
};
use crate::error::{Error, Result};
use crate::exec::{DevView, Exec, OnStream};
use crate::gpu::{Gpu, LaunchConfig};
use crate::launch::Launch;
use crate::memory::zeroed;
use crate::tensor_map::MapSpec;
use cust::memory::DeviceBuffer;
use cust::stream::Stream;
use kernel_abi::attention::UNBOUNDED;
use kernel_abi::attention::backward::{
    ATTENTION_BWD_DSINKS_VARLEN, AttentionBwdParams, AttentionBwdVarlenParams, BwdKernels,
    ROW_BLOCK, bwd_varlen_kernels,
};
use kernel_abi::attention::hopper_bwd::{
    HopperBwdParams, HopperDkdvq, dq_accum_varlen_len, dq_order_varlen_len,
    hopper_bwd_varlen_kernel,
};
use kernel_abi::{KernelDecl, TensorMap};

/// The tensors of a backward pass over packed sequences. Packed tensors are views of shape
/// `[1, rows, heads, D]` ([`View::packed`]). The outputs must overlap neither each other nor
/// the inputs.
pub struct AttentionVarlenBackwardTensors<'a, T> {
    /// Q `[total_q, heads_q, D]`.
    pub q: View<'a, T>,
    /// K `[total_k, heads_kv, D]`.
    pub k: View<'a, T>,
    /// V `[total_k, heads_kv, D_v]` (`D_v` = D but for a pair of
    /// [`kernel_abi::attention::VALUE_DIMS`]).
    pub v: View<'a, T>,
    /// O of the forward `[total_q, heads_q, D_v]`.
    pub o: View<'a, T>,
    /// dO, as O.
    pub d_o: View<'a, T>,
    /// LSE of the forward `[heads_q, total_q]` f32 (natural log), contiguous.
    pub lse: DevView<'a, f32>,
    /// dLSE, as LSE; `None` when the loss does not depend on LSE.
    pub d_lse: Option<DevView<'a, f32>>,
    /// dQ, as Q (written).
    pub dq: View<'a, T>,
    /// dK, as K (written; with grouped-query attention the sum over the group's query heads).
    pub dk: View<'a, T>,
    /// dV, as V (written, as dK).
    pub dv: View<'a, T>,
    /// `[batch + 1]` query offsets.
    pub cu_seqlens_q: DevView<'a, i32>,
    /// `[batch + 1]` key offsets.
    pub cu_seqlens_k: DevView<'a, i32>,
    /// The sink logits `[heads_q]` f32 of a problem with sinks, the forward's; `None` without.
    pub sinks: Option<DevView<'a, f32>>,
    /// The sinks' gradient `[heads_q]` f32 (written, summed over every sequence) of a problem
    /// with sinks; `None` without.
    pub d_sinks: Option<DevView<'a, f32>>,
}

impl<T> Clone for AttentionVarlenBackwardTensors<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for AttentionVarlenBackwardTensors<'_, T> {}

/// The dK/dV launch of a backward over packed sequences: the `mma.sync` kernels', or the
/// Hopper dK/dV/dQ kernel's (its tensor maps zero until [`AttentionVarlenBackwardPlan::run`]
/// encodes them).
// Launches are built once per plan and passed by reference: the size gap costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum VarlenBwdLaunch {
    /// An `mma.sync` kernel.
    MmaSync(Launch<AttentionBwdVarlenParams>),
    /// The Hopper dK/dV/dQ kernel.
    Hopper(Launch<HopperBwdParams>),
}

impl VarlenBwdLaunch {
    /// The kernel's handle.
    pub fn kernel(&self) -> &KernelDecl {
        match self {
            VarlenBwdLaunch::MmaSync(l) => l.kernel(),
            VarlenBwdLaunch::Hopper(l) => l.kernel(),
        }
    }

    /// The kernel's name.
    pub fn name(&self) -> &'static str {
        self.kernel().name
    }

    /// Grid, block and shared memory.
    pub fn config(&self) -> &LaunchConfig {
        match self {
            VarlenBwdLaunch::MmaSync(l) => l.config(),
            VarlenBwdLaunch::Hopper(l) => l.config(),
        }
    }

    /// The parameters every backward kernel over packed sequences reads (the Hopper kernel's
    /// beside its tensor maps).
    pub fn params(&self) -> AttentionBwdVarlenParams {
        match self {
            VarlenBwdLaunch::MmaSync(l) => *l.params(),
            VarlenBwdLaunch::Hopper(l) => {
                let p = l.params();
                AttentionBwdVarlenParams {
                    base: p.base,
                    cu_seqlens_q: p.cu_seqlens_q,
                    cu_seqlens_k: p.cu_seqlens_k,
                    total_q: p.total_q,
                    total_k: p.total_k,
                }
            }
        }
    }
}

/// The launches of a planned backward over packed sequences, in order; a launch whose grid is
/// empty is `None`.
pub struct VarlenBackwardLaunches {
    /// `delta'` and the zeroed accumulator (`None` without query rows).
    pub pre: Option<Launch<AttentionBwdVarlenParams>>,
    /// dK, dV (and dQ into the accumulator unless deterministic on the `mma.sync` path; `None`
    /// without key rows).
    pub dkdv: Option<VarlenBwdLaunch>,
    /// dQ: the conversion of the accumulator, or the deterministic dQ kernel (`None` without
    /// query rows).
    pub dq: Option<Launch<AttentionBwdVarlenParams>>,
    /// The sinks' gradient (after the preprocess; zeros without query rows), with sinks.
    pub dsinks: Option<Launch<AttentionBwdVarlenParams>>,
}

/// The Hopper kernels of a backward over packed sequences and their tensor maps of Q, dO, K, V
/// (encoded when they run).
struct VarlenHopper {
    kernels: &'static HopperDkdvq,
    maps: [MapSpec; 4],
}

/// A planned backward pass over packed sequences: up to three launches, the workspace sizes.
pub struct AttentionVarlenBackwardPlan {
    kernels: &'static BwdKernels<AttentionBwdVarlenParams>,
    /// The kernels of the value head dimension (`kernels` but under a pair): their preprocess
    /// reads O and dO.
    value_kernels: &'static BwdKernels<AttentionBwdVarlenParams>,
    hopper: Option<VarlenHopper>,
    deterministic: bool,
    /// Whether the logits are soft-capped (the `softcap` kernels).
    softcap: bool,
    /// Whether the problem has sinks (the dsinks kernel).
    sinks: bool,
    /// Parameters with null workspace pointers (filled in by
    /// [`AttentionVarlenBackwardPlan::launches`]).
    params: AttentionBwdVarlenParams,
    row_grid: (u32, u32, u32),
    dkdv_grid: (u32, u32, u32),
    /// The deterministic mode's interleaving of the dK/dV grid's (key/value head, sequence)
    /// pairs ([`dq_order_group`]), used where its dQ additions are ordered.
    order_group: u32,
    dq_grid: (u32, u32, u32),
    delta_len: usize,
    dq_accum_len: usize,
}

impl AttentionVarlenProblem {
    /// Plan the backward pass on `tensors` for `target`: validates the problem, every view (as
    /// the forward over packed sequences validates its views: shape, contiguous head
    /// dimension, 16-byte aligned start and strides, in bounds; views without rows by their
    /// shape only), LSE's and dLSE's lengths, the boundaries' lengths, that no output has
    /// elements sharing memory and that the outputs overlap neither each other nor the inputs,
    /// and picks the path from the problem's `path` (module docs). The boundaries' contents are
    /// device data, clamped by the kernels.
    pub fn plan_backward<T: AttentionElem>(
        &self,
        target: Target,
        tensors: &AttentionVarlenBackwardTensors<'_, T>,
        options: BackwardOptions,
    ) -> Result<AttentionVarlenBackwardPlan> {
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
        let t = tensors;
        let packed = |[n, h, d]: [usize; 3]| [1, n, h, d];
        let (qs, ks) = (packed(self.q_shape()), packed(self.kv_shape()));
        let (vs, os) = (packed(self.v_shape()), packed(self.o_shape()));
        for (what, view, shape) in [
            ("Q", &t.q, qs),
            ("K", &t.k, ks),
            ("V", &t.v, vs),
            ("O", &t.o, os),
            ("dO", &t.d_o, os),
            ("dQ", &t.dq, qs),
            ("dK", &t.dk, ks),
            ("dV", &t.dv, vs),
        ] {
            check_packed(view, what, shape)?;
        }
        for (what, view, rows) in [
            ("dQ", &t.dq, self.total_q),
            ("dK", &t.dk, self.total_k),
            ("dV", &t.dv, self.total_k),
        ] {
            if rows > 0 {
                view.check_distinct(what)?;
            }
        }
        for (what, len) in [
            ("LSE", Some(t.lse.len())),
            ("dLSE", t.d_lse.map(|d| d.len())),
        ] {
            if let Some(len) = len
                && len != self.lse_len()
            {
                return Err(Error::shape(
                    what,
                    format!("{} elements", self.lse_len()),
                    len,
                ));
            }
        }
        for (what, cu) in [
            ("cu_seqlens_q", t.cu_seqlens_q),
            ("cu_seqlens_k", t.cu_seqlens_k),
        ] {
            if cu.len() != self.batch + 1 {
                return Err(Error::shape(
                    format!("{what} length"),
                    self.batch + 1,
                    cu.len(),
                ));
            }
        }
        check_outputs_apart(&AttentionBackwardTensors {
            q: t.q,
            k: t.k,
            v: t.v,
            o: t.o,
            d_o: t.d_o,
            lse: t.lse,
            d_lse: t.d_lse,
            dq: t.dq,
            dk: t.dk,
            dv: t.dv,
            sinks: t.sinks,
            d_sinks: t.d_sinks,
        })?;
        let d = self.head_dim as u32;
        let kernels = bwd_varlen_kernels(self.dtype, d).expect("validated head dimension");
        let value_kernels =
            bwd_varlen_kernels(self.dtype, self.v_dim() as u32).expect("validated value dimension");
        let dense = self.sequence(self.max_seqlen_q, self.max_seqlen_k);
        dense.check_backward_sinks(t.sinks.as_ref(), t.d_sinks.as_ref())?;
        let (left, right) = dense.effective_window();
        let scale = dense.softmax_scale();
        let (scale_log2, logits) = dense.logit_params(t.sinks.as_ref());
        let hopper = self.backward_hopper(target, dense.softcap.is_some(), t)?;
        if dense.has_value_dim() && hopper.is_none() {
            return Err(Error::unsupported(
                "the backward with V and O of their own head dimension",
                if self.path == Path::MmaSync {
                    "the mma.sync backward kernels take one head dimension for Q, K, V and O"
                        .to_string()
                } else if !target.arch.has_hopper_kernels() {
                    format!(
                        "the Hopper backward kernels (sm_90a) compute it; this GPU runs {}",
                        target.arch
                    )
                } else {
                    "the Hopper kernels need query and key rows in the batch and views \
                     tensor maps describe"
                        .to_string()
                },
            ));
        }
        let params = AttentionBwdVarlenParams {
            base: AttentionBwdParams {
                q: t.q.ptr() as *const u16,
                k: t.k.ptr() as *const u16,
                v: t.v.ptr() as *const u16,
                o: t.o.ptr() as *const u16,
                d_o: t.d_o.ptr() as *const u16,
                dq: t.dq.ptr() as *mut u16,
                dk: t.dk.ptr() as *mut u16,
                dv: t.dv.ptr() as *mut u16,
                lse: t.lse.addr() as *const f32,
                d_lse: t.d_lse.map_or(std::ptr::null(), |d| d.addr() as *const f32),
                delta: std::ptr::null_mut(),
                dq_accum: std::ptr::null_mut(),
                dq_order: std::ptr::null_mut(),
                q_strides: t.q.strides3(),
                k_strides: t.k.strides3(),
                v_strides: t.v.strides3(),
                o_strides: t.o.strides3(),
                do_strides: t.d_o.strides3(),
                dq_strides: t.dq.strides3(),
                dk_strides: t.dk.strides3(),
                dv_strides: t.dv.strides3(),
                batch: self.batch as u32,
                seq_q: self.max_seqlen_q as u32,
                seq_k: self.max_seqlen_k as u32,
                heads_q: self.heads_q as u32,
                heads_kv: self.heads_kv as u32,
                scale,
                scale_log2,
                window_left: left.map_or(UNBOUNDED, |l| l as i32),
                window_right: right.map_or(UNBOUNDED, |r| r as i32),
                dq_accum_tiled: hopper.as_ref().map_or(0, |h| h.kernels.cfg.head_dim),
                head_dim: d,
                value_dim: self.v_dim() as u32,
                logits,
                d_sinks: t
                    .d_sinks
                    .map_or(std::ptr::null_mut(), |s| s.addr() as *mut f32),
            },
            cu_seqlens_q: t.cu_seqlens_q.addr() as *const i32,
            cu_seqlens_k: t.cu_seqlens_k.addr() as *const i32,
            total_q: self.total_q as u32,
            total_k: self.total_k as u32,
        };
        let (sq, sk) = (self.max_seqlen_q as u32, self.max_seqlen_k as u32);
        let (hq, hkv, b) = (self.heads_q as u32, self.heads_kv as u32, self.batch as u32);
        let workspace = self.backward_workspace_lens(options);
        let block_n = hopper
            .as_ref()
            .map_or(kernels.tiles.block_n, |h| h.kernels.cfg.block_n());
        Ok(AttentionVarlenBackwardPlan {
            kernels,
            value_kernels,
            hopper,
            deterministic: options.deterministic,
            softcap: dense.softcap.is_some(),
            sinks: dense.sinks,
            params,
            row_grid: (sq.div_ceil(ROW_BLOCK), hq, b),
            dkdv_grid: (sk.div_ceil(block_n), hkv, b),
            order_group: order_group(right, sk.div_ceil(block_n), hkv * b, target),
            dq_grid: (sq.div_ceil(kernels.dq_tiles.block_m), hq, b),
            delta_len: workspace.delta,
            dq_accum_len: workspace.dq_accum,
        })
    }

    /// The f32 elements of the backward's workspace with `options`, whatever the path:
    /// `delta'` `heads_q total_q`; the dQ accumulator in the Hopper kernel's packed tiled
    /// layout (`heads_q (floor(total_q / 64) + batch)` tiles of 64 rows as wide as the
    /// kernel's head dimension; the `mma.sync` path uses its first `heads_q total_q D`
    /// elements), in deterministic mode followed by one u32 counter per tile (rounded up to 4).
    pub fn backward_workspace_lens(&self, options: BackwardOptions) -> BackwardWorkspaceLens {
        let (hq, tq, b) = (self.heads_q, self.total_q, self.batch);
        let accum = dq_accum_varlen_len(hq, tq, b, self.dq_accum_width());
        BackwardWorkspaceLens {
            delta: self.lse_len(),
            dq_accum: if options.deterministic {
                accum + dq_order_varlen_len(hq, tq, b).next_multiple_of(4)
            } else {
                accum
            },
        }
    }

    /// The row width of the dQ accumulator: the head dimension of the Hopper kernel the
    /// backward may take (at least this problem's).
    fn dq_accum_width(&self) -> usize {
        let (d, softcap) = (self.head_dim as u32, self.softcap.is_some());
        hopper_bwd_varlen_kernel(self.dtype, d, softcap)
            .map_or(self.head_dim, |k| k.head_dim as usize)
    }

    /// The Hopper kernels for the checked tensors `t` on `target`, if the backward takes them
    /// (module docs): with [`Path::Auto`] where the target has them, the batch has query and
    /// key rows and tensor maps describe Q, dO, K and V; with [`Path::Hopper`] likewise, but
    /// an error where they cannot run; [`Path::MmaSync`] never.
    fn backward_hopper<T>(
        &self,
        target: Target,
        softcap: bool,
        t: &AttentionVarlenBackwardTensors<'_, T>,
    ) -> Result<Option<VarlenHopper>> {
        let has = target.arch.has_hopper_kernels();
        match self.path {
            Path::MmaSync => return Ok(None),
            Path::Hopper if !has => {
                return Err(Error::unsupported(
                    "attention path Hopper",
                    format!("needs the sm_90a kernels; this GPU runs {}", target.arch),
                ));
            }
            Path::Auto if !has => return Ok(None),
            Path::Auto | Path::Hopper => {}
        }
        let plan = (|| {
            let kernels = hopper_bwd_varlen_kernel(self.dtype, self.head_dim as u32, softcap)
                .and_then(|k| k.fused.as_ref())
                .ok_or_else(|| {
                    Error::unsupported(
                        "attention path Hopper",
                        format!("no backward kernel for head dimension {}", self.head_dim),
                    )
                })?;
            if self.total_q == 0 || self.total_k == 0 {
                return Err(Error::unsupported(
                    "attention path Hopper",
                    "no query or no key row in the batch (a tensor map needs one); \
                     Path::Auto takes mma.sync",
                ));
            }
            let cfg = kernels.cfg;
            Ok(VarlenHopper {
                kernels,
                maps: [
                    packed_tile_map(self.dtype, &t.q, cfg.block_m)?,
                    packed_tile_map(self.dtype, &t.d_o, cfg.block_m)?,
                    packed_tile_map(self.dtype, &t.k, cfg.block_n())?,
                    packed_tile_map(self.dtype, &t.v, cfg.block_n())?,
                ],
            })
        })();
        match plan {
            Ok(h) => Ok(Some(h)),
            Err(e) if self.path == Path::Hopper => Err(e),
            // Strides a tensor map cannot describe, an empty batch: mma.sync handles any.
            Err(_) => Ok(None),
        }
    }
}

impl AttentionVarlenBackwardPlan {
    /// The path.
    pub fn path(&self) -> BackwardPath {
        if self.hopper.is_some() {
            BackwardPath::Hopper
        } else {
            BackwardPath::MmaSync
        }
    }

    /// Whether the plan was made in deterministic mode.
    pub fn deterministic(&self) -> bool {
        self.deterministic
    }

    /// The kernels of the plan's element type and head dimension.
    pub fn kernels(&self) -> &'static BwdKernels<AttentionBwdVarlenParams> {
        self.kernels
    }

    /// f32 elements of the workspace's `delta'`: `heads_q total_q`.
    pub fn delta_len(&self) -> usize {
        self.delta_len
    }

    /// f32 elements of the workspace's dQ accumulator (as
    /// [`AttentionVarlenProblem::backward_workspace_lens`]).
    pub fn dq_accum_len(&self) -> usize {
        self.dq_accum_len
    }

    /// The launches with the workspace `ws`, after checking its sizes and alignment.
    pub fn launches(&self, ws: &BackwardWorkspace<'_>) -> Result<VarlenBackwardLaunches> {
        let (delta, dq_accum) = workspace_pointers(ws, self.delta_len, self.dq_accum_len)?;
        // The accumulator is used by the dK/dV/dQ kernels only (null otherwise, so that the
        // preprocess does not zero it); the counters follow the tiled accumulator.
        let fused = self.hopper.is_some() || !self.deterministic;
        let ordered = self.hopper.is_some() && self.deterministic;
        let p = &self.params;
        let tiled = dq_accum_varlen_len(
            p.base.heads_q as usize,
            p.total_q as usize,
            p.base.batch as usize,
            p.base.dq_accum_tiled as usize,
        );
        let params = AttentionBwdVarlenParams {
            base: AttentionBwdParams {
                delta,
                dq_accum: if fused {
                    dq_accum
                } else {
                    std::ptr::null_mut()
                },
                dq_order: if ordered {
                    dq_accum.wrapping_add(tiled) as *mut u32
                } else {
                    std::ptr::null_mut()
                },
                ..self.params.base
            },
            ..self.params
        };
        let k = self.kernels;
        let nonempty = |g: (u32, u32, u32)| g.0 > 0;
        let (dkdv, dq) = if let Some(h) = &self.hopper {
            let hp = HopperBwdParams {
                tmap_q: TensorMap::ZEROED,
                tmap_do: TensorMap::ZEROED,
                tmap_k: TensorMap::ZEROED,
                tmap_v: TensorMap::ZEROED,
                base: params.base,
                cu_seqlens_q: params.cu_seqlens_q,
                cu_seqlens_k: params.cu_seqlens_k,
                total_q: params.total_q,
                total_k: params.total_k,
                order_group: if ordered { self.order_group } else { 1 },
            };
            let f = h.kernels;
            (
                nonempty(self.dkdv_grid).then(|| {
                    VarlenBwdLaunch::Hopper(Launch::new(&f.varlen, self.dkdv_grid, f.cfg, hp))
                }),
                // The conversion's blocks are the accumulator's tiles: the preprocess's grid.
                nonempty(self.row_grid)
                    .then(|| Launch::new(&f.convert_varlen, self.row_grid, (), params)),
            )
        } else if self.deterministic {
            let (dkdv, dq) = if self.softcap {
                (&k.dkdv_softcap, &k.dq_softcap)
            } else {
                (&k.dkdv, &k.dq)
            };
            (
                nonempty(self.dkdv_grid).then(|| {
                    VarlenBwdLaunch::MmaSync(Launch::new(dkdv, self.dkdv_grid, k.tiles, params))
                }),
                nonempty(self.dq_grid).then(|| Launch::new(dq, self.dq_grid, k.dq_tiles, params)),
            )
        } else {
            let dkdv = if self.softcap {
                &k.dkdv_dq_softcap
            } else {
                &k.dkdv_dq
            };
            (
                nonempty(self.dkdv_grid).then(|| {
                    VarlenBwdLaunch::MmaSync(Launch::new(dkdv, self.dkdv_grid, k.tiles, params))
                }),
                nonempty(self.row_grid)
                    .then(|| Launch::new(&k.dq_convert, self.row_grid, (), params)),
            )
        };
        let heads = (self.params.base.heads_q, 1, 1);
        let dsinks = (self.sinks && nonempty(heads))
            .then(|| Launch::new(&ATTENTION_BWD_DSINKS_VARLEN, heads, (), params));
        Ok(VarlenBackwardLaunches {
            pre: nonempty(self.row_grid)
                .then(|| Launch::new(&self.value_kernels.pre, self.row_grid, (), params)),
            dkdv,
            dq,
            dsinks,
        })
    }

    /// Run the plan's launches with the workspace `ws` (asynchronous on a stream: synchronize
    /// before reading the gradients or releasing the workspace).
    ///
    /// # Safety
    /// The tensors the plan was made for and the workspace are live memory of `exec` for the
    /// whole run; the workspace overlaps none of the tensors.
    pub unsafe fn run(&self, exec: &impl Exec, ws: &BackwardWorkspace<'_>) -> Result<()> {
        let launches = self.launches(ws)?;
        // SAFETY: (every launch) the plan checked every view (shape, contiguous head
        // dimension, 16-byte aligned start and strides, in bounds of its memory), LSE's and
        // dLSE's lengths (heads_q total_q), the boundaries' lengths (batch + 1), that the
        // outputs alias nothing, and validated the sizes and window; the kernels clamp the
        // boundaries' contents to the totals (and the lengths to the longest), so every row
        // they touch is inside the checked views and every accumulator tile inside the
        // workspace; `launches` checked the workspace's sizes and alignment; the grids are the
        // ones the kernels document; on one executor the launches run in order (the dK/dV
        // kernel reads the preprocess's delta and zeroed accumulator and counters, the dQ
        // kernel delta or the complete accumulator, the dsinks kernel delta and the checked
        // sinks, writing the checked `heads_q` values of dsinks); the Hopper kernel's tensor
        // maps describe the packed views the plan checked (Q, dO, K, V); the memory is live and
        // the workspace aliases nothing (the caller's contract).
        unsafe {
            for launch in [&launches.pre, &launches.dsinks].into_iter().flatten() {
                exec.launch(launch)?;
            }
            match &launches.dkdv {
                Some(VarlenBwdLaunch::MmaSync(l)) => exec.launch(l)?,
                Some(VarlenBwdLaunch::Hopper(l)) => exec.launch(&self.encode_maps(l)?)?,
                None => {}
            }
            if let Some(l) = &launches.dq {
                exec.launch(l)?;
            }
        }
        Ok(())
    }

    /// The Hopper launch `l` (the plan's dK/dV/dQ launch) with its tensor maps encoded (needs
    /// the driver).
    fn encode_maps(&self, l: &Launch<HopperBwdParams>) -> Result<Launch<HopperBwdParams>> {
        let h = self.hopper.as_ref().expect("a Hopper plan");
        let params = HopperBwdParams {
            tmap_q: h.maps[0].encode()?,
            tmap_do: h.maps[1].encode()?,
            tmap_k: h.maps[2].encode()?,
            tmap_v: h.maps[3].encode()?,
            ..*l.params()
        };
        Ok(Launch::new(
            &h.kernels.varlen,
            self.dkdv_grid,
            h.kernels.cfg,
            params,
        ))
    }
}

/// The backward pass over packed sequences on `stream`: dQ into `dq` (`[total_q, heads_q, D]`,
/// [`View::packed`]), dK and dV into `dk` and `dv` (`[total_k, heads_kv, D]`), given the
/// forward's inputs, its O and LSE (`[heads_q, total_q]`), the loss's gradient `d_o` and, when
/// the loss uses LSE, `d_lse`. The problem must be the one of `seqlens`
/// ([`AttentionVarlenProblem::new`]). The workspace is allocated here; the call returns once the
/// kernels finished. The outputs must overlap neither each other nor the inputs (checked).
/// For a problem with sinks, [`backward_varlen_with_sinks`].
#[allow(clippy::too_many_arguments)]
pub fn backward_varlen<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionVarlenProblem,
    seqlens: &DeviceCuSeqlens,
    q: &View<T>,
    k: &View<T>,
    v: &View<T>,
    o: &View<T>,
    lse: &DeviceBuffer<f32>,
    d_o: &View<T>,
    d_lse: Option<&DeviceBuffer<f32>>,
    dq: &mut View<T>,
    dk: &mut View<T>,
    dv: &mut View<T>,
    options: BackwardOptions,
) -> Result<()> {
    launch_varlen_backward(
        gpu,
        stream,
        (problem, seqlens),
        (q, k, v, o, lse),
        (d_o, d_lse),
        (dq, dk, dv),
        None,
        options,
    )
}

/// [`backward_varlen`] of a problem with sinks: `sinks` holds their logits `[heads_q]` (the
/// forward's); their gradient `[heads_q]` (summed over every sequence) is written into
/// `d_sinks`.
#[allow(clippy::too_many_arguments)]
pub fn backward_varlen_with_sinks<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    problem: &AttentionVarlenProblem,
    seqlens: &DeviceCuSeqlens,
    q: &View<T>,
    k: &View<T>,
    v: &View<T>,
    o: &View<T>,
    lse: &DeviceBuffer<f32>,
    d_o: &View<T>,
    d_lse: Option<&DeviceBuffer<f32>>,
    dq: &mut View<T>,
    dk: &mut View<T>,
    dv: &mut View<T>,
    sinks: &DeviceBuffer<f32>,
    d_sinks: &mut DeviceBuffer<f32>,
    options: BackwardOptions,
) -> Result<()> {
    launch_varlen_backward(
        gpu,
        stream,
        (problem, seqlens),
        (q, k, v, o, lse),
        (d_o, d_lse),
        (dq, dk, dv),
        Some((sinks, d_sinks)),
        options,
    )
}

/// The plan of `problem` on these tensors, run on `stream` with a fresh workspace.
#[allow(clippy::too_many_arguments, clippy::type_complexity)]
fn launch_varlen_backward<T: AttentionElem>(
    gpu: &Gpu,
    stream: &Stream,
    (problem, seqlens): (&AttentionVarlenProblem, &DeviceCuSeqlens),
    (q, k, v, o, lse): (&View<T>, &View<T>, &View<T>, &View<T>, &DeviceBuffer<f32>),
    (d_o, d_lse): (&View<T>, Option<&DeviceBuffer<f32>>),
    (dq, dk, dv): (&mut View<T>, &mut View<T>, &mut View<T>),
    sinks: Option<(&DeviceBuffer<f32>, &mut DeviceBuffer<f32>)>,
    options: BackwardOptions,
) -> Result<()> {
    problem.validate()?;
    problem.check_seqlens(seqlens.host())?;
    let (cu_seqlens_q, cu_seqlens_k) = seqlens.device();
    let tensors = AttentionVarlenBackwardTensors {
        q: *q,
        k: *k,
        v: *v,
        o: *o,
        d_o: *d_o,
        lse: lse.into(),
        d_lse: d_lse.map(|d| d.into()),
        dq: *dq,
        dk: *dk,
        dv: *dv,
        cu_seqlens_q,
        cu_seqlens_k,
        sinks: sinks.as_ref().map(|(s, _)| (*s).into()),
        d_sinks: sinks.as_ref().map(|(_, d)| (&**d).into()),
    };
    let plan = problem.plan_backward(Target::of(gpu), &tensors, options)?;
    // At least one element each (no query row gives an empty workspace), viewed at the plan's
    // lengths.
    let delta = zeroed::<f32>(plan.delta_len().max(1))?;
    let accum = if plan.dq_accum_len() > 0 {
        Some(zeroed::<f32>(plan.dq_accum_len())?)
    } else {
        None
    };
    let ws = BackwardWorkspace {
        // SAFETY: the first `delta_len` elements of `delta`, live until the end of the call.
        delta: unsafe { DevView::from_raw(DevView::from(&delta).addr(), plan.delta_len()) },
        dq_accum: accum.as_ref().map(|a| a.into()),
    };
    // SAFETY: the views, LSE, dLSE, the boundaries and the sinks are borrowed for the whole call, which
    // waits for the kernels before returning (so the workspace outlives them); the workspace is
    // fresh memory that aliases nothing; the plan checked that the outputs alias no tensor.
    unsafe { plan.run(&OnStream { gpu, stream }, &ws) }?;
    gpu.sync(stream, "attention backward over packed sequences")
}
