//! Running the passes on `cust` buffers on a stream ([`forward_pre`], ...), each a thin wrapper
//! over plan and run.

use super::{
    MhcLayout, MhcProblem, MhcTensors, RawCoefficients, RawGradients, RawScratch, RawWeights,
};
use crate::error::Result;
use crate::exec::{DevView, OnStream};
use crate::gpu::Gpu;
use crate::memory::{poisoned, zeroed};
use cust::memory::DeviceBuffer;
use cust::stream::Stream;
use half::bf16;

// ---------------------------------------------------------------------------------------------
// Typed device API.

/// The weights on the device.
#[derive(Clone, Copy)]
pub struct MhcWeights<'a> {
    /// `[n C, M]` f32.
    pub phi: &'a DeviceBuffer<f32>,
    /// `[n C]` f32, exactly when the problem has `gamma`.
    pub gamma: Option<&'a DeviceBuffer<f32>>,
    /// `[3]` f32: `a_pre, a_post, a_res`.
    pub alpha: &'a DeviceBuffer<f32>,
    /// `[M]` f32.
    pub bias: &'a DeviceBuffer<f32>,
}

impl<'a> MhcWeights<'a> {
    fn raw(&self) -> RawWeights<'a> {
        RawWeights {
            phi: self.phi.into(),
            gamma: self.gamma.map(DevView::from),
            alpha: self.alpha.into(),
            bias: self.bias.into(),
        }
    }
}

/// The coefficients the forward saves for the second half and the backward (f32).
pub struct MhcCoefficients {
    /// `[T, n]`.
    pub h_pre: DeviceBuffer<f32>,
    /// `[T, n]`.
    pub h_post: DeviceBuffer<f32>,
    /// `[T, n, n]`.
    pub h_res: DeviceBuffer<f32>,
    /// `[T, M]`: `h~ = x~ phi' / r`.
    pub hproj: DeviceBuffer<f32>,
    /// `[T]`: `r`.
    pub rms: DeviceBuffer<f32>,
}

impl MhcCoefficients {
    /// Buffers for `problem`, poisoned (NaN) until the forward writes them.
    pub fn new(problem: &MhcProblem) -> Result<Self> {
        problem.validate()?;
        let (t, n, m) = (problem.tokens(), problem.n, problem.m());
        Ok(MhcCoefficients {
            h_pre: poisoned(t * n)?,
            h_post: poisoned(t * n)?,
            h_res: poisoned(t * n * n)?,
            hproj: poisoned(t * m)?,
            rms: poisoned(t)?,
        })
    }

    fn raw(&self) -> RawCoefficients<'_> {
        RawCoefficients {
            h_pre: (&self.h_pre).into(),
            h_post: (&self.h_post).into(),
            h_res: (&self.h_res).into(),
            hproj: (&self.hproj).into(),
            rms: (&self.rms).into(),
        }
    }

    fn raw_mut(&mut self) -> RawCoefficients<'_> {
        RawCoefficients {
            h_pre: (&mut self.h_pre).into(),
            h_post: (&mut self.h_post).into(),
            h_res: (&mut self.h_res).into(),
            hproj: (&mut self.hproj).into(),
            rms: (&mut self.rms).into(),
        }
    }
}

/// Scratch memory of the launches (sizes from [`MhcProblem::layout`]).
pub struct MhcWorkspace {
    packed_f1: DeviceBuffer<u32>,
    packed_b2: DeviceBuffer<u32>,
    part_proj: DeviceBuffer<f32>,
    part_sumsq: DeviceBuffer<f32>,
    dh: DeviceBuffer<f32>,
    u: DeviceBuffer<f32>,
    xcoef: DeviceBuffer<f32>,
    part_coef: DeviceBuffer<f32>,
    part_w: DeviceBuffer<f32>,
}

impl MhcWorkspace {
    /// Scratch for `problem`.
    pub fn new(problem: &MhcProblem) -> Result<Self> {
        problem.validate()?;
        let p: MhcLayout = problem.layout();
        Ok(MhcWorkspace {
            packed_f1: zeroed(p.packed_f1)?,
            packed_b2: zeroed(p.packed_b2)?,
            part_proj: zeroed(p.part_proj)?,
            part_sumsq: zeroed(p.part_sumsq)?,
            dh: zeroed(p.dh)?,
            u: zeroed(p.u)?,
            xcoef: zeroed(problem.tokens())?,
            part_coef: zeroed(p.part_coef)?,
            part_w: zeroed(p.part_w)?,
        })
    }

    fn raw_mut(&mut self) -> RawScratch<'_> {
        RawScratch {
            packed_f1: (&mut self.packed_f1).into(),
            packed_b2: (&mut self.packed_b2).into(),
            part_proj: (&mut self.part_proj).into(),
            part_sumsq: (&mut self.part_sumsq).into(),
            dh: (&mut self.dh).into(),
            u: (&mut self.u).into(),
            xcoef: (&mut self.xcoef).into(),
            part_coef: (&mut self.part_coef).into(),
            part_w: (&mut self.part_w).into(),
        }
    }
}

/// The gradients the backward writes.
pub struct MhcGradients {
    /// `[T, n, C]` bf16.
    pub dx: DeviceBuffer<bf16>,
    /// `[T, C]` bf16.
    pub dy: DeviceBuffer<bf16>,
    /// `[n C, M]` f32.
    pub dphi: DeviceBuffer<f32>,
    /// `[n C]` f32, when the problem has `gamma`.
    pub dgamma: Option<DeviceBuffer<f32>>,
    /// `[3]` f32.
    pub dalpha: DeviceBuffer<f32>,
    /// `[M]` f32 (pre, post, res).
    pub dbias: DeviceBuffer<f32>,
}

impl MhcGradients {
    /// Buffers for `problem`, poisoned (NaN) until the backward writes them.
    pub fn new(problem: &MhcProblem) -> Result<Self> {
        problem.validate()?;
        let (t, c, k, m) = (problem.tokens(), problem.c, problem.k(), problem.m());
        Ok(MhcGradients {
            dx: poisoned(t * k)?,
            dy: poisoned(t * c)?,
            dphi: poisoned(k * m)?,
            dgamma: if problem.gamma {
                Some(poisoned(k)?)
            } else {
                None
            },
            dalpha: poisoned(3)?,
            dbias: poisoned(m)?,
        })
    }

    fn raw_mut(&mut self) -> RawGradients<'_> {
        RawGradients {
            dx: (&mut self.dx).into(),
            dy: (&mut self.dy).into(),
            dphi: (&mut self.dphi).into(),
            dgamma: self.dgamma.as_mut().map(DevView::from),
            dalpha: (&mut self.dalpha).into(),
            dbias: (&mut self.dbias).into(),
        }
    }
}

/// The first half of the forward on `stream` (asynchronous): the coefficients of every token
/// into `coeffs`, and `x_in = H_pre x` (`[T, C]` bf16).
#[allow(clippy::too_many_arguments)]
pub fn forward_pre(
    gpu: &Gpu,
    stream: &Stream,
    problem: &MhcProblem,
    weights: &MhcWeights,
    x: &DeviceBuffer<bf16>,
    workspace: &mut MhcWorkspace,
    coeffs: &mut MhcCoefficients,
    x_in: &mut DeviceBuffer<bf16>,
) -> Result<()> {
    let exec = OnStream { gpu, stream };
    let plan = problem.plan(&MhcTensors::ForwardPre {
        weights: weights.raw(),
        x: x.into(),
        scratch: workspace.raw_mut(),
        coeffs: coeffs.raw_mut(),
        x_in: x_in.into(),
    })?;
    // SAFETY: every view comes from a live device buffer of this GPU's context, borrowed for the
    // call (outputs mutably, so they cannot alias each other or the inputs); launches are
    // ordered on `stream`, and the buffers outlive them only if the caller synchronizes before
    // dropping them, as for every asynchronous launch in this crate.
    unsafe { plan.run(&exec) }
}

/// The second half of the forward on `stream` (asynchronous), once the layer produced
/// `y [T, C]`: `x_next = H_res x + H_post^T y` (`[T, n, C]` bf16).
pub fn forward_post(
    gpu: &Gpu,
    stream: &Stream,
    problem: &MhcProblem,
    x: &DeviceBuffer<bf16>,
    y: &DeviceBuffer<bf16>,
    coeffs: &MhcCoefficients,
    x_next: &mut DeviceBuffer<bf16>,
) -> Result<()> {
    let exec = OnStream { gpu, stream };
    let plan = problem.plan(&MhcTensors::ForwardPost {
        x: x.into(),
        y: y.into(),
        coeffs: coeffs.raw(),
        x_next: x_next.into(),
    })?;
    // SAFETY: as in `forward_pre`.
    unsafe { plan.run(&exec) }
}

/// The backward on `stream` (asynchronous): from `d_xin [T, C]` and `d_xnext [T, n, C]`, all
/// gradients into `grads`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    gpu: &Gpu,
    stream: &Stream,
    problem: &MhcProblem,
    weights: &MhcWeights,
    x: &DeviceBuffer<bf16>,
    y: &DeviceBuffer<bf16>,
    coeffs: &MhcCoefficients,
    d_xin: &DeviceBuffer<bf16>,
    d_xnext: &DeviceBuffer<bf16>,
    workspace: &mut MhcWorkspace,
    grads: &mut MhcGradients,
) -> Result<()> {
    let exec = OnStream { gpu, stream };
    let plan = problem.plan(&MhcTensors::Backward {
        weights: weights.raw(),
        x: x.into(),
        y: y.into(),
        coeffs: coeffs.raw(),
        d_xin: d_xin.into(),
        d_xnext: d_xnext.into(),
        scratch: workspace.raw_mut(),
        grads: grads.raw_mut(),
    })?;
    // SAFETY: as in `forward_pre`.
    unsafe { plan.run(&exec) }
}
