//! The epilogue of the `mma.sync` kernel: the row sums finished across the quad, O normalized
//! and stored, and the LSE.

use super::super::elem::Elem;
use super::super::logits::finish_row;
use super::super::seq::Layout;
use super::mainloop::Warp;
use crate::arch::{math, warp};

/// Finish the row sums across the quad, normalize, store O and LSE (rows with no allowed key
/// get O = 0 and LSE = -inf). With `CAPSINK`, every row's softmax also takes the sink `sink2`
/// (base 2; -inf for none) through [`finish_row`].
#[inline(always)]
pub(super) fn store_output<
    L: Layout,
    E: Elem,
    const MT: usize,
    const DT: usize,
    const CAPSINK: bool,
>(
    pp: &L::Params,
    seq: &L,
    w: &Warp,
    o: &[[[f32; 4]; DT]; MT],
    row_max: &[[f32; 2]; MT],
    row_sum: &[[f32; 2]; MT],
    sink2: f32,
) {
    let p = L::base(pp);
    let o_base = p.o.wrapping_add(seq.o_offset(pp) as usize);
    for mt in 0..MT {
        for h in 0..2 {
            let mut sum = row_sum[mt][h];
            // SAFETY: all 32 lanes execute these shuffles.
            unsafe {
                sum += warp::shfl_xor_f32(warp::FULL_MASK, sum, 1);
                sum += warp::shfl_xor_f32(warp::FULL_MASK, sum, 2);
            }
            let (inv, lse) = if CAPSINK {
                finish_row(row_max[mt][h], sum, sink2)
            } else if sum > 0.0 {
                (1.0 / sum, (row_max[mt][h] + math::log2(sum)) * math::LN_2)
            } else {
                (0.0, f32::NEG_INFINITY)
            };
            let row = w.warp_row + 16 * mt as u32 + w.g + 8 * h as u32;
            if row < w.rows_valid {
                let i = w.m0 + row;
                let dst = o_base.wrapping_add((i as u64 * p.o_strides[1]) as usize);
                for d in 0..DT {
                    let v = E::pack(o[mt][d][2 * h] * inv, o[mt][d][2 * h + 1] * inv);
                    // SAFETY: row i < seq_q of the sequence and column 8 d + 2 t + 1 < D_v: inside O; the address
                    // is 4-byte aligned (16-byte aligned rows, even column).
                    unsafe { *(dst.wrapping_add(8 * d + 2 * w.t as usize) as *mut u32) = v };
                }
                if w.t == 0 {
                    let idx = seq.lse_index(pp, i);
                    // SAFETY: row i < seq_q of this (sequence, head): inside LSE.
                    unsafe { *p.lse.add(idx as usize) = lse };
                }
            }
        }
    }
}
