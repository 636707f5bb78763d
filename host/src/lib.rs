//! Safe host API for the project's GPU kernels.
//!
//! Kernels are written in Rust (`gpu-kernels/`), compiled to PTX by rustc's NVPTX backend at
//! build time (`build.rs` through `ptx-builder`), embedded in this crate, and launched through
//! `cust`. At run time [`Gpu::new`] picks the PTX target that matches the device.
//!
//! Every kernel family has the same shape: a module with a typed problem description that is
//! validated before anything is launched, the launcher, and an f64 CPU reference, which is the
//! specification. Errors are one enum, [`Error`].
//!
//! Memory the library does not own (a framework's tensors, by address, shape and strides, on the
//! framework's stream and in the device's primary context) goes through [`raw`] and each
//! family's raw entry point (`attention::forward_raw`), which run the same plans.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs, clippy::undocumented_unsafe_blocks)]

pub mod attention;
pub mod catalog;
pub mod data;
pub mod error;
pub mod exec;
pub mod gemm;
pub mod gla;
pub mod gpu;
pub mod launch;
pub mod memory;
pub mod mhc;
#[cfg(feature = "negative-controls")]
pub mod negative;
pub mod ptx;
pub mod raw;
pub mod semicrf;
pub mod tensor_map;
pub mod timing;

#[cfg(feature = "progress")]
pub mod progress;

pub use error::{Error, Result};
pub use gpu::{DeviceInfo, Gpu, LaunchConfig};
pub use kernel_abi::{Kernel, KernelDecl};
pub use launch::Launch;
pub use ptx::Arch;

pub use half::{bf16, f16};

/// The `cust` types that appear in this crate's API.
pub use cust::memory::DeviceBuffer;
pub use cust::stream::Stream;
