//! `kbench attention-decode`: one decode step over a paged KV cache (`attention::decode`'s
//! kernels with the split heuristic), D = 128, 32 query / 8 key-value heads, pages of 64 tokens,
//! one query token, batches 1..256 and contexts 1k..64k (at most 2^21 cached tokens: 8 GiB of
//! K and V), beside the device copy bandwidth measured in the same run and the peers of
//! `bench/peers/attention_decode.py` (PyTorch SDPA, FLASH and CUDNN backends, on the same
//! contexts gathered into dense padded K/V: the baseline the issue names; the gather is not
//! timed).
//!
//! Inputs: both caches hold `2^21` tokens' pages filled with a repeating block of random values
//! (`BLOCK` elements, V shifted by half a block), so the peers rebuild them on the GPU from the
//! block alone; each configuration's block table is a random choice of pages in random order.
//! Bytes: the K and V of every context (`AttentionDecodeProblem::kv_bytes`); GB/s against the
//! copy's (`memcpy_dtod`, 2 x the bytes of a 1 GiB copy per time). Sequence 0 of every
//! configuration is checked against the f64 reference (`max_err`); the peers' rows record
//! their difference from our O.

use crate::config;
use crate::harness::{Bench, Row, Tensor};
use kernels::attention::{
    self, AttentionDecodePlan, AttentionDecodeProblem, AttentionDecodeTensors, Dtype, View,
};
use kernels::data::{rng, uniform_bf16};
use kernels::exec::OnStream;
use kernels::memory::{copy_async, download, poisoned, upload, upload_at, zeroed};
use kernels::{DeviceBuffer, Result, bf16};
use rand::seq::SliceRandom;

/// Elements of the repeating block the caches are filled with (not a multiple of a page's
/// elements, so pages differ).
const BLOCK: usize = (1 << 22) + 24;
/// Tokens the caches hold.
const CACHE_TOKENS: usize = 1 << 21;
const PAGE: usize = 64;
const HEADS_Q: usize = 32;
const HEADS_KV: usize = 8;
const D: usize = 128;

/// Run the family.
pub fn run(b: &mut Bench) -> Result<()> {
    b.peers_from("attention_decode");
    let (batches, contexts): (&[usize], &[usize]) = if b.quick {
        (&[1, 8], &[1024, 4096])
    } else {
        (&[1, 8, 32, 128, 256], &[1024, 4096, 16384, 65536])
    };
    let mut r = rng(77);
    let block = uniform_bf16(&mut r, BLOCK, -1.0, 1.0);
    let pages = CACHE_TOKENS / PAGE;
    let cache_len = CACHE_TOKENS * HEADS_KV * D;
    // The caches: the block repeated (V from half a block on).
    let fill = |shift: usize| -> Result<DeviceBuffer<bf16>> {
        let mut buf = poisoned::<bf16>(cache_len)?;
        let rolled: Vec<bf16> = block[shift..]
            .iter()
            .chain(&block[..shift])
            .copied()
            .collect();
        let mut at = 0;
        while at < cache_len {
            let n = BLOCK.min(cache_len - at);
            upload_at(&mut buf, at, &rolled[..n])?;
            at += n;
        }
        Ok(buf)
    };
    let (k_cache, v_cache) = (fill(0)?, fill(BLOCK / 2)?);
    let cache_at = |shift: usize, e: usize| block[(e + shift) % BLOCK];
    b.shared(&[("block", Tensor::Bf16(&block, vec![BLOCK]))])?;

    // Copy bandwidth on the same device, in the same run.
    let copy_elems = 1usize << 29;
    let (src, mut dst) = (zeroed::<bf16>(copy_elems)?, zeroed::<bf16>(copy_elems)?);
    let tc = b.time(|| copy_async(&b.stream, &mut dst, &src))?;
    drop((src, dst));
    let copy_bytes = 2.0 * copy_elems as f64 * 2.0;
    b.push(Row::ours("memcpy_dtod", config!("bytes": copy_bytes), &tc).bytes(copy_bytes));

    for &len in contexts {
        for &batch in batches {
            if batch * len > CACHE_TOKENS {
                continue;
            }
            let max_pages = len / PAGE;
            let mut p =
                AttentionDecodeProblem::new(batch, 1, HEADS_Q, HEADS_KV, D, PAGE, pages, max_pages);
            p.dtype = Dtype::Bf16;
            let mut order: Vec<i32> = (0..pages as i32).collect();
            order.shuffle(&mut r);
            let table: Vec<i32> = order[..batch * max_pages].to_vec();
            let lens = vec![len as i32; batch];
            let longest = p.check_tables(&table, &lens)?;
            let q = uniform_bf16(&mut r, batch * HEADS_Q * D, -1.0, 1.0);
            let splits = p.num_splits_on(longest, b.gpu.info());
            let (dq, dt, dl) = (upload(&q)?, upload(&table)?, upload(&lens)?);
            let out = poisoned::<bf16>(q.len())?;
            let lse = poisoned::<f32>(p.lse_len())?;
            let ws = poisoned::<f32>(p.workspace_len(splits).max(1))?;
            let tensors = AttentionDecodeTensors {
                q: View::contiguous(&dq, p.q_shape()),
                k_cache: View::contiguous(&k_cache, p.cache_shape()),
                v_cache: View::contiguous(&v_cache, p.cache_shape()),
                o: View::contiguous(&out, p.q_shape()),
                lse: (&lse).into(),
                block_table: (&dt).into(),
                cache_seqlens: (&dl).into(),
                workspace: (&ws).into(),
                sinks: None,
            };
            let plan: AttentionDecodePlan = p.plan(&tensors, splits)?;
            let exec = OnStream {
                gpu: &b.gpu,
                stream: &b.stream,
            };
            // SAFETY: every buffer the plan was made for lives until after the synchronizing
            // download below; O, LSE and the workspace overlap nothing.
            let t = b.time(|| unsafe { plan.run(&exec) })?;
            let o = download(&out)?;
            // Sequence 0 against the f64 reference: its keys gathered from the pages.
            let row = HEADS_KV * D;
            let gather = |shift: usize| -> Vec<bf16> {
                (0..len)
                    .flat_map(|j| {
                        let at = (table[j / PAGE] as usize * PAGE + j % PAGE) * row;
                        (at..at + row).map(move |e| cache_at(shift, e))
                    })
                    .collect()
            };
            let want = attention::reference(
                &p.sequence(len),
                &q[..HEADS_Q * D],
                &gather(0),
                &gather(BLOCK / 2),
            );
            let err = o[..HEADS_Q * D]
                .iter()
                .zip(&want.o)
                .map(|(x, y)| (x.to_f64() - y).abs())
                .fold(
                    0.0f64,
                    |a, e| if e.is_nan() { f64::INFINITY } else { a.max(e) },
                );
            if err > 2e-2 {
                return Err(kernels::Error::invalid(
                    "attention decode result",
                    format!("{p:?}: max error {err:.3e} on sequence 0 exceeds 2e-2"),
                ));
            }
            let bytes = p.kv_bytes(&lens);
            let cfg = config!(
                "batch": batch, "context": len, "heads_q": HEADS_Q, "heads_kv": HEADS_KV,
                "d": D, "page": PAGE, "seq_q": 1, "dtype": "bf16", "splits": splits
            );
            b.push(
                Row::ours("attention_decode", cfg.clone(), &t)
                    .bytes(bytes)
                    .err(err),
            );
            let table64: Vec<i64> = table.iter().map(|&x| x as i64).collect();
            b.case(
                "attention_decode",
                &cfg,
                // The cache's construction, for the peers to rebuild it.
                config!("bytes": bytes, "cache_tokens": CACHE_TOKENS, "block": BLOCK),
                &[
                    ("q", Tensor::Bf16(&q, vec![batch, 1, HEADS_Q, D])),
                    ("block_table", Tensor::I64(&table64, vec![batch, max_pages])),
                    ("ours", Tensor::Bf16(&o, vec![batch, 1, HEADS_Q, D])),
                ],
            )?;
        }
    }
    drop((k_cache, v_cache));
    b.run_peers();
    Ok(())
}
