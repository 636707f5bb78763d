//! The GLA backward for the reliability tests (its property tests, `props_gpu`, and its negative
//! control, `negative`): random inputs, a whole backward through its plan on the CPU emulator or
//! on a GPU (the library's kernels or the control), every gradient against the f64 backward.
//!
//! Tolerance: the backward tests' (`tests/gla/backward_kernels.rs`): relative L2 error
//! `||x - ref|| / ||ref||` at most [`TOL`] for each of dq, dk, dv, dg and the initial states'
//! gradient (absolute where the reference is all zeros), and dg exactly 0 where `g < G_FLOOR`.

use kernel_tests::emu::{Emulator, HostBuf};
use kernels::exec::{Exec, OnStream};
use kernels::gla::reference::{ExactInputs, Gradients, HostInputs, OutputGrads, backward, rel_l2};
use kernels::gla::{
    G_FLOOR, GlaBackwardPlan, GlaBackwardSplit, GlaBackwardTensors, GlaBackwardWorkspace,
    GlaProblem, Target,
};
use kernels::memory::{download, poisoned, upload};
use kernels::{Arch, Gpu, bf16};
use rand::Rng;

/// The bound on each gradient's relative L2 error (the backward tests' `TOL`: the kernels round
/// their operands to bf16, accumulate in f32 and store dq, dk, dv in bf16).
pub const TOL: f64 = 1e-2;

/// How the log-decays are drawn.
#[derive(Clone, Copy, Debug)]
pub enum Decay {
    /// Uniform in `[lo, hi)`.
    Uniform(f32, f32),
    /// Each element -20 with probability 1/4 (the clamp), else uniform in `[-0.1, 0)`.
    Spiky,
}

/// A backward case: the problem, whether the forward had initial states and the loss a
/// final-state term, the decays and the seed of the data.
#[derive(Clone, Debug)]
pub struct Case {
    pub p: GlaProblem,
    pub init: bool,
    pub d_final: bool,
    pub decay: Decay,
    pub seed: u64,
}

/// The inputs of a case (bf16 as the kernels take them) and the gradients of the outputs.
pub struct Data {
    q: Vec<bf16>,
    k: Vec<bf16>,
    v: Vec<bf16>,
    g: Vec<bf16>,
    init: Option<Vec<f32>>,
    d_o: Vec<bf16>,
    d_final: Option<Vec<f32>>,
}

impl Data {
    /// q, k, v, dO uniform in `[-1, 1)`, the initial states and dS_final too (where the case
    /// has them), the log-decays as the case says.
    pub fn random(c: &Case) -> Data {
        let p = &c.p;
        let mut r = kernels::data::rng(c.seed);
        let mut draw = |n: usize| kernels::data::uniform_bf16(&mut r, n, -1.0, 1.0);
        let (q, k, v, d_o) = (
            draw(p.qk_len()),
            draw(p.qk_len()),
            draw(p.v_len()),
            draw(p.v_len()),
        );
        let g = (0..p.qk_len())
            .map(|_| {
                bf16::from_f32(match c.decay {
                    Decay::Uniform(lo, hi) => r.random_range(lo..hi),
                    Decay::Spiky => {
                        if r.random_range(0..4) == 0 {
                            -20.0
                        } else {
                            r.random_range(-0.1..0.0)
                        }
                    }
                })
            })
            .collect();
        let mut state =
            |on: bool| on.then(|| kernels::data::uniform_f32(&mut r, p.state_len(), -1.0, 1.0));
        let init = state(c.init);
        let d_final = state(c.d_final);
        Data {
            q,
            k,
            v,
            g,
            init,
            d_o,
            d_final,
        }
    }

    /// The f64 backward of the case.
    pub fn reference(&self, p: &GlaProblem) -> kernels::Result<Gradients> {
        let x = ExactInputs::from_host(&HostInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            g: &self.g,
            init_state: self.init.as_deref(),
        });
        let d_o: Vec<f64> = self.d_o.iter().map(|x| x.to_f64()).collect();
        let d_final: Option<Vec<f64>> = self
            .d_final
            .as_ref()
            .map(|f| f.iter().map(|&x| x as f64).collect());
        backward(
            p,
            &x,
            &OutputGrads {
                d_o: &d_o,
                d_final_state: d_final.as_deref(),
            },
        )
    }
}

/// The gradients a backward wrote.
pub struct Got {
    pub d_q: Vec<bf16>,
    pub d_k: Vec<bf16>,
    pub d_v: Vec<bf16>,
    pub d_g: Vec<f32>,
    pub d_init: Vec<f32>,
}

/// The measured errors of one backward: relative L2 of each gradient, and the elements of dg
/// that are not 0 where `g < G_FLOOR`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Errors {
    pub dq: f64,
    pub dk: f64,
    pub dv: f64,
    pub dg: f64,
    pub d_init: f64,
    pub clamped_nonzero: usize,
}

impl Errors {
    /// The errors of `got` against `want` on `data`.
    pub fn of(data: &Data, got: &Got, want: &Gradients) -> Errors {
        let b = |v: &[bf16]| v.iter().map(|x| x.to_f64()).collect::<Vec<_>>();
        Errors {
            dq: rel_l2(b(&got.d_q), &want.dq),
            dk: rel_l2(b(&got.d_k), &want.dk),
            dv: rel_l2(b(&got.d_v), &want.dv),
            dg: rel_l2(got.d_g.iter().map(|&x| x as f64), &want.dg),
            d_init: rel_l2(got.d_init.iter().map(|&x| x as f64), &want.d_init_state),
            clamped_nonzero: data
                .g
                .iter()
                .zip(&got.d_g)
                .filter(|(g, dg)| g.to_f32() < G_FLOOR && **dg != 0.0)
                .count(),
        }
    }

    /// Every gradient within [`TOL`] and dg 0 where clamped.
    pub fn ok(&self) -> bool {
        self.clamped_nonzero == 0
            && [self.dq, self.dk, self.dv, self.dg, self.d_init]
                .iter()
                .all(|e| *e <= TOL)
    }

    /// The element-wise worst of two.
    pub fn max(self, o: Errors) -> Errors {
        Errors {
            dq: self.dq.max(o.dq),
            dk: self.dk.max(o.dk),
            dv: self.dv.max(o.dv),
            dg: self.dg.max(o.dg),
            d_init: self.d_init.max(o.d_init),
            clamped_nonzero: self.clamped_nonzero.max(o.clamped_nonzero),
        }
    }
}

impl std::fmt::Display for Errors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "rel L2 dq {:.3e}, dk {:.3e}, dv {:.3e}, dg {:.3e}, dS_0 {:.3e} (tol {TOL:.0e}); {} \
             dg elements nonzero where g < G_FLOOR",
            self.dq, self.dk, self.dv, self.dg, self.d_init, self.clamped_nonzero
        )
    }
}

/// What runs the backward's dq/dk/dg step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernels {
    /// The library's plan as it is.
    Library,
    /// The plan with `negative_gla_bwd_no_carry_barrier` in place of
    /// `gla_bwd_dqkg_tc_dk64_dv64` (`kernels::negative`).
    NoCarryBarrier,
}

/// Run `plan` on `exec`, with the library's kernels or the negative control.
///
/// # Safety
/// As for `GlaBackwardPlan::run`.
unsafe fn run_plan(
    plan: &GlaBackwardPlan,
    exec: &impl Exec,
    ws: &GlaBackwardWorkspace<'_>,
    kernels: Kernels,
) -> kernels::Result<()> {
    // SAFETY: forwarded to the caller.
    unsafe {
        match kernels {
            Kernels::Library => plan.run(exec, ws),
            Kernels::NoCarryBarrier => {
                kernels::negative::gla_backward_no_carry_barrier_run(plan, exec, ws)
            }
        }
    }
}

/// The target the emulated plans are made for (any: the emulator runs the baseline's portable
/// kernels, as every target does).
const EMULATED_TARGET: Target = Target {
    arch: Arch::Sm80,
    multiprocessors: 132,
};

/// The whole backward (`GlaProblem::plan_backward`) in the CPU emulator: host buffers with guard
/// bands, outputs and workspace poisoned with NaN; an error if a kernel wrote outside a buffer
/// (or, from the emulator, on a shared-memory hazard).
pub fn emulated(p: &GlaProblem, d: &Data, kernels: Kernels) -> kernels::Result<Got> {
    let (mut q, mut k, mut v, mut g, mut d_o) = (
        HostBuf::from_slice(&d.q),
        HostBuf::from_slice(&d.k),
        HostBuf::from_slice(&d.v),
        HostBuf::from_slice(&d.g),
        HostBuf::from_slice(&d.d_o),
    );
    let mut init = d.init.as_deref().map(HostBuf::from_slice);
    let mut d_final = d.d_final.as_deref().map(HostBuf::from_slice);
    let mut d_q = HostBuf::filled(p.qk_len(), bf16::NAN);
    let mut d_k = HostBuf::filled(p.qk_len(), bf16::NAN);
    let mut d_v = HostBuf::filled(p.v_len(), bf16::NAN);
    let mut d_g = HostBuf::filled(p.qk_len(), f32::NAN);
    let mut d_init = HostBuf::filled(p.state_len(), f32::NAN);
    let tensors = GlaBackwardTensors {
        q: q.view(),
        k: k.view(),
        v: v.view(),
        g: g.view(),
        init_state: init.as_mut().map(|b| b.view()),
        d_o: d_o.view(),
        d_final_state: d_final.as_mut().map(|b| b.view()),
        d_q: d_q.view(),
        d_k: d_k.view(),
        d_v: d_v.view(),
        d_g: d_g.view(),
        d_init_state: d_init.view(),
    };
    let plan = p.plan_backward(EMULATED_TARGET, &tensors)?;
    let (words, combine_words) = plan.segments.table_words();
    let mut segments = HostBuf::from_slice(&words);
    let mut combine = HostBuf::from_slice(&combine_words);
    let mut grad = HostBuf::filled(plan.grad_len, f32::NAN);
    let (state, decay) = plan.workspace.unwrap_or((0, 0));
    let mut seg_end = HostBuf::filled(state, f32::NAN);
    let mut delta = HostBuf::filled(state, f32::NAN);
    let mut decay_log2 = HostBuf::filled(decay, f32::NAN);
    let mut seg_init = HostBuf::filled(plan.seg_init_len, f32::NAN);
    let ws = GlaBackwardWorkspace {
        segments: segments.view(),
        grad: grad.view(),
        split: plan.workspace.map(|_| GlaBackwardSplit {
            combine: combine.view(),
            seg_end: seg_end.view(),
            delta: delta.view(),
            decay_log2: decay_log2.view(),
            seg_init: Some(seg_init.view()),
        }),
    };
    // SAFETY: every view is a distinct host buffer of the size the problem and plan need,
    // alive for the call; the emulator runs on host memory; the table holds the plan's words.
    unsafe { run_plan(&plan, &Emulator, &ws, kernels)? };
    let intact = [
        q.guards_intact(),
        k.guards_intact(),
        v.guards_intact(),
        g.guards_intact(),
        d_o.guards_intact(),
        init.as_ref().is_none_or(|b| b.guards_intact()),
        d_final.as_ref().is_none_or(|b| b.guards_intact()),
        d_q.guards_intact(),
        d_k.guards_intact(),
        d_v.guards_intact(),
        d_g.guards_intact(),
        d_init.guards_intact(),
        segments.guards_intact(),
        combine.guards_intact(),
        grad.guards_intact(),
        seg_end.guards_intact(),
        delta.guards_intact(),
        decay_log2.guards_intact(),
        seg_init.guards_intact(),
    ];
    if !intact.iter().all(|x| *x) {
        return Err(kernels::Error::invalid(
            "emulated GLA backward",
            "a kernel wrote outside a buffer (guard bands changed)",
        ));
    }
    Ok(Got {
        d_q: d_q.to_vec(),
        d_k: d_k.to_vec(),
        d_v: d_v.to_vec(),
        d_g: d_g.to_vec(),
        d_init: d_init.to_vec(),
    })
}

/// The whole backward on the GPU through its plan (as `gla::backward` runs it, but with the
/// outputs and the workspace poisoned), synchronized with the watchdog.
pub fn on_gpu(gpu: &Gpu, p: &GlaProblem, d: &Data, kernels: Kernels) -> kernels::Result<Got> {
    let stream = gpu.stream()?;
    let (q, k, v, g) = (upload(&d.q)?, upload(&d.k)?, upload(&d.v)?, upload(&d.g)?);
    let init = d.init.as_deref().map(upload).transpose()?;
    let d_o = upload(&d.d_o)?;
    let d_final = d.d_final.as_deref().map(upload).transpose()?;
    let mut d_q = poisoned::<bf16>(p.qk_len())?;
    let mut d_k = poisoned::<bf16>(p.qk_len())?;
    let mut d_v = poisoned::<bf16>(p.v_len())?;
    let mut d_g = poisoned::<f32>(p.qk_len())?;
    let mut d_init = poisoned::<f32>(p.state_len())?;
    {
        let tensors = GlaBackwardTensors {
            q: (&q).into(),
            k: (&k).into(),
            v: (&v).into(),
            g: (&g).into(),
            init_state: init.as_ref().map(|b| b.into()),
            d_o: (&d_o).into(),
            d_final_state: d_final.as_ref().map(|b| b.into()),
            d_q: (&mut d_q).into(),
            d_k: (&mut d_k).into(),
            d_v: (&mut d_v).into(),
            d_g: (&mut d_g).into(),
            d_init_state: (&mut d_init).into(),
        };
        let plan = p.plan_backward(Target::of(gpu), &tensors)?;
        let (words, combine_words) = plan.segments.table_words();
        let segments = upload(&words)?;
        let mut grad = poisoned::<f32>(plan.grad_len)?;
        let mut split = match plan.workspace {
            Some((state, decay)) => Some((
                upload(&combine_words)?,
                poisoned::<f32>(state)?,
                poisoned::<f32>(state)?,
                poisoned::<f32>(decay)?,
                poisoned::<f32>(plan.seg_init_len)?,
            )),
            None => None,
        };
        let ws = GlaBackwardWorkspace {
            segments: (&segments).into(),
            grad: (&mut grad).into(),
            split: split.as_mut().map(|(c, e, dl, l, i)| GlaBackwardSplit {
                combine: (&*c).into(),
                seg_end: e.into(),
                delta: dl.into(),
                decay_log2: l.into(),
                seg_init: Some(i.into()),
            }),
        };
        let exec = OnStream {
            gpu,
            stream: &stream,
        };
        // SAFETY: every view is a live allocation of this GPU's context of the size the plan
        // checked (the outputs distinct from each other and from the inputs, the workspace
        // fresh); the table holds the plan's words; nothing else touches them until the sync.
        unsafe { run_plan(&plan, &exec, &ws, kernels)? };
        gpu.sync(&stream, "GLA backward")?;
    }
    Ok(Got {
        d_q: download(&d_q)?,
        d_k: download(&d_k)?,
        d_v: download(&d_v)?,
        d_g: download(&d_g)?,
        d_init: download(&d_init)?,
    })
}
