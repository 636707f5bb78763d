//! `mhc_fwd_coeff` and `mhc_bwd_coeff`: the per-token coefficient maps (norm, gains, sigmoids,
//! Sinkhorn-Knopp) and their backward, one 8-lane group per token.
//!
//! # Parameters
//! [`FwdCoeffParams`], [`BwdCoeffParams`] (`kernel_abi::mhc`). `n <= 8` is a run-time value:
//! every per-lane array has 8 entries, and entries past `n` are kept at zero.
//!
//! # Thread mapping
//! `COEFF_THREADS` = 128 threads = 16 groups of 8 lanes; group `q` of block `b` owns token
//! `16 b + q` (groups past `T` compute on zeros and write nothing to global memory). Lane
//! `i` of a group owns row `i` of the `n x n` matrices and `H_pre[i]`, `H_post[i]`; lanes
//! `i >= n` hold zero rows. A column step is a reduce-scatter over the group's 8 lanes (lane `j`
//! ends with the sum of column `j`: 7 shuffles), one reciprocal per lane, and an all-gather (7
//! shuffles), so every lane holds the whole column vector; each column is summed by one lane in
//! a fixed order. Each lane loads its own coefficients (`H_pre[i]`, `H_post[i]`, row `i` of
//! `H_res`: the `n + 2` columns it owns) and their biases before anything else, so a group's
//! loads are one round trip to memory. Reciprocals are `rcp.approx` (within 1 ulp).
//!
//! Sinkhorn-Knopp is computed in its scaling form, which is the alternating normalisation of the
//! specification exactly rewritten: with `P0 = exp(z - rowmax z)` (the row shift cancels in the
//! first row normalisation), iteration `t` is `u(t) = 1 / (P0 v(t-1))` (rows), then
//! `v(t) = 1 / (P0^T u(t))` (columns), `v(0) = 1`, and `H_res = diag(u(T)) P0 diag(v(T))`.
//!
//! The backward runs the iterations in reverse with the adjoints of those two maps
//! (`da = -dv v(t)^2`, `du += P0 da`, `dP0 += u(t) da`; `db = -du u(t)^2`, `dv = P0^T db`,
//! `dP0 += db v(t-1)`), from `dP0 = G u v`, `du = (G P0) v`, `dv = P0^T (G u)` with
//! `G = dL/dH_res`; then `dz = dP0 * P0`. The iterates `u(t)` and `v(t)` of the forward
//! recomputation are kept in shared memory (2 floats per lane and iteration), so the backward is
//! `O(t_max n^2)` per token; hence `t_max <= MAX_SINKHORN_ITERS`.
//!
//! # Barrier protocol
//! `mhc_fwd_coeff`: none (shuffles only, all 128 threads in uniform control flow).
//!
//! `mhc_bwd_coeff`:
//! 1. During the forward recomputation, each lane stores its own `u(t)` and `v(t)[i]` at
//!    `[t][0|1][tid]` (one writer per word).
//! 2. `sync_threads`: every iterate is visible to the other lanes of its group.
//! 3. The reverse iterations read their group's `v(t)[j]` (words of lanes `j`), and nothing more
//!    is written to that area.
//! 4. Each group writes its token's `dz` (`M` words, each by the one lane owning that
//!    coefficient) and the three `dalpha` terms (lane 0) into its own row of the reduction area.
//! 5. `sync_threads`: the rows are visible.
//! 6. Thread `m < M + 3` sums column `m` over the 16 rows, in row order, into
//!    `part_coef[block][m]`: each `(token, coefficient)` is added exactly once.

use crate::arch::{index, math, smem, sync, warp};
use kernel_abi::mhc::*;

/// Lanes per group (= the largest `n`).
const G: usize = GROUP as usize;

/// Sum of `v` over the calling lane's group of 8 (all 32 lanes of the warp call it).
#[inline(always)]
unsafe fn group_sum(mut v: f32) -> f32 {
    // SAFETY: forwarded to the caller (all lanes execute this).
    unsafe {
        v += warp::shfl_xor_f32(warp::FULL_MASK, v, 1);
        v += warp::shfl_xor_f32(warp::FULL_MASK, v, 2);
        v += warp::shfl_xor_f32(warp::FULL_MASK, v, 4);
    }
    v
}

/// Column sums of the group's rows: lane `i` of the group passes its row `a` (8 values) and
/// receives `sum over lanes l of a_l[i]`, the sum of column `i` (a reduce-scatter by halves:
/// 4 + 2 + 1 shuffles instead of 8 butterflies of 3). Each column is summed by one lane, in a
/// fixed order. All 32 lanes of the warp call it.
#[inline(always)]
unsafe fn group_column_sum(a: &[f32; G], lane: u32) -> f32 {
    let (b2, b1, b0) = (lane & 4 != 0, lane & 2 != 0, lane & 1 != 0);
    let mut q = [0.0f32; 4];
    for k in 0..4 {
        let (keep, send) = if b2 {
            (a[k + 4], a[k])
        } else {
            (a[k], a[k + 4])
        };
        // SAFETY: forwarded to the caller (all lanes execute this).
        q[k] = keep + unsafe { warp::shfl_xor_f32(warp::FULL_MASK, send, 4) };
    }
    let mut h = [0.0f32; 2];
    for k in 0..2 {
        let (keep, send) = if b1 {
            (q[k + 2], q[k])
        } else {
            (q[k], q[k + 2])
        };
        // SAFETY: as above.
        h[k] = keep + unsafe { warp::shfl_xor_f32(warp::FULL_MASK, send, 2) };
    }
    let (keep, send) = if b0 { (h[1], h[0]) } else { (h[0], h[1]) };
    // SAFETY: as above.
    keep + unsafe { warp::shfl_xor_f32(warp::FULL_MASK, send, 1) }
}

/// All-gather: lane `i` of the group passes `x`, every lane receives `[x_0, .., x_7]` (1 + 2 + 4
/// shuffles). All 32 lanes of the warp call it.
#[inline(always)]
unsafe fn group_gather(x: f32, lane: u32) -> [f32; G] {
    let mut out = [0.0f32; G];
    out[0] = x;
    let mut have = 1;
    let mut bit = 1u32;
    while bit < GROUP {
        // `out[..have]` holds the values of the aligned block of `have` lanes that contains
        // this lane, in lane order; the partner `lane ^ bit` holds the adjacent block.
        let mut got = [0.0f32; G];
        for k in 0..G / 2 {
            if k < have {
                // SAFETY: forwarded to the caller (uniform: `have` is the same on every lane).
                got[k] = unsafe { warp::shfl_xor_f32(warp::FULL_MASK, out[k], bit) };
            }
        }
        let upper = lane & bit != 0;
        let mut next = [0.0f32; G];
        for k in 0..G {
            if k < 2 * have {
                let (mine, other) = if k < have {
                    (out[k], got[k])
                } else {
                    (out[k - have], got[k - have])
                };
                // The lower half of the doubled block is the lane with `bit` clear.
                next[k] = if (k < have) != upper { mine } else { other };
            }
        }
        out = next;
        have *= 2;
        bit *= 2;
    }
    out
}

#[inline(always)]
fn sigmoid(z: f32) -> f32 {
    1.0 / (1.0 + math::exp(-z))
}

/// A lane's view of the Sinkhorn state of its token: row `i` of `P0`, `u(T)[i]`, and all of
/// `v(T)` (replicated in the group).
struct Sinkhorn {
    p0: [f32; G],
    u: f32,
    v: [f32; G],
}

/// Per-iterate storage of the backward: `u(t)` and `v(t)[i]` of every lane, at
/// `[(2 t) COEFF_THREADS + tid]` and `[(2 t + 1) COEFF_THREADS + tid]` (t from 0).
#[derive(Clone, Copy)]
struct Iterates {
    words: smem::SmemArray<f32>,
    tid: u32,
}

impl Iterates {
    fn u_at(it: u32, tid: u32) -> u32 {
        2 * it * COEFF_THREADS + tid
    }
    fn v_at(it: u32, tid: u32) -> u32 {
        (2 * it + 1) * COEFF_THREADS + tid
    }
}

/// The logits `z[j] = a_res h~[res(row, j)] + b[res(row, j)]` of row `row` from the lane's own
/// coefficients and biases (zeros outside `n x n`).
#[inline(always)]
fn res_logits(n: u32, row: u32, a_res: f32, h: &[f32; OWN], bias: &[f32; OWN]) -> [f32; G] {
    let mut z = [0.0f32; G];
    for j in 0..G {
        if row < n && (j as u32) < n {
            z[j] = a_res * h[2 + j] + bias[2 + j];
        }
    }
    z
}

/// Sinkhorn-Knopp in scaling form (module documentation), optionally storing the iterates.
#[inline(always)]
unsafe fn sinkhorn(
    z: &[f32; G],
    n: u32,
    row: u32,
    iters: u32,
    store: Option<Iterates>,
) -> Sinkhorn {
    let row_ok = row < n;
    let mut mx = 0.0f32;
    for j in 0..G {
        if row_ok && (j as u32) < n {
            mx = if j == 0 { z[j] } else { mx.max(z[j]) };
        }
    }
    let mut p0 = [0.0f32; G];
    let mut v = [0.0f32; G];
    for j in 0..G {
        if row_ok && (j as u32) < n {
            p0[j] = math::exp(z[j] - mx);
        }
        if (j as u32) < n {
            v[j] = 1.0;
        }
    }
    let mut u = 0.0f32;
    let mut it = 0;
    while it < iters {
        let mut b = 0.0f32;
        for j in 0..G {
            b += p0[j] * v[j];
        }
        u = if row_ok { math::rcp(b) } else { 0.0 };
        let mut pu = [0.0f32; G];
        for j in 0..G {
            pu[j] = p0[j] * u;
        }
        // Lane `row` sums column `row` and normalises it; every lane gets all of `v`.
        // SAFETY: all lanes execute these (uniform loop over `iters`).
        let col = unsafe { group_column_sum(&pu, row) };
        let own_v = if row_ok { math::rcp(col) } else { 0.0 };
        // SAFETY: as above.
        v = unsafe { group_gather(own_v, row) };
        if let Some(s) = store {
            // SAFETY: it < iters and tid < COEFF_THREADS: inside the iterate area; each word
            // has this one writer (barrier protocol step 1).
            unsafe {
                s.words.store(Iterates::u_at(it, s.tid), u);
                s.words.store(Iterates::v_at(it, s.tid), own_v);
            }
        }
        it += 1;
    }
    Sinkhorn { p0, u, v }
}

/// `dL/dP0` of row `row` from `g = dL/dH_res` (row `row`), through every iteration in reverse.
#[inline(always)]
unsafe fn sinkhorn_backward(
    sk: &Sinkhorn,
    g: &[f32; G],
    n: u32,
    row: u32,
    iters: u32,
    store: Iterates,
) -> [f32; G] {
    let group_base = store.tid - row;
    let mut dp = [0.0f32; G];
    let mut du = 0.0f32;
    let mut gup = [0.0f32; G];
    for j in 0..G {
        dp[j] = g[j] * sk.u * sk.v[j];
        du += g[j] * sk.p0[j] * sk.v[j];
        gup[j] = g[j] * sk.u * sk.p0[j];
    }
    // SAFETY: all lanes execute these.
    let mut dv = unsafe { group_gather(group_column_sum(&gup, row), row) };
    let mut it = iters;
    while it > 0 {
        it -= 1;
        // Iteration t = it + 1 (0-based storage index `it`).
        let mut vt = [0.0f32; G];
        let mut vprev = [0.0f32; G];
        // SAFETY: it < iters, group_base + j < COEFF_THREADS: inside the iterate area, written
        // before the barrier that precedes this call (barrier protocol steps 1-2).
        let ut = unsafe { store.words.load(Iterates::u_at(it, store.tid)) };
        for j in 0..G {
            // SAFETY: as above.
            vt[j] = unsafe { store.words.load(Iterates::v_at(it, group_base + j as u32)) };
            vprev[j] = if it == 0 {
                if (j as u32) < n { 1.0 } else { 0.0 }
            } else {
                // SAFETY: as above (it - 1 < iters).
                unsafe {
                    store
                        .words
                        .load(Iterates::v_at(it - 1, group_base + j as u32))
                }
            };
        }
        // Columns: v(t) = 1 / (P0^T u(t)).
        for j in 0..G {
            let da = -dv[j] * vt[j] * vt[j];
            du += sk.p0[j] * da;
            dp[j] += ut * da;
        }
        // Rows: u(t) = 1 / (P0 v(t - 1)).
        let db = if row < n { -du * ut * ut } else { 0.0 };
        let mut pdb = [0.0f32; G];
        for j in 0..G {
            pdb[j] = sk.p0[j] * db;
            dp[j] += db * vprev[j];
        }
        // SAFETY: all lanes execute these (uniform loop over `iters`).
        dv = unsafe { group_gather(group_column_sum(&pdb, row), row) };
        du = 0.0;
    }
    dp
}

/// Column of entry `e` of a lane's coefficients (`e = 0`: `H_pre[row]`, `1`: `H_post[row]`,
/// `2 + j`: `H_res[row][j]`), and whether it exists (`row < n`, `j < n`).
#[inline(always)]
fn own_col(n: u32, row: u32, e: usize) -> Option<u32> {
    if row >= n {
        None
    } else if e == 0 {
        Some(row)
    } else if e == 1 {
        Some(post_col(n, row))
    } else if ((e - 2) as u32) < n {
        Some(res_col(n, row, (e - 2) as u32))
    } else {
        None
    }
}

/// Entries of a lane's coefficients: `pre`, `post`, and a row of `res`.
const OWN: usize = G + 2;

/// `bias` at the lane's coefficients (zeros where they do not exist).
///
/// # Safety
/// `bias` holds `M` values.
#[inline(always)]
unsafe fn own_bias(bias: *const f32, n: u32, row: u32) -> [f32; OWN] {
    let mut b = [0.0f32; OWN];
    for e in 0..OWN {
        if let Some(c) = own_col(n, row, e) {
            // SAFETY: c < M (the caller's contract on `bias`).
            b[e] = unsafe { *bias.add(c as usize) };
        }
    }
    b
}

/// See the module documentation.
///
/// # Safety
/// Grid of `ceil(T / COEFF_TOKENS)` blocks of `COEFF_THREADS` threads, no shared memory;
/// `2 <= n <= 8`; the pointers hold the documented sizes.
#[inline(always)]
pub unsafe fn forward(p: FwdCoeffParams) {
    let tid = index::thread_idx_x();
    let row = tid % GROUP;
    let tok = index::block_idx_x() * COEFF_TOKENS + tid / GROUP;
    let valid = tok < p.tokens;
    let (n, mm) = (p.n, m_of(p.n));
    let tokens = p.tokens as usize;
    // Every load first (one round trip to memory): the partial sums of squares, the split
    // partials of the lane's own coefficients, the gains and biases.
    let mut sumsq = 0.0f32;
    let mut h = [0.0f32; OWN];
    if valid {
        for s in 0..p.splits as usize {
            // SAFETY: s < splits and tok < T: inside `part_sumsq [splits, T]`.
            sumsq += unsafe { *p.part_sumsq.add(s * tokens + tok as usize) };
            let at = (s * tokens + tok as usize) * mm as usize;
            for e in 0..OWN {
                if let Some(c) = own_col(n, row, e) {
                    // SAFETY: s < splits, tok < T, c < M: inside `part_proj [splits, T, M]`.
                    h[e] += unsafe { *p.part_proj.add(at + c as usize) };
                }
            }
        }
    }
    // SAFETY: `alpha` holds 3 values, `bias` M (launch contract).
    let (a, bias) = unsafe {
        (
            [*p.alpha, *p.alpha.add(1), *p.alpha.add(2)],
            own_bias(p.bias, n, row),
        )
    };
    let r = math::sqrt(sumsq / p.k as f32 + p.eps);
    for e in 0..OWN {
        h[e] /= r;
    }

    if valid && row < n {
        for e in 0..OWN {
            if let Some(c) = own_col(n, row, e) {
                // SAFETY: tok < T, c < M: inside `hproj [T, M]` (each column has one owner).
                unsafe { *p.hproj.add(tok as usize * mm as usize + c as usize) = h[e] };
            }
        }
        let i = tok as usize * n as usize + row as usize;
        // SAFETY: row < n: i inside `h_pre`, `h_post [T, n]`.
        unsafe {
            *p.h_pre.add(i) = sigmoid(a[0] * h[0] + bias[0]);
            *p.h_post.add(i) = 2.0 * sigmoid(a[1] * h[1] + bias[1]);
        }
    }
    // SAFETY: all lanes reach the shuffles inside (uniform).
    let sk = unsafe { sinkhorn(&res_logits(n, row, a[2], &h, &bias), n, row, p.iters, None) };
    if valid && row < n {
        for j in 0..G {
            if (j as u32) < n {
                let idx = (tok as usize * n as usize + row as usize) * n as usize + j;
                // SAFETY: row, j < n: inside `h_res [T, n, n]`.
                unsafe { *p.h_res.add(idx) = sk.u * sk.p0[j] * sk.v[j] };
            }
        }
    }
    if valid && row == 0 {
        // SAFETY: tok < T: inside `rms [T]`.
        unsafe { *p.rms.add(tok as usize) = r };
    }
}

/// See the module documentation.
///
/// # Safety
/// Grid of `ceil(T / COEFF_TOKENS)` blocks of `COEFF_THREADS` threads,
/// `bwd_coeff_smem_bytes(iters)` of dynamic shared memory; `2 <= n <= 8`,
/// `1 <= iters <= MAX_SINKHORN_ITERS`; the pointers hold the documented sizes.
#[inline(always)]
pub unsafe fn backward(p: BwdCoeffParams) {
    let tid = index::thread_idx_x();
    let row = tid % GROUP;
    let group = tid / GROUP;
    let tok = index::block_idx_x() * COEFF_TOKENS + group;
    let valid = tok < p.tokens;
    let (n, mm, m16) = (p.n, m_of(p.n), m16_of(p.n));
    let tu = tok as usize;
    let r = if valid {
        // SAFETY: tok < T: inside `rms`.
        unsafe { *p.rms.add(tu) }
    } else {
        1.0
    };
    // Every load first (one round trip): the lane's own `h~` and `dL/dH` entries and biases.
    let (mut h, mut dh) = ([0.0f32; OWN], [0.0f32; OWN]);
    if valid {
        for e in 0..OWN {
            if let Some(c) = own_col(n, row, e) {
                let at = tu * mm as usize + c as usize;
                // SAFETY: tok < T, c < M: inside `hproj [T, M]` and `dh [T, M]`.
                unsafe {
                    h[e] = *p.hproj.add(at);
                    dh[e] = *p.dh.add(at);
                }
            }
        }
    }
    // SAFETY: `bias` holds M values (launch contract).
    let bias = unsafe { own_bias(p.bias, n, row) };
    // SAFETY: `alpha` holds 3 values (launch contract).
    let a = unsafe { [*p.alpha, *p.alpha.add(1), *p.alpha.add(2)] };
    let base = smem::aligned_base();
    let store = Iterates {
        words: smem::SmemArray::new(base, p.iters * 2 * COEFF_THREADS),
        tid,
    };
    let red = smem::SmemArray::<f32>::new(
        base + bwd_coeff_reduce_offset(p.iters) as u32,
        COEFF_TOKENS * COEF_PARTIAL,
    );

    let (mut dz_pre, mut dz_post) = (0.0f32, 0.0f32);
    if row < n {
        let s = sigmoid(a[0] * h[0] + bias[0]);
        dz_pre = dh[0] * s * (1.0 - s);
        let s = sigmoid(a[1] * h[1] + bias[1]);
        dz_post = dh[1] * 2.0 * s * (1.0 - s);
    }
    // SAFETY: all lanes reach the shuffles (uniform); the iterate area is
    // `iters * 2 * COEFF_THREADS` words of the launch's shared memory.
    let sk = unsafe {
        let z = res_logits(n, row, a[2], &h, &bias);
        sinkhorn(&z, n, row, p.iters, Some(store))
    };
    // SAFETY: every thread reaches this barrier once (no early exit in this kernel).
    unsafe { sync::sync_threads() };
    let mut g = [0.0f32; G];
    g.copy_from_slice(&dh[2..]);
    // SAFETY: uniform control flow; iterates published by the barrier above.
    let dp0 = unsafe { sinkhorn_backward(&sk, &g, n, row, p.iters, store) };
    let mut dz_res = [0.0f32; G];
    for j in 0..G {
        dz_res[j] = dp0[j] * sk.p0[j];
    }

    // u = alpha_g dz / r (zero padded to m16), and the dalpha terms sum(dz h~) per group.
    let (mut da_pre, mut da_post, mut da_res) = (0.0f32, 0.0f32, 0.0f32);
    if row < n {
        let c = post_col(n, row);
        da_pre = dz_pre * h[0];
        da_post = dz_post * h[1];
        if valid {
            let out = tu * m16 as usize;
            // SAFETY: tok < T, row, c < M <= m16: inside `u [T, m16]`.
            unsafe {
                *p.u.add(out + row as usize) = a[0] * dz_pre / r;
                *p.u.add(out + c as usize) = a[1] * dz_post / r;
            }
        }
        for j in 0..G {
            if (j as u32) < n {
                let c = res_col(n, row, j as u32);
                da_res += dz_res[j] * h[2 + j];
                if valid {
                    // SAFETY: c < M <= m16: inside `u`.
                    unsafe { *p.u.add(tu * m16 as usize + c as usize) = a[2] * dz_res[j] / r };
                }
            }
        }
    }
    let mut m = mm + row;
    while m < m16 {
        if valid {
            // SAFETY: m < m16: inside `u`.
            unsafe { *p.u.add(tu * m16 as usize + m as usize) = 0.0 };
        }
        m += GROUP;
    }
    // SAFETY: all lanes execute these.
    let (da_pre, da_post, da_res) =
        unsafe { (group_sum(da_pre), group_sum(da_post), group_sum(da_res)) };
    if valid && row == 0 {
        let dot = a[0] * da_pre + a[1] * da_post + a[2] * da_res;
        // SAFETY: tok < T: inside `xcoef`.
        unsafe { *p.xcoef.add(tu) = -dot / (p.k as f32 * r * r) };
    }

    // Block partials of dbias and dalpha (barrier protocol steps 4-6).
    let slot = group * COEF_PARTIAL;
    // SAFETY: every index is < slot + M + 3 <= (group + 1) COEF_PARTIAL = inside this group's
    // row; each word has one writer (the lane owning the coefficient, or lane 0).
    unsafe {
        if row < n {
            red.store(slot + row, dz_pre);
            red.store(slot + post_col(n, row), dz_post);
            for j in 0..G {
                if (j as u32) < n {
                    red.store(slot + res_col(n, row, j as u32), dz_res[j]);
                }
            }
        }
        if row == 0 {
            red.store(slot + mm, da_pre);
            red.store(slot + mm + 1, da_post);
            red.store(slot + mm + 2, da_res);
        }
        sync::sync_threads();
    }
    if tid < mm + 3 {
        let mut acc = 0.0f32;
        for q in 0..COEFF_TOKENS {
            // SAFETY: written by group q before the barrier (every column < M + 3 of every row).
            acc += unsafe { red.load(q * COEF_PARTIAL + tid) };
        }
        let out = index::block_idx_x() as usize * COEF_PARTIAL as usize + tid as usize;
        // SAFETY: block < gridDim.x rows of `part_coef`, tid < COEF_PARTIAL.
        unsafe { *p.part_coef.add(out) = acc };
    }
}
