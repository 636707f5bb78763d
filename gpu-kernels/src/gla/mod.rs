//! Gated linear attention (GLA) forward, chunkwise: outputs `o`, the final states, and for
//! sequences split into several segments, the state each segment adds (`delta`, `decay_log2`)
//! and the initial state of every later segment. Semantics: `kernel_abi::gla` and the f64
//! recurrence in `host/src/gla/reference.rs`.
//!
//! Two implementations of the same chunkwise algorithm (chunks of 16 tokens, halves of 8 with
//! their midpoints as reference points for the decay factors):
//! - [`baseline`]: portable, `mma.sync` tensor cores, `cp.async` ring (sm_80 and newer; also
//!   run on the CPU by the `kernel-emulator` crate): `gla_fwd_dk{DK}_dv{DV}` (outputs),
//!   `gla_states_dk{DK}_dv{DV}` (segment states) and `gla_combine` (segment initial states).
//! - `pingpong` (sm_90a only): warp-specialized, TMA into mbarrier rings, `wgmma`, consumer
//!   warpgroups taking turns: `gla_fwd_pp_dk{DK}_dv{DV}` and `gla_states_pp_dk{DK}_dv{DV}`.
//!
//! # Files
//! - `chunk.rs`: the math both implementations share: the chunkwise form and why it is stable
//!   (the module documentation), the per-(token, channel) operand formulas, the chunk's edge
//!   cumulative decays, the intra-chunk scores on `mma.sync`, and the tile-addressing trait
//!   through which the element-wise phases read and write shared memory.
//! - `baseline/`: `mod.rs` (entries, parameters, tiling, barrier protocol), `walk.rs` (the walk
//!   of a segment), `elementwise.rs`, `matrix.rs` (the two phases of a chunk), `tiles.rs`
//!   (shared-memory tiles), `combine.rs` (`gla_combine`).
//! - `backward/`: the backward: `mod.rs` (entries, algorithm, barrier protocol), `dhdv.rs`
//!   (the reverse pass on the baseline's tiling: the reverse walk of a segment, `gla_bwd_dhdv`
//!   and `gla_bwd_states`), `elementwise.rs` (a chunk's operand tiles), `dv.rs` (dv of a chunk:
//!   transposed scores, inter-chunk term), `combine.rs` (`gla_bwd_combine`), `dqkg_tc.rs` (dq,
//!   dk, dg chunkwise on tensor cores: `gla_bwd_dqkg_tc`, the default), `dqkg.rs` (the same
//!   token by token: `gla_bwd_dqkg`, the reference on the device).
//! - `pingpong/`: `mod.rs` (entries, work and role split, barrier protocol), `forward.rs` (the
//!   forward walk: producer, consumers' steps, GEMM phase), `states.rs` (the state pass),
//!   `elementwise.rs` (the vectorized element-wise phases), `turns.rs` (the consumers' turn
//!   order), `tiles.rs` (swizzled tiles and vector shared-memory accesses).

pub mod backward;
pub mod baseline;
mod chunk;
#[cfg(target_feature = "sm_90a")]
pub mod pingpong;

// The kernels of this family, for the CPU emulator (`crate::emu`).
#[cfg(not(target_arch = "nvptx64"))]
pub use baseline::EMU_KERNELS;
