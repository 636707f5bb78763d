//! The plan of a backward pass: which kernels, their grids and parameters, and the workspace
//! they need, decided without a GPU.

use super::super::plan::{Target, check_head_values, check_sinks, tile_map};
use super::super::problem::{AttentionElem, AttentionProblem, Path, View, last_element};
use crate::error::{Error, Result};
use crate::exec::DevView;
use crate::gpu::LaunchConfig;
use crate::launch::Launch;
use crate::tensor_map::MapSpec;
use kernel_abi::attention::UNBOUNDED;
use kernel_abi::attention::backward::{
    ATTENTION_BWD_DSINKS, AttentionBwdParams, BwdKernels, ROW_BLOCK, bwd_kernels,
};
use kernel_abi::attention::hopper_bwd::{
    HOPPER_DQ_BLOCK_M, HOPPER_DQ_BLOCK_N, HopperBwdConfig, HopperBwdKernel, HopperBwdParams,
    HopperBwdSplit, dq_accum_len, dq_order_group, dq_order_len, hopper_bwd_kernel,
    hopper_bwd_padded_kernel,
};
use kernel_abi::{Kernel, KernelDecl, TensorMap};

/// Options of the backward.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BackwardOptions {
    /// Bitwise reproducible gradients. On the Hopper path at D 64 and 128, each key block
    /// adds its share of dQ into the f32 accumulator in a fixed order of the key blocks (each
    /// waits for the one before it); elsewhere dQ comes from its own kernel over query blocks
    /// (no atomics), at the cost of recomputing P and dS once more. Otherwise each key block
    /// adds its share of dQ into the accumulator as soon as it has it (atomically: the order
    /// of the additions, so the last bits, vary between runs).
    pub deterministic: bool,
}

/// Which kernels compute the backward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackwardPath {
    /// The `mma.sync` kernels (every GPU of compute capability >= 8.0, Hopper included).
    MmaSync,
    /// dK, dV and dQ from the Hopper kernels (sm_90a: TMA, `wgmma`, warp specialization) after
    /// the `mma.sync` path's preprocess: the dK/dV/dQ kernel and the accumulator's conversion
    /// (in deterministic mode with its additions ordered), or where there is none the dK/dV
    /// kernel and the dQ kernel.
    Hopper,
}

/// The tensors of a backward pass. Inputs: Q, K, V, the forward's O and LSE, the gradients dO
/// and (optionally) dLSE of the loss. Outputs: dQ (a view like Q's), dK and dV (like K's),
/// which must overlap neither each other nor the inputs.
pub struct AttentionBackwardTensors<'a, T> {
    /// Q `[batch, seq_q, heads_q, D]`.
    pub q: View<'a, T>,
    /// K `[batch, seq_k, heads_kv, D]`.
    pub k: View<'a, T>,
    /// V `[batch, seq_k, heads_kv, D_v]` (`D_v` = D but for a pair of
    /// [`kernel_abi::attention::VALUE_DIMS`]: [`AttentionProblem::value_dim`]).
    pub v: View<'a, T>,
    /// O of the forward `[batch, seq_q, heads_q, D_v]`.
    pub o: View<'a, T>,
    /// dO, as O.
    pub d_o: View<'a, T>,
    /// LSE of the forward `[batch, heads_q, seq_q]` f32 (natural log), contiguous.
    pub lse: DevView<'a, f32>,
    /// dLSE, as LSE; `None` when the loss does not depend on LSE.
    pub d_lse: Option<DevView<'a, f32>>,
    /// dQ, as Q (written).
    pub dq: View<'a, T>,
    /// dK, as K (written).
    pub dk: View<'a, T>,
    /// dV, as V (written).
    pub dv: View<'a, T>,
    /// The sink logits `[heads_q]` f32 of a problem with sinks ([`AttentionProblem::sinks`]),
    /// the forward's; `None` without.
    pub sinks: Option<DevView<'a, f32>>,
    /// The sinks' gradient `[heads_q]` f32 (written) of a problem with sinks; `None` without.
    pub d_sinks: Option<DevView<'a, f32>>,
}

impl<T> Clone for AttentionBackwardTensors<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for AttentionBackwardTensors<'_, T> {}

/// Device scratch of a backward pass, sized by [`AttentionBackwardPlan::delta_len`] and
/// [`AttentionBackwardPlan::dq_accum_len`]; it must overlap none of the tensors.
#[derive(Clone, Copy)]
pub struct BackwardWorkspace<'a> {
    /// `delta'` `[batch, heads_q, seq_q]` f32.
    pub delta: DevView<'a, f32>,
    /// The dQ accumulator f32, 16-byte aligned, of
    /// [`AttentionBackwardPlan::dq_accum_len`] elements (in deterministic mode followed by
    /// the counters that order its additions); `None` when that length is 0.
    pub dq_accum: Option<DevView<'a, f32>>,
}

/// The launches of a planned backward, in order, with the workspace's addresses.
pub struct BackwardLaunches {
    /// `delta'` and the zeroed accumulator.
    pub pre: Launch<AttentionBwdParams>,
    /// dK, dV (and dQ by atomics unless deterministic).
    pub dkdv: BwdLaunch,
    /// dQ: the conversion of the accumulator, or a deterministic dQ kernel.
    pub dq: BwdLaunch,
    /// The sinks' gradient (after the preprocess), with sinks.
    pub dsinks: Option<Launch<AttentionBwdParams>>,
}

/// A dK/dV or dQ launch of a backward: on the `mma.sync` path, or a Hopper kernel's (its tensor
/// maps zero until [`AttentionBackwardPlan::run`] encodes them).
// Launches are built once per plan and passed by reference: the size gap costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum BwdLaunch {
    /// A kernel on the plain parameters: the `mma.sync` kernels, the conversions of the
    /// accumulator.
    MmaSync(Launch<AttentionBwdParams>),
    /// The Hopper kernel.
    Hopper(Launch<HopperBwdParams>),
}

impl BwdLaunch {
    /// The kernel's handle.
    pub fn kernel(&self) -> &KernelDecl {
        match self {
            BwdLaunch::MmaSync(l) => l.kernel(),
            BwdLaunch::Hopper(l) => l.kernel(),
        }
    }

    /// The kernel's name.
    pub fn name(&self) -> &'static str {
        self.kernel().name
    }

    /// Grid, block and shared memory.
    pub fn config(&self) -> &LaunchConfig {
        match self {
            BwdLaunch::MmaSync(l) => l.config(),
            BwdLaunch::Hopper(l) => l.config(),
        }
    }

    /// The parameters every backward kernel takes (the Hopper kernels' beside their tensor
    /// maps).
    pub fn params(&self) -> &AttentionBwdParams {
        match self {
            BwdLaunch::MmaSync(l) => l.params(),
            BwdLaunch::Hopper(l) => &l.params().base,
        }
    }
}

/// The Hopper kernels of a plan and their tensor maps of Q, dO, K, V (encoded when they run):
/// `maps` with the main kernel's box rows (dK/dV or dK/dV/dQ), `dq_maps` with the dQ kernel's.
struct HopperDkdv {
    kernel: &'static HopperBwdKernel,
    maps: [MapSpec; 4],
    dq_maps: [MapSpec; 4],
    /// Whether dQ comes from the dK/dV/dQ kernel (where there is one, in deterministic mode
    /// where it orders its additions).
    fused: bool,
}

impl HopperDkdv {
    /// The main kernel and its configuration: the dK/dV/dQ kernel, or the dK/dV kernel.
    fn main(
        &self,
    ) -> (
        &'static Kernel<HopperBwdParams, HopperBwdConfig>,
        HopperBwdConfig,
    ) {
        match (&self.kernel.fused, &self.kernel.split) {
            (Some(f), _) if self.fused => (&f.kernel, f.cfg),
            (_, Some(s)) => (&s.dkdv, s.cfg),
            _ => unreachable!("a plan's Hopper entry has the kernels of its mode"),
        }
    }

    /// The dQ kernel (the split kernels).
    fn dq(&self) -> Option<&'static HopperBwdSplit> {
        self.kernel.split.as_ref().filter(|_| !self.fused)
    }
}

/// The deterministic mode's interleaving of the dK/dV grid's (key/value head, sequence) pairs
/// ([`dq_order_group`]) for `key_blocks` blocks of each of `pairs` pairs, under the effective
/// right window `right`. Without one (no causal mask, no right window) every key block's walk
/// starts at the first query block, and the blocks of a pair launched together take their
/// common tiles one after the other: interleaved. Under a causal mask or a right window each
/// key block's walk starts a step after its predecessor's (already staggered) and the grid
/// keeps its order: interleaving there measured no better (`bench/NOTES.md`, "The
/// deterministic grid interleaves its head pairs").
pub(super) fn order_group(
    right: Option<usize>,
    key_blocks: u32,
    pairs: u32,
    target: Target,
) -> u32 {
    match right {
        None => dq_order_group(key_blocks, pairs, target.multiprocessors),
        Some(_) => 1,
    }
}

/// A planned backward pass: three launches on the `mma.sync` path, the workspace sizes.
pub struct AttentionBackwardPlan {
    path: BackwardPath,
    kernels: &'static BwdKernels,
    /// The kernels of the value head dimension (`kernels` but under a pair of
    /// `VALUE_DIMS`): their preprocess reads O and dO.
    value_kernels: &'static BwdKernels,
    hopper: Option<HopperDkdv>,
    deterministic: bool,
    /// Whether the logits are soft-capped (the `softcap` kernels).
    softcap: bool,
    /// Whether the problem has sinks (the dsinks kernel).
    sinks: bool,
    /// Parameters with null workspace pointers (filled in by [`AttentionBackwardPlan::launches`]).
    params: AttentionBwdParams,
    row_grid: (u32, u32, u32),
    dkdv_grid: (u32, u32, u32),
    /// The deterministic mode's interleaving of the dK/dV grid's (key/value head, sequence)
    /// pairs ([`dq_order_group`]), used where its dQ additions are ordered.
    order_group: u32,
    dq_grid: (u32, u32, u32),
    delta_len: usize,
    dq_accum_len: usize,
}

/// A byte range `[start, end)` of device memory.
type Span = (u64, u64);

/// The bytes a view reaches (from its first element's address through its last element).
fn span<T>(v: &View<'_, T>) -> Span {
    let last = last_element(0, v.shape(), v.strides()).expect("a checked, non-empty view");
    let size = std::mem::size_of::<T>() as u64;
    (v.ptr(), v.ptr() + (last as u64 + 1) * size)
}

/// The bytes of a flat view.
fn flat_span<T>(v: &DevView<'_, T>) -> Span {
    let size = std::mem::size_of::<T>() as u64;
    (v.addr(), v.addr() + v.len() as u64 * size)
}

fn spans_meet(a: Span, b: Span) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// Whether two checked views of the same element type share an element. Views with the same
/// strides whose rows nest (each dimension's stride covers the extent of the smaller ones, the
/// smallest covers a row of D elements: e.g. Q, K, V or dQ, dK, dV as views into one packed
/// `[b, s, 3, h, d]` tensor) are compared exactly, row by row; other pairs by the bytes they
/// span (conservative).
pub(in crate::attention) fn views_overlap<T>(a: &View<'_, T>, b: &View<'_, T>) -> bool {
    let (sa, sb) = (span(a), span(b));
    if !spans_meet(sa, sb) {
        return false;
    }
    if a.strides() != b.strides() || a.shape() != b.shape() {
        return true;
    }
    let (shape, strides) = (a.shape(), a.strides());
    let size = std::mem::size_of::<T>() as i128;
    let delta = (b.ptr() as i128 - a.ptr() as i128) / size;
    if (b.ptr() as i128 - a.ptr() as i128) % size != 0 {
        return true;
    }
    let row = shape[3] as i128;
    // Dimensions of more than one element, by stride descending.
    let mut dims: Vec<(i128, i128)> = (0..3)
        .filter(|&i| shape[i] > 1)
        .map(|i| (strides[i] as i128, shape[i] as i128))
        .collect();
    dims.sort_by_key(|d| std::cmp::Reverse(d.0));
    let mut extent = row;
    for &(stride, n) in dims.iter().rev() {
        if stride < extent {
            return true; // rows do not nest: keep the conservative answer
        }
        extent = stride * n;
    }
    // Rows nest: some rows of the two views meet iff `|delta + sum n_k s_k| < D` for integers
    // `|n_k| < shape_k`; at each dimension only the two multiples nearest to cancelling the
    // remainder can lead there (the smaller dimensions reach less than one stride).
    fn search(rest: i128, dims: &[(i128, i128)], row: i128) -> bool {
        let Some(&(stride, n)) = dims.first() else {
            return rest.abs() < row;
        };
        let base = (-rest).div_euclid(stride);
        [base, base + 1]
            .into_iter()
            .filter(|m| m.abs() < n)
            .any(|m| search(rest + m * stride, &dims[1..], row))
    }
    search(delta, &dims, row)
}

/// Check that the outputs of `t` (dQ, dK, dV, dsinks) overlap neither each other nor the inputs
/// (Q, K, V, O, dO, LSE, dLSE, sinks). Views without elements (packed tensors of no rows)
/// overlap nothing.
pub(in crate::attention) fn check_outputs_apart<T>(
    t: &AttentionBackwardTensors<'_, T>,
) -> Result<()> {
    let empty = |v: &View<'_, T>| v.shape().contains(&0);
    let outputs = [("dQ", &t.dq), ("dK", &t.dk), ("dV", &t.dv)];
    let inputs = [
        ("Q", &t.q),
        ("K", &t.k),
        ("V", &t.v),
        ("O", &t.o),
        ("dO", &t.d_o),
    ];
    for (i, (name, out)) in outputs.iter().enumerate() {
        if empty(out) {
            continue;
        }
        for (other, view) in inputs.iter().chain(&outputs[i + 1..]) {
            if !empty(view) && views_overlap(out, view) {
                return Err(Error::invalid(
                    name.to_string(),
                    format!("overlaps {other} (outputs must not alias any tensor)"),
                ));
            }
        }
        let flat = [
            Some(("LSE", t.lse)),
            t.d_lse.map(|d| ("dLSE", d)),
            t.sinks.map(|s| ("sinks", s)),
            t.d_sinks.map(|s| ("dsinks", s)),
        ];
        for (other, view) in flat.into_iter().flatten() {
            if spans_meet(span(out), flat_span(&view)) {
                return Err(Error::invalid(
                    name.to_string(),
                    format!("overlaps {other} (outputs must not alias any tensor)"),
                ));
            }
        }
    }
    if let Some(ds) = t.d_sinks {
        let views = inputs
            .iter()
            .filter(|(_, v)| !empty(v))
            .map(|&(n, v)| (n, span(v)));
        let flat = [
            Some(("LSE", t.lse)),
            t.d_lse.map(|d| ("dLSE", d)),
            t.sinks.map(|s| ("sinks", s)),
        ];
        let flat = flat.into_iter().flatten().map(|(n, v)| (n, flat_span(&v)));
        for (other, sp) in views.chain(flat) {
            if spans_meet(flat_span(&ds), sp) {
                return Err(Error::invalid(
                    "dsinks",
                    format!("overlaps {other} (outputs must not alias any tensor)"),
                ));
            }
        }
    }
    Ok(())
}

/// Check that a backward of V and O of their own head dimension (a pair of
/// [`kernel_abi::attention::VALUE_DIMS`]) has the kernels it needs: the Hopper dK/dV/dQ kernel
/// of a wider head (`hopper`, fused), which computes on V and dO zero-padded to its head
/// dimension by its tensor maps and stores D_v columns of dV. The `mma.sync` kernels take one
/// head dimension for all four tensors: typed errors on them.
fn check_value_dim_path(path: Path, target: Target, hopper: Option<&HopperDkdv>) -> Result<()> {
    if hopper.is_some_and(|h| h.fused) {
        return Ok(());
    }
    let why = if path == Path::MmaSync {
        "the mma.sync backward kernels take one head dimension for Q, K, V and O".to_string()
    } else if !target.arch.has_hopper_kernels() {
        format!(
            "the Hopper backward kernels (sm_90a) compute it; this GPU runs {}",
            target.arch
        )
    } else {
        "the Hopper kernels cannot describe these views (tensor maps)".to_string()
    };
    Err(Error::unsupported(
        "the backward with V and O of their own head dimension",
        why,
    ))
}

/// Check the workspace `ws` against the lengths `delta_len` and `dq_accum_len` (the accumulator
/// required unless of no element, 16-byte aligned, apart from `delta'`); its pointers
/// (`delta'`, the accumulator or null).
pub(in crate::attention) fn workspace_pointers(
    ws: &BackwardWorkspace<'_>,
    delta_len: usize,
    dq_accum_len: usize,
) -> Result<(*mut f32, *mut f32)> {
    if ws.delta.len() != delta_len {
        return Err(Error::shape(
            "backward workspace delta",
            format!("{delta_len} elements"),
            ws.delta.len(),
        ));
    }
    if !ws.delta.addr().is_multiple_of(4) {
        return Err(Error::Misaligned {
            what: "backward workspace delta".into(),
            required: 4,
            actual: ws.delta.addr() % 4,
        });
    }
    let accum = if dq_accum_len == 0 {
        std::ptr::null_mut()
    } else {
        let acc = ws.dq_accum.ok_or_else(|| {
            Error::invalid(
                "backward workspace",
                format!("the dQ accumulator is required ({dq_accum_len} f32)"),
            )
        })?;
        if acc.len() != dq_accum_len {
            return Err(Error::shape(
                "backward workspace dQ accumulator",
                format!("{dq_accum_len} elements"),
                acc.len(),
            ));
        }
        if !acc.addr().is_multiple_of(16) {
            return Err(Error::Misaligned {
                what: "backward workspace dQ accumulator".into(),
                required: 16,
                actual: acc.addr() % 16,
            });
        }
        if spans_meet(flat_span(&acc), flat_span(&ws.delta)) {
            return Err(Error::invalid(
                "backward workspace",
                "the dQ accumulator overlaps delta",
            ));
        }
        acc.addr() as *mut f32
    };
    Ok((ws.delta.addr() as *mut f32, accum))
}

impl AttentionProblem {
    /// Plan the backward pass on `tensors` for `target`. Validates the problem, every view
    /// (as the forward validates its views: shape, contiguous head dimension, 16-byte aligned
    /// start and strides, in bounds), LSE's and dLSE's lengths, that no output has elements
    /// sharing memory, and that the outputs overlap neither each other nor the inputs.
    pub fn plan_backward<T: AttentionElem>(
        &self,
        target: Target,
        tensors: &AttentionBackwardTensors<'_, T>,
        options: BackwardOptions,
    ) -> Result<AttentionBackwardPlan> {
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
        t.q.check("Q", self.q_shape())?;
        t.k.check("K", self.kv_shape())?;
        t.v.check("V", self.v_shape())?;
        t.o.check("O", self.o_shape())?;
        t.d_o.check("dO", self.o_shape())?;
        t.dq.check("dQ", self.q_shape())?;
        t.dk.check("dK", self.kv_shape())?;
        t.dv.check("dV", self.v_shape())?;
        t.dq.check_distinct("dQ")?;
        t.dk.check_distinct("dK")?;
        t.dv.check_distinct("dV")?;
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
        self.check_backward_sinks(t.sinks.as_ref(), t.d_sinks.as_ref())?;
        check_outputs_apart(t)?;
        let d = self.head_dim as u32;
        let kernels = bwd_kernels(self.dtype, d).expect("validated head dimension");
        let value_kernels =
            bwd_kernels(self.dtype, self.v_dim() as u32).expect("validated value dimension");
        let hopper = self.backward_hopper_kernel(target, t)?;
        if self.has_value_dim() {
            check_value_dim_path(self.path, target, hopper.as_ref())?;
        }
        let (left, right) = self.effective_window();
        let scale = self.softmax_scale();
        let (scale_log2, logits) = self.logit_params(t.sinks.as_ref());
        let params = AttentionBwdParams {
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
            seq_q: self.seq_q as u32,
            seq_k: self.seq_k as u32,
            heads_q: self.heads_q as u32,
            heads_kv: self.heads_kv as u32,
            scale,
            scale_log2,
            window_left: left.map_or(UNBOUNDED, |l| l as i32),
            window_right: right.map_or(UNBOUNDED, |r| r as i32),
            dq_accum_tiled: hopper
                .as_ref()
                .filter(|h| h.fused)
                .map_or(0, |h| h.kernel.head_dim),
            head_dim: d,
            value_dim: self.v_dim() as u32,
            logits,
            d_sinks: t
                .d_sinks
                .map_or(std::ptr::null_mut(), |s| s.addr() as *mut f32),
        };
        let (sq, sk) = (self.seq_q as u32, self.seq_k as u32);
        let (hq, hkv, b) = (self.heads_q as u32, self.heads_kv as u32, self.batch as u32);
        let workspace = self.backward_workspace_lens(options);
        let (block_n, dq_block_m) = if let Some(h) = &hopper {
            (h.main().1.block_n(), HOPPER_DQ_BLOCK_M)
        } else {
            (kernels.tiles.block_n, kernels.dq_tiles.block_m)
        };
        Ok(AttentionBackwardPlan {
            path: if hopper.is_some() {
                BackwardPath::Hopper
            } else {
                BackwardPath::MmaSync
            },
            kernels,
            value_kernels,
            hopper,
            deterministic: options.deterministic,
            softcap: self.softcap.is_some(),
            sinks: self.sinks,
            params,
            row_grid: (sq.div_ceil(ROW_BLOCK), hq, b),
            dkdv_grid: (sk.div_ceil(block_n), hkv, b),
            order_group: order_group(right, sk.div_ceil(block_n), hkv * b, target),
            dq_grid: (sq.div_ceil(dq_block_m), hq, b),
            delta_len: workspace.delta,
            dq_accum_len: workspace.dq_accum,
        })
    }

    /// The Hopper kernels for the checked tensors `t` on `target`, if the backward takes them:
    /// with [`Path::Auto`] where the target has the Hopper kernels, one exists for the element
    /// type and head dimension (D 64, 96, 128; D 256: the dK/dV/dQ kernel of a wide head; D
    /// 32, 48, 80, 112: the dK/dV and dQ kernels of the next of 64, 96, 128 on zero-padded
    /// columns; D 144 to 240: the D 256 dK/dV/dQ kernel on zero-padded columns) and tensor maps
    /// describe Q, dO, K and V; with [`Path::Hopper`] likewise, but an error on a GPU without
    /// the Hopper kernels or for views a tensor map cannot describe; [`Path::MmaSync`] never. A
    /// softcap takes the kernels' softcap forms; sinks change neither kernel (the forward's LSE
    /// holds them). Both modes take the same kernels.
    fn backward_hopper_kernel<T>(
        &self,
        target: Target,
        t: &AttentionBackwardTensors<'_, T>,
    ) -> Result<Option<HopperDkdv>> {
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
        let softcap = self.softcap.is_some();
        let d = self.head_dim as u32;
        // A head dimension without Hopper kernels of its own takes those of the next one above
        // it, on zero-padded columns (a padded plan): the dK/dV and dQ kernels where they
        // exist (up to 128), else the dK/dV/dQ kernel (D 256).
        let (kernel, padded) = match hopper_bwd_kernel(self.dtype, d, softcap) {
            Some(k) => (k, false),
            None => match hopper_bwd_padded_kernel(self.dtype, d, softcap) {
                Some(k) => (k, true),
                None => return Ok(None),
            },
        };
        // The dK/dV/dQ kernel where there is one (both modes: in deterministic mode it orders
        // its additions); D 96 has none (both modes take the dK/dV and dQ kernels: the
        // workspace keeps the accumulator's size, unused).
        let fused = (!padded || kernel.padded_takes_fused()) && kernel.fused.is_some();
        let main_cfg = match (&kernel.fused, &kernel.split) {
            (Some(f), _) if fused => f.cfg,
            (_, Some(s)) => s.cfg,
            _ => return Ok(None),
        };
        let maps = (|| {
            Ok::<_, Error>([
                tile_map(self.dtype, &t.q, main_cfg.block_m)?,
                tile_map(self.dtype, &t.d_o, main_cfg.block_m)?,
                tile_map(self.dtype, &t.k, main_cfg.block_n())?,
                tile_map(self.dtype, &t.v, main_cfg.block_n())?,
                tile_map(self.dtype, &t.q, HOPPER_DQ_BLOCK_M)?,
                tile_map(self.dtype, &t.d_o, HOPPER_DQ_BLOCK_M)?,
                tile_map(self.dtype, &t.k, HOPPER_DQ_BLOCK_N)?,
                tile_map(self.dtype, &t.v, HOPPER_DQ_BLOCK_N)?,
            ])
        })();
        match maps {
            Ok([a, b, c, d, e, f, g, h]) => Ok(Some(HopperDkdv {
                kernel,
                maps: [a, b, c, d],
                dq_maps: [e, f, g, h],
                fused,
            })),
            Err(e) if self.path == Path::Hopper => Err(e),
            // Strides a tensor map cannot describe: the mma.sync kernels handle any.
            Err(_) => Ok(None),
        }
    }

    /// The f32 elements of the backward's workspace with `options` (what the plan reports as
    /// [`AttentionBackwardPlan::delta_len`] and [`AttentionBackwardPlan::dq_accum_len`]), for
    /// a caller that allocates it before planning. The accumulator has the size of the Hopper
    /// path's tiled layout (`seq_q` rounded up to whole tiles of 64 rows; the `mma.sync` path
    /// uses its first `batch heads_q seq_q D` elements), in deterministic mode followed by one
    /// u32 counter per tile (rounded up to 4: 16-byte multiples), whatever path the plan takes.
    pub fn backward_workspace_lens(&self, options: BackwardOptions) -> BackwardWorkspaceLens {
        let accum = dq_accum_len(self.batch, self.heads_q, self.seq_q, self.dq_accum_width());
        BackwardWorkspaceLens {
            delta: self.lse_len(),
            dq_accum: if options.deterministic {
                accum + dq_order_len(self.batch, self.heads_q, self.seq_q).next_multiple_of(4)
            } else {
                accum
            },
        }
    }
}

impl AttentionProblem {
    /// The row width of the dQ accumulator: the head dimension, or where a padded plan may
    /// take the Hopper dK/dV/dQ kernel of a wider head (D 144 to 240: the D 256 kernel), that
    /// kernel's.
    fn dq_accum_width(&self) -> usize {
        let (d, softcap) = (self.head_dim as u32, self.softcap.is_some());
        hopper_bwd_padded_kernel(self.dtype, d, softcap)
            .filter(|k| k.padded_takes_fused())
            .map_or(self.head_dim, |k| k.head_dim as usize)
    }

    /// Check a backward's sinks and their gradient: both present exactly when the problem
    /// has sinks, `heads_q` f32 values each, 4-byte aligned.
    pub(in crate::attention) fn check_backward_sinks(
        &self,
        sinks: Option<&DevView<'_, f32>>,
        d_sinks: Option<&DevView<'_, f32>>,
    ) -> Result<()> {
        check_sinks(self.sinks, self.heads_q, sinks)?;
        check_head_values("dsinks", "sink gradient", self.sinks, self.heads_q, d_sinks)
    }
}

/// The f32 elements of a backward's workspace ([`BackwardWorkspace`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardWorkspaceLens {
    /// `delta'`: `batch heads_q seq_q`.
    pub delta: usize,
    /// The dQ accumulator: `batch heads_q seq_q' D` with `seq_q'` rounded up to a multiple of
    /// 64, in deterministic mode and the counters of its order (`batch heads_q seq_q' / 64`
    /// rounded up to a multiple of 4) after it.
    pub dq_accum: usize,
}

impl AttentionBackwardPlan {
    /// The path.
    pub fn path(&self) -> BackwardPath {
        self.path
    }

    /// Whether the plan was made in deterministic mode.
    pub fn deterministic(&self) -> bool {
        self.deterministic
    }

    /// The kernels of the plan's element type and head dimension.
    pub fn kernels(&self) -> &'static BwdKernels {
        self.kernels
    }

    /// f32 elements of the workspace's `delta'`: `batch heads_q seq_q`.
    pub fn delta_len(&self) -> usize {
        self.delta_len
    }

    /// f32 elements of the workspace's dQ accumulator (as
    /// [`AttentionProblem::backward_workspace_lens`]).
    pub fn dq_accum_len(&self) -> usize {
        self.dq_accum_len
    }

    /// The three launches with the workspace `ws`, after checking its sizes and alignment (on
    /// the Hopper path with the tensor maps zero: [`AttentionBackwardPlan::run`] encodes them).
    pub fn launches(&self, ws: &BackwardWorkspace<'_>) -> Result<BackwardLaunches> {
        let (delta, dq_accum) = workspace_pointers(ws, self.delta_len, self.dq_accum_len)?;
        // Only the dK/dV/dQ kernels use the accumulator (the Hopper dK/dV and dQ kernels and
        // the mma.sync path's deterministic kernels do not): null otherwise, so that the
        // preprocess does not zero it. The counters follow the tiled accumulator.
        let fused = match &self.hopper {
            Some(h) => h.fused,
            None => !self.deterministic,
        };
        let ordered = fused && self.deterministic;
        let p = &self.params;
        let width = match p.dq_accum_tiled {
            0 => self.kernels.tiles.head_dim,
            w => w,
        };
        let tiled = dq_accum_len(
            p.batch as usize,
            p.heads_q as usize,
            p.seq_q as usize,
            width as usize,
        );
        let params = AttentionBwdParams {
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
            ..self.params
        };
        let k = self.kernels;
        let (dkdv, dq) = if let Some(h) = &self.hopper {
            let hp = HopperBwdParams {
                tmap_q: TensorMap::ZEROED,
                tmap_do: TensorMap::ZEROED,
                tmap_k: TensorMap::ZEROED,
                tmap_v: TensorMap::ZEROED,
                base: params,
                cu_seqlens_q: std::ptr::null(),
                cu_seqlens_k: std::ptr::null(),
                total_q: 0,
                total_k: 0,
                order_group: if ordered { self.order_group } else { 1 },
            };
            let (main, cfg) = h.main();
            let dkdv = BwdLaunch::Hopper(Launch::new(main, self.dkdv_grid, cfg, hp));
            match (h.dq(), &h.kernel.fused) {
                (Some(s), _) => (
                    dkdv,
                    BwdLaunch::Hopper(Launch::new(&s.dq, self.dq_grid, s.dq_cfg, hp)),
                ),
                // The conversion's blocks are the accumulator's tiles: the preprocess's grid.
                (None, Some(f)) => (
                    dkdv,
                    BwdLaunch::MmaSync(Launch::new(&f.convert, self.row_grid, (), params)),
                ),
                (None, None) => unreachable!("a Hopper entry has dQ's kernels"),
            }
        } else if self.deterministic {
            let (dkdv, dq) = if self.softcap {
                (&k.dkdv_softcap, &k.dq_softcap)
            } else {
                (&k.dkdv, &k.dq)
            };
            (
                BwdLaunch::MmaSync(Launch::new(dkdv, self.dkdv_grid, k.tiles, params)),
                BwdLaunch::MmaSync(Launch::new(dq, self.dq_grid, k.dq_tiles, params)),
            )
        } else {
            let dkdv = if self.softcap {
                &k.dkdv_dq_softcap
            } else {
                &k.dkdv_dq
            };
            (
                BwdLaunch::MmaSync(Launch::new(dkdv, self.dkdv_grid, k.tiles, params)),
                BwdLaunch::MmaSync(Launch::new(&k.dq_convert, self.row_grid, (), params)),
            )
        };
        let dsinks = self.sinks.then(|| {
            let grid = (self.params.heads_q, 1, 1);
            Launch::new(&ATTENTION_BWD_DSINKS, grid, (), params)
        });
        Ok(BackwardLaunches {
            pre: Launch::new(&self.value_kernels.pre, self.row_grid, (), params),
            dkdv,
            dq,
            dsinks,
        })
    }
}

impl AttentionBackwardPlan {
    /// The Hopper launch `l` (the plan's dK/dV or dQ launch) with its tensor maps encoded
    /// (needs the driver).
    pub(crate) fn encode_maps(
        &self,
        l: &Launch<HopperBwdParams>,
    ) -> Result<Launch<HopperBwdParams>> {
        let h = self.hopper.as_ref().expect("a Hopper plan");
        let dq = h.dq().filter(|s| l.name() == s.dq.name);
        let maps = if dq.is_some() { &h.dq_maps } else { &h.maps };
        let params = HopperBwdParams {
            tmap_q: maps[0].encode()?,
            tmap_do: maps[1].encode()?,
            tmap_k: maps[2].encode()?,
            tmap_v: maps[3].encode()?,
            ..*l.params()
        };
        Ok(match dq {
            Some(s) => Launch::new(&s.dq, self.dq_grid, s.dq_cfg, params),
            None => {
                let (main, cfg) = h.main();
                Launch::new(main, self.dkdv_grid, cfg, params)
            }
        })
    }
}
