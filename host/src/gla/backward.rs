//! The backward pass, planned as the forward is ([`GlaProblem`] -> plan -> `run` on any
//! executor). So far its reverse pass ([`GlaProblem::plan_reverse_pass`]): dv, the gradient of
//! every sequence's initial state and the gradient of the state at the end of every
//! [`G_BLOCK`](kernel_abi::gla::backward::G_BLOCK)-token block (bench/NOTES.md, "GLA backward:
//! plan"). The f64 specification is [`reference::backward`](super::reference::backward).

use super::plan::check_view;
use super::problem::{GlaKernel, GlaProblem, SegmentPlan};
use crate::attention::Target;
use crate::error::{Error, Result};
use crate::exec::{DevView, Exec};
use crate::launch::Launch;
use half::bf16;
use kernel_abi::Kernel;
use kernel_abi::gla::CombineParams;
use kernel_abi::gla::backward::{DhdvParams, GLA_BWD_COMBINE, grad_slots, reverse_kernels};

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
}

/// A launch of a [`GlaBackwardPlan`] with its workspace filled in.
#[derive(Clone, Debug)]
pub enum GlaBackwardLaunch {
    /// `gla_bwd_states_dk*_dv*` or `gla_bwd_dhdv_dk*_dv*`.
    Reverse(Launch<DhdvParams>),
    /// `gla_bwd_combine`.
    Combine(Launch<CombineParams>),
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
            steps,
        })
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
                Some(w)
            }
            (Some(_), None) => {
                return Err(Error::invalid(
                    "GLA backward workspace",
                    "the plan splits a sequence but no split workspace was given",
                ));
            }
        };
        let (seg_end, delta, decay_log2) = match split {
            Some(w) => (w.seg_end.ptr(), w.delta.ptr(), w.decay_log2.ptr()),
            None => (
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            ),
        };
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
                            entries: split.map_or(std::ptr::null(), |w| w.combine.ptr()),
                            seg_init: seg_end,
                            delta,
                            decay_log2,
                            ..params
                        },
                    ))
                }
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
                // segments' end gradients.
                GlaBackwardLaunch::Combine(l) => unsafe { exec.launch(l)? },
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
        }
    }

    /// Grid, block and shared memory.
    pub fn config(&self) -> &crate::gpu::LaunchConfig {
        match self {
            GlaBackwardLaunch::Reverse(l) => l.config(),
            GlaBackwardLaunch::Combine(l) => l.config(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::check_kernel_launch;
    use crate::ptx::Arch;

    fn view<'a, T>(addr: u64, len: usize) -> DevView<'a, T> {
        // SAFETY: only planned, never dereferenced.
        unsafe { DevView::from_raw(addr, len) }
    }

    fn tensors<'a>(p: &GlaProblem) -> GlaReverseTensors<'a> {
        GlaReverseTensors {
            q: view(1 << 30, p.qk_len()),
            k: view(2 << 30, p.qk_len()),
            g: view(3 << 30, p.qk_len()),
            d_o: view(4 << 30, p.v_len()),
            d_final_state: Some(view(5 << 30, p.state_len())),
            d_init_state: view(6 << 30, p.state_len()),
            d_v: view(7 << 30, p.v_len()),
        }
    }

    /// The plan's launches on a made-up workspace, each checked against every target's PTX.
    fn checked_names(plan: &GlaBackwardPlan) -> Vec<&'static str> {
        let (seg, comb) = plan.segments.table_words();
        let ws = GlaBackwardWorkspace {
            segments: view(8 << 30, seg.len()),
            grad: view(9 << 30, plan.grad_len),
            split: plan.workspace.map(|(state, decay)| GlaBackwardSplit {
                combine: view(10 << 30, comb.len()),
                seg_end: view(11 << 30, state),
                delta: view(12 << 30, state),
                decay_log2: view(13 << 30, decay),
            }),
        };
        let launches = plan.launches(&ws).unwrap();
        for l in &launches {
            for arch in Arch::ALL {
                check_kernel_launch(arch, l.kernel(), l.config(), 227 * 1024)
                    .unwrap_or_else(|e| panic!("{arch}: {e}"));
            }
        }
        launches.iter().map(|l| l.kernel().name).collect()
    }

    #[test]
    fn one_launch_without_a_split_three_with() {
        let target = Target {
            arch: Arch::Sm80,
            multiprocessors: 132,
        };
        let p = GlaProblem::new(4, 100, 8, 64, 128);
        let plan = p.plan_reverse_pass(target, &tensors(&p)).unwrap();
        assert!(plan.workspace.is_none());
        assert_eq!(checked_names(&plan), ["gla_bwd_dhdv_dk64_dv128"]);
        assert_eq!(plan.grad_len, grad_slots(400, 4) * 8 * 64 * 128);

        let p = GlaProblem::new(1, 1000, 2, 128, 64).with_segment_len(64);
        let plan = p.plan_reverse_pass(target, &tensors(&p)).unwrap();
        assert_eq!(plan.segments.segments.len(), 16);
        assert_eq!(plan.workspace, Some((16 * 2 * 128 * 64, 16 * 2 * 128)));
        assert_eq!(
            checked_names(&plan),
            [
                "gla_bwd_states_dk128_dv64",
                "gla_bwd_combine",
                "gla_bwd_dhdv_dk128_dv64"
            ]
        );
    }

    #[test]
    fn rejects_a_missing_split_workspace() {
        let target = Target {
            arch: Arch::Sm90a,
            multiprocessors: 132,
        };
        let p = GlaProblem::new(1, 200, 1, 64, 64).with_segment_len(32);
        let plan = p.plan_reverse_pass(target, &tensors(&p)).unwrap();
        let (seg, _) = plan.segments.table_words();
        let ws = GlaBackwardWorkspace {
            segments: view(8 << 30, seg.len()),
            grad: view(9 << 30, plan.grad_len),
            split: None,
        };
        assert!(plan.launches(&ws).is_err());
    }
}
