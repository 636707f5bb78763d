//! Emulated `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32`: the warp's
//! fragments are exchanged and each lane computes its four accumulator elements from the
//! fragment layouts of the PTX ISA (see the device module's documentation).

use super::convert::{bf16_to_f32, f16_to_f32};
use crate::emu::{ctx, warp_exchange};

fn mma(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2], elem: fn(u16) -> f32) {
    let lane = ctx().tid % 32;
    let (g, t) = (lane / 4, lane % 4);
    let words = [
        a[0],
        a[1],
        a[2],
        a[3],
        b[0],
        b[1],
        d[0].to_bits(),
        d[1].to_bits(),
        d[2].to_bits(),
        d[3].to_bits(),
    ];
    let out = warp_exchange(&words, |get| {
        let half = |w: u32, k: u32| {
            elem(if k.is_multiple_of(2) {
                w as u16
            } else {
                (w >> 16) as u16
            })
        };
        // A[row][k]: lane 4 (row % 8) + (k % 8) / 2, register (row / 8) + 2 (k / 8).
        let a_el = |row: u32, k: u32| {
            half(
                get(
                    4 * (row % 8) + (k % 8) / 2,
                    ((row / 8) + 2 * (k / 8)) as usize,
                ),
                k,
            )
        };
        // B[k][col]: lane 4 col + (k % 8) / 2, register k / 8.
        let b_el = |k: u32, col: u32| half(get(4 * col + (k % 8) / 2, 4 + (k / 8) as usize), k);
        let mut out = [0.0f32; 4];
        for (idx, o) in out.iter_mut().enumerate() {
            let row = g + 8 * (idx as u32 / 2);
            let col = 2 * t + idx as u32 % 2;
            let mut acc = f32::from_bits(get(lane, 6 + idx));
            for k in 0..16 {
                acc += a_el(row, k) * b_el(k, col);
            }
            *o = acc;
        }
        out
    });
    *d = out;
}

/// `D += A B`, bf16 inputs.
///
/// # Safety
/// The whole warp executes the call.
pub unsafe fn m16n8k16_bf16(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
    mma(d, a, b, bf16_to_f32)
}

/// `D += A B`, f16 inputs.
///
/// # Safety
/// The whole warp executes the call.
pub unsafe fn m16n8k16_f16(d: &mut [f32; 4], a: [u32; 4], b: [u32; 2]) {
    mma(d, a, b, f16_to_f32)
}
