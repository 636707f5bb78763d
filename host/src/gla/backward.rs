//! The backward pass, planned as the forward is ([`GlaProblem`] -> plan -> `run` on any
//! executor). So far its reverse pass ([`GlaProblem::plan_reverse_pass`]): dv, the gradient of
//! every sequence's initial state and the gradient of the state at the end of every
//! [`G_BLOCK`](kernel_abi::gla::backward::G_BLOCK)-token block (bench/NOTES.md, "GLA backward:
//! plan"). The f64 specification is [`reference::backward`](super::reference::backward).

use super::plan::check_view;
use super::problem::{GlaProblem, SegmentPlan, plan_segments};
use crate::attention::Target;
use crate::error::Result;
use crate::exec::{DevView, Exec};
use crate::launch::Launch;
use half::bf16;
use kernel_abi::Kernel;
use kernel_abi::gla::backward::{DhdvParams, dhdv_kernel, grad_slots};

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
}

/// One launch of a [`GlaBackwardPlan`], with the workspace's pointers still zero.
#[derive(Clone, Copy)]
pub enum GlaBackwardStep {
    /// `gla_bwd_dhdv_dk*_dv*`.
    Reverse {
        /// The kernel.
        kernel: &'static Kernel<DhdvParams>,
        /// `(segments, heads, 1)`.
        grid: (u32, u32, u32),
        /// The parameters.
        params: DhdvParams,
    },
}

impl std::fmt::Debug for GlaBackwardStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GlaBackwardStep::Reverse { kernel, grid, .. } => {
                write!(f, "{} on {grid:?}", kernel.name)
            }
        }
    }
}

/// A planned backward pass (pure: built on the CPU, no GPU needed).
#[derive(Clone, Debug)]
pub struct GlaBackwardPlan {
    /// The segments: one per sequence (the backward does not split sequences yet).
    pub segments: SegmentPlan,
    /// Elements of the workspace's state gradients: `slots * heads * dk * dv` with
    /// [`grad_slots`] slots.
    pub grad_len: usize,
    /// The launches, in order.
    pub steps: Vec<GlaBackwardStep>,
}

impl GlaProblem {
    /// The segments of the backward: one per sequence, whatever the forward's segment length.
    pub fn backward_segments(&self) -> Result<SegmentPlan> {
        plan_segments(self, usize::MAX)
    }

    /// Plan the reverse pass on `tensors` for `target` (the baseline kernels run on
    /// every target): validates the problem and the tensors' sizes and alignment.
    pub fn plan_reverse_pass(
        &self,
        target: Target,
        t: &GlaReverseTensors<'_>,
    ) -> Result<GlaBackwardPlan> {
        let _ = target;
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
        let segments = p.backward_segments()?;
        let grad_len = grad_slots(p.rows(), segments.segments.len()) * p.heads * p.dk * p.dv;
        let kernel = dhdv_kernel(p.dk as u32, p.dv as u32).expect("validated head dimensions");
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
            heads: p.heads as u32,
            scale: p.output_scale(),
            has_d_final: u32::from(t.d_final_state.is_some()),
            pad: 0,
        };
        let steps = vec![GlaBackwardStep::Reverse {
            kernel,
            grid: (segments.segments.len() as u32, p.heads as u32, 1),
            params,
        }];
        Ok(GlaBackwardPlan {
            segments,
            grad_len,
            steps,
        })
    }
}

impl GlaBackwardPlan {
    /// The launches on `workspace` (checked against the plan's sizes).
    pub fn launches(
        &self,
        workspace: &GlaBackwardWorkspace<'_>,
    ) -> Result<Vec<Launch<DhdvParams>>> {
        check_view(
            "segment table",
            &workspace.segments,
            4 * self.segments.segments.len(),
        )?;
        check_view("workspace state gradients", &workspace.grad, self.grad_len)?;
        Ok(self
            .steps
            .iter()
            .map(|step| match *step {
                GlaBackwardStep::Reverse {
                    kernel,
                    grid,
                    params,
                } => Launch::new(
                    kernel,
                    grid,
                    (),
                    DhdvParams {
                        segments: workspace.segments.ptr(),
                        grad: workspace.grad.ptr(),
                        ..params
                    },
                ),
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
            // SAFETY: q, k, g, dO, dv have the problem's sizes and the state gradients N * heads
            // * dk * dv elements (checked by the plan), the workspace the plan's sizes
            // (checked); the segment table covers the problem's sequences, one segment each,
            // and has gridDim.x entries; each block writes only its own rows of dv, its own
            // gradient slots (distinct, `grad_slot`) and its sequence's initial-state gradient. The memory is live (the
            // caller's contract).
            unsafe { exec.launch(&launch)? };
        }
        Ok(())
    }
}
