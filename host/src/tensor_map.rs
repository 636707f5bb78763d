//! TMA tensor maps: `cuTensorMapEncodeTiled` behind a validated builder.
//!
//! The driver function is not in cust's bindings (it is CUDA 12+); it is declared here and
//! resolved from `libcuda`, which cust already links.

use crate::error::{Error, Result};
use kernel_abi::TensorMap;
use std::ffi::c_void;

/// Element types a tensor map can describe (those the kernels use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapDtype {
    /// 16-bit brain float.
    Bf16,
    /// 16-bit IEEE float.
    F16,
    /// 32-bit IEEE float.
    F32,
    /// Bytes (the FP8 kernels' e4m3).
    U8,
}

impl MapDtype {
    fn bytes(self) -> u64 {
        match self {
            MapDtype::Bf16 | MapDtype::F16 => 2,
            MapDtype::F32 => 4,
            MapDtype::U8 => 1,
        }
    }

    /// `CUtensorMapDataType`.
    fn raw(self) -> u32 {
        match self {
            MapDtype::U8 => 0,
            MapDtype::F16 => 6,
            MapDtype::F32 => 7,
            MapDtype::Bf16 => 9,
        }
    }
}

/// Shared-memory swizzle of the box (`CUtensorMapSwizzle`). The box's inner extent in bytes
/// may not exceed the swizzle span.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapSwizzle {
    /// Row-major box, no swizzle.
    None,
    /// 32-byte swizzle.
    B32,
    /// 64-byte swizzle.
    B64,
    /// 128-byte swizzle (what wgmma's K-major 128B layouts read); destination 1024-byte aligned.
    B128,
}

impl MapSwizzle {
    fn raw(self) -> u32 {
        match self {
            MapSwizzle::None => 0,
            MapSwizzle::B32 => 1,
            MapSwizzle::B64 => 2,
            MapSwizzle::B128 => 3,
        }
    }

    fn span(self) -> Option<u64> {
        match self {
            MapSwizzle::None => None,
            MapSwizzle::B32 => Some(32),
            MapSwizzle::B64 => Some(64),
            MapSwizzle::B128 => Some(128),
        }
    }
}

#[repr(C, align(64))]
struct AlignedMap([u64; 16]);

unsafe extern "C" {
    fn cuTensorMapEncodeTiled(
        tensor_map: *mut AlignedMap,
        data_type: u32,
        rank: u32,
        global_address: *mut c_void,
        global_dim: *const u64,
        global_strides: *const u64,
        box_dim: *const u32,
        element_strides: *const u32,
        interleave: u32,
        swizzle: u32,
        l2_promotion: u32,
        oob_fill: u32,
    ) -> cust::sys::CUresult;
}

/// A tiled tensor map over a device tensor of rank 1..=5.
///
/// `dims` and `box_dims` are innermost first; `strides_bytes[i]` is the byte stride of
/// dimension `i + 1` (the innermost dimension is contiguous). Out-of-bounds box elements load
/// as zero.
#[derive(Clone, Debug)]
pub struct TiledMap<'a> {
    /// Device address of element 0 (16-byte aligned).
    pub address: u64,
    /// Element type.
    pub dtype: MapDtype,
    /// Extent of each dimension, innermost first.
    pub dims: &'a [u64],
    /// Byte stride of dimensions 1.. (multiples of 16).
    pub strides_bytes: &'a [u64],
    /// Box extent per dimension (1..=256; the innermost times the element size a multiple of 16).
    pub box_dims: &'a [u32],
    /// Shared-memory swizzle.
    pub swizzle: MapSwizzle,
}

impl TiledMap<'_> {
    /// Validate and encode.
    pub fn encode(&self) -> Result<TensorMap> {
        self.validate()?;
        self.encode_validated()
    }

    /// An owned copy, for plans that encode their maps when they run.
    pub fn spec(&self) -> Result<MapSpec> {
        self.validate()?;
        let rank = self.dims.len();
        let mut spec = MapSpec {
            address: self.address,
            dtype: self.dtype,
            rank,
            dims: [1; 5],
            strides_bytes: [0; 4],
            box_dims: [1; 5],
            swizzle: self.swizzle,
        };
        spec.dims[..rank].copy_from_slice(self.dims);
        spec.strides_bytes[..rank - 1].copy_from_slice(self.strides_bytes);
        spec.box_dims[..rank].copy_from_slice(self.box_dims);
        Ok(spec)
    }

    /// Check what `cuTensorMapEncodeTiled` requires, without the driver.
    pub fn validate(&self) -> Result<()> {
        let rank = self.dims.len();
        let bad = |reason: String| Error::invalid("tensor map", reason);
        if !(1..=5).contains(&rank) {
            return Err(bad(format!("rank {rank} outside 1..=5")));
        }
        if self.strides_bytes.len() != rank - 1 || self.box_dims.len() != rank {
            return Err(bad(format!(
                "rank {rank} needs {} strides and {rank} box dims, got {} and {}",
                rank - 1,
                self.strides_bytes.len(),
                self.box_dims.len()
            )));
        }
        if !self.address.is_multiple_of(16) {
            return Err(Error::Misaligned {
                what: "tensor map base address".into(),
                required: 16,
                actual: self.address % 16,
            });
        }
        for (i, &d) in self.dims.iter().enumerate() {
            if d == 0 || d > (1 << 32) {
                return Err(bad(format!(
                    "dimension {i} has extent {d}, outside 1..=2^32"
                )));
            }
        }
        for (i, &s) in self.strides_bytes.iter().enumerate() {
            if !s.is_multiple_of(16) || s >= (1 << 40) {
                return Err(Error::Misaligned {
                    what: format!("tensor map stride of dimension {} ({s} bytes)", i + 1),
                    required: 16,
                    actual: s % 16,
                });
            }
        }
        for (i, &b) in self.box_dims.iter().enumerate() {
            if b == 0 || b > 256 {
                return Err(bad(format!("box dimension {i} is {b}, outside 1..=256")));
            }
        }
        let inner_bytes = self.box_dims[0] as u64 * self.dtype.bytes();
        if !inner_bytes.is_multiple_of(16) {
            return Err(bad(format!(
                "box inner extent is {inner_bytes} bytes, not a multiple of 16"
            )));
        }
        if let Some(span) = self.swizzle.span()
            && inner_bytes > span
        {
            return Err(bad(format!(
                "box inner extent of {inner_bytes} bytes exceeds the {span}-byte swizzle"
            )));
        }
        Ok(())
    }

    fn encode_validated(&self) -> Result<TensorMap> {
        let rank = self.dims.len();
        let elem_strides = [1u32; 5];
        let mut map = AlignedMap([0; 16]);
        // SAFETY: every pointer refers to an array of the length the rank implies (checked
        // above); `map` is a 64-byte aligned, 128-byte out-buffer. Encoding only writes `map`;
        // the address is not dereferenced.
        let r = unsafe {
            cuTensorMapEncodeTiled(
                &mut map,
                self.dtype.raw(),
                rank as u32,
                self.address as *mut c_void,
                self.dims.as_ptr(),
                self.strides_bytes.as_ptr(),
                self.box_dims.as_ptr(),
                elem_strides.as_ptr(),
                0, // CU_TENSOR_MAP_INTERLEAVE_NONE
                self.swizzle.raw(),
                3, // CU_TENSOR_MAP_L2_PROMOTION_L2_256B
                0, // CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: out-of-bounds elements are zero
            )
        };
        crate::gpu::check(r, "encoding a tensor map (cuTensorMapEncodeTiled)")?;
        Ok(TensorMap { opaque: map.0 })
    }
}

/// A validated tensor map description that owns its arrays ([`TiledMap::spec`]): what a plan
/// holds, to be encoded by the driver when the plan runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSpec {
    /// Device address of element 0.
    pub address: u64,
    /// Element type.
    pub dtype: MapDtype,
    /// Dimensions used (1..=5).
    pub rank: usize,
    /// Extent of each dimension, innermost first (`rank` used).
    pub dims: [u64; 5],
    /// Byte stride of dimensions 1.. (`rank - 1` used).
    pub strides_bytes: [u64; 4],
    /// Box extent per dimension (`rank` used).
    pub box_dims: [u32; 5],
    /// Shared-memory swizzle.
    pub swizzle: MapSwizzle,
}

impl MapSpec {
    /// The map as a [`TiledMap`].
    pub fn tiled(&self) -> TiledMap<'_> {
        TiledMap {
            address: self.address,
            dtype: self.dtype,
            dims: &self.dims[..self.rank],
            strides_bytes: &self.strides_bytes[..self.rank - 1],
            box_dims: &self.box_dims[..self.rank],
            swizzle: self.swizzle,
        }
    }

    /// Encode with the driver (`cuTensorMapEncodeTiled`).
    pub fn encode(&self) -> Result<TensorMap> {
        self.tiled().encode()
    }
}
