//! The one error type of the library.

use cust::error::CudaError;

/// Everything that can go wrong, with the context needed to act on it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable CUDA device (no driver, no GPU, or initialization failed).
    #[error("no CUDA device available: {reason}")]
    NoDevice {
        /// What the driver said.
        reason: String,
    },
    /// The device is older than every embedded PTX target.
    #[error(
        "no embedded kernels run on {device} (compute capability {major}.{minor}); \
         embedded targets: {available}"
    )]
    UnsupportedDevice {
        /// Device name.
        device: String,
        /// Compute capability, major.
        major: u32,
        /// Compute capability, minor.
        minor: u32,
        /// The PTX targets this build carries.
        available: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA error while {context}: {source}")]
    Cuda {
        /// What was being done.
        context: String,
        /// The driver's error.
        #[source]
        source: CudaError,
    },
    /// A CUDA driver call made directly (not through cust) failed.
    #[error("CUDA driver error {name} ({code}) while {context}: {message}")]
    Driver {
        /// What was being done.
        context: String,
        /// The `CUresult` code.
        code: u32,
        /// Its name, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`.
        name: String,
        /// The driver's description.
        message: String,
    },
    /// A tensor has the wrong shape or size.
    #[error("{what}: expected {expected}, got {got}")]
    ShapeMismatch {
        /// Which tensor or dimension.
        what: String,
        /// What the problem requires.
        expected: String,
        /// What was given.
        got: String,
    },
    /// A valid request that this library does not implement (head dim, dtype, ...).
    #[error("unsupported {what}: {reason}")]
    Unsupported {
        /// What is unsupported.
        what: String,
        /// Why, and what is supported.
        reason: String,
    },
    /// An argument outside its domain (zero size, NaN, out-of-range option, ...).
    #[error("invalid {what}: {reason}")]
    InvalidArgument {
        /// Which argument.
        what: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A device pointer or stride does not meet a kernel's alignment requirement.
    #[error("{what} must be aligned to {required} bytes, but is at offset {actual} mod {required}")]
    Misaligned {
        /// Which pointer or stride.
        what: String,
        /// Required alignment in bytes.
        required: u64,
        /// The value modulo `required`.
        actual: u64,
    },
    /// A launch configuration the kernel or device cannot run (checked before launching).
    #[error("invalid launch of kernel {kernel}: {reason}")]
    InvalidLaunch {
        /// Kernel name.
        kernel: String,
        /// What is wrong.
        reason: String,
    },
    /// Work on a stream did not finish within the watchdog's limit: a deadlock, or a problem
    /// much larger than the limit allows. The context is unusable afterwards.
    #[error(
        "{what} did not finish within {seconds} s (deadlock?); raise KERNELS_WATCHDOG_SECS for \
         very large problems or slow tools such as compute-sanitizer"
    )]
    Timeout {
        /// What was being waited for.
        what: String,
        /// The limit.
        seconds: f64,
    },
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attach context to a CUDA result.
pub(crate) trait CudaContext<T> {
    /// Map a `CudaError` to [`Error::Cuda`] with `context` ("while ...").
    fn ctx(self, context: &str) -> Result<T>;
}

impl<T> CudaContext<T> for std::result::Result<T, CudaError> {
    fn ctx(self, context: &str) -> Result<T> {
        self.map_err(|source| Error::Cuda {
            context: context.to_string(),
            source,
        })
    }
}

/// Shorthand constructors used by validation code.
impl Error {
    /// [`Error::ShapeMismatch`].
    pub fn shape(what: impl Into<String>, expected: impl ToString, got: impl ToString) -> Self {
        Error::ShapeMismatch {
            what: what.into(),
            expected: expected.to_string(),
            got: got.to_string(),
        }
    }

    /// [`Error::InvalidArgument`].
    pub fn invalid(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidArgument {
            what: what.into(),
            reason: reason.into(),
        }
    }

    /// [`Error::Unsupported`].
    pub fn unsupported(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Unsupported {
            what: what.into(),
            reason: reason.into(),
        }
    }
}
