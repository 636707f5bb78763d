//! Attention backward on Hopper (sm_90a): a dK/dV kernel and a dQ kernel with TMA, mbarrier
//! rings, `wgmma` and warp specialization. They take the place of the `mma.sync` dK/dV and
//! deterministic dQ kernels in a backward pass; the preprocess (`delta'`) stays the one of
//! [`super::backward`].
//!
//! - dK/dV: one block per [`HOPPER_BWD_BLOCK_N`] keys of one key/value head of one sequence:
//!   one producer warpgroup (TMA loads) and two consumer warpgroups, consumer `c` owning keys
//!   `64 c .. 64 c + 64` of the block with their dK and dV in registers (f32) over every query
//!   head of the group and every [`HOPPER_BWD_BLOCK_M`]-row query block that sees the keys.
//! - dQ: one block per [`HOPPER_DQ_BLOCK_M`] query rows of one query head of one sequence,
//!   consumer `c` owning rows `64 c .. 64 c + 64` with their dQ in registers, over the
//!   [`HOPPER_DQ_BLOCK_N`]-key blocks the rows may see. No atomics: bitwise reproducible.
//!
//! The kernels' module documentation (`gpu-kernels/src/attention/hopper_bwd/`) has the
//! products and the barrier protocols.

use super::backward::AttentionBwdParams;
use super::{Dtype, HOPPER_ATOM, HOPPER_THREADS};
use crate::{Kernel, KernelDecl, SMEM_ALIGN, TensorMap};

/// Keys per block (64 per consumer warpgroup: the M of its `wgmma`s).
pub const HOPPER_BWD_BLOCK_N: u32 = 128;
/// Query rows per step (the Q and dO tiles of one ring stage).
pub const HOPPER_BWD_BLOCK_M: u32 = 64;
/// Stages of the Q/dO ring (dK/dV) and of the K/V ring (dQ).
pub const HOPPER_BWD_STAGES: u32 = 2;
/// Query rows per block of the dQ kernel (64 per consumer warpgroup).
pub const HOPPER_DQ_BLOCK_M: u32 = 128;
/// Keys per step of the dQ kernel (the K and V tiles of one ring stage).
pub const HOPPER_DQ_BLOCK_N: u32 = 64;

/// Parameters of the Hopper dK/dV kernel: the tensor maps of Q, dO, K and V (4-D, dims `[D,
/// heads, seq, batch]`, box `[64, 1, rows, 1]` with rows [`HOPPER_BWD_BLOCK_M`] for Q and dO and
/// [`HOPPER_BWD_BLOCK_N`] for K and V, 128-byte swizzle; rows past the sequence read as zeros),
/// then the `mma.sync` backward's parameters, of which the kernel reads LSE, `delta'`, dK, dV
/// with their strides, the sizes, the scales and the window.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct HopperBwdParams {
    /// Q map.
    pub tmap_q: TensorMap,
    /// dO map.
    pub tmap_do: TensorMap,
    /// K map.
    pub tmap_k: TensorMap,
    /// V map.
    pub tmap_v: TensorMap,
    /// Everything else, as for the `mma.sync` kernels.
    pub base: AttentionBwdParams,
}

/// The shared-memory layout of the Hopper dK/dV kernel for one head dimension. Tiles are stored
/// as `D / 64` column blocks of 128-byte swizzled rows (one TMA box each), as in the forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperBwdConfig {
    /// Head dimension D.
    pub head_dim: u32,
}

impl HopperBwdConfig {
    /// 128-byte column blocks along D.
    pub const fn column_blocks(&self) -> u32 {
        self.head_dim / HOPPER_ATOM
    }

    /// Bytes of one column block of `rows` rows.
    pub const fn block_bytes(&self, rows: u32) -> u32 {
        rows * 128
    }

    /// Bytes of a `[rows, D]` tile.
    pub const fn tile_bytes(&self, rows: u32) -> u32 {
        self.column_blocks() * self.block_bytes(rows)
    }

    /// Offset of the K tile (`[HOPPER_BWD_BLOCK_N, D]`).
    pub const fn k_offset(&self) -> u32 {
        0
    }

    /// Offset of the V tile.
    pub const fn v_offset(&self) -> u32 {
        self.tile_bytes(HOPPER_BWD_BLOCK_N)
    }

    /// Offset of stage `s`'s Q tile (`[HOPPER_BWD_BLOCK_M, D]`).
    pub const fn q_offset(&self, s: u32) -> u32 {
        2 * self.tile_bytes(HOPPER_BWD_BLOCK_N) + 2 * s * self.tile_bytes(HOPPER_BWD_BLOCK_M)
    }

    /// Offset of stage `s`'s dO tile.
    pub const fn do_offset(&self, s: u32) -> u32 {
        self.q_offset(s) + self.tile_bytes(HOPPER_BWD_BLOCK_M)
    }

    /// Bytes the K and V loads deliver together.
    pub const fn kv_bytes(&self) -> u32 {
        2 * self.tile_bytes(HOPPER_BWD_BLOCK_N)
    }

    /// Bytes one step's Q and dO loads deliver together.
    pub const fn step_bytes(&self) -> u32 {
        2 * self.tile_bytes(HOPPER_BWD_BLOCK_M)
    }

    /// Offset of stage `s`'s row values: `HOPPER_BWD_BLOCK_M` f32 LSE values in base 2 (+inf
    /// where P must be 0), then as many `delta'` values (0 past the sequence), written by the
    /// producer for the step's query rows.
    pub const fn rows_offset(&self, s: u32) -> u32 {
        self.q_offset(HOPPER_BWD_STAGES) + s * 2 * HOPPER_BWD_BLOCK_M * 4
    }

    /// Offset of the mbarriers: `kv_full`, then `full[s]` and `empty[s]` of the ring.
    pub const fn barriers_offset(&self) -> u32 {
        self.rows_offset(HOPPER_BWD_STAGES)
    }

    /// Number of mbarriers.
    pub const fn barriers(&self) -> u32 {
        1 + 2 * HOPPER_BWD_STAGES
    }

    /// Dynamic shared memory of the kernel.
    pub const fn smem_bytes(&self) -> usize {
        crate::align_up(
            self.barriers_offset() as usize + 8 * self.barriers() as usize,
            16,
        ) + SMEM_ALIGN
    }
}

/// The shared-memory layout of the Hopper dQ kernel: Q and dO tiles (`[HOPPER_DQ_BLOCK_M, D]`,
/// loaded once), then the K/V ring (`[HOPPER_DQ_BLOCK_N, D]` each), then the mbarriers; tiles
/// as [`HopperBwdConfig`]'s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HopperDqConfig {
    /// Head dimension D.
    pub head_dim: u32,
}

impl HopperDqConfig {
    const fn tiles(&self) -> HopperBwdConfig {
        HopperBwdConfig {
            head_dim: self.head_dim,
        }
    }

    /// 128-byte column blocks along D.
    pub const fn column_blocks(&self) -> u32 {
        self.tiles().column_blocks()
    }

    /// Bytes of one column block of `rows` rows.
    pub const fn block_bytes(&self, rows: u32) -> u32 {
        self.tiles().block_bytes(rows)
    }

    /// Offset of the Q tile.
    pub const fn q_offset(&self) -> u32 {
        0
    }

    /// Offset of the dO tile.
    pub const fn do_offset(&self) -> u32 {
        self.tiles().tile_bytes(HOPPER_DQ_BLOCK_M)
    }

    /// Offset of stage `s`'s K tile.
    pub const fn k_offset(&self, s: u32) -> u32 {
        2 * self.tiles().tile_bytes(HOPPER_DQ_BLOCK_M)
            + 2 * s * self.tiles().tile_bytes(HOPPER_DQ_BLOCK_N)
    }

    /// Offset of stage `s`'s V tile.
    pub const fn v_offset(&self, s: u32) -> u32 {
        self.k_offset(s) + self.tiles().tile_bytes(HOPPER_DQ_BLOCK_N)
    }

    /// Bytes the Q and dO loads deliver together.
    pub const fn qdo_bytes(&self) -> u32 {
        2 * self.tiles().tile_bytes(HOPPER_DQ_BLOCK_M)
    }

    /// Bytes one step's K and V loads deliver together.
    pub const fn step_bytes(&self) -> u32 {
        2 * self.tiles().tile_bytes(HOPPER_DQ_BLOCK_N)
    }

    /// Offset of the mbarriers: `qdo_full`, then `full[s]` and `empty[s]` of the ring.
    pub const fn barriers_offset(&self) -> u32 {
        self.k_offset(HOPPER_BWD_STAGES)
    }

    /// Number of mbarriers.
    pub const fn barriers(&self) -> u32 {
        1 + 2 * HOPPER_BWD_STAGES
    }

    /// Dynamic shared memory of the kernel.
    pub const fn smem_bytes(&self) -> usize {
        crate::align_up(
            self.barriers_offset() as usize + 8 * self.barriers() as usize,
            16,
        ) + SMEM_ALIGN
    }
}

/// The Hopper dK/dV configuration for head dimension `d`, if the kernel exists for it (D = 256
/// would need 256 accumulator registers per thread for dK and dV: it keeps the `mma.sync`
/// kernels).
pub const fn hopper_bwd_config(d: u32) -> Option<HopperBwdConfig> {
    match d {
        64 | 128 => Some(HopperBwdConfig { head_dim: d }),
        _ => None,
    }
}

/// [`hopper_bwd_config`] for a supported head dimension (compile-time use in kernels).
pub const fn hopper_bwd_config_of(d: u32) -> HopperBwdConfig {
    match hopper_bwd_config(d) {
        Some(c) => c,
        None => panic!("no Hopper backward for this head dimension"),
    }
}

/// The Hopper backward kernels of one element type and head dimension: their handles and what
/// they were compiled for.
pub struct HopperBwdKernel {
    /// The dK/dV kernel; launch it with shape [`HopperBwdKernel::cfg`].
    pub kernel: Kernel<HopperBwdParams, HopperBwdConfig>,
    /// The dQ kernel; launch it with shape [`HopperBwdKernel::dq_cfg`].
    pub dq: Kernel<HopperBwdParams, HopperDqConfig>,
    /// Element type.
    pub dtype: Dtype,
    /// The dK/dV configuration (its head dimension is the kernels').
    pub cfg: HopperBwdConfig,
    /// The dQ configuration.
    pub dq_cfg: HopperDqConfig,
    /// Whether the kernels apply the softcap of
    /// [`AttentionBwdParams::logits`](super::backward::AttentionBwdParams::logits).
    pub softcap: bool,
}

fn smem(cfg: HopperBwdConfig) -> usize {
    cfg.smem_bytes()
}

fn smem_dq(cfg: HopperDqConfig) -> usize {
    cfg.smem_bytes()
}

const fn hopper_bwd(name: &'static str, dq: &'static str, dtype: Dtype, d: u32) -> HopperBwdKernel {
    HopperBwdKernel {
        kernel: Kernel::new(name, HOPPER_THREADS, 1, smem),
        dq: Kernel::new(dq, HOPPER_THREADS, 1, smem_dq),
        dtype,
        cfg: hopper_bwd_config_of(d),
        dq_cfg: HopperDqConfig { head_dim: d },
        softcap: false,
    }
}

/// [`hopper_bwd`] of the softcap kernels.
const fn hopper_bwd_softcap(
    name: &'static str,
    dq: &'static str,
    dtype: Dtype,
    d: u32,
) -> HopperBwdKernel {
    HopperBwdKernel {
        softcap: true,
        ..hopper_bwd(name, dq, dtype, d)
    }
}

/// The Hopper backward kernels (sm_90a only), then their softcap forms.
pub const HOPPER_BWD_KERNELS: [HopperBwdKernel; 8] = [
    hopper_bwd(
        "attention_bwd_hopper_dkdv_bf16_d64",
        "attention_bwd_hopper_dq_bf16_d64",
        Dtype::Bf16,
        64,
    ),
    hopper_bwd(
        "attention_bwd_hopper_dkdv_bf16_d128",
        "attention_bwd_hopper_dq_bf16_d128",
        Dtype::Bf16,
        128,
    ),
    hopper_bwd(
        "attention_bwd_hopper_dkdv_f16_d64",
        "attention_bwd_hopper_dq_f16_d64",
        Dtype::F16,
        64,
    ),
    hopper_bwd(
        "attention_bwd_hopper_dkdv_f16_d128",
        "attention_bwd_hopper_dq_f16_d128",
        Dtype::F16,
        128,
    ),
    hopper_bwd_softcap(
        "attention_bwd_hopper_dkdv_softcap_bf16_d64",
        "attention_bwd_hopper_dq_softcap_bf16_d64",
        Dtype::Bf16,
        64,
    ),
    hopper_bwd_softcap(
        "attention_bwd_hopper_dkdv_softcap_bf16_d128",
        "attention_bwd_hopper_dq_softcap_bf16_d128",
        Dtype::Bf16,
        128,
    ),
    hopper_bwd_softcap(
        "attention_bwd_hopper_dkdv_softcap_f16_d64",
        "attention_bwd_hopper_dq_softcap_f16_d64",
        Dtype::F16,
        64,
    ),
    hopper_bwd_softcap(
        "attention_bwd_hopper_dkdv_softcap_f16_d128",
        "attention_bwd_hopper_dq_softcap_f16_d128",
        Dtype::F16,
        128,
    ),
];

/// Handles in [`HOPPER_BWD_KERNELS`] (two per entry).
pub const HOPPER_BWD_KERNEL_COUNT: usize = 2 * HOPPER_BWD_KERNELS.len();

/// The handles of [`HOPPER_BWD_KERNELS`], for the family's table.
pub const fn hopper_bwd_kernel_decls() -> [KernelDecl; HOPPER_BWD_KERNEL_COUNT] {
    let mut out = [HOPPER_BWD_KERNELS[0].kernel.info(); HOPPER_BWD_KERNEL_COUNT];
    let mut i = 0;
    while i < HOPPER_BWD_KERNELS.len() {
        out[2 * i] = HOPPER_BWD_KERNELS[i].kernel.info();
        out[2 * i + 1] = HOPPER_BWD_KERNELS[i].dq.info();
        i += 1;
    }
    out
}

/// The Hopper backward kernels for `dtype` and head dimension `head_dim` (their softcap forms
/// if `softcap`), if built.
pub fn hopper_bwd_kernel(
    dtype: Dtype,
    head_dim: u32,
    softcap: bool,
) -> Option<&'static HopperBwdKernel> {
    const ALL: &[HopperBwdKernel] = &HOPPER_BWD_KERNELS;
    ALL.iter()
        .find(|k| k.dtype == dtype && k.cfg.head_dim == head_dim && k.softcap == softcap)
}

const _: () = {
    // Two consumer warpgroups of 64 keys each; Q/dO tiles of one swizzle atom's K slices.
    assert!(HOPPER_BWD_BLOCK_N == 2 * 64 && HOPPER_BWD_BLOCK_M.is_multiple_of(16));
    // Tensor maps at 64-byte offsets (TMA).
    assert!(core::mem::offset_of!(HopperBwdParams, tmap_do) % 64 == 0);
    assert!(core::mem::offset_of!(HopperBwdParams, tmap_k) % 64 == 0);
    assert!(core::mem::offset_of!(HopperBwdParams, tmap_v) % 64 == 0);
    // The largest configurations fit the 227 KiB a block may have.
    assert!(hopper_bwd_config_of(128).smem_bytes() <= 227 * 1024);
    assert!(HopperDqConfig { head_dim: 128 }.smem_bytes() <= 227 * 1024);
    assert!(HOPPER_DQ_BLOCK_M == 2 * 64 && HOPPER_DQ_BLOCK_N == 64);
};
