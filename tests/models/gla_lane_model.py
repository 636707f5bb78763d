"""Lane-level model of one chunk step of `gla_fwd` (gpu-kernels/src/gla): the element-wise phase
(per thread, with the warp shuffles of its scan) and the matrix phase (per warp), transcribing the
kernel's shared-memory address formulas and the PTX semantics of `ldmatrix` (.x2/.x4, .trans) and
`mma.sync.m16n8k16` fragments, checked against the chunk step computed directly from the
recurrence. It checks the kernel's index mappings without a GPU (the Rust tests check the whole
kernel on one). Pure Python, no dependencies:

    python3 tests/models/gla_lane_model.py      # ~3 s, prints the errors, fails on > 1e-2

Keep it in step with the kernel when its mappings change."""
import math
import random
import struct
import sys

LOG2E = 1.4426950408889634
G_FLOOR = -20.0


def f32(x):
    return struct.unpack('f', struct.pack('f', x))[0] if math.isfinite(x) else x


def bf16(x):
    if not math.isfinite(x):
        return x
    b = struct.unpack('I', struct.pack('f', x))[0]
    lsb = (b >> 16) & 1
    b = (b + 0x7FFF + lsb) & 0xFFFF0000
    return struct.unpack('f', struct.pack('I', b))[0]


def exp2(x):
    try:
        return f32(2.0 ** x)
    except OverflowError:
        return math.inf


class Smem:
    def __init__(self):
        self.h = {}  # 2-byte element address -> value
        self.w = {}  # 4-byte f32 address -> value

    def st_pair(self, addr, lo, hi):
        assert addr % 4 == 0
        self.h[addr] = bf16(lo)
        self.h[addr + 2] = bf16(hi)

    def ld_pair(self, addr):
        return (self.h[addr], self.h[addr + 2])

    def row8(self, addr):
        assert addr % 16 == 0, addr
        return [self.h[addr + 2 * i] for i in range(8)]


def ldmatrix(sm, addrs, n, trans):
    """addrs[lane]; returns regs[lane][j] = (lo, hi)."""
    mats = []
    for j in range(n):
        rows = [sm.row8(addrs[8 * j + i]) for i in range(8)]
        mats.append(rows)
    out = []
    for l in range(32):
        g, t = l // 4, l % 4
        regs = []
        for j in range(n):
            M = mats[j]
            if trans:
                regs.append((M[2 * t][g], M[2 * t + 1][g]))
            else:
                regs.append((M[g][2 * t], M[g][2 * t + 1]))
        out.append(regs)
    return out


def mma(c, a, b):
    """c[lane] = [4 floats], a[lane] = 4 pairs, b[lane] = 2 pairs (bf16 values)."""
    A = [[0.0] * 16 for _ in range(16)]
    B = [[0.0] * 8 for _ in range(16)]
    for l in range(32):
        g, t = l // 4, l % 4
        A[g][2 * t], A[g][2 * t + 1] = a[l][0]
        A[g + 8][2 * t], A[g + 8][2 * t + 1] = a[l][1]
        A[g][2 * t + 8], A[g][2 * t + 9] = a[l][2]
        A[g + 8][2 * t + 8], A[g + 8][2 * t + 9] = a[l][3]
        B[2 * t][g], B[2 * t + 1][g] = b[l][0]
        B[2 * t + 8][g], B[2 * t + 9][g] = b[l][1]
    for l in range(32):
        g, t = l // 4, l % 4
        for e in range(4):
            r = g + 8 * (e // 2)
            col = 2 * t + e % 2
            acc = c[l][e]
            s = 0.0
            ok = True
            for k in range(16):
                p = A[r][k] * B[k][col]
                s += p
            c[l][e] = f32(acc + s)


def pack(lo, hi):
    return (bf16(lo), bf16(hi))


def simulate(DK, DV, q, k, g, v, S0, valid):
    """One chunk. q,k,g: [16][DK] bf16 floats (zero rows past valid), v: [16][DV], S0 [DK][DV]
    f32. Returns (o [16][DV] f32 before bf16 / scale, S_new [DK][DV])."""
    THREADS = 2 * DV
    P = THREADS // (DK // 2)
    TPT = 16 // P
    RB = DK * 2 + 16
    RBV = DV * 2 + 16
    sm = Smem()
    # raw tiles at separate bases
    RAW_Q, RAW_K, RAW_G, RAW_V = 0, 100000, 200000, 300000
    QI, QD, K0, K1, KS, DEC = 400000, 500000, 600000, 700000, 800000, 900000
    for r in range(16):
        for d in range(0, DK, 2):
            sm.st_pair(RAW_Q + r * RB + 2 * d, q[r][d], q[r][d + 1])
            sm.st_pair(RAW_K + r * RB + 2 * d, k[r][d], k[r][d + 1])
            sm.st_pair(RAW_G + r * RB + 2 * d, g[r][d], g[r][d + 1])
        for e in range(0, DV, 2):
            sm.st_pair(RAW_V + r * RBV + 2 * e, v[r][e], v[r][e + 1])
    # ---- element-wise phase, per thread, with shuffles emulated across the block ----
    floor2 = f32(G_FLOOR * LOG2E)
    T = {}
    for tid in range(THREADS):
        pair, part = tid // P, tid % P
        col = 4 * pair
        first = part * TPT
        b = []
        acc = [0.0, 0.0]
        for i in range(TPT):
            g0, g1 = sm.ld_pair(RAW_G + (first + i) * RB + col)
            acc = [f32(acc[0] + max(f32(g0 * LOG2E), floor2)), f32(acc[1] + max(f32(g1 * LOG2E), floor2))]
            b.append(list(acc))
        T[tid] = dict(pair=pair, part=part, first=first, b=b, acc=acc)

    def lane_of(tid):
        return tid % 32

    def shfl_up(vals, delta):
        out = {}
        for tid in vals:
            l = tid % 32
            src = tid - delta if l >= delta else tid
            out[tid] = vals[src]
        return out

    def shfl_idx(vals, srclane):
        return {tid: vals[(tid // 32) * 32 + srclane[tid]] for tid in vals}

    incl = {tid: list(T[tid]['acc']) for tid in T}
    off = 1
    while off < P:
        for c in range(2):
            v_ = shfl_up({tid: incl[tid][c] for tid in T}, off)
            for tid in T:
                if T[tid]['part'] >= off:
                    incl[tid][c] = f32(incl[tid][c] + v_[tid])
        off *= 2
    for c in range(2):
        v_ = shfl_up({tid: incl[tid][c] for tid in T}, 1)
        for tid in T:
            ex = 0.0 if T[tid]['part'] == 0 else v_[tid]
            for i in range(TPT):
                T[tid]['b'][i][c] = f32(T[tid]['b'][i][c] + ex)
    for c in range(2):
        base = {tid: lane_of(tid) - T[tid]['part'] for tid in T}
        e0 = shfl_idx({tid: T[tid]['b'][0][c] for tid in T}, base)
        e1 = shfl_idx({tid: T[tid]['b'][TPT - 1][c] for tid in T}, {t: base[t] + P // 2 - 1 for t in T})
        e2 = shfl_idx({tid: T[tid]['b'][0][c] for tid in T}, {t: base[t] + P // 2 for t in T})
        e3 = shfl_idx({tid: T[tid]['b'][TPT - 1][c] for tid in T}, {t: base[t] + P - 1 for t in T})
        for tid in T:
            T[tid].setdefault('edge', [[0, 0] for _ in range(4)])
            T[tid]['edge'][0][c] = e0[tid]
            T[tid]['edge'][1][c] = e1[tid]
            T[tid]['edge'][2][c] = e2[tid]
            T[tid]['edge'][3][c] = e3[tid]
    for tid in T:
        th = T[tid]
        pair, part, first, b, edge = th['pair'], th['part'], th['first'], th['b'], th['edge']
        col = 4 * pair
        b15 = edge[3]
        if part == P - 1:
            sm.w[DEC + 8 * pair] = exp2(b15[0])
            sm.w[DEC + 8 * pair + 4] = exp2(b15[1])
        half = first // 8
        m = [[f32(0.5 * (edge[0][c] + edge[1][c])) for c in range(2)],
             [f32(0.5 * (edge[2][c] + edge[3][c])) for c in range(2)]]
        mh = m[half]
        f_inter = [exp2(mh[c]) for c in range(2)]
        f_10 = [exp2(f32(m[1][c] - m[0][c])) if half == 0 else 1.0 for c in range(2)]
        f_state = [exp2(f32(b15[c] - m[1][c])) for c in range(2)]
        for i in range(TPT):
            row = first + i
            at = row * RB + col
            qq = sm.ld_pair(RAW_Q + at)
            kk_ = sm.ld_pair(RAW_K + at)
            qd, kd, qi, kh1, ks = [0, 0], [0, 0], [0, 0], [0, 0], [0, 0]
            for c in range(2):
                x = f32(b[i][c] - mh[c])
                qd[c] = f32(qq[c] * exp2(x))
                kd[c] = f32(kk_[c] * exp2(-x))
                qi[c] = f32(qd[c] * f_inter[c])
                kh1[c] = f32(kd[c] * f_10[c])
                ks[c] = f32(kh1[c] * f_state[c])
            sm.st_pair(QD + at, *qd)
            sm.st_pair(QI + at, *qi)
            if half == 0:
                sm.st_pair(K0 + at, *kd)
            sm.st_pair(K1 + at, *kh1)
            sm.st_pair(KS + at, *ks)
    # ---- matrix phase per warp ----
    NKK = DK // 16
    NJ = DK // 8
    o_all = [[None] * DV for _ in range(16)]
    S_new = [[None] * DV for _ in range(DK)]
    for w in range(DV // 16):
        dv0 = 16 * w
        wchunk = dv0 // 8
        # state accumulators from S0: st[j][lane][e]
        st = [[[0.0] * 4 for _ in range(32)] for _ in range(NJ)]
        for j in range(NJ):
            for l in range(32):
                gg, t = l // 4, l % 4
                for e in range(4):
                    dk = 8 * j + 2 * t + e % 2
                    dv = dv0 + gg + 8 * (e // 2)
                    st[j][l][e] = S0[dk][dv]
        va = ldmatrix(sm, [RAW_V + ((l // 16) * 8 + l % 8) * RBV + (wchunk + (l // 8) % 2) * 16 for l in range(32)], 4, True)
        o = [[[0.0] * 4 for _ in range(32)] for _ in range(2)]
        x = [[0.0] * 4 for _ in range(32)]
        y = [[0.0] * 4 for _ in range(32)]
        z = [[0.0] * 4 for _ in range(32)]
        for kk in range(NKK):
            kc = 2 * kk
            qa = ldmatrix(sm, [QD + (l % 16) * RB + (kc + l // 16) * 16 for l in range(32)], 4, False)
            b0 = ldmatrix(sm, [K0 + (l % 8) * RB + (kc + (l // 8) % 2) * 16 for l in range(32)], 2, False)
            b1 = ldmatrix(sm, [K1 + (l % 8 + (l // 16) * 8) * RB + (kc + (l // 8) % 2) * 16 for l in range(32)], 4, False)
            mma(x, qa, b0)
            mma(y, qa, [[b1[l][0], b1[l][1]] for l in range(32)])
            mma(z, qa, [[b1[l][2], b1[l][3]] for l in range(32)])
        pa = []
        for l in range(32):
            gg, t = l // 4, l % 4
            keep0 = 2 * t <= gg
            keep1 = 2 * t < gg
            sel = lambda kp, vv: vv if kp else 0.0
            pa.append([pack(sel(keep0, x[l][0]), sel(keep1, x[l][1])), pack(y[l][2], y[l][3]),
                       pack(0.0, 0.0), pack(sel(keep0, z[l][2]), sel(keep1, z[l][3]))])
        vb = ldmatrix(sm, [RAW_V + (l % 16) * RBV + (wchunk + l // 16) * 16 for l in range(32)], 4, True)
        mma(o[0], pa, [[vb[l][0], vb[l][1]] for l in range(32)])
        mma(o[1], pa, [[vb[l][2], vb[l][3]] for l in range(32)])
        for kk in range(NKK):
            kc = 2 * kk
            j0, j1 = 2 * kk, 2 * kk + 1
            b_lo = [[pack(st[j0][l][0], st[j0][l][1]), pack(st[j1][l][0], st[j1][l][1])] for l in range(32)]
            b_hi = [[pack(st[j0][l][2], st[j0][l][3]), pack(st[j1][l][2], st[j1][l][3])] for l in range(32)]
            qa = ldmatrix(sm, [QI + (l % 16) * RB + (kc + l // 16) * 16 for l in range(32)], 4, False)
            mma(o[0], qa, b_lo)
            mma(o[1], qa, b_hi)
            for l in range(32):
                t = l % 4
                dl = [sm.w[DEC + 4 * (16 * kk + 2 * t)], sm.w[DEC + 4 * (16 * kk + 2 * t) + 4]]
                dh = [sm.w[DEC + 4 * (16 * kk + 8 + 2 * t)], sm.w[DEC + 4 * (16 * kk + 8 + 2 * t) + 4]]
                for e in range(4):
                    st[j0][l][e] = f32(st[j0][l][e] * dl[e % 2])
                    st[j1][l][e] = f32(st[j1][l][e] * dh[e % 2])
            kb = ldmatrix(sm, [KS + (l % 16) * RB + (kc + l // 16) * 16 for l in range(32)], 4, True)
            mma(st[j0], va, [[kb[l][0], kb[l][1]] for l in range(32)])
            mma(st[j1], va, [[kb[l][2], kb[l][3]] for l in range(32)])
        for l in range(32):
            gg, t = l // 4, l % 4
            for h in range(2):
                row = gg + 8 * h
                for n in range(2):
                    c0 = dv0 + 8 * n + 2 * t
                    o_all[row][c0] = o[n][l][2 * h]
                    o_all[row][c0 + 1] = o[n][l][2 * h + 1]
        for j in range(NJ):
            for l in range(32):
                gg, t = l // 4, l % 4
                for e in range(4):
                    dk = 8 * j + 2 * t + e % 2
                    dv = dv0 + gg + 8 * (e // 2)
                    S_new[dk][dv] = st[j][l][e]
    return o_all, S_new


def direct(DK, DV, q, k, g, v, S0):
    """Exact chunk step: recurrence over the 16 rows (padded rows: q=k=v=0, g=0), with g clamped."""
    S = [row[:] for row in S0]
    o = []
    for t in range(16):
        for d in range(DK):
            a = math.exp(max(g[t][d], G_FLOOR))
            for e in range(DV):
                S[d][e] = a * S[d][e] + k[t][d] * v[t][e]
        o.append([sum(q[t][d] * S[d][e] for d in range(DK)) for e in range(DV)])
    return o, S


def rel(a, b):
    num = sum((x - y) ** 2 for ra, rb in zip(a, b) for x, y in zip(ra, rb))
    den = sum(y ** 2 for rb in b for y in rb)
    return math.sqrt(num / den)


def run(DK, DV, mode, valid, seed):
    rnd = random.Random(seed)
    def gv():
        if mode == 'zero':
            return 0.0
        if mode == 'strong':
            return -20.0
        if mode == 'spiky':
            return -20.0 if rnd.random() < 0.25 else rnd.uniform(-0.1, 0)
        return rnd.uniform(-1, 0)
    q = [[bf16(rnd.uniform(-1, 1)) if r < valid else 0.0 for _ in range(DK)] for r in range(16)]
    k = [[bf16(rnd.uniform(-1, 1)) if r < valid else 0.0 for _ in range(DK)] for r in range(16)]
    g = [[bf16(gv()) if r < valid else 0.0 for _ in range(DK)] for r in range(16)]
    v = [[bf16(rnd.uniform(-1, 1)) if r < valid else 0.0 for _ in range(DV)] for r in range(16)]
    S0 = [[rnd.uniform(-1, 1) for _ in range(DV)] for _ in range(DK)]
    o, S = simulate(DK, DV, q, k, g, v, S0, valid)
    od, Sd = direct(DK, DV, q, k, g, v, S0)
    eo = rel(o[:valid], od[:valid])
    es = rel(S, Sd)
    print(f"DK {DK} DV {DV} g {mode:6} valid {valid:2}: rel L2 o {eo:.2e}, state {es:.2e}")
    assert eo < 1e-2 and es < 1e-2, (eo, es)


if __name__ == '__main__':
    for (DK, DV) in [(64, 64), (128, 64), (64, 128)]:
        for mode in ['uniform', 'zero', 'strong', 'spiky']:
            for valid in [16, 5]:
                run(DK, DV, mode, valid, DK + DV + valid + len(mode))
    print("ok")
