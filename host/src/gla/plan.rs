//! The plan: every launch of a forward pass decided on the CPU ([`GlaPlan`]: the kernels, the
//! segments, the grids, the parameters, the workspace sizes, the pingpong's tensor maps), and
//! its run on any executor ([`GlaPlan::run`]).

use super::problem::{GlaKernel, GlaProblem, SegmentPlan};
use crate::attention::Target;
use crate::error::{Error, Result};
use crate::exec::{DevView, Exec};
use crate::gpu::LaunchConfig;
use crate::launch::Launch;
use crate::tensor_map::{MapDtype, MapSpec, MapSwizzle, TiledMap};
use half::bf16;
use kernel_abi::gla::{
    COMBINE_THREADS, CombineParams, GLA_COMBINE, GlaParams, GlaPingpongParams, PP_ATOM,
    baseline_kernels, pingpong_config, pingpong_kernels,
};
use kernel_abi::{Kernel, KernelDecl, TensorMap};

/// The tensors of one forward pass as device views (contiguous).
#[derive(Clone, Copy)]
pub struct GlaTensors<'a> {
    /// Queries `[B, T, H, dk]`.
    pub q: DevView<'a, bf16>,
    /// Keys `[B, T, H, dk]`.
    pub k: DevView<'a, bf16>,
    /// Values `[B, T, H, dv]`.
    pub v: DevView<'a, bf16>,
    /// Log-decays `[B, T, H, dk]`.
    pub g: DevView<'a, bf16>,
    /// Initial states `[N, H, dk, dv]`, or zero states.
    pub init_state: Option<DevView<'a, f32>>,
    /// Outputs `[B, T, H, dv]` (written).
    pub o: DevView<'a, bf16>,
    /// Final states `[N, H, dk, dv]` (written), if wanted.
    pub final_state: Option<DevView<'a, f32>>,
}

/// The workspace of a plan as device views: its segment table and, when a sequence is split,
/// the combination table and the buffers of the segment passes (contents from the plan's
/// [`SegmentPlan::table_words`], sizes from [`GlaPlan::workspace`]).
#[derive(Clone, Copy)]
pub struct GlaWorkspace<'a> {
    /// The segment table as words (`[start, len, seq, flags]` per segment).
    pub segments: DevView<'a, u32>,
    /// When some sequence has several segments: the combination table and the buffers.
    pub split: Option<GlaSplitWorkspace<'a>>,
}

/// The combination table and the buffers of the segment passes as device views.
#[derive(Clone, Copy)]
pub struct GlaSplitWorkspace<'a> {
    /// `[seq, first, count, 0]` per split sequence.
    pub combine: DevView<'a, u32>,
    /// `[segments, heads, dk, dv]` f32.
    pub seg_init: DevView<'a, f32>,
    /// `[segments, heads, dk, dv]` f32.
    pub delta: DevView<'a, f32>,
    /// `[segments, heads, dk]` f32.
    pub decay_log2: DevView<'a, f32>,
}

/// A planned forward pass: which kernels run, on which segments, with which grids and
/// parameters, and the workspace it needs. Pure (built on the CPU, no GPU needed); the
/// workspace's addresses are filled in, and the pingpong's tensor maps encoded, when it runs.
#[derive(Clone, Debug)]
pub struct GlaPlan {
    /// The kernels that run: [`GlaKernel::Baseline`] or [`GlaKernel::Pingpong`] (`Auto`
    /// resolved).
    pub kernel: GlaKernel,
    /// The segments (one `gla_fwd` block per segment and head for the baseline).
    pub segments: SegmentPlan,
    /// Elements of the workspace buffers, `(seg_init and delta each, decay_log2)`, when some
    /// sequence is split (else no workspace beyond the segment table).
    pub workspace: Option<(usize, usize)>,
    /// q, k, g, v as the pingpong kernels' tensor maps describe them (pingpong only).
    pub maps: Option<[MapSpec; 4]>,
    /// The launches, in order.
    pub steps: Vec<GlaStep>,
}

/// One launch of a [`GlaPlan`]: its kernel, grid and parameters, with the workspace's
/// pointers (and the pingpong's tensor maps) still zero.
#[derive(Clone, Copy)]
pub enum GlaStep {
    /// A baseline kernel: `gla_states_dk*_dv*` or `gla_fwd_dk*_dv*`.
    Baseline {
        /// The kernel.
        kernel: &'static Kernel<GlaParams>,
        /// `(segments, heads, 1)`.
        grid: (u32, u32, u32),
        /// The parameters.
        params: GlaParams,
    },
    /// `gla_combine`.
    Combine {
        /// `(split sequences, heads, ceil(dk dv / COMBINE_THREADS))`.
        grid: (u32, u32, u32),
        /// The parameters.
        params: CombineParams,
    },
    /// A pingpong kernel: `gla_states_pp_dk*_dv*` or `gla_fwd_pp_dk*_dv*` (its tensor maps are
    /// the plan's [`GlaPlan::maps`]).
    Pingpong {
        /// The kernel.
        kernel: &'static Kernel<GlaPingpongParams>,
        /// One-dimensional grid.
        grid: (u32, u32, u32),
        /// Launched overlapping the previous kernel (programmatic dependent launch): the
        /// forward after the state pass.
        overlapping_previous: bool,
        /// The parameters besides the tensor maps ([`GlaPingpongParams::base`]).
        base: GlaParams,
        /// [`GlaPingpongParams::items`].
        items: u32,
    },
}

impl std::fmt::Debug for GlaStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (name, grid, overlap) = match self {
            GlaStep::Baseline { kernel, grid, .. } => (kernel.name, grid, false),
            GlaStep::Combine { grid, .. } => (GLA_COMBINE.name, grid, false),
            GlaStep::Pingpong {
                kernel,
                grid,
                overlapping_previous,
                ..
            } => (kernel.name, grid, *overlapping_previous),
        };
        write!(f, "{name} on {grid:?}")?;
        if overlap {
            write!(f, " overlapping the previous kernel")?;
        }
        Ok(())
    }
}

impl GlaStep {
    /// The kernel's entry name.
    pub fn name(&self) -> &'static str {
        match self {
            GlaStep::Baseline { kernel, .. } => kernel.name,
            GlaStep::Combine { .. } => GLA_COMBINE.name,
            GlaStep::Pingpong { kernel, .. } => kernel.name,
        }
    }
}

/// A launch of a plan with its workspace and tensor maps filled in, ready to run.
#[derive(Clone, Debug)]
pub enum GlaLaunch {
    /// `gla_states_dk*_dv*` or `gla_fwd_dk*_dv*`.
    Baseline(Launch<GlaParams>),
    /// `gla_combine`.
    Combine(Launch<CombineParams>),
    /// `gla_states_pp_dk*_dv*` or `gla_fwd_pp_dk*_dv*` (boxed: four tensor maps).
    Pingpong(Box<Launch<GlaPingpongParams>>),
}

impl GlaLaunch {
    /// What the kernel's handle declares.
    pub fn kernel(&self) -> &KernelDecl {
        match self {
            GlaLaunch::Baseline(l) => l.kernel(),
            GlaLaunch::Combine(l) => l.kernel(),
            GlaLaunch::Pingpong(l) => l.kernel(),
        }
    }

    /// Grid, block and shared memory.
    pub fn config(&self) -> &LaunchConfig {
        match self {
            GlaLaunch::Baseline(l) => l.config(),
            GlaLaunch::Combine(l) => l.config(),
            GlaLaunch::Pingpong(l) => l.config(),
        }
    }

    /// Run the launch on `exec`.
    ///
    /// # Safety
    /// As [`GlaPlan::run`], with every launch of the plan before this one run before it on
    /// `exec`.
    pub unsafe fn run(&self, exec: &impl Exec) -> Result<()> {
        match self {
            // SAFETY: q, k, g, v, o have the problem's sizes and the states N * heads * dk * dv
            // elements (checked by the plan); the segment table covers exactly the problem's
            // sequences and has gridDim.x entries; delta and decay_log2 hold segments * heads *
            // dk * dv and segments * heads * dk f32 (checked); `gla_states` writes only the
            // slices of the segments that are not last, each from its own block; `gla_fwd`
            // reads seg_init only for segments that are not first, written by `gla_combine`
            // just before (in order on the executor), and each block writes only its own rows
            // of o and, if it is the last of its sequence, that sequence's final state. The
            // memory is live (the caller's contract).
            GlaLaunch::Baseline(l) => unsafe { exec.launch(l) },
            // SAFETY: the combine entries name consecutive segments of the table (count >= 2,
            // all of one sequence, seq < N); every buffer has the size the parameters document
            // (checked); each thread writes its own element of the later segments' initial
            // states.
            GlaLaunch::Combine(l) => unsafe { exec.launch(l) },
            // SAFETY: as for the baseline; the tensor maps describe the checked q, k, g, v
            // views (contiguous `[rows, heads, d]`, 16-byte aligned), the grid covers every
            // (segment, head) item once. The forward reads delta and decay_log2 of its
            // sequence's earlier segments, written by `gla_states_pp` just before: when
            // overlapping it, after waiting for it to complete (the overlapped launch's
            // contract, kept by every consumer thread).
            GlaLaunch::Pingpong(l) => unsafe { exec.launch(l) },
        }
    }
}

impl GlaProblem {
    /// Plan the forward pass on `tensors` for `target` (its PTX target: which kernels run,
    /// [`GlaProblem::kernel_for`]; and its multiprocessors: the automatic segment length fills
    /// one wave of their resident blocks): validates the problem, the tensors' sizes and
    /// alignment and the tensor maps (without the driver).
    pub fn plan(&self, target: Target, tensors: &GlaTensors<'_>) -> Result<GlaPlan> {
        self.validate()?;
        let kernel = self.kernel_for(target.arch)?;
        let segments = self.segments_of(kernel, target.multiprocessors as usize)?;
        GlaPlan::for_segments(self, kernel, segments, tensors)
    }
}

impl GlaPlan {
    /// The plan of `problem` with `kernel` (resolved for the target by
    /// [`GlaProblem::kernel_for`]: the baseline or the pingpong) on `segments` (made for it by
    /// [`GlaProblem::segments`]) and `t` (see [`GlaProblem::plan`]).
    pub(super) fn for_segments(
        problem: &GlaProblem,
        kernel: GlaKernel,
        segments: SegmentPlan,
        t: &GlaTensors<'_>,
    ) -> Result<GlaPlan> {
        let p = problem;
        p.validate()?;
        check_view("q [B, T, H, dk]", &t.q, p.qk_len())?;
        check_view("k [B, T, H, dk]", &t.k, p.qk_len())?;
        check_view("g [B, T, H, dk]", &t.g, p.qk_len())?;
        check_view("v [B, T, H, dv]", &t.v, p.v_len())?;
        check_view("o [B, T, H, dv]", &t.o, p.v_len())?;
        if let Some(s) = &t.init_state {
            check_view("initial state [N, H, dk, dv]", s, p.state_len())?;
        }
        if let Some(s) = &t.final_state {
            check_view("final state [N, H, dk, dv]", s, p.state_len())?;
        }
        let workspace = p.workspace_len(&segments);
        let split = workspace.is_some();
        let null = std::ptr::null_mut::<f32>();
        let params = GlaParams {
            q: t.q.ptr(),
            k: t.k.ptr(),
            v: t.v.ptr(),
            g: t.g.ptr(),
            o: t.o.ptr(),
            segments: std::ptr::null(),
            init_state: t.init_state.map_or(null, |b| b.ptr()),
            final_state: t.final_state.map_or(null, |b| b.ptr()),
            seg_init: null,
            delta: null,
            decay_log2: null,
            heads: p.heads as u32,
            scale: p.output_scale(),
            has_init: u32::from(t.init_state.is_some()),
            has_final: u32::from(t.final_state.is_some()),
        };
        let (dk, dv) = (p.dk as u32, p.dv as u32);
        let blocks = (segments.segments.len() * p.heads) as u32;
        let mut steps = Vec::new();
        debug_assert_ne!(kernel, GlaKernel::Auto, "resolved by kernel_for");
        if kernel == GlaKernel::Pingpong {
            let pcfg = pingpong_config(dk, dv).expect("validated head dimensions");
            let (fwd, states) = pingpong_kernels(dk, dv).expect("validated head dimensions");
            let map = |view: &DevView<'_, bf16>, d: usize| {
                TiledMap {
                    address: view.addr(),
                    dtype: MapDtype::Bf16,
                    dims: &[d as u64, p.heads as u64, p.rows() as u64],
                    strides_bytes: &[2 * d as u64, 2 * (p.heads * d) as u64],
                    box_dims: &[PP_ATOM, 1, pcfg.step],
                    swizzle: MapSwizzle::B128,
                }
                .spec()
            };
            let maps = [
                map(&t.q, p.dk)?,
                map(&t.k, p.dk)?,
                map(&t.g, p.dk)?,
                map(&t.v, p.dv)?,
            ];
            let items = blocks * pcfg.dv_parts;
            if split {
                // One block per (segment, head), all value columns.
                steps.push(GlaStep::Pingpong {
                    kernel: states,
                    grid: (blocks, 1, 1),
                    overlapping_previous: false,
                    base: params,
                    items,
                });
            }
            // The forward folds the earlier segments' states into each item's initial state
            // itself (from delta and decay_log2): no combination launch. After a state pass it
            // is launched overlapping it (programmatic dependent launch): its set-up and first
            // loads run during the state pass's tail; its consumers wait for the state pass
            // (`griddepcontrol.wait`) before reading delta or writing anything.
            steps.push(GlaStep::Pingpong {
                kernel: fwd,
                grid: (items.div_ceil(pcfg.consumers), 1, 1),
                overlapping_previous: split,
                base: params,
                items,
            });
            Ok(GlaPlan {
                kernel: GlaKernel::Pingpong,
                segments,
                workspace,
                maps: Some(maps),
                steps,
            })
        } else {
            let (fwd, states) = baseline_kernels(dk, dv).expect("validated head dimensions");
            let grid = (segments.segments.len() as u32, p.heads as u32, 1);
            if split {
                steps.push(GlaStep::Baseline {
                    kernel: states,
                    grid,
                    params,
                });
                steps.push(GlaStep::Combine {
                    grid: (
                        segments.combine.len() as u32,
                        p.heads as u32,
                        (dk * dv).div_ceil(COMBINE_THREADS),
                    ),
                    params: CombineParams {
                        entries: std::ptr::null(),
                        init_state: params.init_state,
                        seg_init: null,
                        delta: null,
                        decay_log2: null,
                        heads: p.heads as u32,
                        dk,
                        dv,
                        has_init: params.has_init,
                    },
                });
            }
            steps.push(GlaStep::Baseline {
                kernel: fwd,
                grid,
                params,
            });
            Ok(GlaPlan {
                kernel: GlaKernel::Baseline,
                segments,
                workspace,
                maps: None,
                steps,
            })
        }
    }

    /// The launches on `workspace` (checked against the plan's sizes), with the pingpong's
    /// tensor maps `tmaps` (q, k, g, v; encoded from [`GlaPlan::maps`], ignored by the
    /// baseline).
    pub fn launches(
        &self,
        workspace: &GlaWorkspace<'_>,
        tmaps: &[TensorMap; 4],
    ) -> Result<Vec<GlaLaunch>> {
        check_view(
            "segment table",
            &workspace.segments,
            4 * self.segments.segments.len(),
        )?;
        let split = match (self.workspace, &workspace.split) {
            (None, _) => None,
            (Some((state, decay)), Some(w)) => {
                check_view(
                    "combination table",
                    &w.combine,
                    4 * self.segments.combine.len(),
                )?;
                check_view("workspace seg_init", &w.seg_init, state)?;
                check_view("workspace delta", &w.delta, state)?;
                check_view("workspace decay_log2", &w.decay_log2, decay)?;
                Some(w)
            }
            (Some(_), None) => {
                return Err(Error::invalid(
                    "GLA workspace",
                    "the plan splits a sequence but no workspace was given",
                ));
            }
        };
        let null = std::ptr::null_mut::<f32>();
        let (seg_init, delta, decay_log2) = match split {
            Some(w) => (w.seg_init.ptr(), w.delta.ptr(), w.decay_log2.ptr()),
            None => (null, null, null),
        };
        let with_workspace = |p: GlaParams| GlaParams {
            segments: workspace.segments.ptr(),
            seg_init,
            delta,
            decay_log2,
            ..p
        };
        let launches = self.steps.iter().map(|step| match *step {
            GlaStep::Baseline {
                kernel,
                grid,
                params,
            } => GlaLaunch::Baseline(Launch::new(kernel, grid, (), with_workspace(params))),
            GlaStep::Combine { grid, params } => GlaLaunch::Combine(Launch::new(
                &GLA_COMBINE,
                grid,
                (),
                CombineParams {
                    entries: split.map_or(std::ptr::null(), |w| w.combine.ptr()),
                    seg_init,
                    delta,
                    decay_log2,
                    ..params
                },
            )),
            GlaStep::Pingpong {
                kernel,
                grid,
                overlapping_previous,
                base,
                items,
            } => {
                let launch = Launch::new(
                    kernel,
                    grid,
                    (),
                    GlaPingpongParams {
                        tmap_q: tmaps[0],
                        tmap_k: tmaps[1],
                        tmap_g: tmaps[2],
                        tmap_v: tmaps[3],
                        base: with_workspace(base),
                        items,
                    },
                );
                GlaLaunch::Pingpong(Box::new(if overlapping_previous {
                    launch.overlapping_previous()
                } else {
                    launch
                }))
            }
        });
        Ok(launches.collect())
    }

    /// Run the plan on `exec` with `workspace` (asynchronous on a stream: synchronize before
    /// reading the outputs): up to three kernels.
    ///
    /// # Safety
    /// The tensors the plan was made for and `workspace` are memory of `exec`'s device, alive
    /// and not otherwise accessed until the launches completed; the workspace's tables hold the
    /// words of the plan's segments ([`SegmentPlan::table_words`]).
    pub unsafe fn run(&self, exec: &impl Exec, workspace: &GlaWorkspace<'_>) -> Result<()> {
        // Check the workspace before the driver encodes anything.
        self.launches(workspace, &[TensorMap::ZEROED; 4])?;
        let tmaps = match &self.maps {
            Some([q, k, g, v]) => [q.encode()?, k.encode()?, g.encode()?, v.encode()?],
            None => [TensorMap::ZEROED; 4],
        };
        for launch in self.launches(workspace, &tmaps)? {
            // SAFETY: the caller's contract; the launches run in the plan's order.
            unsafe { launch.run(exec)? };
        }
        Ok(())
    }
}

pub(super) fn check_view<T>(what: &str, view: &DevView<'_, T>, want: usize) -> Result<()> {
    if view.len() != want {
        return Err(Error::shape(
            format!("GLA {what}"),
            format!("{want} elements"),
            view.len(),
        ));
    }
    if !view.addr().is_multiple_of(16) {
        return Err(Error::Misaligned {
            what: format!("GLA {what}"),
            required: 16,
            actual: view.addr() % 16,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gla::PINGPONG_MIN_PAIRS;
    use crate::gpu::check_kernel_launch;
    use crate::ptx::Arch;
    use kernel_abi::gla::{KERNELS, pingpong_config_of};

    /// The largest dynamic shared memory of a block on an H100/H200.
    const HOPPER_MAX_SMEM: usize = 227 * 1024;

    /// PTX target `arch` on a GPU of 132 multiprocessors (as an H100/H200).
    fn target(arch: Arch) -> Target {
        Target {
            arch,
            multiprocessors: 132,
        }
    }

    fn view<'a, T>(addr: u64, len: usize) -> DevView<'a, T> {
        // SAFETY: only planned, never dereferenced.
        unsafe { DevView::from_raw(addr, len) }
    }

    fn tensors<'a>(p: &GlaProblem) -> GlaTensors<'a> {
        GlaTensors {
            q: view(1 << 30, p.qk_len()),
            k: view(2 << 30, p.qk_len()),
            v: view(3 << 30, p.v_len()),
            g: view(4 << 30, p.qk_len()),
            init_state: Some(view(5 << 30, p.state_len())),
            o: view(6 << 30, p.v_len()),
            final_state: Some(view(7 << 30, p.state_len())),
        }
    }

    fn workspace<'a>(plan: &GlaPlan) -> GlaWorkspace<'a> {
        let (segments, combine) = plan.segments.table_words();
        GlaWorkspace {
            segments: view(8 << 30, segments.len()),
            split: plan.workspace.map(|(state, decay)| GlaSplitWorkspace {
                combine: view(9 << 30, combine.len()),
                seg_init: view(10 << 30, state),
                delta: view(11 << 30, state),
                decay_log2: view(12 << 30, decay),
            }),
        }
    }

    /// The plan's launches on a made-up workspace, each checked against the PTX of `arches`.
    fn checked_launches(plan: &GlaPlan, arches: &[Arch]) -> Vec<GlaLaunch> {
        let launches = plan
            .launches(&workspace(plan), &[TensorMap::ZEROED; 4])
            .unwrap();
        for l in &launches {
            for &arch in arches {
                check_kernel_launch(arch, l.kernel(), l.config(), HOPPER_MAX_SMEM)
                    .unwrap_or_else(|e| panic!("{arch}: {e}"));
            }
        }
        launches
    }

    fn names(plan: &GlaPlan) -> Vec<&'static str> {
        plan.steps.iter().map(GlaStep::name).collect()
    }

    #[test]
    fn the_table_lists_every_entry_of_the_ptx_with_its_launch_bounds() {
        for arch in Arch::ALL {
            let ptx = arch.kernels();
            let mut in_ptx: Vec<&str> = ptx
                .keys()
                .map(String::as_str)
                .filter(|n| n.starts_with("gla_"))
                .collect();
            let mut declared: Vec<&str> = KERNELS
                .iter()
                .map(|k| k.name)
                .filter(|n| arch.has_hopper_kernels() || !n.contains("_pp_"))
                .collect();
            in_ptx.sort();
            declared.sort();
            assert_eq!(in_ptx, declared, "{arch}");
            for k in KERNELS.iter().filter(|k| ptx.contains_key(k.name)) {
                let info = &ptx[k.name];
                assert_eq!(info.max_threads, Some(k.threads), "{arch} {}", k.name);
                assert_eq!(info.min_blocks, Some(k.min_blocks), "{arch} {}", k.name);
                assert_eq!(info.params, vec![k.param_bytes], "{arch} {}", k.name);
            }
        }
    }

    #[test]
    fn the_baseline_without_a_split() {
        let p = GlaProblem::new(2, 100, 3, 64, 128).with_scale(0.5);
        for (arch, kernel) in [
            (Arch::Sm80, GlaKernel::Auto),
            (Arch::Sm80, GlaKernel::Baseline),
            (Arch::Sm90a, GlaKernel::Baseline),
        ] {
            let p = p.clone().with_kernel(kernel);
            let plan = p.plan(target(arch), &tensors(&p)).unwrap();
            assert_eq!(plan.kernel, GlaKernel::Baseline);
            assert_eq!(names(&plan), ["gla_fwd_dk64_dv128"]);
            assert_eq!(plan.workspace, None);
            assert!(plan.maps.is_none());
            let launches = checked_launches(&plan, &Arch::ALL);
            let GlaLaunch::Baseline(l) = &launches[0] else {
                panic!("{launches:?}")
            };
            assert_eq!(l.config().grid, (2, 3, 1));
            assert_eq!(l.config().block, (256, 1, 1));
            assert!(!l.config().overlap_previous);
            let params = l.params();
            assert_eq!(params.q as u64, 1 << 30);
            assert_eq!(params.o as u64, 6 << 30);
            assert_eq!(params.segments as u64, 8 << 30);
            assert!(params.seg_init.is_null() && params.delta.is_null());
            assert_eq!((params.heads, params.scale), (3, 0.5));
            assert_eq!((params.has_init, params.has_final), (1, 1));
        }
    }

    /// The automatic choice: on sm_90a the pingpong from `PINGPONG_MIN_PAIRS` (sequence, head)
    /// pairs up, the baseline below, for every head-dimension pair, every length, packed
    /// sequences, forced segments, with and without states; the baseline on sm_80. The
    /// segments are those of the chosen kernels' wave.
    #[test]
    fn auto_is_the_pingpong_on_sm_90a_and_the_baseline_on_sm_80() {
        let mut problems = Vec::new();
        for (dk, dv) in [(64, 64), (64, 128), (128, 64), (128, 128)] {
            for t in [1, 65, 1000, 16384] {
                for heads in [2, PINGPONG_MIN_PAIRS - 1, PINGPONG_MIN_PAIRS, 32] {
                    problems.push(GlaProblem::new(1, t, heads, dk, dv));
                }
            }
            problems.push(GlaProblem::varlen(vec![0, 1, 17, 300, 5000], 3, dk, dv));
            problems.push(GlaProblem::new(2, 1000, 2, dk, dv).with_segment_len(64));
            problems.push(GlaProblem::new(2, 1000, 2, dk, dv).with_segment_len(usize::MAX));
        }
        for p in &problems {
            for (init, fin) in [(true, true), (false, false)] {
                let mut t = tensors(p);
                if !init {
                    t.init_state = None;
                }
                if !fin {
                    t.final_state = None;
                }
                let on_hopper = if p.num_seqs() * p.heads >= PINGPONG_MIN_PAIRS {
                    GlaKernel::Pingpong
                } else {
                    GlaKernel::Baseline
                };
                for (arch, want) in [(Arch::Sm90a, on_hopper), (Arch::Sm80, GlaKernel::Baseline)] {
                    assert_eq!(p.kernel_for(arch).unwrap(), want, "{arch} {p:?}");
                    let plan = p.plan(target(arch), &t).unwrap();
                    assert_eq!(plan.kernel, want, "{arch} {p:?}");
                    let forced = p.clone().with_kernel(want);
                    assert_eq!(
                        plan.segments,
                        forced.segments(target(arch)).unwrap(),
                        "{arch} {p:?}"
                    );
                    let forced_plan = forced.plan(target(arch), &t).unwrap();
                    assert_eq!(names(&plan), names(&forced_plan), "{arch} {p:?}");
                    let pingpong = want == GlaKernel::Pingpong;
                    assert_eq!(plan.maps.is_some(), pingpong, "{arch} {p:?}");
                    assert!(
                        names(&plan).iter().all(|n| n.contains("_pp_") == pingpong),
                        "{arch} {p:?}: {:?}",
                        names(&plan)
                    );
                    checked_launches(&plan, &[arch]);
                }
            }
        }
        // The automatic segments fill the chosen kernels' wave: at dk = dv = 64 the baseline
        // keeps three blocks per SM (3 * 132 (segment, head) pairs), the pingpong two items
        // (2 * 132); B4 H32 T4k: 3 and 2 segments per sequence.
        let p = GlaProblem::new(4, 4096, 32, 64, 64);
        let per_seq = |arch| {
            let plan = p.plan(target(arch), &tensors(&p)).unwrap();
            plan.segments.segments.len() / 4
        };
        assert_eq!((per_seq(Arch::Sm80), per_seq(Arch::Sm90a)), (3, 2));
    }

    #[test]
    fn a_forced_choice_is_kept_and_checked() {
        let p = GlaProblem::new(1, 64, 2, 64, 64);
        let baseline = p.clone().with_kernel(GlaKernel::Baseline);
        assert_eq!(
            baseline.kernel_for(Arch::Sm90a).unwrap(),
            GlaKernel::Baseline
        );
        let pingpong = p.with_kernel(GlaKernel::Pingpong);
        assert_eq!(
            pingpong.kernel_for(Arch::Sm90a).unwrap(),
            GlaKernel::Pingpong
        );
        for result in [
            pingpong.kernel_for(Arch::Sm80).map(|_| ()),
            pingpong.segments(target(Arch::Sm80)).map(|_| ()),
            pingpong
                .plan(target(Arch::Sm80), &tensors(&pingpong))
                .map(|_| ()),
        ] {
            assert!(
                matches!(result, Err(Error::Unsupported { .. })),
                "{result:?}"
            );
        }
    }

    #[test]
    fn a_split_baseline_runs_states_combine_forward() {
        // Three segments of 32, 32 and 1 tokens per sequence.
        let p = GlaProblem::new(2, 65, 3, 128, 128).with_segment_len(32);
        let mut t = tensors(&p);
        t.init_state = None;
        let plan = p.plan(target(Arch::Sm80), &t).unwrap();
        assert_eq!(
            names(&plan),
            [
                "gla_states_dk128_dv128",
                "gla_combine",
                "gla_fwd_dk128_dv128"
            ]
        );
        assert_eq!(plan.segments.segments.len(), 6);
        assert_eq!(plan.workspace, Some((6 * 3 * 128 * 128, 6 * 3 * 128)));
        let launches = checked_launches(&plan, &Arch::ALL);
        let grids: Vec<_> = launches.iter().map(|l| l.config().grid).collect();
        assert_eq!(grids, [(6, 3, 1), (2, 3, 64), (6, 3, 1)]);
        assert!(launches.iter().all(|l| !l.config().overlap_previous));
        let GlaLaunch::Combine(c) = &launches[1] else {
            panic!("{launches:?}")
        };
        let c = c.params();
        assert_eq!(c.entries as u64, 9 << 30);
        assert_eq!((c.seg_init as u64, c.delta as u64), (10 << 30, 11 << 30));
        assert_eq!((c.heads, c.dk, c.dv, c.has_init), (3, 128, 128, 0));
        assert!(c.init_state.is_null());
        let GlaLaunch::Baseline(f) = &launches[2] else {
            panic!("{launches:?}")
        };
        assert_eq!(f.params().decay_log2 as u64, 12 << 30);
    }

    #[test]
    fn the_pingpong_overlaps_its_forward_with_the_state_pass() {
        for (dk, dv) in [(64, 64), (64, 128), (128, 64), (128, 128)] {
            let pcfg = pingpong_config_of(dk as u32, dv as u32);
            let p = GlaProblem::new(1, 1000, 3, dk, dv)
                .with_segment_len(320)
                .with_kernel(GlaKernel::Pingpong);
            let plan = p.plan(target(Arch::Sm90a), &tensors(&p)).unwrap();
            assert_eq!(plan.kernel, GlaKernel::Pingpong);
            assert_eq!(
                names(&plan),
                [
                    format!("gla_states_pp_dk{dk}_dv{dv}"),
                    format!("gla_fwd_pp_dk{dk}_dv{dv}")
                ]
            );
            let launches = checked_launches(&plan, &[Arch::Sm90a]);
            let items = 4 * 3 * pcfg.dv_parts;
            let grids: Vec<_> = launches.iter().map(|l| l.config().grid).collect();
            assert_eq!(grids, [(12, 1, 1), (items.div_ceil(pcfg.consumers), 1, 1)]);
            let overlaps: Vec<_> = launches
                .iter()
                .map(|l| l.config().overlap_previous)
                .collect();
            assert_eq!(overlaps, [false, true]);
            let GlaLaunch::Pingpong(f) = &launches[1] else {
                panic!("{launches:?}")
            };
            assert_eq!(f.params().items, items);
            assert_eq!(f.params().base.delta as u64, 11 << 30);
            let maps = plan.maps.unwrap();
            let rows = p.rows() as u64;
            assert_eq!(maps[0].address, 1 << 30);
            assert_eq!(maps[0].dims[..3], [dk as u64, 3, rows]);
            assert_eq!(maps[3].dims[..3], [dv as u64, 3, rows]);
            assert_eq!(maps[3].box_dims[..3], [PP_ATOM, 1, pcfg.step]);
            // Unsplit: the forward alone, not overlapping anything.
            let p = p.with_segment_len(usize::MAX);
            let plan = p.plan(target(Arch::Sm90a), &tensors(&p)).unwrap();
            let launches = checked_launches(&plan, &[Arch::Sm90a]);
            assert_eq!(launches.len(), 1);
            assert!(!launches[0].config().overlap_previous);
            assert_eq!(plan.workspace, None);
        }
    }

    #[test]
    fn the_automatic_split_fills_one_wave() {
        // 132 SMs, one block of 256 threads per SM at dk = dv = 128 (the baseline), or one
        // pingpong block of two items, the value halves of one (segment, head).
        let p = GlaProblem::new(1, 16384, 16, 128, 128);
        for arch in Arch::ALL {
            let plan = p.plan(target(arch), &tensors(&p)).unwrap();
            assert_eq!(plan.segments.segments.len() * 16, 128, "{arch}");
        }
        // Three blocks per SM at dk = dv = 64.
        let p = GlaProblem::new(4, 4096, 32, 64, 64);
        let plan = p.plan(target(Arch::Sm80), &tensors(&p)).unwrap();
        assert_eq!(plan.segments.segments.len() * 32, 3 * 128);
        // Enough (batch, head) pairs: nothing split, no workspace.
        let p = GlaProblem::new(8, 4096, 64, 64, 64);
        let plan = p.plan(target(Arch::Sm80), &tensors(&p)).unwrap();
        assert_eq!((plan.segments.segments.len(), plan.workspace), (8, None));
    }

    #[test]
    fn plans_refuse_what_the_kernels_cannot_do() {
        let p = GlaProblem::new(1, 64, 2, 64, 64).with_kernel(GlaKernel::Pingpong);
        assert!(matches!(
            p.plan(target(Arch::Sm80), &tensors(&p)),
            Err(Error::Unsupported { .. })
        ));
        let p = GlaProblem::new(1, 64, 2, 96, 64);
        assert!(matches!(
            p.plan(target(Arch::Sm90a), &tensors(&p)),
            Err(Error::Unsupported { .. })
        ));
        let p = GlaProblem::new(1, 64, 2, 64, 64).with_segment_len(32);
        let mut t = tensors(&p);
        t.v = view(3 << 30, p.v_len() - 1);
        assert!(matches!(
            p.plan(target(Arch::Sm80), &t),
            Err(Error::ShapeMismatch { .. })
        ));
        t = tensors(&p);
        t.o = view((6 << 30) + 8, p.v_len());
        assert!(matches!(
            p.plan(target(Arch::Sm80), &t),
            Err(Error::Misaligned { .. })
        ));
        // A split plan needs the workspace of its size.
        let plan = p.plan(target(Arch::Sm80), &tensors(&p)).unwrap();
        let mut w = workspace(&plan);
        w.split = None;
        assert!(matches!(
            plan.launches(&w, &[TensorMap::ZEROED; 4]),
            Err(Error::InvalidArgument { .. })
        ));
        let mut w = workspace(&plan);
        if let Some(s) = &mut w.split {
            s.delta = view(11 << 30, 1);
        }
        assert!(matches!(
            plan.launches(&w, &[TensorMap::ZEROED; 4]),
            Err(Error::ShapeMismatch { .. })
        ));
    }
}
