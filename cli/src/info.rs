//! `info`: the GPU, the driver, and the PTX targets embedded in this build.

use kernels::Arch;

/// The lines `kernels-cli info` prints. Without a usable GPU it says why, after the facts that
/// need none (the embedded PTX, the driver library's version).
pub fn lines() -> Vec<String> {
    let mut out = vec![format!("kernels-cli {}", env!("CARGO_PKG_VERSION"))];
    out.push("embedded PTX targets:".to_string());
    for arch in Arch::ALL {
        let runs_on = match arch {
            Arch::Sm90a => "compute capability 9.0 (Hopper: TMA, wgmma)",
            Arch::Sm80 => "compute capability >= 8.0 (cp.async, ldmatrix, mma.sync)",
        };
        out.push(format!(
            "  {:<7} {} kernels, {} KiB of PTX; runs on {runs_on}",
            arch.name(),
            arch.kernels().len(),
            arch.ptx().len() / 1024
        ));
    }
    out.push(format!(
        "driver (libcuda): {}",
        kernels::gpu::driver_version()
    ));
    match crate::open_gpu() {
        Ok(gpu) => {
            let i = gpu.info();
            out.push(format!("gpu 0: {}", i.name));
            out.push(format!(
                "  compute capability {}.{}, {} SMs, {:.1} GiB, {} KiB shared memory per block",
                i.compute_capability.0,
                i.compute_capability.1,
                i.multiprocessors,
                i.total_memory as f64 / (1u64 << 30) as f64,
                i.max_shared_memory_per_block / 1024
            ));
            out.push(format!(
                "  PTX target in use: {} (set {}=sm_80 to force the portable one)",
                gpu.arch(),
                kernels::gpu::ARCH_ENV
            ));
        }
        Err(crate::CliError::NoGpu { reason }) => out.push(format!("gpu: none ({reason})")),
        Err(e) => out.push(format!("gpu: unusable ({e})")),
    }
    out
}
