//! Device memory helpers: upload, download, poison.

use crate::error::{CudaContext, Error, Result};
use cust::memory::{CopyDestination, DeviceBuffer, DeviceCopy};
use cust::stream::Stream;

/// Copy a host slice to a new device buffer.
pub fn upload<T: DeviceCopy>(data: &[T]) -> Result<DeviceBuffer<T>> {
    DeviceBuffer::from_slice(data).ctx("copying to the device")
}

/// Copy `data` into `buf` from element `offset` on (the range must lie inside `buf`).
pub fn upload_at<T: DeviceCopy>(
    buf: &mut DeviceBuffer<T>,
    offset: usize,
    data: &[T],
) -> Result<()> {
    let end = offset
        .checked_add(data.len())
        .filter(|e| *e <= buf.len())
        .ok_or_else(|| {
            Error::shape("upload range", buf.len(), offset.saturating_add(data.len()))
        })?;
    buf.index(offset..end)
        .copy_from(data)
        .ctx("copying to the device")
}

/// Copy `len` elements of `buf` from element `offset` on to a new host vector.
pub fn download_range<T: DeviceCopy + Default + Clone>(
    buf: &DeviceBuffer<T>,
    offset: usize,
    len: usize,
) -> Result<Vec<T>> {
    let end = offset
        .checked_add(len)
        .filter(|e| *e <= buf.len())
        .ok_or_else(|| Error::shape("download range", buf.len(), offset.saturating_add(len)))?;
    let mut v = vec![T::default(); len];
    buf.index(offset..end)
        .copy_to(&mut v[..])
        .ctx("copying from the device")?;
    Ok(v)
}

/// Copy a device buffer to a new host vector.
pub fn download<T: DeviceCopy + Default + Clone>(buf: &DeviceBuffer<T>) -> Result<Vec<T>> {
    let mut v = vec![T::default(); buf.len()];
    buf.copy_to(&mut v[..]).ctx("copying from the device")?;
    Ok(v)
}

/// A device buffer of `len` elements with every byte 0xFF: NaN for f32/f16/bf16 and all ones
/// for integers, so an output element a kernel fails to write is detectable.
pub fn poisoned<T: DeviceCopy>(len: usize) -> Result<DeviceBuffer<T>> {
    // SAFETY: the allocation is fully initialized by the memset below before it is returned;
    // every bit pattern is a valid value of the plain-old-data element types used here.
    let buf = unsafe { DeviceBuffer::<T>::uninitialized(len) }.ctx("allocating device memory")?;
    let bytes = len * std::mem::size_of::<T>();
    if bytes > 0 {
        // SAFETY: writes exactly the `bytes` bytes of the allocation.
        let r = unsafe { cust::sys::cuMemsetD8_v2(buf.as_device_ptr().as_raw(), 0xff, bytes) };
        crate::gpu::check(r, "poisoning an output buffer")?;
    }
    Ok(buf)
}

/// A zeroed device buffer.
pub fn zeroed<T: DeviceCopy + cust::memory::bytemuck::Zeroable>(
    len: usize,
) -> Result<DeviceBuffer<T>> {
    DeviceBuffer::zeroed(len).ctx("allocating device memory")
}

/// Free device memory in bytes (`cuMemGetInfo`), for measuring what a computation allocates.
pub fn free_device_memory() -> Result<usize> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both are valid out-pointers; a context is current (callers hold a `Gpu`).
    let r = unsafe { cust::sys::cuMemGetInfo_v2(&mut free, &mut total) };
    crate::gpu::check(r, "reading free device memory")?;
    Ok(free)
}

/// Copy `src` into `dst` (same length) on `stream`, asynchronously (`cuMemcpyDtoDAsync`).
pub fn copy_async<T: DeviceCopy>(
    stream: &Stream,
    dst: &mut DeviceBuffer<T>,
    src: &DeviceBuffer<T>,
) -> Result<()> {
    if dst.len() != src.len() {
        return Err(Error::shape(
            "copy destination",
            format!("{} elements", src.len()),
            dst.len(),
        ));
    }
    let bytes = src.len() * std::mem::size_of::<T>();
    // SAFETY: both are live allocations of `bytes` bytes (same length and type), distinct
    // (one is borrowed mutably); the copy is ordered on `stream`.
    let r = unsafe {
        cust::sys::cuMemcpyDtoDAsync_v2(
            dst.as_device_ptr().as_raw(),
            src.as_device_ptr().as_raw(),
            bytes,
            stream.as_inner(),
        )
    };
    crate::gpu::check(r, "copying device memory")
}
