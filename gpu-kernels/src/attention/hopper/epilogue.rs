//! The epilogue of the Hopper kernel, per consumer thread and tile: the row sums finished
//! across the quad, O normalized and stored from the accumulators, and the LSE (rows with no
//! allowed key get O = 0 and LSE = -inf).
//!
//! A macro rather than a function: the expansion is the consumer's own code, so the kernels'
//! PTX does not depend on how a call would be inlined (an `#[inline(always)]` function here
//! already swapped two independent instructions of the PTX).

/// Store the thread's two rows of O, normalized by the finished row sums, and their LSE, for
/// the tile at query row `$m0` of (`$batch`, `$head`) (with `VARLEN`, of the sequence from
/// packed row `$q0`): rows `$warp_row + $g` and `$warp_row + $g + 8` of the tile, at or past
/// `$rows_valid` not stored; `$t = lane % 4` picks the column pair of each n8 tile of the
/// accumulators `$o` (`[f32; $or]`); `$row_max` and `$row_sum` are the thread's partial softmax
/// statistics of the two rows. The whole warp
/// expands it in uniform control flow (the row sums are finished by shuffles); `$p` is the
/// kernel's `&HopperParams` and `$e` the element type. The kernel's `CAPSINK` adds the sink of
/// `$head` to every row's softmax (`super::super::logits::finish_row`).
macro_rules! store_tile {
    (
        $e:ty, $or:expr, $p:ident, $o:ident, $row_max:ident, $row_sum:ident,
        $m0:ident, $q0:ident, $head:ident, $batch:ident, $rows_valid:ident, $warp_row:ident,
        $g:ident, $t:ident
    ) => {
        // Packed sequences (`VARLEN`): O `[total_q, heads_q, D_v]` from the sequence's first row
        // `$q0`, LSE `[heads_q, total_q]`.
        let o_base = if VARLEN {
            $p.o.wrapping_add(($head as u64 * $p.o_strides[2]) as usize)
        } else {
            $p.o.wrapping_add(
                ($batch as u64 * $p.o_strides[0] + $head as u64 * $p.o_strides[2]) as usize,
            )
        };
        let sink2 = if CAPSINK {
            // SAFETY: `sinks` is null or has `heads_q` values (`HopperParams`' contract).
            unsafe { $crate::attention::logits::sink_log2(&$p.logits, $head) }
        } else {
            f32::NEG_INFINITY
        };
        for h in 0..2 {
            let mut sum = $row_sum[h];
            // SAFETY: all 32 lanes execute these shuffles.
            unsafe {
                sum += $crate::arch::warp::shfl_xor_f32($crate::arch::warp::FULL_MASK, sum, 1);
                sum += $crate::arch::warp::shfl_xor_f32($crate::arch::warp::FULL_MASK, sum, 2);
            }
            let (inv, lse) = if CAPSINK {
                $crate::attention::logits::finish_row($row_max[h], sum, sink2)
            } else if sum > 0.0 {
                (
                    1.0 / sum,
                    ($row_max[h] + $crate::arch::math::log2(sum)) * $crate::arch::math::LN_2,
                )
            } else {
                (0.0, f32::NEG_INFINITY)
            };
            // The FP8 kernels' V descale (`HopperParams::o_scale`).
            let inv = if FP8 { inv * $p.o_scale } else { inv };
            let row = $warp_row + $g + 8 * h as u32;
            if row < $rows_valid {
                let i = $m0 + row;
                let row_o = if VARLEN { i + $q0 } else { i };
                let dst = o_base.wrapping_add((row_o as u64 * $p.o_strides[1]) as usize);
                for j in 0..$or / 4 {
                    let v = <$e>::pack($o[4 * j + 2 * h] * inv, $o[4 * j + 2 * h + 1] * inv);
                    // SAFETY: row i < seq_q (packed: q0 + i below the sequence's clamped end,
                    // at most total_q), column 8 j + 2 t + 1 < D_v: inside O; 4-byte aligned
                    // (16-byte aligned rows, even column).
                    unsafe { *(dst.wrapping_add(8 * j + 2 * $t as usize) as *mut u32) = v };
                }
                if $t == 0 {
                    let idx = if VARLEN {
                        $head as u64 * $p.total_q as u64 + ($q0 + i) as u64
                    } else {
                        ($batch as u64 * $p.heads_q as u64 + $head as u64) * $p.seq_q as u64
                            + i as u64
                    };
                    // SAFETY: idx < batch * heads_q * seq_q (dense) or heads_q * total_q
                    // (packed: q0 + i is below the clamped end of the sequence): inside LSE.
                    unsafe { *$p.lse.add(idx as usize) = lse };
                }
            }
        }
    };
}
pub(super) use store_tile;
