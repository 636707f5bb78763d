//! Scaffolding shared by the test suites (`tests/`), the benchmarks (`bench/`) and the examples:
//! what runs the library's kernels on whole random problems and checks them, kept out of the
//! library itself. Nothing here is part of the library's API.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod attention;
pub mod gla;
pub mod mhc;
pub mod negative;
pub mod semicrf;
pub mod smoke;
