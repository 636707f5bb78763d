//! mHC: every device buffer of one problem from host data ([`MhcDeviceRun`]), and the
//! comparison of the kernels' outputs with the reference ([`compare`]), for the tests, the
//! benchmarks and the examples.

mod compare;

pub use compare::{Comparison, MhcHostOutputs, OUTPUTS, Stat, compare, sample_tokens};

use kernels::Result;
use kernels::memory::poisoned;
use kernels::mhc::reference;
use kernels::mhc::{
    MhcCoefficients, MhcGradients, MhcProblem, MhcWeights, MhcWorkspace, backward, forward_post,
    forward_pre,
};
use kernels::{DeviceBuffer, Gpu, Stream, bf16};

/// Every device buffer of one problem: inputs uploaded from host data, outputs poisoned.
pub struct MhcDeviceRun {
    /// The problem.
    pub problem: MhcProblem,
    /// `x`.
    pub x: DeviceBuffer<bf16>,
    /// `y`.
    pub y: DeviceBuffer<bf16>,
    /// `phi`.
    pub phi: DeviceBuffer<f32>,
    /// `gamma`.
    pub gamma: Option<DeviceBuffer<f32>>,
    /// `alpha`.
    pub alpha: DeviceBuffer<f32>,
    /// `bias`.
    pub bias: DeviceBuffer<f32>,
    /// `d_xin`.
    pub d_xin: DeviceBuffer<bf16>,
    /// `d_xnext`.
    pub d_xnext: DeviceBuffer<bf16>,
    /// Scratch.
    pub workspace: MhcWorkspace,
    /// Saved coefficients.
    pub coeffs: MhcCoefficients,
    /// Gradients.
    pub grads: MhcGradients,
    /// `x_in`.
    pub x_in: DeviceBuffer<bf16>,
    /// `x_next`.
    pub x_next: DeviceBuffer<bf16>,
}

impl MhcDeviceRun {
    /// Upload `data` and allocate everything else.
    pub fn upload(data: &reference::MhcData) -> Result<Self> {
        use kernels::memory::upload;
        let p = data.problem;
        p.validate()?;
        Ok(MhcDeviceRun {
            problem: p,
            x: upload(&data.x)?,
            y: upload(&data.y)?,
            phi: upload(&data.phi)?,
            gamma: data.gamma.as_deref().map(upload).transpose()?,
            alpha: upload(&data.alpha)?,
            bias: upload(&data.bias)?,
            d_xin: upload(&data.d_xin)?,
            d_xnext: upload(&data.d_xnext)?,
            workspace: MhcWorkspace::new(&p)?,
            coeffs: MhcCoefficients::new(&p)?,
            grads: MhcGradients::new(&p)?,
            x_in: poisoned(p.tokens() * p.c)?,
            x_next: poisoned(p.tokens() * p.k())?,
        })
    }

    /// [`forward_pre`] (asynchronous).
    pub fn forward_pre(&mut self, gpu: &Gpu, stream: &Stream) -> Result<()> {
        let w = MhcWeights {
            phi: &self.phi,
            gamma: self.gamma.as_ref(),
            alpha: &self.alpha,
            bias: &self.bias,
        };
        forward_pre(
            gpu,
            stream,
            &self.problem,
            &w,
            &self.x,
            &mut self.workspace,
            &mut self.coeffs,
            &mut self.x_in,
        )
    }

    /// [`forward_post`] (asynchronous).
    pub fn forward_post(&mut self, gpu: &Gpu, stream: &Stream) -> Result<()> {
        forward_post(
            gpu,
            stream,
            &self.problem,
            &self.x,
            &self.y,
            &self.coeffs,
            &mut self.x_next,
        )
    }

    /// Both halves of the forward (asynchronous).
    pub fn forward(&mut self, gpu: &Gpu, stream: &Stream) -> Result<()> {
        self.forward_pre(gpu, stream)?;
        self.forward_post(gpu, stream)
    }

    /// [`backward`] (asynchronous; needs the forward's coefficients).
    pub fn backward(&mut self, gpu: &Gpu, stream: &Stream) -> Result<()> {
        let w = MhcWeights {
            phi: &self.phi,
            gamma: self.gamma.as_ref(),
            alpha: &self.alpha,
            bias: &self.bias,
        };
        backward(
            gpu,
            stream,
            &self.problem,
            &w,
            &self.x,
            &self.y,
            &self.coeffs,
            &self.d_xin,
            &self.d_xnext,
            &mut self.workspace,
            &mut self.grads,
        )
    }

    /// Copy every output to the host (synchronous).
    pub fn download(&self) -> Result<MhcHostOutputs> {
        use kernels::memory::download;
        Ok(MhcHostOutputs {
            x_in: download(&self.x_in)?,
            x_next: download(&self.x_next)?,
            h_pre: download(&self.coeffs.h_pre)?,
            h_post: download(&self.coeffs.h_post)?,
            h_res: download(&self.coeffs.h_res)?,
            hproj: download(&self.coeffs.hproj)?,
            rms: download(&self.coeffs.rms)?,
            dx: download(&self.grads.dx)?,
            dy: download(&self.grads.dy)?,
            dphi: download(&self.grads.dphi)?,
            dgamma: self.grads.dgamma.as_ref().map(download).transpose()?,
            dalpha: download(&self.grads.dalpha)?,
            dbias: download(&self.grads.dbias)?,
        })
    }
}
