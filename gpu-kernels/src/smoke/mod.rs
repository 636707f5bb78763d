//! Smoke kernels: small kernels that each prove a group of device-layer primitives on a GPU,
//! checked by host tests against CPU references.

mod mma_tile;
mod numerics;
pub(crate) mod reduce;

#[cfg(target_feature = "sm_90a")]
mod pingpong;
#[cfg(target_feature = "sm_90a")]
mod tma_load;
#[cfg(target_feature = "sm_90a")]
mod wgmma_tile;
