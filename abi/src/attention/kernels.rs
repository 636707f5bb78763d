//! The family's kernel handles: the `mma.sync` and Hopper forward kernels of each element type,
//! head dimension and tuning variant, the lookups by them, and the family's table of every
//! kernel (the backward's and the packed-sequence forward's included).

use super::*;

/// An `mma.sync` kernel: its handle (dynamic shared memory as a function of its tile
/// configuration) and what it was compiled for.
pub struct MmaKernel {
    /// The handle; launch it with shape [`MmaKernel::tiles`].
    pub kernel: Kernel<AttentionParams, TileConfig>,
    /// Element type.
    pub dtype: Dtype,
    /// Tile configuration (its head dimension is the kernel's).
    pub tiles: TileConfig,
    /// The tuning variant ([`TUNING_VARIANTS`]), `None` for the default tiles of its head
    /// dimension ([`tile_config`]).
    pub variant: Option<&'static str>,
    /// Whether it applies the softcap and sinks of [`LogitOptions`] (the `capsink` kernels;
    /// default tiles only).
    pub capsink: bool,
}

/// A Hopper kernel: its handle (dynamic shared memory as a function of its configuration) and
/// what it was compiled for.
pub struct HopperKernel {
    /// The handle; launch it with shape [`HopperKernel::cfg`].
    pub kernel: Kernel<HopperParams, HopperConfig>,
    /// Element type.
    pub dtype: Dtype,
    /// Configuration (its head dimension is the kernel's).
    pub cfg: HopperConfig,
    /// The tuning variant ([`HOPPER_VARIANTS`]), `None` for the default configuration of its
    /// head dimension ([`hopper_config`]).
    pub variant: Option<&'static str>,
    /// Whether it applies the softcap and sinks of [`LogitOptions`] (the `capsink` kernels;
    /// default configuration only).
    pub capsink: bool,
    /// Whether it takes packed sequences (the `varlen` kernels, [`HopperParams::cu_seqlens_q`];
    /// default configuration only, [`HOPPER_VARLEN_KERNELS`]).
    pub varlen: bool,
}

pub(crate) fn mma_smem(tiles: TileConfig) -> usize {
    tiles.smem_bytes()
}

fn hopper_smem(cfg: HopperConfig) -> usize {
    cfg.smem_bytes()
}

/// Whether `name` ends with `_{variant}` (a variant's entry name carries the variant's name).
const fn names_variant(name: &str, variant: Option<&str>) -> bool {
    let Some(variant) = variant else {
        return true;
    };
    let (n, v) = (name.as_bytes(), variant.as_bytes());
    if n.len() <= v.len() || n[n.len() - v.len() - 1] != b'_' {
        return false;
    }
    let mut i = 0;
    while i < v.len() {
        if n[n.len() - v.len() + i] != v[i] {
            return false;
        }
        i += 1;
    }
    true
}

const fn mma(
    name: &'static str,
    dtype: Dtype,
    tiles: TileConfig,
    variant: Option<&'static str>,
) -> MmaKernel {
    assert!(names_variant(name, variant));
    MmaKernel {
        kernel: Kernel::new(name, tiles.threads(), tiles.blocks_per_sm, mma_smem),
        dtype,
        tiles,
        variant,
        capsink: false,
    }
}

/// The `capsink` kernel of the default tiles of head dimension `d`.
const fn mma_capsink(name: &'static str, dtype: Dtype, d: u32) -> MmaKernel {
    MmaKernel {
        capsink: true,
        ..mma(name, dtype, tile_config_of(d), None)
    }
}

pub(crate) const fn hopper(
    name: &'static str,
    dtype: Dtype,
    cfg: HopperConfig,
    variant: Option<&'static str>,
) -> HopperKernel {
    assert!(names_variant(name, variant));
    HopperKernel {
        kernel: Kernel::new(name, HOPPER_THREADS, 1, hopper_smem),
        dtype,
        cfg,
        variant,
        capsink: false,
        varlen: false,
    }
}

/// The `capsink` kernel of the default configuration of head dimension `d`.
pub(crate) const fn hopper_capsink(name: &'static str, dtype: Dtype, d: u32) -> HopperKernel {
    HopperKernel {
        capsink: true,
        ..hopper(name, dtype, hopper_config_of(d), None)
    }
}

/// [`MMA_KERNELS`] from the head dimensions' tokens.
macro_rules! mma_table {
    ($($d:literal),*) => {
        [
            $(mma(concat!("attention_fwd_bf16_d", $d), Dtype::Bf16, tile_config_of($d), None),)*
            $(mma(concat!("attention_fwd_f16_d", $d), Dtype::F16, tile_config_of($d), None),)*
            mma(
                "attention_fwd_bf16_d128_mt1",
                Dtype::Bf16,
                TUNING_VARIANTS[0].1,
                Some(TUNING_VARIANTS[0].0),
            ),
            mma(
                "attention_fwd_bf16_d128_n64",
                Dtype::Bf16,
                TUNING_VARIANTS[1].1,
                Some(TUNING_VARIANTS[1].0),
            ),
            mma(
                "attention_fwd_bf16_d128_n64pf",
                Dtype::Bf16,
                TUNING_VARIANTS[2].1,
                Some(TUNING_VARIANTS[2].0),
            ),
            mma(
                "attention_fwd_bf16_d256_n32",
                Dtype::Bf16,
                TUNING_VARIANTS[3].1,
                Some(TUNING_VARIANTS[3].0),
            ),
            mma(
                "attention_fwd_bf16_d128_ffma",
                Dtype::Bf16,
                TUNING_VARIANTS[4].1,
                Some(TUNING_VARIANTS[4].0),
            ),
            mma(
                "attention_fwd_bf16_d128_scaled",
                Dtype::Bf16,
                TUNING_VARIANTS[5].1,
                Some(TUNING_VARIANTS[5].0),
            ),
            mma(
                "attention_fwd_bf16_d128_n64lazy",
                Dtype::Bf16,
                TUNING_VARIANTS[6].1,
                Some(TUNING_VARIANTS[6].0),
            ),
            $(mma_capsink(concat!("attention_fwd_capsink_bf16_d", $d), Dtype::Bf16, $d),)*
            $(mma_capsink(concat!("attention_fwd_capsink_f16_d", $d), Dtype::F16, $d),)*
        ]
    };
}

/// The `mma.sync` kernels: the default tiles for each dtype and head dimension, then the
/// tuning variants (bf16) in the order of [`TUNING_VARIANTS`], then the `capsink` kernels.
pub const MMA_KERNELS: [MmaKernel; 4 * HEAD_DIMS.len() + TUNING_VARIANTS.len()] =
    crate::with_attention_head_dims!(mma_table!());

/// [`HOPPER_KERNELS`] from the head dimensions' tokens.
macro_rules! hopper_table {
    ($($d:literal),*) => {
        [
            $(hopper(
                concat!("attention_fwd_hopper_bf16_d", $d),
                Dtype::Bf16,
                hopper_config_of($d),
                None,
            ),)*
            $(hopper(
                concat!("attention_fwd_hopper_f16_d", $d),
                Dtype::F16,
                hopper_config_of($d),
                None,
            ),)*
            hopper(
                "attention_fwd_hopper_bf16_d128_hscaled",
                Dtype::Bf16,
                HOPPER_VARIANTS[0].1,
                Some(HOPPER_VARIANTS[0].0),
            ),
            hopper(
                "attention_fwd_hopper_bf16_d128_hpp",
                Dtype::Bf16,
                HOPPER_VARIANTS[1].1,
                Some(HOPPER_VARIANTS[1].0),
            ),
            hopper(
                "attention_fwd_hopper_bf16_d128_h176",
                Dtype::Bf16,
                HOPPER_VARIANTS[2].1,
                Some(HOPPER_VARIANTS[2].0),
            ),
            hopper(
                "attention_fwd_hopper_bf16_d128_h3",
                Dtype::Bf16,
                HOPPER_VARIANTS[3].1,
                Some(HOPPER_VARIANTS[3].0),
            ),
            hopper(
                "attention_fwd_hopper_bf16_d128_hnp",
                Dtype::Bf16,
                HOPPER_VARIANTS[4].1,
                Some(HOPPER_VARIANTS[4].0),
            ),
            hopper(
                "attention_fwd_hopper_bf16_d128_hstatic",
                Dtype::Bf16,
                HOPPER_VARIANTS[5].1,
                Some(HOPPER_VARIANTS[5].0),
            ),
            hopper(
                "attention_fwd_hopper_bf16_d128_hgrid3",
                Dtype::Bf16,
                HOPPER_VARIANTS[6].1,
                Some(HOPPER_VARIANTS[6].0),
            ),
            hopper(
                "attention_fwd_hopper_bf16_d64_hpp64",
                Dtype::Bf16,
                HOPPER_VARIANTS[7].1,
                Some(HOPPER_VARIANTS[7].0),
            ),
            hopper(
                "attention_fwd_hopper_bf16_d256_hpp256",
                Dtype::Bf16,
                HOPPER_VARIANTS[8].1,
                Some(HOPPER_VARIANTS[8].0),
            ),
            hopper(
                "attention_fwd_hopper_bf16_d256_hscaled256",
                Dtype::Bf16,
                HOPPER_VARIANTS[9].1,
                Some(HOPPER_VARIANTS[9].0),
            ),
            hopper(
                "attention_fwd_hopper_bf16_d192_h64",
                Dtype::Bf16,
                HOPPER_VARIANTS[10].1,
                Some(HOPPER_VARIANTS[10].0),
            ),
            hopper(
                "attention_fwd_hopper_bf16_d256_h64",
                Dtype::Bf16,
                HOPPER_VARIANTS[11].1,
                Some(HOPPER_VARIANTS[11].0),
            ),
            hopper(
                "attention_fwd_hopper_bf16_d64_hdyn",
                Dtype::Bf16,
                HOPPER_VARIANTS[12].1,
                Some(HOPPER_VARIANTS[12].0),
            ),
            hopper(
                "attention_fwd_hopper_bf16_d128_hdyn",
                Dtype::Bf16,
                HOPPER_VARIANTS[13].1,
                Some(HOPPER_VARIANTS[13].0),
            ),
            hopper(
                "attention_fwd_hopper_bf16_d64_hn192",
                Dtype::Bf16,
                HOPPER_VARIANTS[14].1,
                Some(HOPPER_VARIANTS[14].0),
            ),
            // The dynamic grid and the long key steps in f16 too: the plan's choices by the
            // problem.
            hopper(
                "attention_fwd_hopper_f16_d64_hdyn",
                Dtype::F16,
                HOPPER_VARIANTS[12].1,
                Some(HOPPER_VARIANTS[12].0),
            ),
            hopper(
                "attention_fwd_hopper_f16_d128_hdyn",
                Dtype::F16,
                HOPPER_VARIANTS[13].1,
                Some(HOPPER_VARIANTS[13].0),
            ),
            hopper(
                "attention_fwd_hopper_f16_d64_hn192",
                Dtype::F16,
                HOPPER_VARIANTS[14].1,
                Some(HOPPER_VARIANTS[14].0),
            ),
            $(hopper_capsink(concat!("attention_fwd_hopper_capsink_bf16_d", $d), Dtype::Bf16, $d),)*
            $(hopper_capsink(concat!("attention_fwd_hopper_capsink_f16_d", $d), Dtype::F16, $d),)*
        ]
    };
}

/// The Hopper kernels (sm_90a only): the default configuration for each dtype and head
/// dimension, then the tuning variants (bf16) in the order of [`HOPPER_VARIANTS`], the f16
/// kernels of the variants the plan picks by the problem ([`HOPPER_F16_VARIANTS`]), then the
/// `capsink` kernels.
pub const HOPPER_KERNELS: [HopperKernel;
    4 * HEAD_DIMS.len() + HOPPER_VARIANTS.len() + HOPPER_F16_VARIANTS] =
    crate::with_attention_head_dims!(hopper_table!());

/// The f16 kernels of the variants the plan picks by the problem in either dtype: the dynamic
/// grid's (`hdyn`, D = 64 and 128; short causal problems) and the long key steps'
/// ([`HOPPER_LONG_KEYS_VARIANT`], D = 64).
pub const HOPPER_F16_VARIANTS: usize = 3;

/// The `mma.sync` kernels of the head-dimension pairs of [`VALUE_DIMS`] (dense batches): per
/// pair bf16, f16 ([`mma_value_config`]).
pub const MMA_VALUE_DIM_KERNELS: [MmaKernel; 2 * VALUE_DIMS.len()] = [
    mma(
        "attention_fwd_bf16_d192_v128",
        Dtype::Bf16,
        mma_value_config_of(192, 128),
        None,
    ),
    mma(
        "attention_fwd_f16_d192_v128",
        Dtype::F16,
        mma_value_config_of(192, 128),
        None,
    ),
];

/// The Hopper kernels of the head-dimension pairs of [`VALUE_DIMS`] (sm_90a only): per
/// pair bf16, f16, then their packed-sequence forms.
pub const HOPPER_VALUE_DIM_KERNELS: [HopperKernel; 4 * VALUE_DIMS.len()] = [
    hopper(
        "attention_fwd_hopper_bf16_d192_v128",
        Dtype::Bf16,
        hopper_value_config_of(192, 128),
        None,
    ),
    hopper(
        "attention_fwd_hopper_f16_d192_v128",
        Dtype::F16,
        hopper_value_config_of(192, 128),
        None,
    ),
    HopperKernel {
        varlen: true,
        ..hopper(
            "attention_fwd_hopper_varlen_bf16_d192_v128",
            Dtype::Bf16,
            hopper_value_config_of(192, 128),
            None,
        )
    },
    HopperKernel {
        varlen: true,
        ..hopper(
            "attention_fwd_hopper_varlen_f16_d192_v128",
            Dtype::F16,
            hopper_value_config_of(192, 128),
            None,
        )
    },
];

/// The family's kernels (both forward paths, the backward's on dense batches and on packed
/// sequences, the forward over packed sequences, the Hopper backward's dK/dV kernels, the
/// decode kernels over a paged KV cache, then the FP8 forward's).
pub const KERNELS: &[KernelDecl] = &kernel_decls();

const FAMILY_KERNELS: usize = MMA_KERNELS.len()
    + HOPPER_KERNELS.len()
    + backward::BWD_KERNEL_COUNT
    + MMA_VARLEN_KERNELS.len()
    + HOPPER_VARLEN_KERNELS.len()
    + HOPPER_VALUE_DIM_KERNELS.len()
    + MMA_VALUE_DIM_KERNELS.len()
    + MMA_VARLEN_VALUE_DIM_KERNELS.len()
    + hopper_bwd::HOPPER_BWD_KERNEL_COUNT
    + decode::DECODE_KERNEL_COUNT
    + fp8::FP8_KERNEL_COUNT;

const fn kernel_decls() -> [KernelDecl; FAMILY_KERNELS] {
    let mut out = [MMA_KERNELS[0].kernel.info(); FAMILY_KERNELS];
    let mut i = 0;
    while i < MMA_KERNELS.len() {
        out[i] = MMA_KERNELS[i].kernel.info();
        i += 1;
    }
    let mut j = 0;
    while j < HOPPER_KERNELS.len() {
        out[i + j] = HOPPER_KERNELS[j].kernel.info();
        j += 1;
    }
    let bwd = backward::bwd_kernel_decls();
    let mut k = 0;
    while k < bwd.len() {
        out[i + j + k] = bwd[k];
        k += 1;
    }
    let mut l = 0;
    while l < MMA_VARLEN_KERNELS.len() {
        out[i + j + k + l] = MMA_VARLEN_KERNELS[l].kernel.info();
        l += 1;
    }
    while l < MMA_VARLEN_KERNELS.len() + HOPPER_VARLEN_KERNELS.len() {
        out[i + j + k + l] = HOPPER_VARLEN_KERNELS[l - MMA_VARLEN_KERNELS.len()]
            .kernel
            .info();
        l += 1;
    }
    let mut p = 0;
    while p < HOPPER_VALUE_DIM_KERNELS.len() {
        out[i + j + k + l] = HOPPER_VALUE_DIM_KERNELS[p].kernel.info();
        l += 1;
        p += 1;
    }
    p = 0;
    while p < MMA_VALUE_DIM_KERNELS.len() {
        out[i + j + k + l] = MMA_VALUE_DIM_KERNELS[p].kernel.info();
        l += 1;
        p += 1;
    }
    p = 0;
    while p < MMA_VARLEN_VALUE_DIM_KERNELS.len() {
        out[i + j + k + l] = MMA_VARLEN_VALUE_DIM_KERNELS[p].kernel.info();
        l += 1;
        p += 1;
    }
    let hb = hopper_bwd::hopper_bwd_kernel_decls();
    let mut m = 0;
    while m < hb.len() {
        out[i + j + k + l + m] = hb[m];
        m += 1;
    }
    let dec = decode::decode_kernel_decls();
    let mut n = 0;
    while n < dec.len() {
        out[i + j + k + l + m + n] = dec[n];
        n += 1;
    }
    let f8 = fp8::fp8_kernel_decls();
    let mut f = 0;
    while f < f8.len() {
        out[i + j + k + l + m + n + f] = f8[f];
        f += 1;
    }
    out
}

fn same_variant(a: Option<&str>, b: Option<&str>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => str_eq(a, b),
        _ => false,
    }
}

/// The `mma.sync` kernel for `dtype` and head dimension `head_dim`: the default tiles
/// (`variant` `None`) or the tuning variant of that name, if one was built.
pub fn mma_kernel(
    dtype: Dtype,
    head_dim: u32,
    variant: Option<&str>,
) -> Option<&'static MmaKernel> {
    const ALL: &[MmaKernel] = &MMA_KERNELS;
    ALL.iter().find(|k| {
        k.dtype == dtype
            && k.tiles.head_dim == head_dim
            && same_variant(k.variant, variant)
            && !k.capsink
    })
}

/// The `mma.sync` `capsink` kernel (softcap and sinks) for `dtype` and head dimension
/// `head_dim`.
pub fn mma_capsink_kernel(dtype: Dtype, head_dim: u32) -> Option<&'static MmaKernel> {
    const ALL: &[MmaKernel] = &MMA_KERNELS;
    ALL.iter()
        .find(|k| k.dtype == dtype && k.tiles.head_dim == head_dim && k.capsink)
}

/// The Hopper kernel for `dtype` and head dimension `head_dim`: the default configuration
/// (`variant` `None`) or the tuning variant of that name, if one was built.
pub fn hopper_kernel(
    dtype: Dtype,
    head_dim: u32,
    variant: Option<&str>,
) -> Option<&'static HopperKernel> {
    const ALL: &[HopperKernel] = &HOPPER_KERNELS;
    ALL.iter().find(|k| {
        k.dtype == dtype
            && k.cfg.head_dim == head_dim
            && same_variant(k.variant, variant)
            && !k.capsink
    })
}

/// The Hopper kernel for `dtype` and head dimension `head_dim` whose persistent grid draws its
/// tiles at run time ([`HopperGrid::Dynamic`]), if one was built.
pub fn hopper_dynamic_kernel(dtype: Dtype, head_dim: u32) -> Option<&'static HopperKernel> {
    const ALL: &[HopperKernel] = &HOPPER_KERNELS;
    ALL.iter().find(|k| {
        k.dtype == dtype
            && k.cfg.head_dim == head_dim
            && matches!(k.cfg.grid, HopperGrid::Dynamic)
            && !k.capsink
    })
}

/// The `mma.sync` kernel of the head-dimension pair `(head_dim, value_dim)` of [`VALUE_DIMS`]
/// for `dtype` (dense batches).
pub fn mma_value_dim_kernel(
    dtype: Dtype,
    head_dim: u32,
    value_dim: u32,
) -> Option<&'static MmaKernel> {
    const ALL: &[MmaKernel] = &MMA_VALUE_DIM_KERNELS;
    ALL.iter().find(|k| {
        k.dtype == dtype && k.tiles.head_dim == head_dim && k.tiles.value_dim == value_dim
    })
}

/// The Hopper kernel of the head-dimension pair `(head_dim, value_dim)` of
/// [`VALUE_DIMS`] for `dtype`, for dense batches or (`varlen`) packed sequences.
pub fn hopper_value_dim_kernel(
    dtype: Dtype,
    head_dim: u32,
    value_dim: u32,
    varlen: bool,
) -> Option<&'static HopperKernel> {
    const ALL: &[HopperKernel] = &HOPPER_VALUE_DIM_KERNELS;
    ALL.iter().find(|k| {
        k.dtype == dtype
            && k.cfg.head_dim == head_dim
            && k.cfg.value_dim == value_dim
            && k.varlen == varlen
    })
}

/// The Hopper `capsink` kernel (softcap and sinks) for `dtype` and head dimension `head_dim`.
pub fn hopper_capsink_kernel(dtype: Dtype, head_dim: u32) -> Option<&'static HopperKernel> {
    const ALL: &[HopperKernel] = &HOPPER_KERNELS;
    ALL.iter()
        .find(|k| k.dtype == dtype && k.cfg.head_dim == head_dim && k.capsink)
}
