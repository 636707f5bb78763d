//! The GPU handle: context, device facts, the kernels of the matching PTX target (each loaded
//! on its first launch), and validated kernel launches.

use crate::error::{CudaContext, Error, Result};
use crate::launch::Launch;
use crate::ptx::{Arch, KernelInfo};
use cust::context::{Context, CurrentContext};
use cust::device::{Device, DeviceAttribute};
use cust::module::Module;
use cust::stream::{Stream, StreamFlags};
use cust::sys as cu;
use kernel_abi::KernelDecl;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Facts about the device that launches and reports need.
#[derive(Clone, Debug)]
pub struct DeviceInfo {
    /// Device name, e.g. "NVIDIA H100 80GB HBM3".
    pub name: String,
    /// Compute capability (major, minor).
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Largest dynamic shared memory one block may opt in to, in bytes.
    pub max_shared_memory_per_block: usize,
    /// Shared memory of one multiprocessor, in bytes (what its resident blocks share).
    pub shared_memory_per_multiprocessor: usize,
    /// L2 cache size in bytes.
    pub l2_cache_bytes: usize,
    /// Device memory in bytes.
    pub total_memory: usize,
    /// Driver version: the kernel module's ("580.159.04") where readable, else the CUDA
    /// version the driver implements ("CUDA 13.0").
    pub driver: String,
}

/// The device's state of one function: its module, its handle and the dynamic shared memory
/// limit set.
struct FunctionEntry {
    /// The kernel's own module ([`Arch::entry_module`]), owned so that `raw` stays valid.
    _module: Module,
    raw: cu::CUfunction,
    smem_limit: usize,
}

/// A CUDA device and the kernels of one PTX target.
///
/// A kernel is loaded (its own PTX module, JIT-compiled by the driver) on its first launch and
/// kept until the `Gpu` drops, so a process compiles only the kernels it uses.
///
/// Every method makes the context current on the calling thread first, so a `Gpu` can be shared
/// between threads (the CUDA driver API is thread-safe).
///
/// Fields drop in declaration order: the modules (in the function table) before the context
/// they live in.
pub struct Gpu {
    functions: Mutex<HashMap<String, FunctionEntry>>,
    info: DeviceInfo,
    arch: Arch,
    ordinal: u32,
    ctx: Context,
}

// SAFETY: the raw CUfunction handles in `functions` are driver handles, valid from any thread
// for the lifetime of their modules, which the map owns; all access to the map goes through the
// Mutex.
unsafe impl Send for Gpu {}
// SAFETY: as above; the driver API may be called concurrently from several threads.
unsafe impl Sync for Gpu {}

/// Environment variable selecting the PTX target (`sm_90a` or `sm_80`) instead of the best one
/// for the device, e.g. to run the portable path on a Hopper GPU.
pub const ARCH_ENV: &str = "KERNELS_ARCH";

/// Environment variable with the watchdog limit in seconds for waiting on the GPU.
pub const WATCHDOG_ENV: &str = "KERNELS_WATCHDOG_SECS";

/// Default watchdog limit.
pub const DEFAULT_WATCHDOG: Duration = Duration::from_secs(60);

impl Gpu {
    /// Device 0 with the best PTX target for it (or the one named by `KERNELS_ARCH`).
    pub fn new() -> Result<Gpu> {
        Gpu::with_arch(0, forced_arch()?)
    }

    /// Device `ordinal` with PTX target `arch` (or the best one for the device).
    pub fn with_arch(ordinal: u32, arch: Option<Arch>) -> Result<Gpu> {
        cust::init(cust::CudaFlags::empty()).map_err(|e| Error::NoDevice {
            reason: format!("cuInit failed: {e}"),
        })?;
        let count = Device::num_devices().map_err(|e| Error::NoDevice {
            reason: format!("cuDeviceGetCount failed: {e}"),
        })?;
        if ordinal >= count {
            return Err(Error::NoDevice {
                reason: format!("device {ordinal} requested, {count} present"),
            });
        }
        let device = Device::get_device(ordinal).ctx("getting the device")?;
        let ctx = Context::new(device).ctx("creating the primary context")?;
        let info = device_info(device)?;
        let (major, minor) = info.compute_capability;
        let arch = match arch {
            Some(a) if a.runs_on(major, minor) => a,
            Some(a) => {
                return Err(Error::unsupported(
                    format!("PTX target {a}"),
                    format!("{} has compute capability {major}.{minor}", info.name),
                ));
            }
            None => Arch::for_device(major, minor).ok_or_else(|| Error::UnsupportedDevice {
                device: info.name.clone(),
                major,
                minor,
                available: Arch::ALL.map(|a| a.name()).join(", "),
            })?,
        };
        Ok(Gpu {
            functions: Mutex::new(HashMap::new()),
            info,
            arch,
            ordinal,
            ctx,
        })
    }

    /// Device facts.
    pub fn info(&self) -> &DeviceInfo {
        &self.info
    }

    /// The PTX target in use.
    pub fn arch(&self) -> Arch {
        self.arch
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The context (the device's primary context).
    pub fn context(&self) -> cu::CUcontext {
        self.ctx.as_raw()
    }

    /// Make this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<()> {
        CurrentContext::set_current(&self.ctx).ctx("making the context current")
    }

    /// A new stream (non-blocking with respect to the legacy default stream).
    pub fn stream(&self) -> Result<Stream> {
        self.bind()?;
        Stream::new(StreamFlags::NON_BLOCKING, None).ctx("creating a stream")
    }

    /// Whether this target's PTX has kernel `name`.
    pub fn has_kernel(&self, name: &str) -> bool {
        self.arch.kernels().contains_key(name)
    }

    /// What the PTX declares about kernel `name`.
    pub fn kernel_info(&self, name: &str) -> Result<&'static KernelInfo> {
        self.arch
            .kernels()
            .get(name)
            .ok_or_else(|| Error::InvalidLaunch {
                kernel: name.to_string(),
                reason: format!("not in the {} PTX", self.arch),
            })
    }

    /// Launch `launch` on `stream`, after checking it against what the kernel's PTX declares
    /// and the device's limits ([`check_kernel_launch`]): the entry exists with one parameter
    /// of the handle's struct size and the handle's launch bounds, the grid is within the
    /// device's limits, the dynamic shared memory fits, and overlapping the previous kernel
    /// only on `sm_90a` code.
    ///
    /// # Safety
    /// The parameters must satisfy the kernel's documented contract: their pointers refer to
    /// live device allocations of the documented sizes, their sizes match them, and the grid is
    /// the one the kernel documents. With [`LaunchConfig::overlap_previous`], the kernel waits
    /// for the stream's previous kernel (`griddepcontrol.wait`) as that option requires.
    pub unsafe fn launch<P: Copy>(&self, stream: &Stream, launch: &Launch<P>) -> Result<()> {
        // SAFETY: forwarded to the caller; `stream` is a live stream (borrowed).
        unsafe { self.launch_on(stream.as_inner(), launch) }
    }

    /// [`Gpu::launch`] on a raw stream handle.
    ///
    /// # Safety
    /// As [`Gpu::launch`], and `stream` is a live stream of this GPU's context (or one of the
    /// driver's special handles: the legacy or per-thread default stream).
    pub(crate) unsafe fn launch_on<P: Copy>(
        &self,
        stream: cu::CUstream,
        launch: &Launch<P>,
    ) -> Result<()> {
        check_kernel_launch(
            self.arch,
            launch.kernel(),
            launch.config(),
            self.info.max_shared_memory_per_block,
        )?;
        // SAFETY: forwarded to the caller; the launch was checked above.
        unsafe { self.launch_checked(stream, launch.name(), launch.config(), launch.params()) }
    }

    /// Launch a checked launch.
    ///
    /// # Safety
    /// As [`Gpu::launch`], with the launch already checked against the PTX and the device.
    unsafe fn launch_checked<P: Copy>(
        &self,
        stream: cu::CUstream,
        name: &str,
        cfg: &LaunchConfig,
        params: &P,
    ) -> Result<()> {
        let (gx, gy, gz) = cfg.grid;
        self.bind()?;
        let func = self.function(name, cfg.shared_mem_bytes)?;
        let mut arg = params as *const P as *mut c_void;
        if cfg.overlap_previous {
            // The attribute's value: `programmaticStreamSerializationAllowed = 1` (an int at
            // the start of the 64-byte union).
            let mut value = [0u8; 64];
            value[..4].copy_from_slice(&1i32.to_ne_bytes());
            let mut attr = launch_ex::LaunchAttribute {
                id: launch_ex::PROGRAMMATIC_STREAM_SERIALIZATION,
                pad: [0; 4],
                value,
            };
            let config = launch_ex::LaunchConfig {
                grid_dim: [gx, gy, gz],
                block_dim: [cfg.block.0, cfg.block.1, cfg.block.2],
                shared_mem_bytes: cfg.shared_mem_bytes as u32,
                stream,
                attrs: &mut attr,
                num_attrs: 1,
            };
            // SAFETY: as for `cuLaunchKernel` below; `config` and the attribute it points to
            // have the driver's layouts (`launch_ex`) and outlive the call; the kernel honours
            // the programmatic dependency (the caller's contract).
            let result = unsafe {
                launch_ex::cuLaunchKernelEx(
                    &config,
                    func,
                    &mut arg as *mut *mut c_void,
                    std::ptr::null_mut(),
                )
            };
            return check(
                result,
                &format!("launching {name} (overlapping its predecessor)"),
            );
        }
        // SAFETY: the parameter list was checked against the PTX declaration (one parameter of
        // exactly size_of::<P>() bytes, which the driver copies from `arg`), the launch shape
        // against the kernel's bounds and the device's limits; the caller guarantees the
        // contents of `params` (see `# Safety`).
        let result = unsafe {
            cu::cuLaunchKernel(
                func,
                gx,
                gy,
                gz,
                cfg.block.0,
                cfg.block.1,
                cfg.block.2,
                cfg.shared_mem_bytes as u32,
                stream,
                &mut arg as *mut *mut c_void,
                std::ptr::null_mut(),
            )
        };
        check(result, &format!("launching {name}"))
    }

    /// The function handle of `name`, with its dynamic shared memory limit raised to at least
    /// `smem` bytes.
    fn function(&self, name: &str, smem: usize) -> Result<cu::CUfunction> {
        let mut map = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if !map.contains_key(name) {
            let ptx = self
                .arch
                .entry_module(name)
                .ok_or_else(|| Error::InvalidLaunch {
                    kernel: name.to_string(),
                    reason: format!("not in the {} PTX", self.arch),
                })?;
            let module = Module::from_ptx(&ptx, &[]).ctx(&format!(
                "loading kernel {name} of the {} PTX (JIT compilation)",
                self.arch
            ))?;
            let raw = module
                .get_function(name)
                .ctx(&format!("looking up kernel {name}"))?
                .to_raw();
            map.insert(
                name.to_string(),
                FunctionEntry {
                    _module: module,
                    raw,
                    smem_limit: 48 * 1024,
                },
            );
        }
        let entry = map.get_mut(name).expect("inserted above");
        if smem > entry.smem_limit {
            // SAFETY: `entry.raw` is a live function of our module; the attribute value was
            // checked against the device's opt-in limit by the caller.
            let r = unsafe {
                cu::cuFuncSetAttribute(
                    entry.raw,
                    cu::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
            };
            check(
                r,
                &format!("raising the shared memory limit of {name} to {smem} bytes"),
            )?;
            entry.smem_limit = smem;
        }
        Ok(entry.raw)
    }

    /// Wait for `stream` to finish, polling, and fail with [`Error::Timeout`] past the watchdog
    /// limit (`KERNELS_WATCHDOG_SECS`, default 60 s) instead of hanging on a deadlocked kernel.
    pub fn sync(&self, stream: &Stream, what: &str) -> Result<()> {
        self.sync_within(stream, what, watchdog_limit())
    }

    /// As [`Gpu::sync`] with an explicit limit.
    pub fn sync_within(&self, stream: &Stream, what: &str, limit: Duration) -> Result<()> {
        self.bind()?;
        let start = Instant::now();
        let mut nap = Duration::from_micros(20);
        loop {
            // SAFETY: querying a live stream of this context.
            let r = unsafe { cu::cuStreamQuery(stream.as_inner()) };
            match r {
                cu::cudaError_enum::CUDA_SUCCESS => return Ok(()),
                cu::cudaError_enum::CUDA_ERROR_NOT_READY => {}
                other => return check(other, &format!("waiting for {what}")),
            }
            if start.elapsed() > limit {
                return Err(Error::Timeout {
                    what: what.to_string(),
                    seconds: limit.as_secs_f64(),
                });
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(5));
        }
    }
}

/// The PTX target named by `KERNELS_ARCH`, if set.
pub fn forced_arch() -> Result<Option<Arch>> {
    match std::env::var(ARCH_ENV) {
        Ok(name) => Arch::from_name(&name).map(Some).ok_or_else(|| {
            Error::invalid(
                ARCH_ENV,
                format!("unknown target {name:?}; use sm_90a or sm_80"),
            )
        }),
        Err(_) => Ok(None),
    }
}

/// The watchdog limit from `KERNELS_WATCHDOG_SECS`, or [`DEFAULT_WATCHDOG`].
pub fn watchdog_limit() -> Duration {
    std::env::var(WATCHDOG_ENV)
        .ok()
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|s| *s > 0.0)
        .map(Duration::from_secs_f64)
        .unwrap_or(DEFAULT_WATCHDOG)
}

/// The checks of [`check_kernel_launch`] that need only the kernel's name, parameter size and
/// the launch: kernel `name` of `arch`'s PTX, a parameter struct of `param_bytes` bytes, a device
/// allowing `max_smem` bytes of dynamic shared memory per block:
/// - the kernel exists and takes exactly one parameter of `param_bytes` bytes;
/// - the block has at most the kernel's declared `.maxntid` threads (and 1024);
/// - grid and block dimensions are non-zero and within the device's limits;
/// - the dynamic shared memory fits `max_smem`.
fn check_launch(
    arch: Arch,
    name: &str,
    cfg: &LaunchConfig,
    param_bytes: usize,
    max_smem: usize,
) -> Result<()> {
    let info = arch
        .kernels()
        .get(name)
        .ok_or_else(|| Error::InvalidLaunch {
            kernel: name.to_string(),
            reason: format!("not in the {arch} PTX"),
        })?;
    let invalid = |reason: String| Error::InvalidLaunch {
        kernel: name.to_string(),
        reason,
    };
    if info.params != [param_bytes] {
        return Err(invalid(format!(
            "the PTX declares parameters of {:?} bytes, the host passes one of {param_bytes}",
            info.params
        )));
    }
    let threads = cfg.block.0 as u64 * cfg.block.1 as u64 * cfg.block.2 as u64;
    let max_threads = info.max_threads.unwrap_or(1024).min(1024);
    if threads == 0 || threads > max_threads as u64 {
        return Err(invalid(format!(
            "{threads} threads per block; the kernel allows 1..={max_threads}"
        )));
    }
    let (gx, gy, gz) = cfg.grid;
    if gx == 0 || gy == 0 || gz == 0 || gx > i32::MAX as u32 || gy > 65535 || gz > 65535 {
        return Err(invalid(format!("grid {:?} out of range", cfg.grid)));
    }
    if cfg.shared_mem_bytes > max_smem {
        return Err(invalid(format!(
            "{} bytes of shared memory; the device allows {max_smem}",
            cfg.shared_mem_bytes
        )));
    }
    if cfg.overlap_previous && arch != Arch::Sm90a {
        return Err(invalid(format!(
            "overlapping the previous kernel needs sm_90a code, not {arch}"
        )));
    }
    Ok(())
}

/// The checks [`Gpu::launch`] makes before launching `kernel` (a handle's declaration) of
/// `arch`'s PTX on a device allowing `max_smem` bytes of dynamic shared memory per block
/// (without a device: plans are checked with it on the CPU):
/// - the entry exists, takes exactly one parameter of the handle's struct size, and declares the
///   handle's launch bounds (`.maxntid` = threads, `.minnctapersm` = resident blocks);
/// - the block is the handle's (one-dimensional), and the rest as [`check_launch`].
pub fn check_kernel_launch(
    arch: Arch,
    kernel: &KernelDecl,
    cfg: &LaunchConfig,
    max_smem: usize,
) -> Result<()> {
    let info = arch
        .kernels()
        .get(kernel.name)
        .ok_or_else(|| Error::InvalidLaunch {
            kernel: kernel.name.to_string(),
            reason: format!("not in the {arch} PTX"),
        })?;
    let invalid = |reason: String| Error::InvalidLaunch {
        kernel: kernel.name.to_string(),
        reason,
    };
    if info.max_threads != Some(kernel.threads) || info.min_blocks != Some(kernel.min_blocks) {
        return Err(invalid(format!(
            "the handle declares launch bounds ({}, {}), the PTX ({:?}, {:?})",
            kernel.threads, kernel.min_blocks, info.max_threads, info.min_blocks
        )));
    }
    if cfg.block != (kernel.threads, 1, 1) {
        return Err(invalid(format!(
            "block {:?}; the kernel's handle declares ({}, 1, 1)",
            cfg.block, kernel.threads
        )));
    }
    check_launch(arch, kernel.name, cfg, kernel.param_bytes, max_smem)
}

/// Grid, block and dynamic shared memory of a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Blocks in x, y, z.
    pub grid: (u32, u32, u32),
    /// Threads per block in x, y, z.
    pub block: (u32, u32, u32),
    /// Dynamic shared memory in bytes (including `kernel_abi::SMEM_ALIGN` slack).
    pub shared_mem_bytes: usize,
    /// Programmatic dependent launch (`sm_90a` only): the kernel may be scheduled while the
    /// previous kernel on the stream (its primary) still runs, once every block of that one has
    /// executed `griddepcontrol.launch_dependents` or exited. The kernel must execute
    /// `griddepcontrol.wait` (`arch::griddep::wait_primary`) before it touches memory the
    /// primary writes and before it writes memory the primary reads, in every block (so it
    /// completes after the primary). Off by default.
    pub overlap_previous: bool,
}

impl LaunchConfig {
    /// A one-dimensional block of `threads`, grid `grid`, `smem` bytes of shared memory.
    pub fn new(grid: (u32, u32, u32), threads: u32, smem: usize) -> Self {
        LaunchConfig {
            grid,
            block: (threads, 1, 1),
            shared_mem_bytes: smem,
            overlap_previous: false,
        }
    }

    /// The same launch, overlapping the previous kernel ([`LaunchConfig::overlap_previous`]).
    pub fn overlapping_previous(self) -> Self {
        LaunchConfig {
            overlap_previous: true,
            ..self
        }
    }
}

/// The driver's extended launch (`cuLaunchKernelEx`, CUDA 12.0), which `cust_raw` 0.11 predates:
/// the declarations of `cuda.h` for the one attribute used here.
mod launch_ex {
    use super::cu;
    use std::ffi::c_void;

    /// `CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`.
    pub const PROGRAMMATIC_STREAM_SERIALIZATION: u32 = 6;

    /// `CUlaunchAttribute`: the id, padding to 8 bytes, the 64-byte value union.
    #[repr(C, align(8))]
    pub struct LaunchAttribute {
        pub id: u32,
        pub pad: [u8; 4],
        pub value: [u8; 64],
    }

    /// `CUlaunchConfig`.
    #[repr(C)]
    pub struct LaunchConfig {
        pub grid_dim: [u32; 3],
        pub block_dim: [u32; 3],
        pub shared_mem_bytes: u32,
        pub stream: cu::CUstream,
        pub attrs: *mut LaunchAttribute,
        pub num_attrs: u32,
    }

    const _: () = assert!(
        std::mem::size_of::<LaunchAttribute>() == 72 && std::mem::size_of::<LaunchConfig>() == 56
    );

    #[link(name = "cuda")]
    unsafe extern "C" {
        /// `CUresult cuLaunchKernelEx(const CUlaunchConfig *, CUfunction, void **, void **)`.
        pub fn cuLaunchKernelEx(
            config: *const LaunchConfig,
            f: cu::CUfunction,
            kernel_params: *mut *mut c_void,
            extra: *mut *mut c_void,
        ) -> cu::CUresult;
    }
}

/// Map a raw driver result to [`Error::Driver`], with the driver's name and description.
pub(crate) fn check(result: cu::CUresult, context: &str) -> Result<()> {
    if result == cu::cudaError_enum::CUDA_SUCCESS {
        return Ok(());
    }
    let text =
        |f: unsafe extern "C" fn(cu::CUresult, *mut *const std::ffi::c_char) -> cu::CUresult| {
            let mut p: *const std::ffi::c_char = std::ptr::null();
            // SAFETY: `p` is a valid out-pointer; on success the driver points it at a static
            // NUL-terminated string.
            let ok = unsafe { f(result, &mut p) } == cu::cudaError_enum::CUDA_SUCCESS;
            if ok && !p.is_null() {
                // SAFETY: a static NUL-terminated string owned by the driver (see above).
                unsafe { std::ffi::CStr::from_ptr(p) }
                    .to_string_lossy()
                    .into_owned()
            } else {
                "unknown".to_string()
            }
        };
    Err(Error::Driver {
        context: context.to_string(),
        code: result as u32,
        name: text(cu::cuGetErrorName),
        message: text(cu::cuGetErrorString),
    })
}

fn device_info(device: Device) -> Result<DeviceInfo> {
    let attr = |a: DeviceAttribute| -> Result<u32> {
        device
            .get_attribute(a)
            .map(|v| v as u32)
            .ctx("reading a device attribute")
    };
    let mut optin: i32 = 0;
    // SAFETY: `optin` is a valid out-pointer and `device` a valid device handle.
    let r = unsafe {
        cu::cuDeviceGetAttribute(
            &mut optin,
            cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            device.as_raw(),
        )
    };
    check(r, "reading the shared memory opt-in limit")?;
    let mut per_sm: i32 = 0;
    // SAFETY: as above.
    let r = unsafe {
        cu::cuDeviceGetAttribute(
            &mut per_sm,
            cu::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
            device.as_raw(),
        )
    };
    check(r, "reading the shared memory of a multiprocessor")?;
    Ok(DeviceInfo {
        name: device.name().ctx("reading the device name")?,
        compute_capability: (
            attr(DeviceAttribute::ComputeCapabilityMajor)?,
            attr(DeviceAttribute::ComputeCapabilityMinor)?,
        ),
        multiprocessors: attr(DeviceAttribute::MultiprocessorCount)?,
        max_shared_memory_per_block: optin as usize,
        shared_memory_per_multiprocessor: per_sm as usize,
        l2_cache_bytes: attr(DeviceAttribute::L2CacheSize)? as usize,
        total_memory: device.total_memory().ctx("reading the memory size")?,
        driver: driver_version(),
    })
}

/// The driver's version: the kernel module's from `/proc/driver/nvidia/version` where
/// readable, else the CUDA version the driver implements.
pub fn driver_version() -> String {
    if let Ok(text) = std::fs::read_to_string("/proc/driver/nvidia/version") {
        // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue ..."
        if let Some(v) = text
            .split_whitespace()
            .find(|w| w.chars().next().is_some_and(|c| c.is_ascii_digit()) && w.contains('.'))
        {
            return v.to_string();
        }
    }
    let mut v: i32 = 0;
    // SAFETY: `v` is a valid out-pointer.
    let r = unsafe { cu::cuDriverGetVersion(&mut v) };
    if r == cu::cudaError_enum::CUDA_SUCCESS {
        format!("CUDA {}.{}", v / 1000, (v % 1000) / 10)
    } else {
        "unknown".to_string()
    }
}
