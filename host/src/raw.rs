//! Launches on memory this library does not own: a framework's tensors (PyTorch's), given as
//! device addresses with shapes, strides and element types, on the framework's stream, in the
//! device's primary context (the context the CUDA runtime, and so PyTorch, works in).
//!
//! - [`primary_gpu`] loads the kernels into a device's primary context on first use and keeps
//!   them for the life of the process (one load per device).
//! - [`RawStream`] is a stream handle of that context; it is an [`Exec`], so a family's plan
//!   runs on it exactly as on a `cust` stream.
//! - [`RawTensor`] describes one tensor: the address of its first element, its shape and element
//!   strides, its element type, and the memory it may reach (its storage). A family's raw entry
//!   point (`attention::forward_raw`) turns its tensors into the views its typed API takes and
//!   makes the same plan, so a raw launch is validated as a typed one is (shapes, strides,
//!   alignment, every element inside its storage, sizes, options); in addition every tensor is
//!   checked to be device memory of the stream's device, inside the allocation that holds it
//!   ([`RawTensor::check_memory`]), and outputs to overlap neither the inputs nor each other
//!   ([`check_disjoint`]).

use crate::error::{Error, Result};
use crate::exec::{DevView, Exec};
use crate::gpu::{self, Gpu, check};
use crate::launch::Launch;
use cust::sys as cu;
use half::{bf16, f16};
use std::sync::Mutex;

/// The element type of a [`RawTensor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemType {
    /// bfloat16.
    Bf16,
    /// IEEE half precision.
    F16,
    /// IEEE single precision.
    F32,
    /// IEEE double precision.
    F64,
    /// 32-bit signed integers (sequence offsets, `cu_seqlens`; the kernels' index and table
    /// words, read as `u32`).
    I32,
    /// 8-bit floats e4m3 (PyTorch's `float8_e4m3fn`: no infinities, NaN `0x7f`/`0xff`).
    E4m3,
}

impl ElemType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ElemType::E4m3 => 1,
            ElemType::Bf16 | ElemType::F16 => 2,
            ElemType::F32 | ElemType::I32 => 4,
            ElemType::F64 => 8,
        }
    }

    /// Parse a name: `bf16`/`bfloat16`, `f16`/`float16`/`half`, `f32`/`float32`/`float`,
    /// `f64`/`float64`/`double`, `i32`/`int32`/`int`, `e4m3`/`float8_e4m3fn`, with or without
    /// a `torch.` prefix (so `str(tensor.dtype)` parses).
    pub fn from_name(name: &str) -> Option<ElemType> {
        match name.strip_prefix("torch.").unwrap_or(name) {
            "bf16" | "bfloat16" => Some(ElemType::Bf16),
            "f16" | "float16" | "half" => Some(ElemType::F16),
            "f32" | "float32" | "float" => Some(ElemType::F32),
            "f64" | "float64" | "double" => Some(ElemType::F64),
            "i32" | "int32" | "int" => Some(ElemType::I32),
            "e4m3" | "float8_e4m3fn" => Some(ElemType::E4m3),
            _ => None,
        }
    }
}

/// A Rust element type with its [`ElemType`].
pub trait RawElem: Copy {
    /// Its [`ElemType`].
    const ELEM: ElemType;
}

impl RawElem for bf16 {
    const ELEM: ElemType = ElemType::Bf16;
}
impl RawElem for f16 {
    const ELEM: ElemType = ElemType::F16;
}
impl RawElem for f32 {
    const ELEM: ElemType = ElemType::F32;
}
impl RawElem for f64 {
    const ELEM: ElemType = ElemType::F64;
}
impl RawElem for i32 {
    const ELEM: ElemType = ElemType::I32;
}
impl RawElem for crate::attention::E4m3 {
    const ELEM: ElemType = ElemType::E4m3;
}
/// Table and index words: a 32-bit integer tensor (the framework's `int32`; its values are
/// the kernels' `u32` words).
impl RawElem for u32 {
    const ELEM: ElemType = ElemType::I32;
}

/// A tensor in device memory that the caller owns, described as a framework describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawTensor {
    /// Address of the element at index 0 (PyTorch's `data_ptr()`).
    pub ptr: u64,
    /// Element type.
    pub dtype: ElemType,
    /// Sizes, outermost first.
    pub shape: Vec<usize>,
    /// Element strides, one per dimension (negative strides are rejected).
    pub strides: Vec<i64>,
    /// Address of the first byte of the memory the tensor may reach (PyTorch's
    /// `untyped_storage().data_ptr()`).
    pub storage_ptr: u64,
    /// Bytes of that memory (PyTorch's `untyped_storage().nbytes()`).
    pub storage_bytes: usize,
}

impl RawTensor {
    /// A contiguous tensor of `shape` that is its whole storage (for tests and callers that
    /// allocate exactly).
    pub fn contiguous(ptr: u64, dtype: ElemType, shape: &[usize]) -> RawTensor {
        let mut strides = vec![1i64; shape.len()];
        for i in (0..shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1].saturating_mul(shape[i + 1] as i64);
        }
        RawTensor {
            ptr,
            dtype,
            shape: shape.to_vec(),
            strides,
            storage_ptr: ptr,
            storage_bytes: shape.iter().fold(dtype.size(), |n, &d| n.saturating_mul(d)),
        }
    }

    /// The element strides, checked non-negative, as `usize`.
    pub fn strides(&self, what: &str) -> Result<Vec<usize>> {
        if self.strides.len() != self.shape.len() {
            return Err(Error::shape(
                format!("{what} stride count"),
                self.shape.len(),
                self.strides.len(),
            ));
        }
        self.strides
            .iter()
            .map(|&s| {
                usize::try_from(s).map_err(|_| {
                    Error::unsupported(format!("{what} stride {s}"), "strides must be >= 0")
                })
            })
            .collect()
    }

    /// Check the element type against `T` and the rank against `rank`.
    pub fn expect<T: RawElem>(&self, what: &str, rank: usize) -> Result<()> {
        if self.dtype != T::ELEM {
            return Err(Error::invalid(
                format!("{what} dtype"),
                format!("expected {:?}, got {:?}", T::ELEM, self.dtype),
            ));
        }
        if self.shape.len() != rank {
            return Err(Error::shape(format!("{what} rank"), rank, self.shape.len()));
        }
        Ok(())
    }

    /// The tensor's storage as a [`DevView`] of `T`, and the element offset of element 0 in it.
    /// The caller checks the view's elements against the storage's length (as every family's
    /// `View` check does).
    ///
    /// # Safety
    /// The storage (`storage_ptr`, `storage_bytes`) is device memory of the executor the view
    /// is passed to, live for `'a`.
    pub unsafe fn storage<'a, T: RawElem>(&self, what: &str) -> Result<(DevView<'a, T>, usize)> {
        let size = T::ELEM.size() as u64;
        let offset = self.ptr.checked_sub(self.storage_ptr).ok_or_else(|| {
            Error::invalid(
                format!("{what} address"),
                format!(
                    "{:#x} is before its storage's start {:#x}",
                    self.ptr, self.storage_ptr
                ),
            )
        })?;
        if !offset.is_multiple_of(size) {
            return Err(Error::Misaligned {
                what: format!("{what} offset in its storage"),
                required: size,
                actual: offset % size,
            });
        }
        // SAFETY: the caller's contract; the length counts whole elements of the storage.
        let view =
            unsafe { DevView::from_raw(self.storage_ptr, self.storage_bytes / size as usize) };
        Ok((view, (offset / size) as usize))
    }

    /// The bytes `[first, end)` the tensor's elements span (`None` for an empty tensor or
    /// negative strides).
    pub fn byte_span(&self) -> Option<(u128, u128)> {
        let mut last = 0u128;
        for (&n, &s) in self.shape.iter().zip(&self.strides) {
            last += n.checked_sub(1)? as u128 * u64::try_from(s).ok()? as u128;
        }
        let first = self.ptr as u128;
        Some((first, first + (last + 1) * self.dtype.size() as u128))
    }

    /// The tensor as a flat [`DevView`] of `T`: its element type `T`, its shape exactly
    /// `shape`, contiguous (dimensions of size 1 may have any stride), its first element
    /// aligned to `align` bytes (at least `T`'s size), and every element inside its storage.
    pub fn contiguous_view<'a, T: RawElem>(
        &self,
        what: &str,
        shape: &[usize],
        align: u64,
    ) -> Result<DevView<'a, T>> {
        self.expect::<T>(what, shape.len())?;
        if self.shape != shape {
            return Err(Error::shape(
                format!("{what} shape"),
                format!("{shape:?}"),
                format!("{:?}", self.shape),
            ));
        }
        let strides = self.strides(what)?;
        let mut want = 1usize;
        let mut contiguous = true;
        for i in (0..shape.len()).rev() {
            contiguous &= shape[i] <= 1 || strides[i] == want;
            want = want.saturating_mul(shape[i]);
        }
        if !contiguous {
            return Err(Error::unsupported(
                format!("{what} strides {strides:?}"),
                format!("{what} must be contiguous"),
            ));
        }
        let align = align.max(T::ELEM.size() as u64);
        if !self.ptr.is_multiple_of(align) {
            return Err(Error::Misaligned {
                what: format!("{what} start"),
                required: align,
                actual: self.ptr % align,
            });
        }
        // SAFETY: the view only carries addresses; whoever runs a plan on it (unsafe) vouches
        // for the memory.
        let (memory, offset) = unsafe { self.storage::<T>(what) }?;
        let len = want;
        if offset as u128 + len as u128 > memory.len() as u128 {
            return Err(Error::shape(
                format!("{what} storage"),
                format!("at least {} elements", offset as u128 + len as u128),
                memory.len(),
            ));
        }
        // SAFETY: inside the storage (checked above); addresses only, as above.
        Ok(unsafe { DevView::from_raw(self.ptr, len) })
    }

    /// Check that the storage is device memory of `gpu`'s device, inside one allocation (the
    /// driver's pointer attributes; no device memory is read). A host pointer, memory of
    /// another device, or a storage longer than its allocation is an error.
    pub fn check_memory(&self, what: &str, gpu: &Gpu) -> Result<()> {
        use cu::CUpointer_attribute as A;
        let mut memory_type: u32 = 0;
        let mut ordinal: i32 = -1;
        let mut start: cu::CUdeviceptr = 0;
        let mut size: usize = 0;
        let mut attributes = [
            A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        ];
        let mut data: [*mut std::ffi::c_void; 4] = [
            (&mut memory_type as *mut u32).cast(),
            (&mut ordinal as *mut i32).cast(),
            (&mut start as *mut cu::CUdeviceptr).cast(),
            (&mut size as *mut usize).cast(),
        ];
        // SAFETY: each data pointer points at a value of its attribute's documented type
        // (CUmemorytype, int, CUdeviceptr, size_t). The plural query inspects only the address:
        // for one the driver does not know it leaves the values at zero and succeeds (the
        // singular query would fail, which sanitizers report as an API error).
        let r = unsafe {
            cu::cuPointerGetAttributes(
                attributes.len() as u32,
                attributes.as_mut_ptr(),
                data.as_mut_ptr(),
                self.storage_ptr,
            )
        };
        check(r, &format!("querying the memory of {what}"))?;
        if memory_type != cu::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return Err(Error::invalid(
                what,
                format!(
                    "{:#x} is not device memory known to the CUDA driver (a host tensor?)",
                    self.storage_ptr
                ),
            ));
        }
        if ordinal != gpu.ordinal() as i32 {
            return Err(Error::invalid(
                what,
                format!(
                    "the tensor is on device {ordinal}, the stream on device {}",
                    gpu.ordinal()
                ),
            ));
        }
        // The allocation (for memory mapped with the virtual memory API, as PyTorch's
        // expandable segments are, the reserved address range). Where the driver cannot say,
        // the storage's own description stands.
        let end = self.storage_ptr as u128 + self.storage_bytes as u128;
        let allocation_end = start as u128 + size as u128;
        if size > 0 && start <= self.storage_ptr && end > allocation_end {
            return Err(Error::shape(
                format!("{what} storage"),
                format!(
                    "at most {} bytes (the allocation at {start:#x} ends there)",
                    allocation_end - self.storage_ptr as u128
                ),
                format!("{} bytes", self.storage_bytes),
            ));
        }
        Ok(())
    }
}

/// Check that each of `outputs` overlaps neither any of `inputs` nor another output (by the
/// byte ranges their elements span, so interleaved views count as overlapping).
pub fn check_disjoint(inputs: &[(&str, &RawTensor)], outputs: &[(&str, &RawTensor)]) -> Result<()> {
    for (i, (out_name, out)) in outputs.iter().enumerate() {
        let others = inputs.iter().chain(&outputs[i + 1..]);
        for (name, t) in others {
            if let (Some(a), Some(b)) = (out.byte_span(), t.byte_span())
                && a.0 < b.1
                && b.0 < a.1
            {
                return Err(Error::invalid(
                    *out_name,
                    format!("the output overlaps {name} in memory"),
                ));
            }
        }
    }
    Ok(())
}

/// The kernels loaded into device `ordinal`'s primary context (loaded on the first call for
/// that device, kept for the life of the process), with that context current on the calling
/// thread.
///
/// If no context is current on the thread, the primary context is made current (as the CUDA
/// runtime would on its next call). If another context is current, that is an error: the
/// caller's context is not this library's to change.
pub fn primary_gpu(ordinal: u32) -> Result<&'static Gpu> {
    static LOADED: Mutex<Vec<&'static Gpu>> = Mutex::new(Vec::new());
    cust::init(cust::CudaFlags::empty()).map_err(|e| Error::NoDevice {
        reason: format!("cuInit failed: {e}"),
    })?;
    let device = cust::device::Device::get_device(ordinal).map_err(|e| Error::NoDevice {
        reason: format!("device {ordinal}: {e}"),
    })?;
    let mut current: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let r = unsafe { cu::cuCtxGetCurrent(&mut current) };
    check(r, "reading the current context")?;
    let mut primary: cu::CUcontext = std::ptr::null_mut();
    // SAFETY: a valid out-pointer and device; the reference taken is released just below.
    let r = unsafe { cu::cuDevicePrimaryCtxRetain(&mut primary, device.as_raw()) };
    check(r, "retaining the primary context")?;
    // SAFETY: releases the reference taken above (a `Gpu`, if any, holds its own).
    let r = unsafe { cu::cuDevicePrimaryCtxRelease_v2(device.as_raw()) };
    check(r, "releasing the primary context")?;
    if !current.is_null() && current != primary {
        return Err(Error::invalid(
            "current CUDA context",
            format!(
                "it is not device {ordinal}'s primary context (the one the CUDA runtime and \
                 PyTorch use); make that device current first"
            ),
        ));
    }
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    let gpu = match loaded.iter().find(|g| g.ordinal() == ordinal) {
        Some(gpu) => *gpu,
        None => {
            // `Gpu::with_arch` retains the primary context (kept, like the module, for the
            // life of the process) and makes it current.
            let gpu: &'static Gpu =
                Box::leak(Box::new(Gpu::with_arch(ordinal, gpu::forced_arch()?)?));
            loaded.push(gpu);
            gpu
        }
    };
    if gpu.context() != primary {
        return Err(Error::invalid(
            "primary context",
            format!(
                "device {ordinal}'s primary context was reset after the kernels were loaded \
                 into it"
            ),
        ));
    }
    gpu.bind()?;
    Ok(gpu)
}

/// A stream of a device's primary context, given by its raw handle (PyTorch's
/// `torch.cuda.current_stream().cuda_stream`): launches go on it ([`Exec`]).
#[derive(Clone, Copy)]
pub struct RawStream {
    gpu: &'static Gpu,
    stream: cu::CUstream,
}

// SAFETY: a stream handle may be used from any thread (the driver API is thread-safe); the
// caller of `RawStream::new` vouches that it stays live while the `RawStream` is used.
unsafe impl Send for RawStream {}
// SAFETY: as above.
unsafe impl Sync for RawStream {}

impl RawStream {
    /// Stream `stream` of device `ordinal` (0 is the legacy default stream), with the kernels
    /// loaded into the device's primary context ([`primary_gpu`]). The stream is checked to
    /// belong to that context.
    ///
    /// # Safety
    /// `stream` is 0, a special handle of the driver (`CU_STREAM_LEGACY`,
    /// `CU_STREAM_PER_THREAD`), or a live stream, and stays live while the result is used.
    pub unsafe fn new(ordinal: u32, stream: u64) -> Result<RawStream> {
        let gpu = primary_gpu(ordinal)?;
        let stream = stream as usize as cu::CUstream;
        let mut ctx: cu::CUcontext = std::ptr::null_mut();
        // SAFETY: `stream` is live or special (the caller's contract); a valid out-pointer.
        let r = unsafe { cu::cuStreamGetCtx(stream, &mut ctx) };
        check(r, "reading the stream's context")?;
        if ctx != gpu.context() {
            return Err(Error::invalid(
                "stream",
                format!("it does not belong to device {ordinal}'s primary context"),
            ));
        }
        Ok(RawStream { gpu, stream })
    }

    /// The GPU (the kernels loaded into the stream's context).
    pub fn gpu(&self) -> &'static Gpu {
        self.gpu
    }

    /// Copy `data` into `dst` (of `data`'s length) on the stream (`cuMemcpyHtoDAsync`): ordered
    /// with the stream's launches. `data` may be dropped on return: the driver has copied
    /// pageable host memory (a Rust slice) to its staging memory by then.
    ///
    /// # Safety
    /// `dst` is device memory of the stream's context, live until the copy has completed on
    /// the stream, and nothing else accesses it until then.
    pub unsafe fn upload<T: RawElem>(&self, dst: &DevView<'_, T>, data: &[T]) -> Result<()> {
        if dst.len() != data.len() {
            return Err(Error::shape(
                "upload destination",
                format!("{} elements", data.len()),
                dst.len(),
            ));
        }
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: `dst` holds `data.len()` elements of `T` (checked above) of this stream's
        // context (the caller's contract); `data` is a live host slice of that many elements.
        let r = unsafe {
            cu::cuMemcpyHtoDAsync_v2(
                dst.addr(),
                data.as_ptr().cast(),
                std::mem::size_of_val(data),
                self.stream,
            )
        };
        check(r, "copying a table to the device")
    }
}

impl Exec for RawStream {
    unsafe fn launch<P: Copy>(&self, launch: &Launch<P>) -> Result<()> {
        // SAFETY: forwarded to the caller; the stream is live and of the GPU's context (checked
        // by `RawStream::new`, live by its caller's contract).
        unsafe { self.gpu.launch_on(self.stream, launch) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_overlap() {
        let a = RawTensor::contiguous(0x1000, ElemType::Bf16, &[2, 3, 4, 8]);
        assert_eq!(a.byte_span(), Some((0x1000, 0x1000 + 2 * 3 * 4 * 8 * 2)));
        let b = RawTensor::contiguous(0x1000 + 2 * 3 * 4 * 8 * 2, ElemType::F32, &[2, 4, 3]);
        check_disjoint(&[("A", &a)], &[("B", &b)]).unwrap();
        let c = RawTensor::contiguous(0x1000 + 16, ElemType::Bf16, &[1, 1, 1, 8]);
        let e = check_disjoint(&[("A", &a)], &[("C", &c)]).unwrap_err();
        assert!(e.to_string().contains("overlaps A"), "{e}");
        let e = check_disjoint(&[], &[("A", &a), ("C", &c)]).unwrap_err();
        assert!(e.to_string().contains("overlaps C"), "{e}");
    }

    #[test]
    fn storage_offsets() {
        let mut t = RawTensor::contiguous(0x1000, ElemType::Bf16, &[1, 1, 1, 8]);
        t.storage_ptr = 0x0f00;
        t.storage_bytes = 0x200;
        // SAFETY: the view is never used for memory access.
        let (view, offset) = unsafe { t.storage::<bf16>("T") }.unwrap();
        assert_eq!((view.addr(), view.len(), offset), (0x0f00, 0x100, 0x80));
        t.ptr = 0x1001;
        // SAFETY: as above.
        let misaligned = unsafe { t.storage::<bf16>("T") };
        assert!(matches!(misaligned, Err(Error::Misaligned { .. })));
        t.ptr = 0x0e00;
        // SAFETY: as above.
        assert!(unsafe { t.storage::<bf16>("T") }.is_err());
        assert!(t.expect::<f16>("T", 4).is_err());
        assert!(t.expect::<bf16>("T", 3).is_err());
        t.strides[0] = -1;
        assert!(t.strides("T").is_err());
    }

    #[test]
    fn dtype_names() {
        assert_eq!(ElemType::from_name("torch.bfloat16"), Some(ElemType::Bf16));
        assert_eq!(ElemType::from_name("torch.float16"), Some(ElemType::F16));
        assert_eq!(ElemType::from_name("float32"), Some(ElemType::F32));
        assert_eq!(ElemType::from_name("torch.float64"), Some(ElemType::F64));
        assert_eq!(ElemType::from_name("torch.int32"), Some(ElemType::I32));
        assert_eq!(ElemType::from_name("torch.int64"), None);
    }
}
