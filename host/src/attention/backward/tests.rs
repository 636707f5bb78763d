//! CPU tests of the backward plan.
