//! Smoke kernels (see `gpu-kernels/src/smoke`): launchers and CPU references. Each proves one
//! group of device-layer primitives on a GPU; the tests, the benchmarks and the main job run
//! them.

use cust::memory::{DeviceBuffer, DeviceCopy};
use cust::stream::Stream;
use half::bf16;
use kernel_abi::smoke::*;
use kernels::memory::{download, poisoned, zeroed};
use kernels::tensor_map::{MapDtype, MapSwizzle, TiledMap};
use kernels::{Error, Gpu, Kernel, Launch, Result};

fn require_hopper(gpu: &Gpu, what: &str) -> Result<()> {
    if gpu.arch().has_hopper_kernels() {
        Ok(())
    } else {
        Err(Error::unsupported(
            what,
            format!(
                "needs the sm_90a kernels; this GPU runs the {} PTX",
                gpu.arch()
            ),
        ))
    }
}

fn device_ptr<T: DeviceCopy>(buf: &DeviceBuffer<T>) -> u64 {
    buf.as_device_ptr().as_raw()
}

fn check_len(what: &str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::shape(
            what,
            format!("{expected} elements"),
            format!("{got}"),
        ))
    }
}

// ---------------------------------------------------------------------------------------------

/// Launch `smoke_block_reduce` (asynchronous): one sum per element of `partial`, whose length
/// is the number of blocks.
pub fn block_reduce_launch(
    gpu: &Gpu,
    stream: &Stream,
    input: &DeviceBuffer<f32>,
    partial: &mut DeviceBuffer<f32>,
) -> Result<()> {
    block_reduce_launch_of(gpu, stream, &SMOKE_BLOCK_REDUCE, input, partial)
}

/// [`block_reduce_launch`] of `kernel`, `smoke_block_reduce` or the negative control with its
/// parameters (`negative_block_reduce_no_barrier`).
pub fn block_reduce_launch_of(
    gpu: &Gpu,
    stream: &Stream,
    kernel: &Kernel<ReduceParams>,
    input: &DeviceBuffer<f32>,
    partial: &mut DeviceBuffer<f32>,
) -> Result<()> {
    let blocks = u32::try_from(partial.len())
        .ok()
        .filter(|b| *b > 0)
        .ok_or_else(|| Error::invalid("partial", "needs 1..2^32 elements (one per block)"))?;
    let n = u32::try_from(input.len())
        .map_err(|_| Error::invalid("input", "more than 2^32 - 1 elements"))?;
    let params = ReduceParams {
        input: device_ptr(input) as *const f32,
        partial: device_ptr(partial) as *mut f32,
        n,
    };
    let launch = Launch::new(kernel, (blocks, 1, 1), (), params);
    // SAFETY: `input` holds n f32 and `partial` `blocks` f32, as the kernel's grid needs (the
    // negative control of this kernel has its contract).
    unsafe { gpu.launch(stream, &launch) }
}

/// Per-block sums of `input` by `smoke_block_reduce` with `blocks` blocks (grid-stride).
pub fn block_reduce(
    gpu: &Gpu,
    stream: &Stream,
    input: &DeviceBuffer<f32>,
    blocks: u32,
) -> Result<Vec<f32>> {
    if blocks == 0 {
        return Err(Error::invalid("blocks", "must be at least 1"));
    }
    let mut partial = poisoned::<f32>(blocks as usize)?;
    block_reduce_launch(gpu, stream, input, &mut partial)?;
    gpu.sync(stream, "smoke_block_reduce")?;
    download(&partial)
}

/// The f64 sums each block of [`block_reduce`] computes, and for each the sum of the absolute
/// values of its terms and its number of terms (for the error bound).
pub fn block_reduce_reference(input: &[f32], blocks: u32) -> Vec<(f64, f64, usize)> {
    let per_pass = blocks as usize * REDUCE_THREADS as usize;
    let mut out = vec![(0.0, 0.0, 0usize); blocks as usize];
    for (i, &x) in input.iter().enumerate() {
        let b = (i % per_pass) / REDUCE_THREADS as usize;
        out[b].0 += x as f64;
        out[b].1 += (x as f64).abs();
        out[b].2 += 1;
    }
    out
}

// ---------------------------------------------------------------------------------------------

/// `c = a b^T` for one 64x64x64 tile (`a`, `b` `[64, 64]` bf16 row-major) by `smoke_mma_tile`.
pub fn mma_tile(
    gpu: &Gpu,
    stream: &Stream,
    a: &DeviceBuffer<bf16>,
    b: &DeviceBuffer<bf16>,
) -> Result<Vec<f32>> {
    let elems = (MMA_TILE * MMA_TILE) as usize;
    check_len("a", elems, a.len())?;
    check_len("b", elems, b.len())?;
    let c = poisoned::<f32>(elems)?;
    let params = MmaTileParams {
        a: device_ptr(a) as *const u16,
        b: device_ptr(b) as *const u16,
        c: device_ptr(&c) as *mut f32,
    };
    let launch = Launch::new(&SMOKE_MMA_TILE, (1, 1, 1), (), params);
    // SAFETY: a, b hold 64x64 bf16 and c 64x64 f32; cust allocations are 256-byte aligned.
    unsafe { gpu.launch(stream, &launch)? };
    gpu.sync(stream, "smoke_mma_tile")?;
    download(&c)
}

/// The f64 reference of [`mma_tile`] and [`wgmma_tile`] (see [`kernels::gemm::reference`]).
pub use kernels::gemm::reference as matmul_nt_reference;

// ---------------------------------------------------------------------------------------------

/// Load the `[TMA_BOX_ROWS, TMA_BOX_COLS]` box at column `x`, row `y` of the row-major bf16
/// matrix `tensor [rows, cols]` with `smoke_tma_load`, returning the shared-memory image of the
/// box (u16 words in shared-memory order).
#[allow(clippy::too_many_arguments)]
pub fn tma_load(
    gpu: &Gpu,
    stream: &Stream,
    tensor: &DeviceBuffer<bf16>,
    rows: u64,
    cols: u64,
    x: i32,
    y: i32,
    swizzle: MapSwizzle,
) -> Result<Vec<u16>> {
    if (x as i64 * 2) % 16 != 0 {
        return Err(Error::invalid(
            "TMA box column",
            format!("{x}: the innermost coordinate must be a multiple of 16 bytes (8 bf16)"),
        ));
    }
    require_hopper(gpu, "smoke_tma_load")?;
    check_len("tensor", (rows * cols) as usize, tensor.len())?;
    let tmap = TiledMap {
        address: device_ptr(tensor),
        dtype: MapDtype::Bf16,
        dims: &[cols, rows],
        strides_bytes: &[cols * 2],
        box_dims: &[TMA_BOX_COLS, TMA_BOX_ROWS],
        swizzle,
    }
    .encode()?;
    let out = poisoned::<u16>((TMA_BOX_BYTES / 2) as usize)?;
    let params = TmaLoadParams {
        tmap,
        out: device_ptr(&out) as *mut u16,
        x,
        y,
    };
    let launch = Launch::new(&SMOKE_TMA_LOAD, (1, 1, 1), (), params);
    // SAFETY: the tensor map describes `tensor` (checked size), `out` holds the box.
    unsafe { gpu.launch(stream, &launch)? };
    gpu.sync(stream, "smoke_tma_load")?;
    download(&out)
}

/// Byte offset in shared memory of byte `offset` of a row-major box with 128-byte rows, under
/// TMA swizzle `swizzle` (CUTLASS's `Swizzle<B, 4, 3>`: the 16-byte chunk index XOR the row
/// index modulo 2^B, B = 3, 2, 1 for 128, 64, 32 bytes), box base 1024-byte aligned.
pub fn swizzled_offset(offset: usize, swizzle: MapSwizzle) -> usize {
    let bits = match swizzle {
        MapSwizzle::None => return offset,
        MapSwizzle::B32 => 1,
        MapSwizzle::B64 => 2,
        MapSwizzle::B128 => 3,
    };
    let mask = (1 << bits) - 1;
    offset ^ (((offset >> 7) & mask) << 4)
}

/// The shared-memory image [`tma_load`] must return: the box, zero outside the tensor, placed
/// by [`swizzled_offset`].
pub fn tma_load_reference(
    tensor: &[bf16],
    rows: i64,
    cols: i64,
    x: i32,
    y: i32,
    swizzle: MapSwizzle,
) -> Vec<u16> {
    let (br, bc) = (TMA_BOX_ROWS as usize, TMA_BOX_COLS as usize);
    let mut img = vec![0u16; br * bc];
    for r in 0..br {
        for c in 0..bc {
            let (gr, gc) = (y as i64 + r as i64, x as i64 + c as i64);
            let v = if (0..rows).contains(&gr) && (0..cols).contains(&gc) {
                tensor[(gr * cols + gc) as usize].to_bits()
            } else {
                0
            };
            let off = swizzled_offset((r * bc + c) * 2, swizzle);
            img[off / 2] = v;
        }
    }
    img
}

// ---------------------------------------------------------------------------------------------

/// The N values `smoke_wgmma_n*` exists for.
pub const WGMMA_SMOKE_N: [u32; 3] = [64, 128, 256];

/// `c = a b^T` with `a [64, 64]` and `b [n, 64]` bf16 by `smoke_wgmma_n{n}` (TMA with 128-byte
/// swizzle, wgmma from shared-memory descriptors). `c` is `[64, n]` f32.
pub fn wgmma_tile(
    gpu: &Gpu,
    stream: &Stream,
    n: u32,
    a: &DeviceBuffer<bf16>,
    b: &DeviceBuffer<bf16>,
) -> Result<Vec<f32>> {
    let mut c = poisoned::<f32>((WGMMA_M * n) as usize)?;
    wgmma_tile_launch(gpu, stream, n, a, b, &mut c)?;
    gpu.sync(stream, "smoke_wgmma")?;
    download(&c)
}

/// Launch `smoke_wgmma_n{n}` (asynchronous) into `c` (`[64, n]` f32).
pub fn wgmma_tile_launch(
    gpu: &Gpu,
    stream: &Stream,
    n: u32,
    a: &DeviceBuffer<bf16>,
    b: &DeviceBuffer<bf16>,
    c: &mut DeviceBuffer<f32>,
) -> Result<()> {
    require_hopper(gpu, "smoke_wgmma")?;
    let Some(kernel) = wgmma_tile_kernel(n) else {
        return Err(Error::unsupported(
            "wgmma smoke N",
            format!("{n}; built for 64, 128, 256"),
        ));
    };
    check_len("a", (WGMMA_M * WGMMA_K) as usize, a.len())?;
    check_len("b", (n * WGMMA_K) as usize, b.len())?;
    check_len("c", (WGMMA_M * n) as usize, c.len())?;
    let map = |buf: &DeviceBuffer<bf16>, rows: u32| {
        TiledMap {
            address: device_ptr(buf),
            dtype: MapDtype::Bf16,
            dims: &[WGMMA_K as u64, rows as u64],
            strides_bytes: &[WGMMA_K as u64 * 2],
            box_dims: &[WGMMA_K, rows],
            swizzle: MapSwizzle::B128,
        }
        .encode()
    };
    let params = WgmmaTileParams {
        tmap_a: map(a, WGMMA_M)?,
        tmap_b: map(b, n)?,
        c: device_ptr(c) as *mut f32,
    };
    let launch = Launch::new(kernel, (1, 1, 1), (), params);
    // SAFETY: the maps describe a [64, 64] and b [n, 64]; c holds 64 x n f32.
    unsafe { gpu.launch(stream, &launch) }
}

/// `c = a b` with `a [64, 64]` (K-major) and `b [64, 128]` row-major (MN-major B) by
/// `smoke_wgmma_mn`; `c` is `[64, 128]` f32.
pub fn wgmma_mn(
    gpu: &Gpu,
    stream: &Stream,
    a: &DeviceBuffer<bf16>,
    b: &DeviceBuffer<bf16>,
) -> Result<Vec<f32>> {
    require_hopper(gpu, "smoke_wgmma_mn")?;
    check_len("a", (WGMMA_M * WGMMA_K) as usize, a.len())?;
    check_len("b", (WGMMA_K * WGMMA_MN_N) as usize, b.len())?;
    let map = |buf: &DeviceBuffer<bf16>, rows: u32, cols: u32| {
        TiledMap {
            address: device_ptr(buf),
            dtype: MapDtype::Bf16,
            dims: &[cols as u64, rows as u64],
            strides_bytes: &[cols as u64 * 2],
            box_dims: &[64, rows],
            swizzle: MapSwizzle::B128,
        }
        .encode()
    };
    let c = poisoned::<f32>((WGMMA_M * WGMMA_MN_N) as usize)?;
    let params = WgmmaMnParams {
        tmap_a: map(a, WGMMA_M, WGMMA_K)?,
        tmap_b: map(b, WGMMA_K, WGMMA_MN_N)?,
        c: device_ptr(&c) as *mut f32,
    };
    let launch = Launch::new(&SMOKE_WGMMA_MN, (1, 1, 1), (), params);
    // SAFETY: the maps describe a [64, 64] and b [64, 128]; c holds 64 x 128 f32.
    unsafe { gpu.launch(stream, &launch)? };
    gpu.sync(stream, "smoke_wgmma_mn")?;
    download(&c)
}

/// `c[i][j] = sum_k a[i][k] b[k][j]` in f64 (`a [m, k]`, `b [k, n]`, row-major).
pub fn matmul_nn_reference(
    a: &[bf16],
    b: &[bf16],
    m: usize,
    n: usize,
    k: usize,
) -> (Vec<f64>, Vec<f64>) {
    let mut bt = vec![bf16::ZERO; n * k];
    for kk in 0..k {
        for j in 0..n {
            bt[j * k + kk] = b[kk * n + j];
        }
    }
    kernels::gemm::reference(a, &bt, m, n, k)
}

// ---------------------------------------------------------------------------------------------

/// Output of [`pingpong`].
#[derive(Clone, Debug)]
pub struct PingpongOutput {
    /// `[num_tiles * 4096]`: `2 x + t` for each element `x` of tile `t`.
    pub out: Vec<f32>,
    /// `[num_tiles]`: the order in which tiles entered the ordered section.
    pub order: Vec<u32>,
}

/// Stream `num_tiles` tiles of `[64, 64]` bf16 (rows `64 t ..` of `input`) through the
/// producer/consumer ring of `smoke_pingpong`.
pub fn pingpong(
    gpu: &Gpu,
    stream: &Stream,
    input: &DeviceBuffer<bf16>,
    num_tiles: u32,
) -> Result<PingpongOutput> {
    let elems = num_tiles as usize * PINGPONG_TILE_ELEMS as usize;
    let mut out = poisoned::<f32>(elems)?;
    let mut order = poisoned::<u32>(num_tiles as usize)?;
    let mut counter = zeroed::<u32>(1)?;
    pingpong_launch(
        gpu,
        stream,
        input,
        num_tiles,
        &mut out,
        &mut order,
        &mut counter,
    )?;
    gpu.sync(stream, "smoke_pingpong")?;
    Ok(PingpongOutput {
        out: download(&out)?,
        order: download(&order)?,
    })
}

/// Launch `smoke_pingpong` (asynchronous). `counter` must hold zero.
pub fn pingpong_launch(
    gpu: &Gpu,
    stream: &Stream,
    input: &DeviceBuffer<bf16>,
    num_tiles: u32,
    out: &mut DeviceBuffer<f32>,
    order: &mut DeviceBuffer<u32>,
    counter: &mut DeviceBuffer<u32>,
) -> Result<()> {
    require_hopper(gpu, "smoke_pingpong")?;
    if num_tiles == 0 {
        return Err(Error::invalid("num_tiles", "must be at least 1"));
    }
    let elems = num_tiles as usize * PINGPONG_TILE_ELEMS as usize;
    check_len("input", elems, input.len())?;
    check_len("out", elems, out.len())?;
    check_len("order", num_tiles as usize, order.len())?;
    check_len("counter", 1, counter.len())?;
    let tmap = TiledMap {
        address: device_ptr(input),
        dtype: MapDtype::Bf16,
        dims: &[
            PINGPONG_TILE_COLS as u64,
            num_tiles as u64 * PINGPONG_TILE_ROWS as u64,
        ],
        strides_bytes: &[PINGPONG_TILE_COLS as u64 * 2],
        box_dims: &[PINGPONG_TILE_COLS, PINGPONG_TILE_ROWS],
        swizzle: MapSwizzle::None,
    }
    .encode()?;
    let params = PingpongParams {
        tmap,
        out: device_ptr(out) as *mut f32,
        order: device_ptr(order) as *mut u32,
        counter: device_ptr(counter) as *mut u32,
        num_tiles,
    };
    let launch = Launch::new(&SMOKE_PINGPONG, (1, 1, 1), (), params);
    // SAFETY: the map covers num_tiles tiles of `input`; out, order and counter are sized as
    // the kernel documents (checked); the caller guarantees counter is zero.
    unsafe { gpu.launch(stream, &launch) }
}

/// What [`pingpong`] must produce in `out` (computed in f32, as the kernel does: exact).
pub fn pingpong_reference(input: &[bf16], num_tiles: u32) -> Vec<f32> {
    let per = PINGPONG_TILE_ELEMS as usize;
    (0..num_tiles as usize * per)
        .map(|i| 2.0 * input[i].to_f32() + (i / per) as f32)
        .collect()
}

// ---------------------------------------------------------------------------------------------

/// One problem of [`numerics`]: `d = c + a b` by one bf16 `mma.sync.m16n8k16`.
#[derive(Clone, Debug)]
pub struct MmaProbe {
    /// `[16 (m), 16 (k)]`, row-major.
    pub a: Vec<bf16>,
    /// `[8 (n), 16 (k)]`: B transposed.
    pub b_t: Vec<bf16>,
    /// `[16, 8]` accumulators, row-major.
    pub c: Vec<f32>,
}

/// What `smoke_numerics` computed: `ex2.approx.ftz` and `cvt.rn.bf16` of each scalar, and
/// `d` (`[16, 8]`, row-major) of each mma probe.
#[derive(Clone, Debug)]
pub struct NumericsResult {
    /// `ex2.approx.ftz.f32(x)`.
    pub ex2: Vec<f32>,
    /// `cvt.rn.bf16x2.f32` of `x`.
    pub bf16: Vec<bf16>,
    /// `c + a b` per probe.
    pub d: Vec<Vec<f32>>,
}

/// Run `smoke_numerics` on the scalars `x` and the mma probes.
pub fn numerics(
    gpu: &Gpu,
    stream: &Stream,
    x: &[f32],
    probes: &[MmaProbe],
) -> Result<NumericsResult> {
    for p in probes {
        check_len("mma probe a", 256, p.a.len())?;
        check_len("mma probe b_t", 128, p.b_t.len())?;
        check_len("mma probe c", 128, p.c.len())?;
    }
    let scalars =
        u32::try_from(x.len()).map_err(|_| Error::invalid("x", "more than 2^32 - 1 values"))?;
    let tiles = u32::try_from(probes.len())
        .map_err(|_| Error::invalid("probes", "more than 2^32 - 1 probes"))?;
    // Buffers of at least one element (cust does not allocate empty ones).
    let pad = |mut v: Vec<f32>| {
        if v.is_empty() {
            v.push(0.0);
        }
        v
    };
    let x_dev = kernels::memory::upload(&pad(x.to_vec()))?;
    let a: Vec<bf16> = probes.iter().flat_map(|p| p.a.iter().copied()).collect();
    let b: Vec<bf16> = probes.iter().flat_map(|p| p.b_t.iter().copied()).collect();
    let c: Vec<f32> = probes.iter().flat_map(|p| p.c.iter().copied()).collect();
    let a_dev = kernels::memory::upload(&if a.is_empty() { vec![bf16::ZERO] } else { a })?;
    let b_dev = kernels::memory::upload(&if b.is_empty() { vec![bf16::ZERO] } else { b })?;
    let c_dev = kernels::memory::upload(&pad(c))?;
    let ex2 = poisoned::<f32>(x.len().max(1))?;
    let bf = poisoned::<bf16>(x.len().max(1))?;
    let d = poisoned::<f32>((probes.len() * 128).max(1))?;
    let params = NumericsParams {
        x: device_ptr(&x_dev) as *const f32,
        ex2: device_ptr(&ex2) as *mut f32,
        bf16: device_ptr(&bf) as *mut u16,
        scalars,
        tiles,
        a: device_ptr(&a_dev) as *const u16,
        b: device_ptr(&b_dev) as *const u16,
        c: device_ptr(&c_dev) as *const f32,
        d: device_ptr(&d) as *mut f32,
    };
    let launch = Launch::new(&SMOKE_NUMERICS, (1, 1, 1), (), params);
    // SAFETY: x, ex2, bf16 hold `scalars` elements, a/b/c/d `tiles` tiles of the documented
    // sizes (checked above); cust allocations are 256-byte aligned.
    unsafe { gpu.launch(stream, &launch)? };
    gpu.sync(stream, "smoke_numerics")?;
    let mut ex2_h = download(&ex2)?;
    let mut bf_h = download(&bf)?;
    ex2_h.truncate(x.len());
    bf_h.truncate(x.len());
    let d_h = download(&d)?;
    Ok(NumericsResult {
        ex2: ex2_h,
        bf16: bf_h,
        d: (0..probes.len())
            .map(|m| d_h[m * 128..(m + 1) * 128].to_vec())
            .collect(),
    })
}
