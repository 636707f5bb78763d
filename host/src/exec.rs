//! Device views and executors: what a launch sequence needs to run on a GPU stream or on any
//! other executor of the kernels (the CPU emulator of the tests), over raw device memory.

use crate::error::Result;
use crate::gpu::Gpu;
use crate::launch::Launch;
use cust::memory::{DeviceBuffer, DeviceCopy};
use cust::stream::Stream;
use std::marker::PhantomData;

/// A view of `len` elements of type `T` at a device address (of the executor that will use
/// it), borrowed for `'a`.
pub struct DevView<'a, T> {
    addr: u64,
    len: usize,
    _borrow: PhantomData<&'a [T]>,
}

impl<T> Clone for DevView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for DevView<'_, T> {}

impl<'a, T> DevView<'a, T> {
    /// A view of raw memory.
    ///
    /// # Safety
    /// `addr` holds `len` elements of `T`, accessible by the executor the view is passed to,
    /// for `'a`.
    pub unsafe fn from_raw(addr: u64, len: usize) -> Self {
        DevView {
            addr,
            len,
            _borrow: PhantomData,
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The device address as a pointer (for parameter structs).
    pub(crate) fn ptr<P>(&self) -> *mut P {
        self.addr as *mut P
    }
}

impl<'a, T: DeviceCopy> From<&'a DeviceBuffer<T>> for DevView<'a, T> {
    fn from(buf: &'a DeviceBuffer<T>) -> Self {
        DevView {
            addr: buf.as_device_ptr().as_raw(),
            len: buf.len(),
            _borrow: PhantomData,
        }
    }
}

impl<'a, T: DeviceCopy> From<&'a mut DeviceBuffer<T>> for DevView<'a, T> {
    fn from(buf: &'a mut DeviceBuffer<T>) -> Self {
        DevView {
            addr: buf.as_device_ptr().as_raw(),
            len: buf.len(),
            _borrow: PhantomData,
        }
    }
}

/// Something that launches this crate's kernels: a GPU stream ([`OnStream`]), or the CPU
/// emulator of the tests.
pub trait Exec {
    /// Run `launch` (see [`Gpu::launch`]).
    ///
    /// # Safety
    /// The launch's parameters satisfy the kernel's contract for this executor's memory.
    unsafe fn launch<P: Copy>(&self, launch: &Launch<P>) -> Result<()>;
}

/// Launches on a GPU stream.
pub struct OnStream<'a> {
    /// The GPU.
    pub gpu: &'a Gpu,
    /// The stream.
    pub stream: &'a Stream,
}

impl Exec for OnStream<'_> {
    unsafe fn launch<P: Copy>(&self, launch: &Launch<P>) -> Result<()> {
        // SAFETY: forwarded to the caller.
        unsafe { self.gpu.launch(self.stream, launch) }
    }
}
