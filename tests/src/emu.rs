//! Running the kernels of this repository on the CPU: the kernel crate compiled for the host
//! over its emulated device layer (`kernel_emulator::emu`), behind the same [`Exec`] interface the
//! GPU launches use, and aligned host buffers standing in for device memory.

use kernels::Launch;
use kernels::mhc::{DevView, Exec};
use kernels::{Error, Result};

/// Executes kernels in the CPU emulator (one OS thread per GPU thread; slow, for small problems).
pub struct Emulator;

impl Exec for Emulator {
    unsafe fn launch<P: Copy>(&self, launch: &Launch<P>) -> Result<()> {
        let name = launch.name();
        let cfg = launch.config();
        let invalid = |reason: String| Error::InvalidLaunch {
            kernel: name.to_string(),
            reason,
        };
        let kernel = kernel_emulator::mhc::EMU_KERNELS
            .iter()
            .chain(kernel_emulator::gla::EMU_KERNELS)
            .chain(kernel_emulator::gla::backward::EMU_KERNELS)
            .chain(kernel_emulator::gla::backward::NEGATIVE_EMU_KERNELS)
            .chain(kernel_emulator::attention::EMU_KERNELS)
            .chain(kernel_emulator::attention::VARLEN_EMU_KERNELS)
            .chain(kernel_emulator::attention::backward::EMU_KERNELS)
            .chain(kernel_emulator::attention::backward::VARLEN_EMU_KERNELS)
            .chain(kernel_emulator::attention::backward::NEGATIVE_EMU_KERNELS)
            .chain(kernel_emulator::attention::decode::EMU_KERNELS)
            .chain(kernel_emulator::attention::decode::APPEND_EMU_KERNELS)
            .chain(kernel_emulator::smoke_reduce::EMU_KERNELS)
            .find(|k| k.name == name)
            .ok_or_else(|| invalid("no such kernel in the emulator's table".into()))?;
        if kernel.params != std::mem::size_of::<P>() {
            return Err(invalid(format!(
                "parameter struct of {} bytes, the kernel takes {}",
                std::mem::size_of::<P>(),
                kernel.params
            )));
        }
        if kernel.threads != launch.kernel().threads || cfg.block != (kernel.threads, 1, 1) {
            return Err(invalid(format!(
                "block {:?}; the emulated kernel has {} threads, its handle {}",
                cfg.block,
                kernel.threads,
                launch.kernel().threads
            )));
        }
        // SAFETY: forwarded to the caller (the parameter struct's contract); its type's size
        // matches the kernel's.
        unsafe {
            kernel_emulator::emu::launch(
                kernel,
                cfg.grid,
                cfg.block.0,
                cfg.shared_mem_bytes,
                launch.params() as *const P as *const u8,
            )
        }
        .map_err(|e| invalid(format!("emulated kernel failed: {e}")))
    }
}

/// A host buffer of `len` values of `T`, 16-byte aligned (as device allocations are), standing
/// in for device memory in the emulator. It is surrounded by guard bands of [`GUARD`] bytes
/// with a known pattern: [`HostBuf::guards_intact`] tells whether a kernel wrote outside it.
/// While alive it is registered with the emulator, whose checked global accesses (`cp.async`,
/// `arch::global`) must fall inside a registered buffer.
pub struct HostBuf<T: Copy> {
    words: Vec<u128>,
    len: usize,
    _ty: std::marker::PhantomData<T>,
}

impl<T: Copy> Drop for HostBuf<T> {
    fn drop(&mut self) {
        kernel_emulator::emu::unregister_buffer(self.data() as usize);
    }
}

/// Bytes of each guard band (a multiple of 16, so the data stays 16-byte aligned).
pub const GUARD: usize = 256;

const PATTERN: u128 = 0xa5c3_5a3c_a5c3_5a3c_a5c3_5a3c_a5c3_5a3c;

impl<T: Copy> HostBuf<T> {
    /// A buffer holding `data`.
    pub fn from_slice(data: &[T]) -> Self {
        assert!(std::mem::align_of::<T>() <= 16);
        let bytes = std::mem::size_of_val(data);
        let data_words = bytes.div_ceil(16);
        let g = GUARD / 16;
        let mut words = vec![PATTERN; g + data_words + g];
        // SAFETY: `words` has `data_words * 16 >= bytes` bytes after the first guard; `T` is
        // plain data (Copy).
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr() as *const u8,
                words.as_mut_ptr().add(g) as *mut u8,
                bytes,
            )
        };
        let buf = HostBuf {
            words,
            len: data.len(),
            _ty: std::marker::PhantomData,
        };
        kernel_emulator::emu::register_buffer(buf.data() as usize, bytes);
        buf
    }

    /// `len` copies of `fill` (e.g. NaN: poisoned).
    pub fn filled(len: usize, fill: T) -> Self {
        HostBuf::from_slice(&vec![fill; len])
    }

    fn data(&self) -> *const u128 {
        // SAFETY: the first guard band is GUARD / 16 words long, inside `words`.
        unsafe { self.words.as_ptr().add(GUARD / 16) }
    }

    /// The contents.
    pub fn to_vec(&self) -> Vec<T> {
        // SAFETY: the `len` elements after the first guard were initialized from values of `T`
        // (or written by kernels as values of `T`); the storage is 16-byte aligned.
        unsafe { std::slice::from_raw_parts(self.data() as *const T, self.len) }.to_vec()
    }

    /// Whether both guard bands still hold their pattern (the bytes between the data's end and
    /// the next 16-byte boundary are not checked).
    pub fn guards_intact(&self) -> bool {
        let g = GUARD / 16;
        let n = self.words.len();
        self.words[..g].iter().all(|w| *w == PATTERN)
            && self.words[n - g..].iter().all(|w| *w == PATTERN)
    }

    /// A view for the emulator.
    pub fn view(&mut self) -> DevView<'_, T> {
        // SAFETY: the view covers this buffer's `len` elements, borrowed mutably for its
        // lifetime; the emulator accesses host memory directly.
        unsafe { DevView::from_raw(self.data() as u64, self.len) }
    }

    /// A view of the first `len - short` elements at byte offset `offset` (for validation
    /// tests: wrong sizes, misaligned addresses).
    pub fn view_at(&mut self, offset: usize, short: usize) -> DevView<'_, T> {
        // SAFETY: only used to exercise validation, which rejects the view before any launch.
        unsafe { DevView::from_raw(self.data() as u64 + offset as u64, self.len - short) }
    }
}
