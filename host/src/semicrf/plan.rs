//! The plan of a pass: every launch of it, with its grid, shared memory and parameters, from
//! the problem and the tensors' device addresses (pure: no GPU needed), and its run.

use super::SemiCrfProblem;
use crate::error::{Error, Result};
use crate::exec::{DevView, Exec};
use crate::launch::Launch;
use kernel_abi::semicrf::{
    self as abi, MarginalParams, REDUCE_THREADS, ReduceParams, SEMICRF_MARGINALS, SEMICRF_REDUCE,
    SEMICRF_SCAN, SEMICRF_VITERBI, ScanParams, ViterbiParams,
};

/// The inputs of a problem on the device.
#[derive(Clone, Copy)]
pub struct InputViews<'a> {
    /// Cumulative scores `[B, T + 1, C]`.
    pub cumsum: DevView<'a, f32>,
    /// Duration scores `[K, C]`.
    pub dur: DevView<'a, f32>,
    /// Transition scores `[C, C]`.
    pub trans: DevView<'a, f32>,
    /// Lengths `[B]`, each in `1..=T`.
    pub lengths: DevView<'a, u32>,
}

/// What the forward keeps for the backward (see [`super::ForwardState`]).
#[derive(Clone, Copy)]
pub struct StateViews<'a> {
    /// log Z `[B]`.
    pub log_z: DevView<'a, f32>,
    /// log Z of both directions `[2, B]`.
    pub log_z64: DevView<'a, f64>,
    /// Alpha checkpoints `[B, nseg, K + 1, C]`.
    pub alpha_ckpt: DevView<'a, f64>,
    /// Their normalizers `[B, nseg]`.
    pub alpha_norm: DevView<'a, f64>,
    /// Beta checkpoints `[B, nseg, K, C]`.
    pub beta_ckpt: DevView<'a, f64>,
    /// Their normalizers `[B, nseg]`.
    pub beta_norm: DevView<'a, f64>,
    /// Partial counts `[B, nseg, K C + C C]`.
    pub partials: DevView<'a, f64>,
}

/// The outputs of the backward (see [`super::Gradients`]).
#[derive(Clone, Copy)]
pub struct GradientViews<'a> {
    /// `[B, T + 1, C]`.
    pub grad_cumsum: DevView<'a, f32>,
    /// `[K, C]`.
    pub grad_dur: DevView<'a, f32>,
    /// `[C, C]`.
    pub grad_trans: DevView<'a, f32>,
    /// `[B, T, K, C]`, or none to skip the marginals.
    pub marginals: Option<DevView<'a, f32>>,
}

/// The outputs of the Viterbi kernel (see [`super::ViterbiOutput`]).
#[derive(Clone, Copy)]
pub struct ViterbiViews<'a> {
    /// `[B]`.
    pub score: DevView<'a, f32>,
    /// `[B, T + 1, C]`.
    pub backptr: DevView<'a, u32>,
    /// `[B, T]`.
    pub seg_start: DevView<'a, u32>,
    /// `[B, T]`.
    pub seg_dur: DevView<'a, u32>,
    /// `[B, T]`.
    pub seg_label: DevView<'a, u32>,
    /// `[B]`.
    pub seg_count: DevView<'a, u32>,
}

/// A pass and the tensors it reads and writes.
#[derive(Clone, Copy)]
pub enum SemiCrfTensors<'a> {
    /// The forward scan: log Z and the alpha checkpoints.
    Forward {
        /// Inputs.
        inputs: InputViews<'a>,
        /// State (written).
        state: StateViews<'a>,
    },
    /// After a forward on the same state: the reverse scan, then the segment kernel and the
    /// reduction.
    Backward {
        /// Inputs.
        inputs: InputViews<'a>,
        /// State (the forward's, completed by the reverse scan).
        state: StateViews<'a>,
        /// Gradients (written).
        grads: GradientViews<'a>,
    },
    /// Both scans in one launch (they are independent), then the segment kernel and the
    /// reduction: the results of a forward then a backward.
    ForwardBackward {
        /// Inputs.
        inputs: InputViews<'a>,
        /// State (written).
        state: StateViews<'a>,
        /// Gradients (written).
        grads: GradientViews<'a>,
    },
    /// The best segmentations.
    Viterbi {
        /// Inputs.
        inputs: InputViews<'a>,
        /// Outputs (written).
        out: ViterbiViews<'a>,
    },
}

/// The launches of a pass, in the order they run (those a pass does not use are `None`).
#[derive(Clone, Copy, Debug)]
pub struct SemiCrfPlan {
    /// `semicrf_scan` over the pass's directions: grid `(B, directions)`.
    pub scan: Option<Launch<ScanParams>>,
    /// `semicrf_marginals`: grid `(nseg, B)`.
    pub marginals: Option<Launch<MarginalParams>>,
    /// `semicrf_reduce`: one thread per partial count.
    pub reduce: Option<Launch<ReduceParams>>,
    /// `semicrf_viterbi`: grid `B`.
    pub viterbi: Option<Launch<ViterbiParams>>,
}

/// Grid of `semicrf_scan` over `directions` (1 or 2): one block per (sequence, direction).
fn scan_grid(p: &SemiCrfProblem, directions: u32) -> (u32, u32, u32) {
    (p.batch as u32, directions, 1)
}

/// Grid of `semicrf_marginals`: one block per (segment, sequence).
fn marginals_grid(p: &SemiCrfProblem) -> (u32, u32, u32) {
    (p.num_segments() as u32, p.batch as u32, 1)
}

/// Grid of `semicrf_reduce`: one thread per partial count.
fn reduce_grid(p: &SemiCrfProblem) -> (u32, u32, u32) {
    let blocks = (abi::partial_len(p.k as u32, p.c as u32) as u32).div_ceil(REDUCE_THREADS);
    (blocks, 1, 1)
}

/// Grid of `semicrf_viterbi`: one block per sequence.
fn viterbi_grid(p: &SemiCrfProblem) -> (u32, u32, u32) {
    (p.batch as u32, 1, 1)
}

fn check_len<T>(what: &str, expected: usize, view: &DevView<'_, T>) -> Result<()> {
    if expected == view.len() {
        Ok(())
    } else {
        Err(Error::shape(
            format!("semi-CRF {what}"),
            format!("{expected} elements"),
            view.len(),
        ))
    }
}

impl SemiCrfProblem {
    /// Plan a pass on `tensors`: validates the problem and the tensors' lengths (the values of
    /// the inputs are the caller's: see [`SemiCrfPlan::run`]).
    pub fn plan(&self, tensors: &SemiCrfTensors<'_>) -> Result<SemiCrfPlan> {
        self.validate()?;
        let none = SemiCrfPlan {
            scan: None,
            marginals: None,
            reduce: None,
            viterbi: None,
        };
        Ok(match tensors {
            SemiCrfTensors::Forward { inputs, state } => SemiCrfPlan {
                scan: Some(self.scan_launch(inputs, state, 0, 1)?),
                ..none
            },
            SemiCrfTensors::Backward {
                inputs,
                state,
                grads,
            } => SemiCrfPlan {
                scan: Some(self.scan_launch(inputs, state, 1, 1)?),
                marginals: Some(self.marginals_launch(inputs, state, grads)?),
                reduce: Some(self.reduce_launch(inputs, state, grads)),
                ..none
            },
            SemiCrfTensors::ForwardBackward {
                inputs,
                state,
                grads,
            } => SemiCrfPlan {
                scan: Some(self.scan_launch(inputs, state, 0, 2)?),
                marginals: Some(self.marginals_launch(inputs, state, grads)?),
                reduce: Some(self.reduce_launch(inputs, state, grads)),
                ..none
            },
            SemiCrfTensors::Viterbi { inputs, out } => SemiCrfPlan {
                viterbi: Some(self.viterbi_launch(inputs, out)?),
                ..none
            },
        })
    }

    fn check_inputs(&self, inputs: &InputViews<'_>) -> Result<()> {
        let n = self.buffer_lens();
        check_len("cumulative scores", n.cumsum, &inputs.cumsum)?;
        check_len("duration scores", n.dur, &inputs.dur)?;
        check_len("transition scores", n.trans, &inputs.trans)?;
        check_len("lengths", n.lengths, &inputs.lengths)
    }

    fn check_state(&self, state: &StateViews<'_>) -> Result<()> {
        let n = self.buffer_lens();
        check_len("log Z", n.log_z, &state.log_z)?;
        check_len("log Z (f64)", n.log_z64, &state.log_z64)?;
        check_len("alpha checkpoints", n.alpha_ckpt, &state.alpha_ckpt)?;
        check_len("alpha normalizers", n.alpha_norm, &state.alpha_norm)?;
        check_len("beta checkpoints", n.beta_ckpt, &state.beta_ckpt)?;
        check_len("beta normalizers", n.beta_norm, &state.beta_norm)?;
        check_len("partial counts", n.partials, &state.partials)
    }

    /// `semicrf_scan` over `directions` grid rows, row 0 running direction `first` (0 forward,
    /// 1 reverse).
    fn scan_launch(
        &self,
        inputs: &InputViews<'_>,
        state: &StateViews<'_>,
        first: u32,
        directions: u32,
    ) -> Result<Launch<ScanParams>> {
        self.check_inputs(inputs)?;
        self.check_state(state)?;
        let params = ScanParams {
            cumsum: inputs.cumsum.ptr(),
            dur: inputs.dur.ptr(),
            trans: inputs.trans.ptr(),
            lengths: inputs.lengths.ptr(),
            log_z: state.log_z.ptr(),
            log_z64: state.log_z64.ptr(),
            alpha_ckpt: state.alpha_ckpt.ptr(),
            alpha_norm: state.alpha_norm.ptr(),
            beta_ckpt: state.beta_ckpt.ptr(),
            beta_norm: state.beta_norm.ptr(),
            batch: self.batch as u32,
            t_max: self.t as u32,
            k: self.k as u32,
            c: self.c as u32,
            ckpt: self.checkpoint as u32,
            nseg: self.num_segments() as u32,
            lanes: self.lanes(),
            first_direction: first,
        };
        let grid = scan_grid(self, directions);
        Ok(Launch::new(&SEMICRF_SCAN, grid, self.scan_shape(), params))
    }

    fn marginals_launch(
        &self,
        inputs: &InputViews<'_>,
        state: &StateViews<'_>,
        grads: &GradientViews<'_>,
    ) -> Result<Launch<MarginalParams>> {
        let n = self.buffer_lens();
        check_len(
            "gradient of the cumulative scores",
            n.grad_cumsum,
            &grads.grad_cumsum,
        )?;
        check_len(
            "gradient of the duration scores",
            n.grad_dur,
            &grads.grad_dur,
        )?;
        check_len(
            "gradient of the transitions",
            n.grad_trans,
            &grads.grad_trans,
        )?;
        if let Some(m) = &grads.marginals {
            check_len("marginals", n.marginals, m)?;
        }
        let params = MarginalParams {
            cumsum: inputs.cumsum.ptr(),
            dur: inputs.dur.ptr(),
            trans: inputs.trans.ptr(),
            lengths: inputs.lengths.ptr(),
            log_z64: state.log_z64.ptr(),
            alpha_ckpt: state.alpha_ckpt.ptr(),
            alpha_norm: state.alpha_norm.ptr(),
            beta_ckpt: state.beta_ckpt.ptr(),
            beta_norm: state.beta_norm.ptr(),
            grad_cumsum: grads.grad_cumsum.ptr(),
            marginals: grads
                .marginals
                .as_ref()
                .map_or(std::ptr::null_mut(), |m| m.ptr()),
            partials: state.partials.ptr(),
            batch: self.batch as u32,
            t_max: self.t as u32,
            k: self.k as u32,
            c: self.c as u32,
            ckpt: self.checkpoint as u32,
            nseg: self.num_segments() as u32,
            lanes: self.lanes(),
            pad: 0,
        };
        let grid = marginals_grid(self);
        Ok(Launch::new(
            &SEMICRF_MARGINALS,
            grid,
            self.segment_shape(),
            params,
        ))
    }

    fn reduce_launch(
        &self,
        inputs: &InputViews<'_>,
        state: &StateViews<'_>,
        grads: &GradientViews<'_>,
    ) -> Launch<ReduceParams> {
        let params = ReduceParams {
            partials: state.partials.ptr(),
            lengths: inputs.lengths.ptr(),
            grad_dur: grads.grad_dur.ptr(),
            grad_trans: grads.grad_trans.ptr(),
            batch: self.batch as u32,
            k: self.k as u32,
            c: self.c as u32,
            ckpt: self.checkpoint as u32,
            nseg: self.num_segments() as u32,
            pad: 0,
        };
        Launch::new(&SEMICRF_REDUCE, reduce_grid(self), (), params)
    }

    fn viterbi_launch(
        &self,
        inputs: &InputViews<'_>,
        out: &ViterbiViews<'_>,
    ) -> Result<Launch<ViterbiParams>> {
        self.check_inputs(inputs)?;
        let n = self.buffer_lens();
        check_len("Viterbi scores", n.viterbi_score, &out.score)?;
        check_len("Viterbi backpointers", n.viterbi_backptr, &out.backptr)?;
        check_len("Viterbi segment starts", n.viterbi_segments, &out.seg_start)?;
        check_len(
            "Viterbi segment durations",
            n.viterbi_segments,
            &out.seg_dur,
        )?;
        check_len("Viterbi segment labels", n.viterbi_segments, &out.seg_label)?;
        check_len("Viterbi segment counts", n.viterbi_count, &out.seg_count)?;
        let params = ViterbiParams {
            cumsum: inputs.cumsum.ptr(),
            dur: inputs.dur.ptr(),
            trans: inputs.trans.ptr(),
            lengths: inputs.lengths.ptr(),
            score: out.score.ptr(),
            backptr: out.backptr.ptr(),
            seg_start: out.seg_start.ptr(),
            seg_dur: out.seg_dur.ptr(),
            seg_label: out.seg_label.ptr(),
            seg_count: out.seg_count.ptr(),
            batch: self.batch as u32,
            t_max: self.t as u32,
            k: self.k as u32,
            c: self.c as u32,
            lanes: self.lanes(),
            pad: 0,
        };
        let grid = viterbi_grid(self);
        Ok(Launch::new(
            &SEMICRF_VITERBI,
            grid,
            self.scan_shape(),
            params,
        ))
    }
}

impl SemiCrfPlan {
    /// The same plan with `kernel` in place of `semicrf_marginals` (same parameters, grid and
    /// shared memory): the negative control's launcher (`crate::negative`) runs it.
    #[cfg(any(test, feature = "negative-controls"))]
    pub(crate) fn with_marginals_kernel(
        self,
        kernel: &kernel_abi::Kernel<MarginalParams, abi::SegmentShape>,
        problem: &SemiCrfProblem,
    ) -> SemiCrfPlan {
        SemiCrfPlan {
            marginals: self.marginals.map(|m| {
                Launch::new(
                    kernel,
                    m.config().grid,
                    problem.segment_shape(),
                    *m.params(),
                )
            }),
            ..self
        }
    }

    /// Run the launches in order (asynchronous on a stream: synchronize before reading the
    /// outputs).
    ///
    /// # Safety
    /// The tensors the plan was made for are live device memory of `exec` for the whole run,
    /// the outputs alias nothing else, the lengths are in `1..=T` and the scores finite (as
    /// [`super::SemiCrfInputs::validate`] checks), and a backward's state holds the forward
    /// of the same inputs (from an earlier run on the same stream).
    pub unsafe fn run(&self, exec: &impl Exec) -> Result<()> {
        // SAFETY (every launch): the plan checked every tensor's length against the validated
        // problem; the values and the liveness of the memory are the caller's contract; the
        // launches run in stream order, so the segment kernel reads the checkpoints of both
        // scans and the reduction its partial counts.
        if let Some(l) = &self.scan {
            // SAFETY: see above.
            unsafe { exec.launch(l)? };
        }
        if let Some(l) = &self.marginals {
            // SAFETY: see above.
            unsafe { exec.launch(l)? };
        }
        if let Some(l) = &self.reduce {
            // SAFETY: see above.
            unsafe { exec.launch(l)? };
        }
        if let Some(l) = &self.viterbi {
            // SAFETY: see above.
            unsafe { exec.launch(l)? };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::check_kernel_launch;
    use crate::ptx::Arch;
    use kernel_abi::semicrf::{KERNELS, NEGATIVE, NEGATIVE_SEMICRF_MARGINALS_ALIASED, THREADS};

    /// Dynamic shared memory the PTX checks allow: the sm_90 and sm_80 opt-in limits.
    fn max_smem(arch: Arch) -> usize {
        match arch {
            Arch::Sm90a => 227 * 1024,
            Arch::Sm80 => 163 * 1024,
        }
    }

    /// Views at distinct fake addresses (planned, never dereferenced), of the lengths `n`.
    struct Fake {
        next: std::cell::Cell<u64>,
    }

    impl Fake {
        fn new() -> Fake {
            Fake {
                next: std::cell::Cell::new(1 << 32),
            }
        }

        fn view<'a, T>(&self, len: usize) -> DevView<'a, T> {
            let addr = self.next.get();
            self.next.set(addr + (1 << 32));
            // SAFETY: only planned, never dereferenced.
            unsafe { DevView::from_raw(addr, len) }
        }

        fn inputs<'a>(&self, p: &SemiCrfProblem) -> InputViews<'a> {
            let n = p.buffer_lens();
            InputViews {
                cumsum: self.view(n.cumsum),
                dur: self.view(n.dur),
                trans: self.view(n.trans),
                lengths: self.view(n.lengths),
            }
        }

        fn state<'a>(&self, p: &SemiCrfProblem) -> StateViews<'a> {
            let n = p.buffer_lens();
            StateViews {
                log_z: self.view(n.log_z),
                log_z64: self.view(n.log_z64),
                alpha_ckpt: self.view(n.alpha_ckpt),
                alpha_norm: self.view(n.alpha_norm),
                beta_ckpt: self.view(n.beta_ckpt),
                beta_norm: self.view(n.beta_norm),
                partials: self.view(n.partials),
            }
        }

        fn grads<'a>(&self, p: &SemiCrfProblem, marginals: bool) -> GradientViews<'a> {
            let n = p.buffer_lens();
            GradientViews {
                grad_cumsum: self.view(n.grad_cumsum),
                grad_dur: self.view(n.grad_dur),
                grad_trans: self.view(n.grad_trans),
                marginals: marginals.then(|| self.view(n.marginals)),
            }
        }

        fn viterbi<'a>(&self, p: &SemiCrfProblem) -> ViterbiViews<'a> {
            let n = p.buffer_lens();
            ViterbiViews {
                score: self.view(n.viterbi_score),
                backptr: self.view(n.viterbi_backptr),
                seg_start: self.view(n.viterbi_segments),
                seg_dur: self.view(n.viterbi_segments),
                seg_label: self.view(n.viterbi_segments),
                seg_count: self.view(n.viterbi_count),
            }
        }

        /// The tensors of every pass.
        fn passes<'a>(&self, p: &SemiCrfProblem) -> [SemiCrfTensors<'a>; 4] {
            let (inputs, state) = (self.inputs(p), self.state(p));
            [
                SemiCrfTensors::Forward { inputs, state },
                SemiCrfTensors::Backward {
                    inputs,
                    state,
                    grads: self.grads(p, false),
                },
                SemiCrfTensors::ForwardBackward {
                    inputs,
                    state,
                    grads: self.grads(p, true),
                },
                SemiCrfTensors::Viterbi {
                    inputs,
                    out: self.viterbi(p),
                },
            ]
        }
    }

    /// Every launch of a plan, with what its handle declares.
    fn launches(plan: &SemiCrfPlan) -> Vec<(&kernel_abi::KernelDecl, &crate::LaunchConfig)> {
        let mut v = Vec::new();
        if let Some(l) = &plan.scan {
            v.push((l.kernel(), l.config()));
        }
        if let Some(l) = &plan.marginals {
            v.push((l.kernel(), l.config()));
        }
        if let Some(l) = &plan.reduce {
            v.push((l.kernel(), l.config()));
        }
        if let Some(l) = &plan.viterbi {
            v.push((l.kernel(), l.config()));
        }
        v
    }

    /// Awkward problems: one position, K above T, one label, the most labels, an interval of
    /// one, the largest interval, T a multiple of the interval, the largest batch.
    fn problems() -> Vec<SemiCrfProblem> {
        let max = |k, c| abi::max_checkpoint(k, c) as usize;
        vec![
            SemiCrfProblem::new(1, 1, 1, 1),
            SemiCrfProblem::new(3, 5, 40, 2),
            SemiCrfProblem::new(2, 100, 7, 1),
            SemiCrfProblem::new(2, 300, 4, 64),
            SemiCrfProblem::new(5, 64, 3, 5).with_checkpoint(1),
            SemiCrfProblem::new(2, 5000, 16, 24).with_checkpoint(max(16, 24)),
            SemiCrfProblem::new(4, 96, 8, 3).with_checkpoint(12),
            SemiCrfProblem::new(65_535, 10, 2, 2),
            SemiCrfProblem::new(4, 100_000, 32, 16),
        ]
    }

    #[test]
    fn plans_launch_each_pass_in_order() {
        let p = SemiCrfProblem::new(3, 100, 7, 5).with_checkpoint(13);
        let (nseg, lanes) = (8, p.lanes());
        let f = Fake::new();
        let [fwd, bwd, both, vit] = f.passes(&p).map(|t| p.plan(&t).unwrap());
        let scan_smem = abi::scan_layout(7, 5).bytes;

        let scan = fwd.scan.unwrap();
        assert!(fwd.marginals.is_none() && fwd.reduce.is_none() && fwd.viterbi.is_none());
        assert_eq!(scan.name(), "semicrf_scan");
        assert_eq!(scan.config().grid, (3, 1, 1));
        assert_eq!(scan.config().block, (THREADS, 1, 1));
        assert_eq!(scan.config().shared_mem_bytes, scan_smem);
        let s = scan.params();
        assert_eq!(
            (s.first_direction, s.ckpt, s.nseg, s.lanes),
            (0, 13, nseg, lanes)
        );
        assert_eq!((s.batch, s.t_max, s.k, s.c), (3, 100, 7, 5));

        let scan = bwd.scan.unwrap();
        assert_eq!(scan.config().grid, (3, 1, 1));
        assert_eq!(scan.params().first_direction, 1);
        let m = bwd.marginals.unwrap();
        assert_eq!(m.name(), "semicrf_marginals");
        assert_eq!(m.config().grid, (nseg, 3, 1));
        assert_eq!(
            m.config().shared_mem_bytes,
            abi::segment_layout(13, 7, 5).bytes
        );
        assert!(m.params().marginals.is_null());
        assert_eq!(
            m.params().alpha_ckpt,
            scan.params().alpha_ckpt as *const f64
        );
        assert_eq!(m.params().beta_norm, scan.params().beta_norm as *const f64);
        let r = bwd.reduce.unwrap();
        assert_eq!(r.name(), "semicrf_reduce");
        assert_eq!(
            r.config().grid,
            ((7 * 5 + 5 * 5_u32).div_ceil(REDUCE_THREADS), 1, 1)
        );
        assert_eq!(
            (r.config().block.0, r.config().shared_mem_bytes),
            (REDUCE_THREADS, 0)
        );
        assert_eq!(r.params().partials, m.params().partials as *const f64);
        assert_eq!((r.params().ckpt, r.params().nseg), (13, nseg));
        assert!(bwd.viterbi.is_none());

        let scan = both.scan.unwrap();
        assert_eq!(scan.config().grid, (3, 2, 1));
        assert_eq!(scan.params().first_direction, 0);
        assert!(!both.marginals.unwrap().params().marginals.is_null());
        assert!(both.reduce.is_some());

        let v = vit.viterbi.unwrap();
        assert!(vit.scan.is_none() && vit.marginals.is_none() && vit.reduce.is_none());
        assert_eq!(v.name(), "semicrf_viterbi");
        assert_eq!(v.config().grid, (3, 1, 1));
        assert_eq!(v.config().shared_mem_bytes, scan_smem);
        assert_eq!((v.params().lanes, v.params().k), (lanes, 7));
    }

    #[test]
    fn plans_pass_the_ptx_checks_of_every_arch() {
        for p in problems() {
            p.validate().unwrap();
            let f = Fake::new();
            for t in f.passes(&p) {
                let plan = p.plan(&t).unwrap();
                let negative = plan.with_marginals_kernel(&NEGATIVE_SEMICRF_MARGINALS_ALIASED, &p);
                for arch in Arch::ALL {
                    for (kernel, cfg) in launches(&plan).into_iter().chain(launches(&negative)) {
                        check_kernel_launch(arch, kernel, cfg, max_smem(arch))
                            .unwrap_or_else(|e| panic!("{p:?} on {arch}: {e}"));
                    }
                }
            }
        }
    }

    #[test]
    fn every_handle_matches_its_ptx_entry() {
        for arch in Arch::ALL {
            for k in KERNELS.iter().chain(NEGATIVE) {
                let info = arch.kernels().get(k.name).expect("entry in the PTX");
                assert_eq!(info.params, [k.param_bytes], "{} on {arch}", k.name);
                assert_eq!(info.max_threads, Some(k.threads), "{} on {arch}", k.name);
                assert_eq!(info.min_blocks, Some(k.min_blocks), "{} on {arch}", k.name);
            }
        }
    }

    #[test]
    fn the_negative_control_swaps_only_the_marginals_kernel() {
        let p = SemiCrfProblem::new(2, 60, 4, 3).with_checkpoint(8);
        let f = Fake::new();
        let plan = p.plan(&f.passes(&p)[2]).unwrap();
        let negative = plan.with_marginals_kernel(&NEGATIVE_SEMICRF_MARGINALS_ALIASED, &p);
        let (m, n) = (plan.marginals.unwrap(), negative.marginals.unwrap());
        assert_eq!(n.name(), "negative_semicrf_marginals_aliased");
        assert_eq!(n.config(), m.config());
        assert_eq!(format!("{:?}", n.params()), format!("{:?}", m.params()));
        assert_eq!(
            launches(&negative)
                .iter()
                .map(|(k, _)| k.name)
                .collect::<Vec<_>>(),
            [
                "semicrf_scan",
                "negative_semicrf_marginals_aliased",
                "semicrf_reduce"
            ]
        );
    }

    #[test]
    fn buffer_lens_add_up_to_the_memory_use() {
        for p in problems() {
            let (n, m) = (p.buffer_lens(), p.memory());
            assert_eq!(m.inputs, 4 * (n.cumsum + n.dur + n.trans + n.lengths));
            assert_eq!(
                m.state,
                4 * n.log_z
                    + 8 * (n.log_z64
                        + n.alpha_ckpt
                        + n.alpha_norm
                        + n.beta_ckpt
                        + n.beta_norm
                        + n.partials)
            );
            assert_eq!(m.gradients, 4 * (n.grad_cumsum + n.grad_dur + n.grad_trans));
            assert_eq!(m.marginals, 4 * n.marginals);
        }
    }

    #[test]
    fn plans_refuse_wrong_tensors_and_problems() {
        let p = SemiCrfProblem::new(2, 50, 4, 3);
        let f = Fake::new();
        let mut inputs = f.inputs(&p);
        inputs.lengths = f.view(3);
        let t = SemiCrfTensors::Forward {
            inputs,
            state: f.state(&p),
        };
        assert!(matches!(p.plan(&t), Err(Error::ShapeMismatch { .. })));
        let mut state = f.state(&p);
        state.partials = f.view(1);
        let t = SemiCrfTensors::Forward {
            inputs: f.inputs(&p),
            state,
        };
        assert!(matches!(p.plan(&t), Err(Error::ShapeMismatch { .. })));
        let mut grads = f.grads(&p, true);
        grads.marginals = Some(f.view(p.buffer_lens().marginals - 1));
        let t = SemiCrfTensors::Backward {
            inputs: f.inputs(&p),
            state: f.state(&p),
            grads,
        };
        assert!(matches!(p.plan(&t), Err(Error::ShapeMismatch { .. })));
        let mut out = f.viterbi(&p);
        out.seg_label = f.view(p.t);
        let t = SemiCrfTensors::Viterbi {
            inputs: f.inputs(&p),
            out,
        };
        assert!(matches!(p.plan(&t), Err(Error::ShapeMismatch { .. })));
        // A problem the kernels cannot run is refused before its tensors are looked at.
        let q = SemiCrfProblem::new(2, 50, 4, 65);
        assert!(matches!(
            q.plan(&f.passes(&p)[0]),
            Err(Error::Unsupported { .. })
        ));
        let q = p.with_checkpoint(abi::max_checkpoint(4, 3) as usize + 1);
        assert!(matches!(
            q.plan(&f.passes(&q)[0]),
            Err(Error::InvalidArgument { .. })
        ));
    }
}
