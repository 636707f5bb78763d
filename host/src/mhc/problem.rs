//! The mHC problem: sizes and options, and their validation.

use crate::error::{Error, Result};
use kernel_abi::Kernel;
use kernel_abi::mhc::{self as abi, ProjParams};

/// Default number of Sinkhorn iterations (DeepSeek's).
pub const DEFAULT_SINKHORN_ITERS: u32 = 20;
/// Default RMS epsilon.
pub const DEFAULT_EPS: f32 = 1e-6;

/// An mHC problem: shapes and options. Tensors are contiguous and row-major.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MhcProblem {
    /// Batch size `B`.
    pub batch: usize,
    /// Sequence length `S`.
    pub seq: usize,
    /// Residual streams `n` (2..=8).
    pub n: usize,
    /// Channels per stream `C` (a multiple of 8).
    pub c: usize,
    /// Sinkhorn iterations `t_max` (1..=`MAX_SINKHORN_ITERS`).
    pub sinkhorn_iters: u32,
    /// RMS epsilon (finite, `>= 0`).
    pub eps: f32,
    /// Whether an RMSNorm weight `gamma [n C]` is given (folded into `phi`).
    pub gamma: bool,
    /// A tuning variant of the projection's pipeline (`kernel_abi::mhc::PROJ_VARIANTS`, for
    /// this `n`), or `None` for the default `proj_config(n)`. Results may differ in the last
    /// bits between variants (the K split changes the summation order).
    pub proj_variant: Option<&'static str>,
}

impl MhcProblem {
    /// A problem with the default options (20 iterations, `eps = 1e-6`, no `gamma`).
    pub fn new(batch: usize, seq: usize, n: usize, c: usize) -> Self {
        MhcProblem {
            batch,
            seq,
            n,
            c,
            sinkhorn_iters: DEFAULT_SINKHORN_ITERS,
            eps: DEFAULT_EPS,
            gamma: false,
            proj_variant: None,
        }
    }

    /// The same problem with (`true`) or without an RMSNorm weight.
    pub fn with_gamma(mut self, gamma: bool) -> Self {
        self.gamma = gamma;
        self
    }

    /// The same problem with `iters` Sinkhorn iterations.
    pub fn with_iters(mut self, iters: u32) -> Self {
        self.sinkhorn_iters = iters;
        self
    }

    /// The same problem with RMS epsilon `eps`.
    pub fn with_eps(mut self, eps: f32) -> Self {
        self.eps = eps;
        self
    }

    /// Tokens `T = B S`.
    pub fn tokens(&self) -> usize {
        self.batch * self.seq
    }

    /// `K = n C`.
    pub fn k(&self) -> usize {
        self.n * self.c
    }

    /// Coefficients per token, `M = n^2 + 2 n`.
    pub fn m(&self) -> usize {
        self.n * self.n + 2 * self.n
    }

    /// Check everything the kernels require.
    pub fn validate(&self) -> Result<()> {
        if self.batch == 0 || self.seq == 0 {
            return Err(Error::invalid(
                "mHC batch and sequence",
                "must be at least 1",
            ));
        }
        if !(abi::MIN_N as usize..=abi::MAX_N as usize).contains(&self.n) {
            return Err(Error::unsupported(
                format!("mHC n = {}", self.n),
                format!("streams must be {}..={}", abi::MIN_N, abi::MAX_N),
            ));
        }
        if self.c == 0 {
            return Err(Error::invalid("mHC C", "must be at least 8"));
        }
        if !self.c.is_multiple_of(abi::C_MULTIPLE as usize) {
            return Err(Error::unsupported(
                format!("mHC C = {}", self.c),
                format!(
                    "must be a multiple of {} (16-byte vectors)",
                    abi::C_MULTIPLE
                ),
            ));
        }
        if self.sinkhorn_iters == 0 {
            return Err(Error::invalid("mHC sinkhorn_iters", "must be at least 1"));
        }
        if self.sinkhorn_iters > abi::MAX_SINKHORN_ITERS {
            return Err(Error::unsupported(
                format!("mHC sinkhorn_iters = {}", self.sinkhorn_iters),
                format!(
                    "at most {} (the backward keeps every iterate in shared memory)",
                    abi::MAX_SINKHORN_ITERS
                ),
            ));
        }
        if !self.eps.is_finite() || self.eps < 0.0 {
            return Err(Error::invalid(
                "mHC eps",
                format!("{} is not finite and >= 0", self.eps),
            ));
        }
        if let Some(v) = self.proj_variant
            && abi::proj_variant(self.n as u32, v).is_none()
        {
            return Err(Error::unsupported(
                format!("mHC projection variant {v:?}"),
                format!("no such variant for n = {}", self.n),
            ));
        }
        // Products in u128 (a wrapped usize product could pass the limits).
        let (t, k) = (
            self.batch as u128 * self.seq as u128,
            self.n as u128 * self.c as u128,
        );
        if k > 1 << 20 || t > i32::MAX as u128 || t * k > 1 << 40 {
            return Err(Error::unsupported(
                format!("mHC size (T = {t}, n C = {k})"),
                "n C must be at most 2^20, T below 2^31 and T n C at most 2^40".to_string(),
            ));
        }
        Ok(())
    }

    /// Bytes the forward must move at least (`x` read by `x_in` and again by `x_next`, which
    /// needs `y` = the layer applied to `x_in`; `y` read; `x_in`, `x_next` written), bf16:
    /// `2 (3 n C + 2 C)` per token.
    pub fn forward_bytes(&self) -> f64 {
        2.0 * (3 * self.k() + 2 * self.c) as f64 * self.tokens() as f64
    }

    /// Bytes the backward must move at least: `x`, `y`, `d_xin`, `d_xnext` read and `dx`,
    /// `dy` written, bf16: `2 (3 n C + 3 C)` per token.
    pub fn backward_bytes(&self) -> f64 {
        2.0 * (3 * self.k() + 3 * self.c) as f64 * self.tokens() as f64
    }

    /// FLOPs of the projection `x~ phi'` (`2 K M` per token; the backward does it twice more).
    pub fn projection_flops(&self) -> f64 {
        2.0 * (self.k() * self.m()) as f64 * self.tokens() as f64
    }

    /// The projection's pipeline: the default for `n`, or the tuning variant (which
    /// [`MhcProblem::validate`] checks exists; the default is used if it does not).
    pub fn proj_config(&self) -> abi::ProjConfig {
        self.proj_variant
            .and_then(|v| abi::proj_variant(self.n as u32, v))
            .map_or(abi::proj_config(self.n as u32), |v| v.config)
    }

    /// The projection's kernel: the tuning variant's, or the default for `n` (`None` when `n`
    /// or the variant is not supported).
    pub fn proj_kernel(&self) -> Option<&'static Kernel<ProjParams>> {
        let n = u32::try_from(self.n).ok()?;
        match self.proj_variant {
            Some(v) => abi::proj_variant(n, v).map(|v| &v.kernel),
            None => abi::for_n(abi::FWD_PROJ, n),
        }
    }
}
