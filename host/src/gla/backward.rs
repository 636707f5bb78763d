//! The backward pass, planned as the forward is ([`GlaProblem`] -> plan -> `run` on any
//! executor): [`GlaProblem::plan_backward`] (every gradient) and its first part alone,
//! [`GlaProblem::plan_reverse_pass`] (dv, the gradient of every sequence's initial state and
//! the gradient of the state at the end of every
//! [`G_BLOCK`](kernel_abi::gla::backward::G_BLOCK)-token block; bench/NOTES.md, "GLA backward").
//! The f64 specification is [`reference::backward`](super::reference::backward).
//!
//! The backward needs nothing from the forward but its inputs (q, k, v, g and the initial
//! state): the states it needs at segment starts are recomputed by the forward's own state
//! pass and combination.

use super::plan::check_view;
use super::problem::{GlaKernel, GlaProblem, SegmentPlan};
use crate::attention::Target;
use crate::error::{Error, Result};
use crate::exec::{DevView, Exec};
use crate::launch::Launch;
use half::bf16;
use kernel_abi::Kernel;
use kernel_abi::gla::backward::{
    DhdvParams, DqkgParams, DqkgTcParams, GLA_BWD_COMBINE, dqkg_kernel, dqkg_tc_kernel, grad_slots,
    reverse_kernels,
};
use kernel_abi::gla::{COMBINE_THREADS, CombineParams, GLA_COMBINE, GlaParams, baseline_kernels};

use super::device::GlaInputs;
use crate::exec::OnStream;
use crate::gpu::Gpu;
use crate::memory::{upload, zeroed};
use cust::memory::DeviceBuffer;
use cust::stream::Stream;

/// The tensors of a whole backward pass as device views (contiguous): the forward's inputs, the
/// gradients of its outputs, and the gradients written. The written views must overlap neither
/// each other nor the inputs.
#[derive(Clone, Copy)]
pub struct GlaBackwardTensors<'a> {
    /// Queries `[B, T, H, dk]`.
    pub q: DevView<'a, bf16>,
    /// Keys `[B, T, H, dk]`.
    pub k: DevView<'a, bf16>,
    /// Values `[B, T, H, dv]`.
    pub v: DevView<'a, bf16>,
    /// Log-decays `[B, T, H, dk]`.
    pub g: DevView<'a, bf16>,
    /// The forward's initial states `[N, H, dk, dv]`, or zero states.
    pub init_state: Option<DevView<'a, f32>>,
    /// Gradient of the outputs `[B, T, H, dv]`.
    pub d_o: DevView<'a, bf16>,
    /// Gradient of the final states `[N, H, dk, dv]`, or zero.
    pub d_final_state: Option<DevView<'a, f32>>,
    /// Gradient of the queries `[B, T, H, dk]` (written).
    pub d_q: DevView<'a, bf16>,
    /// Gradient of the keys `[B, T, H, dk]` (written).
    pub d_k: DevView<'a, bf16>,
    /// Gradient of the values `[B, T, H, dv]` (written).
    pub d_v: DevView<'a, bf16>,
    /// Gradient of the log-decays `[B, T, H, dk]`, f32 (written; zero where `g < G_FLOOR`).
    pub d_g: DevView<'a, f32>,
    /// Gradient of the initial states `[N, H, dk, dv]` (written, whether or not the forward had
    /// initial states).
    pub d_init_state: DevView<'a, f32>,
}

/// The tensors of the reverse pass as device views (contiguous).
#[derive(Clone, Copy)]
pub struct GlaReverseTensors<'a> {
    /// Queries `[B, T, H, dk]`.
    pub q: DevView<'a, bf16>,
    /// Keys `[B, T, H, dk]`.
    pub k: DevView<'a, bf16>,
    /// Log-decays `[B, T, H, dk]`.
    pub g: DevView<'a, bf16>,
    /// Gradient of the outputs `[B, T, H, dv]`.
    pub d_o: DevView<'a, bf16>,
    /// Gradient of the final states `[N, H, dk, dv]`, or zero.
    pub d_final_state: Option<DevView<'a, f32>>,
    /// Gradient of the initial states `[N, H, dk, dv]` (written; whether or not the forward had
    /// initial states).
    pub d_init_state: DevView<'a, f32>,
    /// Gradient of the values `[B, T, H, dv]` (written).
    pub d_v: DevView<'a, bf16>,
}

/// The workspace of a backward plan as device views (sizes from the plan).
#[derive(Clone, Copy)]
pub struct GlaBackwardWorkspace<'a> {
    /// The segment table as words ([`SegmentPlan::table_words`]).
    pub segments: DevView<'a, u32>,
    /// The state gradients at block ends, [`GlaBackwardPlan::grad_len`] f32 (written).
    pub grad: DevView<'a, f32>,
    /// When some sequence has several segments: the combination table and the buffers.
    pub split: Option<GlaBackwardSplit<'a>>,
}

/// The combination table and the buffers of the backward's segment passes as device views.
#[derive(Clone, Copy)]
pub struct GlaBackwardSplit<'a> {
    /// `[seq, first, count, 0]` per split sequence ([`SegmentPlan::table_words`]).
    pub combine: DevView<'a, u32>,
    /// Gradient at every segment's end, `[segments, heads, dk, dv]` f32.
    pub seg_end: DevView<'a, f32>,
    /// `[segments, heads, dk, dv]` f32.
    pub delta: DevView<'a, f32>,
    /// `[segments, heads, dk]` f32.
    pub decay_log2: DevView<'a, f32>,
    /// The forward state at every segment's start, `[segments, heads, dk, dv]` f32: needed by
    /// a whole backward ([`GlaBackwardPlan::seg_init_len`]), not by the reverse pass alone.
    pub seg_init: Option<DevView<'a, f32>>,
}

/// Which kernel computes dq, dk and dg in a whole backward.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DqkgKernel {
    /// `gla_bwd_dqkg_tc_dk*_dv*`: chunkwise, the matrix products on tensor cores, the block
    /// gradients of the reverse pass read per block (the default).
    #[default]
    TensorCore,
    /// `gla_bwd_dqkg_dk*_dv*`: token by token on CUDA cores (the reference implementation on
    /// the device).
    TokenByToken,
}

/// One launch of a [`GlaBackwardPlan`], with the workspace's pointers still zero.
#[derive(Clone, Copy)]
pub enum GlaBackwardStep {
    /// `gla_bwd_states_dk*_dv*` or `gla_bwd_dhdv_dk*_dv*`.
    Reverse {
        /// The kernel.
        kernel: &'static Kernel<DhdvParams>,
        /// `(segments, heads, 1)`.
        grid: (u32, u32, u32),
        /// The parameters.
        params: DhdvParams,
    },
    /// `gla_bwd_combine`.
    Combine {
        /// `(split sequences, heads, ceil(dk dv / COMBINE_THREADS))`.
        grid: (u32, u32, u32),
        /// The parameters (read backward: see `GLA_BWD_COMBINE`).
        params: CombineParams,
    },
    /// The forward's `gla_states_dk*_dv*` (split sequences: the state each segment adds).
    ForwardStates {
        /// The kernel.
        kernel: &'static Kernel<GlaParams>,
        /// `(segments, heads, 1)`.
        grid: (u32, u32, u32),
        /// The parameters (no outputs).
        params: GlaParams,
    },
    /// The forward's `gla_combine` (split sequences: the state at every segment's start).
    ForwardCombine {
        /// `(split sequences, heads, ceil(dk dv / COMBINE_THREADS))`.
        grid: (u32, u32, u32),
        /// The parameters.
        params: CombineParams,
    },
    /// `gla_bwd_dqkg_dk*_dv*`.
    Dqkg {
        /// The kernel.
        kernel: &'static Kernel<DqkgParams>,
        /// `(segments, heads, 1)`.
        grid: (u32, u32, u32),
        /// The parameters.
        params: DqkgParams,
    },
    /// `gla_bwd_dqkg_tc_dk*_dv*`.
    DqkgTc {
        /// The kernel.
        kernel: &'static Kernel<DqkgTcParams>,
        /// `(segments, heads, 1)`.
        grid: (u32, u32, u32),
        /// The parameters.
        params: DqkgTcParams,
    },
}

/// A launch of a [`GlaBackwardPlan`] with its workspace filled in.
#[derive(Clone, Debug)]
pub enum GlaBackwardLaunch {
    /// `gla_bwd_states_dk*_dv*` or `gla_bwd_dhdv_dk*_dv*`.
    Reverse(Launch<DhdvParams>),
    /// `gla_bwd_combine` or the forward's `gla_combine`.
    Combine(Launch<CombineParams>),
    /// The forward's `gla_states_dk*_dv*`.
    ForwardStates(Launch<GlaParams>),
    /// `gla_bwd_dqkg_dk*_dv*`.
    Dqkg(Launch<DqkgParams>),
    /// `gla_bwd_dqkg_tc_dk*_dv*`.
    DqkgTc(Launch<DqkgTcParams>),
}

impl std::fmt::Debug for GlaBackwardStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GlaBackwardStep::Reverse { kernel, grid, .. } => {
                write!(f, "{} on {grid:?}", kernel.name)
            }
            GlaBackwardStep::Combine { grid, .. } => {
                write!(f, "{} on {grid:?}", GLA_BWD_COMBINE.name)
            }
            GlaBackwardStep::ForwardStates { kernel, grid, .. } => {
                write!(f, "{} on {grid:?}", kernel.name)
            }
            GlaBackwardStep::ForwardCombine { grid, .. } => {
                write!(f, "{} on {grid:?}", GLA_COMBINE.name)
            }
            GlaBackwardStep::Dqkg { kernel, grid, .. } => {
                write!(f, "{} on {grid:?}", kernel.name)
            }
            GlaBackwardStep::DqkgTc { kernel, grid, .. } => {
                write!(f, "{} on {grid:?}", kernel.name)
            }
        }
    }
}

/// A planned backward pass (pure: built on the CPU, no GPU needed).
#[derive(Clone, Debug)]
pub struct GlaBackwardPlan {
    /// The segments (the baseline forward's for the same target).
    pub segments: SegmentPlan,
    /// Elements of the split workspace's buffers, `(seg_end and delta each, decay_log2)`, when
    /// some sequence is split.
    pub workspace: Option<(usize, usize)>,
    /// Elements of the workspace's state gradients: `slots * heads * dk * dv` with
    /// [`grad_slots`] slots.
    pub grad_len: usize,
    /// Elements of the split workspace's `seg_init` (`segments * heads * dk * dv`) when the
    /// plan is a whole backward and some sequence is split, else 0.
    pub seg_init_len: usize,
    /// The launches, in order.
    pub steps: Vec<GlaBackwardStep>,
}

impl GlaProblem {
    /// The segments of the backward on `target`: the baseline forward's (its kernels run on
    /// every target), [`GlaProblem::segment_len`] or one wave of its resident blocks.
    pub fn backward_segments(&self, target: Target) -> Result<SegmentPlan> {
        self.segments_of(GlaKernel::Baseline, target.multiprocessors as usize)
    }

    /// Plan the reverse pass on `tensors` for `target`: validates the problem and the tensors'
    /// sizes and alignment. With a split sequence: `gla_bwd_states`, `gla_bwd_combine`, then
    /// `gla_bwd_dhdv`; else `gla_bwd_dhdv` alone.
    pub fn plan_reverse_pass(
        &self,
        target: Target,
        t: &GlaReverseTensors<'_>,
    ) -> Result<GlaBackwardPlan> {
        let p = self;
        p.validate()?;
        check_view("q [B, T, H, dk]", &t.q, p.qk_len())?;
        check_view("k [B, T, H, dk]", &t.k, p.qk_len())?;
        check_view("g [B, T, H, dk]", &t.g, p.qk_len())?;
        check_view("value gradient [B, T, H, dv]", &t.d_v, p.v_len())?;
        check_view("output gradient [B, T, H, dv]", &t.d_o, p.v_len())?;
        if let Some(s) = &t.d_final_state {
            check_view("final-state gradient [N, H, dk, dv]", s, p.state_len())?;
        }
        check_view(
            "initial-state gradient [N, H, dk, dv]",
            &t.d_init_state,
            p.state_len(),
        )?;
        let segments = p.backward_segments(target)?;
        let workspace = p.workspace_len(&segments);
        let grad_len = grad_slots(p.rows(), segments.segments.len()) * p.heads * p.dk * p.dv;
        let (full, states) =
            reverse_kernels(p.dk as u32, p.dv as u32).expect("validated head dimensions");
        let params = DhdvParams {
            q: t.q.ptr(),
            k: t.k.ptr(),
            g: t.g.ptr(),
            d_o: t.d_o.ptr(),
            d_v: t.d_v.ptr(),
            segments: std::ptr::null(),
            d_final_state: t.d_final_state.map_or(std::ptr::null_mut(), |b| b.ptr()),
            d_init_state: t.d_init_state.ptr(),
            grad: std::ptr::null_mut(),
            seg_end: std::ptr::null(),
            delta: std::ptr::null_mut(),
            decay_log2: std::ptr::null_mut(),
            heads: p.heads as u32,
            scale: p.output_scale(),
            has_d_final: u32::from(t.d_final_state.is_some()),
            pad: 0,
        };
        let grid = (segments.segments.len() as u32, p.heads as u32, 1);
        let mut steps = Vec::new();
        if workspace.is_some() {
            let (dk, dv) = (p.dk as u32, p.dv as u32);
            steps.push(GlaBackwardStep::Reverse {
                kernel: states,
                grid,
                params,
            });
            steps.push(GlaBackwardStep::Combine {
                grid: (
                    segments.combine.len() as u32,
                    p.heads as u32,
                    (dk * dv).div_ceil(kernel_abi::gla::COMBINE_THREADS),
                ),
                params: CombineParams {
                    entries: std::ptr::null(),
                    init_state: params.d_final_state,
                    seg_init: std::ptr::null_mut(),
                    delta: std::ptr::null(),
                    decay_log2: std::ptr::null(),
                    heads: p.heads as u32,
                    dk,
                    dv,
                    has_init: params.has_d_final,
                },
            });
        }
        steps.push(GlaBackwardStep::Reverse {
            kernel: full,
            grid,
            params,
        });
        Ok(GlaBackwardPlan {
            segments,
            workspace,
            grad_len,
            seg_init_len: 0,
            steps,
        })
    }

    /// Plan the whole backward on `tensors` for `target`: validates the problem and the
    /// tensors' sizes and alignment. The reverse pass ([`GlaProblem::plan_reverse_pass`]: dv,
    /// the initial states' gradients, the gradient at every segment's end), then, with a split
    /// sequence, the forward's `gla_states` and `gla_combine` (the state at every segment's
    /// start; they reuse the reverse pass's `delta` and `decay_log2`, whose contents
    /// `gla_bwd_combine` consumed), then dq, dk, dg by `gla_bwd_dqkg_tc` (chunkwise, reading
    /// the block gradients; [`GlaProblem::plan_backward_with`] picks the kernel). Workspace: the segment
    /// table and the block gradients of the reverse pass ([`GlaBackwardPlan::grad_len`] f32),
    /// and for split sequences four `[segments, heads, dk, dv]` f32 buffers and one
    /// `[segments, heads, dk]`.
    pub fn plan_backward(
        &self,
        target: Target,
        t: &GlaBackwardTensors<'_>,
    ) -> Result<GlaBackwardPlan> {
        self.plan_backward_with(target, t, DqkgKernel::default())
    }

    /// [`GlaProblem::plan_backward`] with dq, dk, dg computed by `dqkg`.
    pub fn plan_backward_with(
        &self,
        target: Target,
        t: &GlaBackwardTensors<'_>,
        dqkg: DqkgKernel,
    ) -> Result<GlaBackwardPlan> {
        let p = self;
        p.validate()?;
        check_view("v [B, T, H, dv]", &t.v, p.v_len())?;
        check_view("query gradient [B, T, H, dk]", &t.d_q, p.qk_len())?;
        check_view("key gradient [B, T, H, dk]", &t.d_k, p.qk_len())?;
        check_view("log-decay gradient [B, T, H, dk]", &t.d_g, p.qk_len())?;
        if let Some(s) = &t.init_state {
            check_view("initial state [N, H, dk, dv]", s, p.state_len())?;
        }
        let mut plan = p.plan_reverse_pass(
            target,
            &GlaReverseTensors {
                q: t.q,
                k: t.k,
                g: t.g,
                d_o: t.d_o,
                d_final_state: t.d_final_state,
                d_init_state: t.d_init_state,
                d_v: t.d_v,
            },
        )?;
        let (dk, dv) = (p.dk as u32, p.dv as u32);
        let grid = (plan.segments.segments.len() as u32, p.heads as u32, 1);
        let null = std::ptr::null_mut::<f32>();
        let init = t.init_state.map_or(null, |b| b.ptr());
        if plan.workspace.is_some() {
            let (_, states) = baseline_kernels(dk, dv).expect("validated head dimensions");
            let fwd = GlaParams {
                q: t.q.ptr(),
                k: t.k.ptr(),
                v: t.v.ptr(),
                g: t.g.ptr(),
                o: std::ptr::null_mut(),
                segments: std::ptr::null(),
                init_state: init,
                final_state: null,
                seg_init: null,
                delta: null,
                decay_log2: null,
                heads: p.heads as u32,
                scale: p.output_scale(),
                has_init: u32::from(t.init_state.is_some()),
                has_final: 0,
            };
            plan.steps.push(GlaBackwardStep::ForwardStates {
                kernel: states,
                grid,
                params: fwd,
            });
            plan.steps.push(GlaBackwardStep::ForwardCombine {
                grid: (
                    plan.segments.combine.len() as u32,
                    p.heads as u32,
                    (dk * dv).div_ceil(COMBINE_THREADS),
                ),
                params: CombineParams {
                    entries: std::ptr::null(),
                    init_state: init,
                    seg_init: null,
                    delta: null,
                    decay_log2: null,
                    heads: p.heads as u32,
                    dk,
                    dv,
                    has_init: fwd.has_init,
                },
            });
            plan.seg_init_len = plan.segments.segments.len() * p.heads * p.dk * p.dv;
        }
        let params = DqkgParams {
            q: t.q.ptr(),
            k: t.k.ptr(),
            v: t.v.ptr(),
            g: t.g.ptr(),
            d_o: t.d_o.ptr(),
            d_q: t.d_q.ptr(),
            d_k: t.d_k.ptr(),
            d_g: t.d_g.ptr(),
            segments: std::ptr::null(),
            init_state: init,
            seg_init: std::ptr::null(),
            d_final_state: t.d_final_state.map_or(null, |b| b.ptr()),
            seg_end: std::ptr::null(),
            heads: p.heads as u32,
            scale: p.output_scale(),
            has_init: u32::from(t.init_state.is_some()),
            has_d_final: u32::from(t.d_final_state.is_some()),
        };
        plan.steps.push(match dqkg {
            DqkgKernel::TensorCore => GlaBackwardStep::DqkgTc {
                kernel: dqkg_tc_kernel(dk, dv).expect("validated head dimensions"),
                grid,
                params: DqkgTcParams {
                    base: params,
                    grad: std::ptr::null(),
                },
            },
            DqkgKernel::TokenByToken => GlaBackwardStep::Dqkg {
                kernel: dqkg_kernel(dk, dv).expect("validated head dimensions"),
                grid,
                params,
            },
        });
        Ok(plan)
    }
}

impl GlaBackwardPlan {
    /// The launches on `workspace` (checked against the plan's sizes).
    pub fn launches(&self, workspace: &GlaBackwardWorkspace<'_>) -> Result<Vec<GlaBackwardLaunch>> {
        check_view(
            "segment table",
            &workspace.segments,
            4 * self.segments.segments.len(),
        )?;
        check_view("workspace state gradients", &workspace.grad, self.grad_len)?;
        let split = match (self.workspace, &workspace.split) {
            (None, _) => None,
            (Some((state, decay)), Some(w)) => {
                check_view(
                    "combination table",
                    &w.combine,
                    4 * self.segments.combine.len(),
                )?;
                check_view("workspace seg_end", &w.seg_end, state)?;
                check_view("workspace delta", &w.delta, state)?;
                check_view("workspace decay_log2", &w.decay_log2, decay)?;
                if self.seg_init_len > 0 {
                    match &w.seg_init {
                        Some(s) => check_view("workspace seg_init", s, self.seg_init_len)?,
                        None => {
                            return Err(Error::invalid(
                                "GLA backward workspace",
                                "the plan splits a sequence but no seg_init was given",
                            ));
                        }
                    }
                }
                Some(w)
            }
            (Some(_), None) => {
                return Err(Error::invalid(
                    "GLA backward workspace",
                    "the plan splits a sequence but no split workspace was given",
                ));
            }
        };
        let null = std::ptr::null_mut::<f32>();
        let (seg_end, delta, decay_log2) = match split {
            Some(w) => (w.seg_end.ptr(), w.delta.ptr(), w.decay_log2.ptr()),
            None => (null, null, null),
        };
        let seg_init = split.and_then(|w| w.seg_init).map_or(null, |s| s.ptr());
        let entries = split.map_or(std::ptr::null(), |w| w.combine.ptr());
        Ok(self
            .steps
            .iter()
            .map(|step| match *step {
                GlaBackwardStep::Reverse {
                    kernel,
                    grid,
                    params,
                } => GlaBackwardLaunch::Reverse(Launch::new(
                    kernel,
                    grid,
                    (),
                    DhdvParams {
                        segments: workspace.segments.ptr(),
                        grad: workspace.grad.ptr(),
                        seg_end,
                        delta,
                        decay_log2,
                        ..params
                    },
                )),
                GlaBackwardStep::Combine { grid, params } => {
                    GlaBackwardLaunch::Combine(Launch::new(
                        &GLA_BWD_COMBINE,
                        grid,
                        (),
                        CombineParams {
                            entries,
                            seg_init: seg_end,
                            delta,
                            decay_log2,
                            ..params
                        },
                    ))
                }
                GlaBackwardStep::ForwardStates {
                    kernel,
                    grid,
                    params,
                } => GlaBackwardLaunch::ForwardStates(Launch::new(
                    kernel,
                    grid,
                    (),
                    GlaParams {
                        segments: workspace.segments.ptr(),
                        seg_init,
                        delta,
                        decay_log2,
                        ..params
                    },
                )),
                GlaBackwardStep::ForwardCombine { grid, params } => {
                    GlaBackwardLaunch::Combine(Launch::new(
                        &GLA_COMBINE,
                        grid,
                        (),
                        CombineParams {
                            entries,
                            seg_init,
                            delta,
                            decay_log2,
                            ..params
                        },
                    ))
                }
                GlaBackwardStep::Dqkg {
                    kernel,
                    grid,
                    params,
                } => GlaBackwardLaunch::Dqkg(Launch::new(
                    kernel,
                    grid,
                    (),
                    DqkgParams {
                        segments: workspace.segments.ptr(),
                        seg_init,
                        seg_end,
                        ..params
                    },
                )),
                GlaBackwardStep::DqkgTc {
                    kernel,
                    grid,
                    params,
                } => GlaBackwardLaunch::DqkgTc(Launch::new(
                    kernel,
                    grid,
                    (),
                    DqkgTcParams {
                        base: DqkgParams {
                            segments: workspace.segments.ptr(),
                            seg_init,
                            seg_end,
                            ..params.base
                        },
                        grad: workspace.grad.ptr(),
                    },
                )),
            })
            .collect())
    }

    /// Run the plan on `exec` with `workspace` (asynchronous on a stream).
    ///
    /// # Safety
    /// The tensors the plan was made for and `workspace` are memory of `exec`'s device, alive
    /// and not otherwise accessed until the launches completed; the segment table holds the
    /// words of the plan's segments ([`SegmentPlan::table_words`]).
    pub unsafe fn run(&self, exec: &impl Exec, workspace: &GlaBackwardWorkspace<'_>) -> Result<()> {
        for launch in self.launches(workspace)? {
            match &launch {
                // SAFETY: q, k, g, dO, dv have the problem's sizes and the state gradients N *
                // heads * dk * dv elements (checked by the plan), the workspace the plan's
                // sizes (checked); the segment table covers the problem's sequences with
                // consecutive disjoint segments and has gridDim.x entries; `gla_bwd_states`
                // writes only the delta and decay slices of its own segment (not first);
                // `gla_bwd_dhdv` reads seg_end only for segments that are not last, written by
                // `gla_bwd_combine` just before (in order on the executor), and writes only its
                // own rows of dv, its own gradient slots (distinct, `grad_slot`) and, for a
                // first segment, its sequence's initial-state gradient. The memory is live (the
                // caller's contract).
                GlaBackwardLaunch::Reverse(l) => unsafe { exec.launch(l)? },
                // SAFETY: the combine entries name consecutive segments of the table (count >=
                // 2, all of one sequence, seq < N); every buffer has the size the parameters
                // document (checked); each thread writes its own element of the earlier
                // segments' end gradients (`gla_bwd_combine`) or of the later segments'
                // initial states (`gla_combine`, after `gla_states` wrote delta and decay_log2).
                GlaBackwardLaunch::Combine(l) => unsafe { exec.launch(l)? },
                // SAFETY: as for the forward's state pass (`GlaPlan::run`): k, g, v have the
                // problem's sizes (checked), delta and decay_log2 the plan's (checked, no
                // longer read by the reverse pass, which completed before on the executor);
                // each block writes only its own segment's slices.
                GlaBackwardLaunch::ForwardStates(l) => unsafe { exec.launch(l)? },
                // SAFETY: q, k, v, g, dO and dq, dk, dg have the problem's sizes, the states
                // and state gradients N * heads * dk * dv elements (checked by the plan);
                // seg_init and seg_end were written by the combinations before (in order on the
                // executor) for every segment that is not first, resp. not last; each block
                // writes only its own segment's rows of dq, dk, dg, which alias nothing (the
                // caller's contract).
                GlaBackwardLaunch::Dqkg(l) => unsafe { exec.launch(l)? },
                // SAFETY: as for `gla_bwd_dqkg`, and `grad` has the plan's size (checked),
                // every slot of every segment written by `gla_bwd_dhdv` before (in order on
                // the executor); the kernel uses its own segment's rows of dg as scratch.
                GlaBackwardLaunch::DqkgTc(l) => unsafe { exec.launch(l)? },
            }
        }
        Ok(())
    }
}

impl GlaBackwardLaunch {
    /// What the kernel's handle declares.
    pub fn kernel(&self) -> &kernel_abi::KernelDecl {
        match self {
            GlaBackwardLaunch::Reverse(l) => l.kernel(),
            GlaBackwardLaunch::Combine(l) => l.kernel(),
            GlaBackwardLaunch::ForwardStates(l) => l.kernel(),
            GlaBackwardLaunch::Dqkg(l) => l.kernel(),
            GlaBackwardLaunch::DqkgTc(l) => l.kernel(),
        }
    }

    /// Grid, block and shared memory.
    pub fn config(&self) -> &crate::gpu::LaunchConfig {
        match self {
            GlaBackwardLaunch::Reverse(l) => l.config(),
            GlaBackwardLaunch::Combine(l) => l.config(),
            GlaBackwardLaunch::ForwardStates(l) => l.config(),
            GlaBackwardLaunch::Dqkg(l) => l.config(),
            GlaBackwardLaunch::DqkgTc(l) => l.config(),
        }
    }
}

/// The gradients of the forward's outputs on the device, for [`backward`].
pub struct GlaOutputGrads<'a> {
    /// `dL/do` `[B, T, H, dv]`.
    pub d_o: &'a DeviceBuffer<bf16>,
    /// `dL/d final_state` `[N, H, dk, dv]`, or zero (the final states unused).
    pub d_final_state: Option<&'a DeviceBuffer<f32>>,
}

/// The gradients [`backward`] writes.
pub struct GlaGradients<'a> {
    /// `dL/dq` `[B, T, H, dk]`.
    pub d_q: &'a mut DeviceBuffer<bf16>,
    /// `dL/dk` `[B, T, H, dk]`.
    pub d_k: &'a mut DeviceBuffer<bf16>,
    /// `dL/dv` `[B, T, H, dv]`.
    pub d_v: &'a mut DeviceBuffer<bf16>,
    /// `dL/dg` `[B, T, H, dk]` f32 (the log-decays before the clamp: zero where
    /// `g < G_FLOOR`).
    pub d_g: &'a mut DeviceBuffer<f32>,
    /// `dL/d initial_state` `[N, H, dk, dv]` (written whether or not `inputs` has initial
    /// states).
    pub d_init_state: &'a mut DeviceBuffer<f32>,
}

/// The backward's device tables and workspace, kept by a [`GlaSession`](super::GlaSession)
/// across runs (sizes from the plan: they depend on the problem and the target only).
pub(super) struct BackwardWorkspace {
    /// The kernel computing dq, dk, dg that the buffers were sized for.
    dqkg: DqkgKernel,
    segments: DeviceBuffer<u32>,
    grad: DeviceBuffer<f32>,
    /// When a sequence is split.
    split: Option<BackwardSplitBuffers>,
}

/// The split workspace's buffers (see [`GlaBackwardSplit`]).
struct BackwardSplitBuffers {
    combine: DeviceBuffer<u32>,
    seg_end: DeviceBuffer<f32>,
    delta: DeviceBuffer<f32>,
    decay_log2: DeviceBuffer<f32>,
    seg_init: DeviceBuffer<f32>,
}

impl BackwardWorkspace {
    fn new(plan: &GlaBackwardPlan, dqkg: DqkgKernel) -> Result<BackwardWorkspace> {
        let (words, combine_words) = plan.segments.table_words();
        Ok(BackwardWorkspace {
            dqkg,
            segments: upload(&words)?,
            grad: zeroed::<f32>(plan.grad_len.max(1))?,
            split: match plan.workspace {
                Some((state, decay)) => Some(BackwardSplitBuffers {
                    combine: upload(&combine_words)?,
                    seg_end: zeroed::<f32>(state)?,
                    delta: zeroed::<f32>(state)?,
                    decay_log2: zeroed::<f32>(decay)?,
                    seg_init: zeroed::<f32>(plan.seg_init_len.max(1))?,
                }),
                None => None,
            },
        })
    }

    fn views(&mut self) -> GlaBackwardWorkspace<'_> {
        GlaBackwardWorkspace {
            segments: (&self.segments).into(),
            grad: (&mut self.grad).into(),
            split: self.split.as_mut().map(|b| GlaBackwardSplit {
                combine: (&b.combine).into(),
                seg_end: (&mut b.seg_end).into(),
                delta: (&mut b.delta).into(),
                decay_log2: (&mut b.decay_log2).into(),
                seg_init: Some((&mut b.seg_init).into()),
            }),
        }
    }
}

impl super::GlaSession {
    /// Launch the whole backward of the session's problem on `stream` (asynchronous): every
    /// gradient of the forward on `inputs` (the forward's own inputs: nothing else of the
    /// forward is kept), given the gradients of its outputs. The first run allocates the
    /// backward's workspace ([`GlaProblem::plan_backward`]), later runs reuse it.
    pub fn backward(
        &mut self,
        gpu: &Gpu,
        stream: &Stream,
        inputs: &GlaInputs,
        out_grads: &GlaOutputGrads,
        grads: &mut GlaGradients,
    ) -> Result<()> {
        self.backward_with(gpu, stream, inputs, out_grads, grads, DqkgKernel::default())
    }

    /// [`GlaSession::backward`](super::GlaSession::backward) with dq, dk, dg computed by
    /// `dqkg`.
    pub fn backward_with(
        &mut self,
        gpu: &Gpu,
        stream: &Stream,
        inputs: &GlaInputs,
        out_grads: &GlaOutputGrads,
        grads: &mut GlaGradients,
        dqkg: DqkgKernel,
    ) -> Result<()> {
        gpu.bind()?;
        let tensors = GlaBackwardTensors {
            q: inputs.q.into(),
            k: inputs.k.into(),
            v: inputs.v.into(),
            g: inputs.g.into(),
            init_state: inputs.init_state.map(|b| b.into()),
            d_o: out_grads.d_o.into(),
            d_final_state: out_grads.d_final_state.map(|b| b.into()),
            d_q: (&mut *grads.d_q).into(),
            d_k: (&mut *grads.d_k).into(),
            d_v: (&mut *grads.d_v).into(),
            d_g: (&mut *grads.d_g).into(),
            d_init_state: (&mut *grads.d_init_state).into(),
        };
        let plan = self
            .problem()
            .plan_backward_with(Target::of(gpu), &tensors, dqkg)?;
        // The plan depends on the problem and the target only: a workspace made for the same
        // kernel fits every later run on this GPU.
        if self.backward.as_ref().is_none_or(|w| w.dqkg != dqkg) {
            self.backward = Some(BackwardWorkspace::new(&plan, dqkg)?);
        }
        let workspace = self.backward.as_mut().expect("allocated above").views();
        // SAFETY: every view is a live allocation of this GPU's context (the inputs borrowed,
        // the gradients mutably borrowed, so distinct from each other and from the inputs; the
        // workspace the session's, held mutably for the call and sized by a plan of this
        // problem and kernel); the table holds the plan's words; kernels on one stream run in
        // order, so a later run's writes to the workspace follow this run's reads.
        unsafe { plan.run(&OnStream { gpu, stream }, &workspace) }
    }
}

/// Convenience: the backward pass on `stream` through a fresh
/// [`GlaSession`](super::GlaSession) (its workspace allocated here), then wait for it (tests,
/// examples; a training loop keeps a session and calls
/// [`GlaSession::backward`](super::GlaSession::backward)).
pub fn backward(
    gpu: &Gpu,
    stream: &Stream,
    problem: &GlaProblem,
    inputs: &GlaInputs,
    out_grads: &GlaOutputGrads,
    grads: &mut GlaGradients,
) -> Result<()> {
    backward_with(
        gpu,
        stream,
        problem,
        inputs,
        out_grads,
        grads,
        DqkgKernel::default(),
    )
}

/// [`backward`] with dq, dk, dg computed by `dqkg`.
pub fn backward_with(
    gpu: &Gpu,
    stream: &Stream,
    problem: &GlaProblem,
    inputs: &GlaInputs,
    out_grads: &GlaOutputGrads,
    grads: &mut GlaGradients,
    dqkg: DqkgKernel,
) -> Result<()> {
    let mut session = super::GlaSession::new(gpu, problem)?;
    session.backward_with(gpu, stream, inputs, out_grads, grads, dqkg)?;
    gpu.sync(stream, "GLA backward")
}

#[cfg(test)]
mod tests;
