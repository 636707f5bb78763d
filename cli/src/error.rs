//! The tool's one error type: every variant prints as one line that names the file or tensor
//! and what was expected.

use std::path::PathBuf;

/// What can go wrong in a run of the tool.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// The input file could not be read (missing, permissions, ...).
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// The input file is not a valid safetensors file.
    #[error("{} is not a valid safetensors file: {reason}", path.display())]
    Format {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        reason: String,
    },
    /// A required tensor is absent.
    #[error("missing tensor `{name}`: expected {expected}")]
    MissingTensor {
        /// Tensor name.
        name: String,
        /// Its dtype and shape, as documented.
        expected: String,
    },
    /// A tensor has a dtype the subcommand does not take.
    #[error("tensor `{name}`: expected dtype {expected}, got {got}")]
    Dtype {
        /// Tensor name.
        name: String,
        /// The accepted dtypes.
        expected: String,
        /// The file's dtype.
        got: String,
    },
    /// A tensor has the wrong rank or a dimension that disagrees with another tensor or option.
    #[error("tensor `{name}`: expected shape {expected}, got {got}")]
    Shape {
        /// Tensor name.
        name: String,
        /// The expected shape, symbolic and with the values known so far.
        expected: String,
        /// The file's shape.
        got: String,
    },
    /// A tensor's values are outside their domain (negative lengths, ...).
    #[error("tensor `{name}`: {reason}")]
    Value {
        /// Tensor name.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor the subcommand does not read (likely a misspelled optional input).
    #[error("unexpected tensor `{name}` (`{command}` reads: {accepted})")]
    UnexpectedTensor {
        /// Tensor name.
        name: String,
        /// The subcommand.
        command: String,
        /// The tensor names it reads.
        accepted: String,
    },
    /// A failure that valid inputs cannot cause (a bug of the tool).
    #[error("internal error: {0}")]
    Internal(String),
    /// No usable GPU for the kernel path.
    #[error("no usable GPU: {reason} (--reference runs the CPU reference instead)")]
    NoGpu {
        /// Why (the driver's words).
        reason: String,
    },
    /// The output file could not be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The operating system's reason.
        #[source]
        source: std::io::Error,
    },
    /// `--check` with a tolerance: an output's error against the reference exceeds it.
    #[error("{command}: check failed against the f64 reference: {failures}")]
    CheckFailed {
        /// The subcommand.
        command: String,
        /// Each failing output with its error and tolerance.
        failures: String,
    },
    /// The library rejected the problem or a launch failed.
    #[error("{0}")]
    Kernel(#[from] kernels::Error),
}

/// Result with [`CliError`].
pub type Result<T, E = CliError> = std::result::Result<T, E>;
