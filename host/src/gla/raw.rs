//! The forward pass on tensors this library does not own ([`crate::raw`]): a framework's
//! tensors on its stream. The problem comes from the tensors' shapes and [`GlaOptions`], the
//! plan is the typed API's ([`GlaProblem::plan`]), so the checks are the same;
//! [`forward_raw`] adds the checks of raw memory (device, allocation, outputs and workspace
//! apart from the inputs) and writes the plan's segment tables into the caller's workspace
//! itself, so the kernels never read a table the library did not make.

use super::backward::{
    GlaBackwardPlan, GlaBackwardSplit, GlaBackwardTensors, GlaBackwardWorkspace,
};
use super::plan::{GlaPlan, GlaSplitWorkspace, GlaTensors, GlaWorkspace};
use super::problem::{GlaKernel, GlaProblem};
use crate::attention::Target;
use crate::error::{Error, Result};
use crate::exec::DevView;
use crate::raw::{RawStream, RawTensor, check_disjoint};

/// Start of every buffer carved from a workspace tensor, in elements of 4 bytes: 256 bytes,
/// the alignment of a fresh CUDA allocation (the kernels need 16).
const CARVE_ALIGN: usize = 64;

/// The options of a forward pass (the sizes come from the tensors).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GlaOptions {
    /// Output scale; `None` is `dk^-0.5`.
    pub scale: Option<f32>,
    /// Packed variable-length sequences: offsets `[0, ..., T]` (the batch is then 1).
    pub cu_seqlens: Option<Vec<usize>>,
    /// Which kernels run.
    pub kernel: GlaKernel,
}

/// The tensors of a raw forward pass: contiguous, bf16 but for the f32 states.
#[derive(Clone, Copy)]
pub struct RawGlaTensors<'t> {
    /// Queries `[B, T, H, dk]`.
    pub q: &'t RawTensor,
    /// Keys `[B, T, H, dk]`.
    pub k: &'t RawTensor,
    /// Values `[B, T, H, dv]`.
    pub v: &'t RawTensor,
    /// Log-decays `[B, T, H, dk]` (natural log).
    pub g: &'t RawTensor,
    /// Initial states `[N, H, dk, dv]` f32, or zero states.
    pub init_state: Option<&'t RawTensor>,
    /// Outputs `[B, T, H, dv]` (written).
    pub o: &'t RawTensor,
    /// Final states `[N, H, dk, dv]` f32 (written), if wanted.
    pub final_state: Option<&'t RawTensor>,
}

/// The workspace of a raw forward pass, of the lengths [`workspace_lens`] gives: contiguous
/// rank-1 tensors.
#[derive(Clone, Copy)]
pub struct RawGlaWorkspace<'t> {
    /// int32, [`GlaWorkspaceLens::table_words`] elements: the segment and combination tables
    /// (written by [`forward_raw`] on the stream before the kernels).
    pub tables: &'t RawTensor,
    /// f32, [`GlaWorkspaceLens::buffer_elems`] elements (`None` when that is 0): the buffers of
    /// the segment passes.
    pub buffers: Option<&'t RawTensor>,
}

/// The workspace a forward pass needs, in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GlaWorkspaceLens {
    /// 32-bit words of the segment and combination tables.
    pub table_words: usize,
    /// f32 elements of the segment passes' buffers (0 when no sequence is split).
    pub buffer_elems: usize,
}

impl GlaProblem {
    /// The problem of q of shape `q` (`[B, T, H, dk]`) and v of shape `v` (`[B, T, H, dv]`;
    /// its leading sizes are checked against q's with the tensors) with `options`.
    pub fn from_shapes(q: &[usize], v: &[usize], options: &GlaOptions) -> Result<GlaProblem> {
        let [batch, seq_len, heads, dk] =
            <[usize; 4]>::try_from(q).map_err(|_| Error::shape("GLA q rank", 4, q.len()))?;
        let [_, _, _, dv] =
            <[usize; 4]>::try_from(v).map_err(|_| Error::shape("GLA v rank", 4, v.len()))?;
        Ok(GlaProblem {
            batch,
            seq_len,
            heads,
            dk,
            dv,
            scale: options.scale,
            cu_seqlens: options.cu_seqlens.clone(),
            segment_len: None,
            kernel: options.kernel,
        })
    }
}

/// Where each buffer of the segment passes lies in the f32 workspace: `(seg_init, delta,
/// decay_log2)` as `(offset, len)`, and the total.
fn carve(state: usize, decay: usize) -> ([(usize, usize); 3], usize) {
    let up = |n: usize| n.div_ceil(CARVE_ALIGN) * CARVE_ALIGN;
    let parts = [(0, state), (up(state), state), (2 * up(state), decay)];
    (parts, 2 * up(state) + decay)
}

/// The workspace a forward pass of Q of shape `q` and V of shape `v` with `options` needs on
/// `target` (pure): the tables of its segments and the buffers of its segment passes. The
/// problem is validated as the plan validates it.
pub fn workspace_lens(
    target: Target,
    q: &[usize],
    v: &[usize],
    options: &GlaOptions,
) -> Result<GlaWorkspaceLens> {
    let problem = GlaProblem::from_shapes(q, v, options)?;
    let segments = problem.segments(target)?;
    let (segment_words, combine_words) = segments.table_words();
    Ok(GlaWorkspaceLens {
        table_words: segment_words.len() + combine_words.len(),
        buffer_elems: problem
            .workspace_len(&segments)
            .map_or(0, |(state, decay)| carve(state, decay).1),
    })
}

/// Plan the forward pass on raw tensors for `target` (pure: no driver call, no memory read):
/// the problem from the shapes and `options`, every tensor bf16 (states f32), of its exact
/// shape, contiguous and inside its storage, the outputs apart from the inputs and each other,
/// the workspace of the plan's lengths and apart from every tensor, then the typed plan's
/// checks. Returns the plan, its workspace as views, and the table words to write there.
pub fn plan_raw<'a>(
    target: Target,
    options: &GlaOptions,
    t: &RawGlaTensors<'_>,
    workspace: &RawGlaWorkspace<'_>,
) -> Result<(GlaPlan, GlaWorkspace<'a>, Vec<u32>)> {
    let p = GlaProblem::from_shapes(&t.q.shape, &t.v.shape, options)?;
    p.validate()?;
    let qk = [p.batch, p.seq_len, p.heads, p.dk];
    let vo = [p.batch, p.seq_len, p.heads, p.dv];
    let state = [p.num_seqs(), p.heads, p.dk, p.dv];
    let tensors = GlaTensors {
        q: t.q.contiguous_view("GLA q", &qk, 16)?,
        k: t.k.contiguous_view("GLA k", &qk, 16)?,
        v: t.v.contiguous_view("GLA v", &vo, 16)?,
        g: t.g.contiguous_view("GLA g", &qk, 16)?,
        init_state: t
            .init_state
            .map(|s| s.contiguous_view("GLA initial state", &state, 16))
            .transpose()?,
        o: t.o.contiguous_view("GLA o", &vo, 16)?,
        final_state: t
            .final_state
            .map(|s| s.contiguous_view("GLA final state", &state, 16))
            .transpose()?,
    };
    check_disjoint(&inputs(t), &outputs(t))?;
    let mut all = inputs(t);
    all.extend(outputs(t));
    check_disjoint(&all, &scratch(workspace))?;
    let plan = p.plan(target, &tensors)?;
    let (segment_words, combine_words) = plan.segments.table_words();
    let words = segment_words.len() + combine_words.len();
    let tables: DevView<'a, u32> =
        workspace
            .tables
            .contiguous_view("GLA workspace tables", &[words], 16)?;
    // SAFETY: inside the checked table view (the segment table's words are a multiple of 4,
    // so the combination table starts 16-byte aligned); addresses only.
    let (segment_table, combine_table) = unsafe {
        (
            DevView::from_raw(tables.addr(), segment_words.len()),
            DevView::from_raw(
                tables.addr() + 4 * segment_words.len() as u64,
                combine_words.len(),
            ),
        )
    };
    let split = match plan.workspace {
        None => None,
        Some((state, decay)) => {
            let (parts, total) = carve(state, decay);
            let buffers = workspace.buffers.ok_or_else(|| {
                Error::invalid(
                    "GLA workspace buffers",
                    "the plan splits a sequence but no buffers were given",
                )
            })?;
            let all: DevView<'a, f32> =
                buffers.contiguous_view("GLA workspace buffers", &[total], 16)?;
            // SAFETY: each part lies inside the checked view (`carve`); addresses only.
            let [seg_init, delta, decay_log2] = parts
                .map(|(at, len)| unsafe { DevView::from_raw(all.addr() + 4 * at as u64, len) });
            Some(GlaSplitWorkspace {
                combine: combine_table,
                seg_init,
                delta,
                decay_log2,
            })
        }
    };
    let ws = GlaWorkspace {
        segments: segment_table,
        split,
    };
    let mut table = segment_words;
    table.extend(combine_words);
    Ok((plan, ws, table))
}

fn inputs<'t>(t: &RawGlaTensors<'t>) -> Vec<(&'static str, &'t RawTensor)> {
    let mut v = vec![("q", t.q), ("k", t.k), ("v", t.v), ("g", t.g)];
    v.extend(t.init_state.map(|s| ("initial state", s)));
    v
}

fn outputs<'t>(t: &RawGlaTensors<'t>) -> Vec<(&'static str, &'t RawTensor)> {
    let mut v = vec![("o", t.o)];
    v.extend(t.final_state.map(|s| ("final state", s)));
    v
}

fn scratch<'t>(w: &RawGlaWorkspace<'t>) -> Vec<(&'static str, &'t RawTensor)> {
    let mut v = vec![("GLA workspace tables", w.tables)];
    v.extend(w.buffers.map(|b| ("GLA workspace buffers", b)));
    v
}

/// Launch the forward pass on `stream` (asynchronous): o (and the final states) written from
/// q, k, v, g (and the initial states), with the problem taken from the shapes and
/// `options`, using the caller's `workspace` (its tables are written here, on the stream,
/// before the kernels). Checks as [`plan_raw`], and that every tensor's storage is device
/// memory of the stream's device inside one allocation.
///
/// # Safety
/// Each tensor's and the workspace's storage is memory the caller owns, live until the
/// launches have completed on `stream`; nothing else writes the inputs or accesses the outputs
/// and the workspace until then.
pub unsafe fn forward_raw(
    stream: &RawStream,
    options: &GlaOptions,
    tensors: &RawGlaTensors<'_>,
    workspace: &RawGlaWorkspace<'_>,
) -> Result<()> {
    let gpu = stream.gpu();
    let (plan, ws, table) = plan_raw(Target::of(gpu), options, tensors, workspace)?;
    let mut all = inputs(tensors);
    all.extend(outputs(tensors));
    all.extend(scratch(workspace));
    for (what, t) in all {
        t.check_memory(what, gpu)?;
    }
    // SAFETY: one view over the segment and the combination tables (consecutive in the
    // caller's table tensor, checked by `plan_raw`), device memory of the stream's device
    // (checked above), live and not accessed by others (the caller's contract).
    unsafe {
        stream.upload(
            &DevView::<u32>::from_raw(ws.segments.addr(), table.len()),
            &table,
        )
    }?;
    // SAFETY: the plan checked every view against its storage and the outputs and workspace
    // against the inputs and each other; every storage is device memory of the stream's device
    // inside one allocation (checked above), live and not accessed by others until the
    // launches complete (the caller's contract); the tables hold the plan's words (written
    // just above, on the same stream).
    unsafe { plan.run(stream, &ws) }
}

/// The tensors of a raw backward: contiguous, bf16 but for the f32 states and dg.
#[derive(Clone, Copy)]
pub struct RawGlaBackwardTensors<'t> {
    /// The forward's queries `[B, T, H, dk]`.
    pub q: &'t RawTensor,
    /// The forward's keys `[B, T, H, dk]`.
    pub k: &'t RawTensor,
    /// The forward's values `[B, T, H, dv]`.
    pub v: &'t RawTensor,
    /// The forward's log-decays `[B, T, H, dk]`.
    pub g: &'t RawTensor,
    /// The forward's initial states `[N, H, dk, dv]` f32, or zero states.
    pub init_state: Option<&'t RawTensor>,
    /// Gradient of the outputs `[B, T, H, dv]`.
    pub d_o: &'t RawTensor,
    /// Gradient of the final states `[N, H, dk, dv]` f32, or zero.
    pub d_final_state: Option<&'t RawTensor>,
    /// dq `[B, T, H, dk]` (written).
    pub d_q: &'t RawTensor,
    /// dk `[B, T, H, dk]` (written).
    pub d_k: &'t RawTensor,
    /// dv `[B, T, H, dv]` (written).
    pub d_v: &'t RawTensor,
    /// dg `[B, T, H, dk]` f32 (written).
    pub d_g: &'t RawTensor,
    /// Gradient of the initial states `[N, H, dk, dv]` f32 (written).
    pub d_init_state: &'t RawTensor,
}

impl<'t> RawGlaBackwardTensors<'t> {
    fn inputs(&self) -> Vec<(&'static str, &'t RawTensor)> {
        let mut v = vec![("q", self.q), ("k", self.k), ("v", self.v), ("g", self.g)];
        v.extend(self.init_state.map(|s| ("initial state", s)));
        v.push(("output gradient", self.d_o));
        v.extend(self.d_final_state.map(|s| ("final-state gradient", s)));
        v
    }

    fn outputs(&self) -> Vec<(&'static str, &'t RawTensor)> {
        vec![
            ("query gradient", self.d_q),
            ("key gradient", self.d_k),
            ("value gradient", self.d_v),
            ("log-decay gradient", self.d_g),
            ("initial-state gradient", self.d_init_state),
        ]
    }
}

/// The f32 buffers of a backward in its workspace: `(state gradients at block ends, seg_end,
/// delta, decay_log2, seg_init)` as `(offset, len)`, and the total.
fn carve_backward(
    grad: usize,
    split: Option<(usize, usize)>,
    seg_init: usize,
) -> ([(usize, usize); 5], usize) {
    let up = |n: usize| n.div_ceil(CARVE_ALIGN) * CARVE_ALIGN;
    let (state, decay) = split.unwrap_or((0, 0));
    let lens = [grad.max(1), state, state, decay, seg_init];
    let mut at = 0;
    let parts = lens.map(|len| {
        let part = (at, len);
        at += up(len);
        part
    });
    let total = parts[4].0 + parts[4].1;
    (parts, total)
}

/// The workspace a backward of Q of shape `q` and V of shape `v` with `options` needs on
/// `target` (pure; its kernels are the baseline's): the tables of its segments and its f32
/// buffers (to be zeroed by the caller). The problem is validated as the plan validates it.
pub fn backward_workspace_lens(
    target: Target,
    q: &[usize],
    v: &[usize],
    options: &GlaOptions,
) -> Result<GlaWorkspaceLens> {
    let p = GlaProblem::from_shapes(q, v, options)?;
    p.validate()?;
    let segments = p.backward_segments(target)?;
    let (segment_words, combine_words) = segments.table_words();
    let split = p.workspace_len(&segments);
    let per_state = p.heads * p.dk * p.dv;
    let grad = kernel_abi::gla::backward::grad_slots(p.rows(), segments.segments.len()) * per_state;
    let seg_init = if split.is_some() {
        segments.segments.len() * per_state
    } else {
        0
    };
    Ok(GlaWorkspaceLens {
        table_words: segment_words.len() + combine_words.len(),
        buffer_elems: carve_backward(grad, split, seg_init).1,
    })
}

/// Plan the backward on raw tensors for `target` (pure), as [`plan_raw`] the forward: the plan,
/// its workspace as views (`workspace.buffers` required), and the table words to write.
pub fn plan_backward_raw<'a>(
    target: Target,
    options: &GlaOptions,
    t: &RawGlaBackwardTensors<'_>,
    workspace: &RawGlaWorkspace<'_>,
) -> Result<(GlaBackwardPlan, GlaBackwardWorkspace<'a>, Vec<u32>)> {
    let p = GlaProblem::from_shapes(&t.q.shape, &t.v.shape, options)?;
    p.validate()?;
    let qk = [p.batch, p.seq_len, p.heads, p.dk];
    let vo = [p.batch, p.seq_len, p.heads, p.dv];
    let state = [p.num_seqs(), p.heads, p.dk, p.dv];
    let st = |what: &str, s: &RawTensor| s.contiguous_view(what, &state, 16);
    let tensors = GlaBackwardTensors {
        q: t.q.contiguous_view("GLA q", &qk, 16)?,
        k: t.k.contiguous_view("GLA k", &qk, 16)?,
        v: t.v.contiguous_view("GLA v", &vo, 16)?,
        g: t.g.contiguous_view("GLA g", &qk, 16)?,
        init_state: t
            .init_state
            .map(|s| st("GLA initial state", s))
            .transpose()?,
        d_o: t.d_o.contiguous_view("GLA output gradient", &vo, 16)?,
        d_final_state: t
            .d_final_state
            .map(|s| st("GLA final-state gradient", s))
            .transpose()?,
        d_q: t.d_q.contiguous_view("GLA query gradient", &qk, 16)?,
        d_k: t.d_k.contiguous_view("GLA key gradient", &qk, 16)?,
        d_v: t.d_v.contiguous_view("GLA value gradient", &vo, 16)?,
        d_g: t.d_g.contiguous_view("GLA log-decay gradient", &qk, 16)?,
        d_init_state: st("GLA initial-state gradient", t.d_init_state)?,
    };
    check_disjoint(&t.inputs(), &t.outputs())?;
    let mut all = t.inputs();
    all.extend(t.outputs());
    check_disjoint(&all, &scratch(workspace))?;
    let plan = p.plan_backward(target, &tensors)?;
    let (segment_words, combine_words) = plan.segments.table_words();
    let words = segment_words.len() + combine_words.len();
    let tables: DevView<'a, u32> =
        workspace
            .tables
            .contiguous_view("GLA workspace tables", &[words], 16)?;
    let (parts, total) = carve_backward(plan.grad_len, plan.workspace, plan.seg_init_len);
    let buffers = workspace
        .buffers
        .ok_or_else(|| Error::invalid("GLA workspace buffers", "the backward needs its buffers"))?;
    let all: DevView<'a, f32> = buffers.contiguous_view("GLA workspace buffers", &[total], 16)?;
    // SAFETY: each part lies inside the checked views (`carve_backward`; the combination table
    // follows the segment table's whole 16-byte entries); addresses only.
    let ws = unsafe {
        let part = |(at, len): (usize, usize)| DevView::from_raw(all.addr() + 4 * at as u64, len);
        GlaBackwardWorkspace {
            segments: DevView::from_raw(tables.addr(), segment_words.len()),
            grad: DevView::from_raw(all.addr(), plan.grad_len),
            split: plan.workspace.map(|_| GlaBackwardSplit {
                combine: DevView::from_raw(
                    tables.addr() + 4 * segment_words.len() as u64,
                    combine_words.len(),
                ),
                seg_end: part(parts[1]),
                delta: part(parts[2]),
                decay_log2: part(parts[3]),
                seg_init: Some(part(parts[4])),
            }),
        }
    };
    let mut table = segment_words;
    table.extend(combine_words);
    Ok((plan, ws, table))
}

/// Launch the backward on `stream` (asynchronous): every gradient of the forward of the same
/// inputs, from dO (and the final states' gradient), using the caller's `workspace` (of
/// [`backward_workspace_lens`], its buffers zeroed; its tables are written here, on the stream,
/// before the kernels). Checks as [`plan_backward_raw`], and every tensor's memory.
///
/// # Safety
/// As [`forward_raw`].
pub unsafe fn backward_raw(
    stream: &RawStream,
    options: &GlaOptions,
    tensors: &RawGlaBackwardTensors<'_>,
    workspace: &RawGlaWorkspace<'_>,
) -> Result<()> {
    let gpu = stream.gpu();
    let (plan, ws, table) = plan_backward_raw(Target::of(gpu), options, tensors, workspace)?;
    let mut all = tensors.inputs();
    all.extend(tensors.outputs());
    all.extend(scratch(workspace));
    for (what, t) in all {
        t.check_memory(what, gpu)?;
    }
    // SAFETY: as in `forward_raw`: the consecutive tables in the caller's checked table tensor.
    unsafe {
        stream.upload(
            &DevView::<u32>::from_raw(ws.segments.addr(), table.len()),
            &table,
        )
    }?;
    // SAFETY: as in `forward_raw`; the tables hold the plan's words, written just above.
    unsafe { plan.run(stream, &ws) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ptx::Arch;
    use crate::raw::ElemType;

    fn target() -> Target {
        Target {
            arch: Arch::Sm90a,
            multiprocessors: 132,
        }
    }

    /// Raw tensors of a problem at made-up, disjoint, aligned addresses.
    struct Fixture {
        q: RawTensor,
        k: RawTensor,
        v: RawTensor,
        g: RawTensor,
        o: RawTensor,
        h0: RawTensor,
        ht: RawTensor,
        tables: RawTensor,
        buffers: RawTensor,
    }

    fn fixture(q: [usize; 4], dv: usize, options: &GlaOptions) -> Fixture {
        let [b, t, h, dk] = q;
        let n = options.cu_seqlens.as_ref().map_or(b, |c| c.len() - 1);
        let lens = workspace_lens(target(), &q, &[b, t, h, dv], options).unwrap();
        let at = |i: u64| i << 36;
        Fixture {
            q: RawTensor::contiguous(at(1), ElemType::Bf16, &q),
            k: RawTensor::contiguous(at(2), ElemType::Bf16, &q),
            v: RawTensor::contiguous(at(3), ElemType::Bf16, &[b, t, h, dv]),
            g: RawTensor::contiguous(at(4), ElemType::Bf16, &q),
            o: RawTensor::contiguous(at(5), ElemType::Bf16, &[b, t, h, dv]),
            h0: RawTensor::contiguous(at(6), ElemType::F32, &[n, h, dk, dv]),
            ht: RawTensor::contiguous(at(7), ElemType::F32, &[n, h, dk, dv]),
            tables: RawTensor::contiguous(at(8), ElemType::I32, &[lens.table_words]),
            buffers: RawTensor::contiguous(at(9), ElemType::F32, &[lens.buffer_elems]),
        }
    }

    impl Fixture {
        fn plan(&self, options: &GlaOptions) -> Result<(GlaPlan, Vec<u32>)> {
            let t = RawGlaTensors {
                q: &self.q,
                k: &self.k,
                v: &self.v,
                g: &self.g,
                init_state: Some(&self.h0),
                o: &self.o,
                final_state: Some(&self.ht),
            };
            let w = RawGlaWorkspace {
                tables: &self.tables,
                buffers: (self.buffers.shape[0] > 0).then_some(&self.buffers),
            };
            plan_raw(target(), options, &t, &w).map(|(plan, _, table)| (plan, table))
        }
    }

    #[test]
    fn raw_plan_matches_the_typed_plan() {
        for (q, dv, options) in [
            ([2, 1000, 4, 64], 128, GlaOptions::default()),
            ([1, 40_000, 2, 128], 64, GlaOptions::default()),
            (
                [1, 3000, 4, 64],
                64,
                GlaOptions {
                    cu_seqlens: Some(vec![0, 17, 2500, 3000]),
                    ..Default::default()
                },
            ),
        ] {
            let f = fixture(q, dv, &options);
            let (plan, table) = f.plan(&options).unwrap();
            let problem = GlaProblem::from_shapes(&q, &[q[0], q[1], q[2], dv], &options).unwrap();
            let segments = problem.segments(target()).unwrap();
            assert_eq!(plan.segments, segments);
            let (s, c) = segments.table_words();
            assert_eq!(table, [s, c].concat());
            assert_eq!(plan.workspace.is_some(), f.buffers.shape[0] > 0, "{q:?}");
        }
    }

    #[test]
    fn bad_raw_tensors_are_refused() {
        let options = GlaOptions::default();
        let f = fixture([1, 40_000, 2, 64], 64, &options);
        f.plan(&options).unwrap();
        let refuse = |change: &dyn Fn(&mut Fixture), needle: &str| {
            let mut g = fixture([1, 40_000, 2, 64], 64, &options);
            change(&mut g);
            let e = g.plan(&options).map(|_| ()).unwrap_err();
            assert!(e.to_string().contains(needle), "{needle}: {e}");
        };
        refuse(&|f| f.q.dtype = ElemType::F16, "GLA q dtype");
        refuse(&|f| f.k.shape[3] = 128, "GLA k shape");
        refuse(&|f| f.g.strides[2] = 128, "GLA g strides");
        refuse(&|f| f.h0.dtype = ElemType::Bf16, "GLA initial state dtype");
        refuse(
            &|f| {
                f.o.ptr = f.q.ptr;
                f.o.storage_ptr = f.q.ptr;
            },
            "overlaps q",
        );
        refuse(&|f| f.tables.shape[0] -= 1, "GLA workspace tables shape");
        refuse(
            &|f| f.tables.dtype = ElemType::F32,
            "GLA workspace tables dtype",
        );
        refuse(&|f| f.buffers.shape[0] = 0, "no buffers were given");
        refuse(
            &|f| {
                f.buffers.ptr = f.ht.ptr + 64;
                f.buffers.storage_ptr = f.buffers.ptr;
            },
            "overlaps final state",
        );
        refuse(&|f| f.v.ptr += 2, "GLA v start");
        refuse(&|f| f.q.storage_bytes -= 2, "GLA q storage");
    }

    #[test]
    fn raw_backward_plan_takes_its_workspace_lens() {
        for (q, dv, options) in [
            ([2, 1000, 4, 64], 128, GlaOptions::default()),
            ([1, 40_000, 2, 128], 64, GlaOptions::default()),
            (
                [1, 3000, 4, 64],
                64,
                GlaOptions {
                    cu_seqlens: Some(vec![0, 17, 2500, 3000]),
                    ..Default::default()
                },
            ),
        ] {
            let v = [q[0], q[1], q[2], dv];
            let lens = backward_workspace_lens(target(), &q, &v, &options).unwrap();
            let f = fixture(q, dv, &options);
            let at = |i: u64| i << 40;
            let grads = [
                RawTensor::contiguous(at(1), ElemType::Bf16, &q),
                RawTensor::contiguous(at(2), ElemType::Bf16, &q),
                RawTensor::contiguous(at(3), ElemType::Bf16, &v),
                RawTensor::contiguous(at(4), ElemType::F32, &q),
                RawTensor::contiguous(at(5), ElemType::F32, &f.h0.shape),
            ];
            let d_o = RawTensor::contiguous(at(6), ElemType::Bf16, &v);
            let tables = RawTensor::contiguous(at(7), ElemType::I32, &[lens.table_words]);
            let buffers = RawTensor::contiguous(at(8), ElemType::F32, &[lens.buffer_elems]);
            let t = RawGlaBackwardTensors {
                q: &f.q,
                k: &f.k,
                v: &f.v,
                g: &f.g,
                init_state: Some(&f.h0),
                d_o: &d_o,
                d_final_state: Some(&f.ht),
                d_q: &grads[0],
                d_k: &grads[1],
                d_v: &grads[2],
                d_g: &grads[3],
                d_init_state: &grads[4],
            };
            let w = RawGlaWorkspace {
                tables: &tables,
                buffers: Some(&buffers),
            };
            let (plan, ws, table) = plan_backward_raw(target(), &options, &t, &w).unwrap();
            let (s, c) = plan.segments.table_words();
            assert_eq!(table, [s, c].concat());
            assert_eq!(ws.split.is_some(), plan.workspace.is_some(), "{q:?}");
            plan.launches(&ws).unwrap();
            let mut short = buffers.clone();
            short.shape[0] -= 1;
            let w = RawGlaWorkspace {
                tables: &tables,
                buffers: Some(&short),
            };
            let e = plan_backward_raw(target(), &options, &t, &w)
                .map(|_| ())
                .unwrap_err();
            assert!(e.to_string().contains("GLA workspace buffers shape"), "{e}");
        }
    }
}
