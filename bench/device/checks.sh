#!/usr/bin/env bash
# The session checks run on the GPU machine (the files in bench/results/sweeps/checks-h100-*.txt):
#   t   attention and GLA backward GPU tests, reliability props and negative controls, CLI tests,
#       the four sanitizers on attention and GLA backward cases, CLI timings with ncu per kernel,
#       ncu details of gla_bwd_dqkg_tc, Python attention and GLA tests;
#   vb  a shorter check set, then kbench attention-backward and kbench gla without peers;
#   fla kbench gla --quick with the fla peer (TRITON_CACHE_DIR kept under /tmp);
#   hd  head dimensions 96 and 192: their GPU tests (forward, packed, backward), GLA backward
#       tests, sanitizers on D 96/192 cases, Python attention tests, then kbench attention and
#       attention-backward at D 96/192 (peers cuDNN and FA2 through SDPA);
#   dec decode over a paged KV cache: its GPU tests and CLI tests, the four sanitizers on decode
#       cases (memcheck on adversarial tables) and on the Hopper forward at D 192, Python
#       attention tests, the D 96/192 tests, then kbench attention-decode and kbench attention
#       at D 96/192.
#   cap softcap and sinks: their GPU tests (both paths, packed sequences), the dense forward and
#       packed tests beside them, CLI tests, the four sanitizers on capsink cases, the Python
#       tests (capsink and attention), then CLI timings (median of 20 timed runs) of the default
#       kernels and the capsink kernels with a softcap, sinks and both, per path and D.
#   capb the backward with a softcap and sinks: its GPU tests (both paths, packed sequences,
#       the deterministic mode), the default backward's and the packed backward's tests beside
#       them, CLI tests, the Python tests (capsink backward, capsink, attention), then CLI
#       timings (median of 20 timed runs) of attention-backward with the default kernels, a
#       softcap, sinks and both, per D;
#   capbsan the four sanitizers on its cases (Hopper and mma.sync softcap, softcap with sinks,
#       sinks on the Hopper kernels, packed sequences).
#   hvar packed sequences on the Hopper path: the packed forward's GPU tests (both paths, the
#       bad-boundary guards), the capsink packed tests, the dense Hopper forward and packed
#       backward tests beside them, the Python packed and attention tests, then kbench
#       attention-varlen with its peers (FlashAttention-4 when installed under /tmp/fa4pkgs);
#   hvarsan the four sanitizers on Hopper packed cases (memcheck on contradictory boundaries);
#   app new keys and values appended to a paged cache: their GPU tests and the decode tests, the
#       four sanitizers on an append case, the Python decode tests (k, v in the call).
#   hdall every multiple of 16 from 32 to 256 as head dimension: the dense, packed, decode and
#       capsink GPU tests (both paths), the Python attention, packed and decode tests;
#   hdsan the four sanitizers on D 80/144/192/240/256 cases of each path (dense, packed, capsink)
#       and of decoding;
#   hdbench kbench attention at every head dimension (peers cuDNN and FA2 through SDPA);
#   ncu64 ncu (full set) on the Hopper forward at D 64 and D 128, B 2 S 8k H 32 / 16 bf16
#       non-causal (through the CLI), details pages kept;
#   grid  kbench attention on its default grid (D 64/128/256, S 512 to 16k, the tuning
#       variants) with cuDNN, FA2 and FlashAttention-4 (when installed under /tmp/fa4pkgs).
#   fq  the Hopper dK/dV/dQ kernel (dQ by bulk reduce-adds): the attention backward's GPU tests
#       (dense, softcap and sinks, packed), reliability props and negative controls, CLI tests,
#       CLI timings with ncu per kernel (default and deterministic), the Python attention tests;
#   fqsan the four sanitizers on its Hopper D 64/128 cases (a softcap included);
#   bwd96 the Hopper backward at D 96: the backward GPU tests at D 96 (dense, softcap and sinks),
#       the four sanitizers on a D 96 case of each mode, CLI timings with ncu per kernel, then
#       kbench attention-backward at D 96 with its peers (FA4 when installed under /tmp/fa4pkgs);
#   ncufq ncu (full set) on the dK/dV/dQ kernel, B2 H16 S4k D128 bf16 (through the CLI);
#   fqb kbench attention-backward (D 64/128/256, S 4k-16k) with cuDNN and FA2 through SDPA, and
#       FlashAttention-4 when installed under /tmp/fa4pkgs.
#   wide the Hopper dK/dV/dQ kernel of a wide head (D 256): the attention backward's GPU tests
#       (dense, softcap and sinks, packed), reliability props and negative controls, CLI tests,
#       the four sanitizers on D 256 cases (GQA causal, a window, a softcap), the Python
#       attention tests;
#   wideb CLI timings with ncu per kernel at D 256 (B2 H8 S8k, both modes), then kbench
#       attention-backward at D 256 with its peers (FA4 when installed under /tmp/fa4pkgs).
#   ord the deterministic mode's ordered dK/dV/dQ kernel (D 64/128): the attention backward's
#       GPU tests (dense, softcap and sinks, packed), props, negative controls, CLI tests, the
#       four sanitizers on deterministic D 64/128 cases (GQA, causal, a window, a softcap), the
#       Python attention tests, CLI timings with ncu per kernel at D 128 and 64 (both modes).
#   nar the 128-row steps of the D 64 dK/dV/dQ kernel: the backward tests as in ord, the four
#       sanitizers on D 64 cases of both modes (1, 113, 239, 300 query rows), CLI timings with
#       ncu per kernel at D 64 (B2 H16 S8k), kbench attention-backward at D 64, S 4k and 16k.
#   rows the row values (LSE, delta') read as 8-byte pairs in the Hopper dK/dV kernels: the
#       backward tests, the four sanitizers on D 128 and 256 cases and a softcap case, CLI
#       timings with ncu per kernel at D 64 and 128, kbench attention-backward at D 64 and 128,
#       S 4k and 16k.
#   e2e2 on a machine of two GPUs, steps chosen by E2E_STEPS (default "ddp tests py fla"):
#       ddp: the transformers Llama under DDP over both GPUs against one GPU
#       (python/e2e/ddp_llama.py); tests: the attention backward's tests (bwd_tests) on GPU 0;
#       py: every Python check (python/tests/test_*.py) on GPU 0; fla: fla's own GLA layer and
#       model with our chunk_gla (python/e2e/fla_gla.py). fla's Triton kernels autotune on their
#       first call, minutes per shape: two processes warm the autotuning first, one per GPU over
#       disjoint layer cases (WARM1 on GPU 1 from the start, beside the tests; WARM0 with the
#       model runs on GPU 0 after them; on one GPU, all of them there), sharing
#       TRITON_CACHE_DIR; then the whole script runs on GPU 0 if time is left (E2E_STEPS=flafull:
#       the whole script only, no warm-up). Triton's autotuning results (*.autotune.json: fla's timings of
#       each configuration, keyed by the kernel's source, shapes and dtypes) are restored first
#       from bench/results/sweeps/fla-autotune-h100.tgz and saved to $OUT/fla-autotune-h100.tgz
#       (committed back there), so the tuning is made once. The scripts' rows go into a copy of
#       bench/results/python.json (kept in /tmp while the machine stays), returned in $OUT. The
#       part stops itself E2E_BUDGET seconds (default 520) after it starts.
#   bwdhd the mma.sync backward at the head dimensions added beside 64, 96, 128, 192, 256: the
#       backward tests (dense, softcap and sinks, packed), props, negative controls, CLI tests,
#       the four sanitizers on D 80, 112, 160, 176, 224, 240 cases (dense, packed, softcap), the
#       Python attention tests, then kbench attention-backward at D 80, 112, 160, 240 (S 4k and
#       16k) with its peers; BWDHD_STEPS chooses among "tests san py bench" (default all).
#   pad  the Hopper backward on zero-padded columns (D 32, 48, 80, 112): the backward tests,
#       props, negative controls, CLI tests, the four sanitizers on D 32/48/80/112 cases
#       (dense both modes, a softcap), the Python attention tests, then kbench
#       attention-backward at D 32, 48, 80, 112 (S 4k and 16k; ours-mma beside the padded
#       kernels) with its peers.
#   pad2 the D 256 Hopper dK/dV/dQ kernel on zero-padded columns (D 144 to 240): the dense,
#       softcap/sinks and packed backward tests, the four sanitizers on D 160 causal and a
#       softcap at D 240, the Python attention tests, then kbench attention-backward at D 160
#       and 240 (S 4k; ours-mma beside) with its peers.
#   fp8  the FP8 forward: its GPU tests (attention_fp8/, the variants included), the dense
#       Hopper forward tests beside them (attention/hopper/), the four sanitizers on FP8 cases
#       (D 128 causal, D 256 window, a partial last step, the pingpong variants), the CLI GPU
#       tests, CLI timing and ncu sections of the FP8 kernel at D 128 S 8k, then kbench
#       attention-fp8 (FP8 beside bf16, same values), and (step py) the Python FP8 check
#       (test_attention_fp8.py) and the attention one; FP8_STEPS picks among
#       "tests san cli bench py" (default the first four).
#   detw the deterministic mode on the wide dK/dV/dQ kernel (D 144 to 256, dQ additions
#       ordered): the backward tests (bwd_tests), the four sanitizers on deterministic D 256 and
#       D 160 cases (GQA causal, a window, a softcap), CLI timings with ncu per kernel at D 256
#       (B2 H8 S8k, both modes), then kbench attention-backward at D 256 and 160 with its
#       peers; then (step neg) the negative controls, racecheck on the Hopper ring control
#       (negative_attention_bwd_hopper_early_empty) and on the mma.sync dS^T one; DETW_STEPS
#       picks among "tests san times bench neg" (default the first four).
#   hvb the backward over packed sequences on the Hopper kernels: the backward's GPU tests
#       (bwd_tests: dense, softcap and sinks, packed on both paths, props, negative controls,
#       CLI), the four sanitizers on packed cases (D 64, 128, 256, the deterministic mode, a
#       softcap; memcheck on contradictory boundaries), the Python packed and attention tests,
#       then kbench attention-varlen (forward and training step, with its peers); HVB_STEPS
#       picks among "tests vtests san py bench" (default all but vtests: the packed tests
#       alone).
#   vdim V and O of their own head dimension (D 192, D_v 128): the Hopper forward's GPU tests
#       (dense and packed, the pair's cases among them), the pair's mma.sync GPU tests, the CLI
#       tests, the four sanitizers on the pair's cases (Hopper: dense causal, a window, packed;
#       mma.sync: dense causal, packed), the Python attention check; then (step bench) kbench attention at D 128 and 192 (S 4k and
#       16k, the pair's rows beside them) with its peers, and (step bwd) kbench
#       attention-backward at D 64 and 128 (S 4k, 16k); VDIM_STEPS picks among
#       "tests san py bench bwd" (default the first three).
#   vbwd the backward of V and O of their own head dimension (D 192, D_v 128; the Hopper
#       kernels): the backward's GPU tests (bwd_tests: dense, softcap and sinks, packed, props,
#       negative controls, CLI; the pair's cases among them), the four sanitizers on the pair's
#       cases (dense causal in both modes, a window, packed), then (step py) the Python
#       attention and packed checks, (step bench) kbench attention-backward at D 192 (S 4k and
#       16k, the pair's rows beside D 192's) with its peers, and (step dec) kbench
#       attention-decode with its peers (FlashAttention-4's paged forward when installed under
#       /tmp/fa4pkgs); VBWD_STEPS picks among "tests san py bench dec" (default the first two
#       and bench).
#   dec2 the decode kernel's steps (Q in registers, the folded lazy softmax, one division per
#       tile): the decode, append and capsink GPU tests, the CLI decode tests, the four
#       sanitizers on decode cases (GQA causal with splits, softcap and sinks, D 96, memcheck on
#       adversarial tables), the Python decode check, then kbench attention-decode with its
#       peers (FlashAttention-4's paged forward when installed under /tmp/fa4pkgs).
#   dyn  the dense Hopper grid whose blocks draw their tiles (variant hdyn, D 64 and 128): its
#       GPU tests with a tile counter, the dense Hopper and packed tests beside them, the four
#       sanitizers on two of its cases, then kbench attention at D 64 and 128, S 1k-16k, with
#       the variant (SDPA peers); DYN_STEPS picks among "tests san bench".
#   auto the plan's choices by the problem (bf16 and f16): the dynamic grid for short causal
#       problems given a tile counter (D 64 and 128), key steps of 192 on long keys (D 64):
#       the dense Hopper GPU tests (each forward given a counter; the hdyn and hn192 variants'
#       among them), the packed ones, the CLI's, the reliability suite's properties,
#       concurrent streams and attention cases, the four sanitizers on f16 cases of the
#       choices, the Python attention checks (step py); then (step bench) kbench attention at
#       D 64, 128, 256, S 1k-16k with the SDPA peers and the variant hnp (D 128, one block per
#       tile), with the counter and then without (KBENCH_ATTENTION_TILE_COUNTER=0 into
#       $OUT/nocounter, D 64 and 128); AUTO_STEPS picks among "tests san py bench".
#   n192 the D = 64 forward in key steps of 192 (variant hn192): its GPU tests, the four
#       sanitizers on two of its cases, then kbench attention at D 64, S 1k-16k, with the
#       variant beside the default, both without a tile counter (SDPA peers); N192_STEPS
#       picks among "tests san bench".
#   ncu192 ncu on the D = 64 forward at 8191 keys (steps of 128) and 8192 (steps of 192), B 2
#       H 32 bf16 non-causal, through the CLI: CLI timings, then SpeedOfLight, compute, warp
#       state and scheduler sections with the XU and tensor pipes and the instructions issued.
#   ncudyn ncu on the D = 128 causal forward at S 16k (B 1, H 16) on the default grid (one block
#       per tile) and on the dynamic grid (variant hdyn), through kbench: the same sections and
#       metrics as ncu192, on the 71st launch of each kernel (kbench times the non-causal
#       shape first, 60 launches: the 71st is causal).
#   flab kbench gla (every configuration) with the fla peer, forward + backward through autograd:
#       Triton's autotuning results of fla's kernels restored from
#       bench/results/sweeps/fla-autotune-h{100,200}.tgz first and saved (all of them) to
#       $OUT/fla-autotune-h200.tgz after, also when the run is cut short, so that a later run
#       tunes only what is new.
#   pmask (steps tests san ab bench, PMASK_STEPS) the attention backward's GPU tests, props,
#       negative controls, CLI; the four sanitizers on masked cases of every Hopper backward
#       kernel (dK/dV/dQ at D 64 causal and D 128 window, the wide kernel causal, the dQ kernel
#       at D 96, packed, softcap); CLI medians of attention-backward, both modes, causal and
#       not, of this bundle against the bundle before it (extracted to /tmp/old/bundle by an
#       earlier call on the same warm machine); abbench: kbench attention-backward of both
#       bundles without peers (D 64, 128, S 4k, 16k); the Python attention tests; then kbench
#       attention-backward at D 64, 128, 256, S 4k-16k with its peers (FA4 under /tmp/fa4pkgs).
# Usage, from the repository root with the bundle at target/bundle-pack/bundle.tar.xz (./x bundle):
#   OUT=DIR bash bench/device/checks.sh t|vb|fla|hd|dec|cap|capb|capbsan|hvar|hvarsan|app|hdall|hdsan|
#   hdbench|ncu64|grid|fq|fqsan|fqb|ncufq|bwd96|wide|wideb|ord|nar|rows|e2e2|bwdhd|pad|pad2|fp8|
#   detw|hvb|vdim|vbwd|dec2|flab|dyn|auto|n192|ncu192|ncudyn|pmask
set -u
part=${1:-t}
B=/tmp/b9/bundle
if [ ! -d $B ]; then mkdir -p /tmp/b9 && tar -xJf target/bundle-pack/bundle.tar.xz -C /tmp/b9 || exit 3; fi
L=/tmp/logs9-$part; mkdir -p $L; S=$OUT/summary.txt
cat $B/MANIFEST > $S
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $S
export KERNELS_WATCHDOG_SECS=120
t() { local n=$1; shift; local s=$(date +%s); timeout ${TT:-200} "$@" > $L/$n.log 2>&1; echo "$n rc=$? $(( $(date +%s)-s ))s $(grep -E '^test result' $L/$n.log | tail -1)" >> $S; grep -E "FAILED|panicked|^WATCHDOG|MISMATCH" $L/$n.log | head -8 >> $S; }
san() { local tool=$1 bin=$2 filt=$3; local extra=(); [ $tool = racecheck ] && extra=(--racecheck-report all)
  local f=${filt//\//_}; f=${f//[\[\]\(\),]/_}
  local s=$(date +%s); KERNELS_SANITIZER=$tool KERNELS_WATCHDOG_SECS=600 timeout 150 compute-sanitizer --tool $tool --error-exitcode 86 "${extra[@]}" $B/bin/test-$bin "$filt" --test-threads 1 > $L/san_${tool}_$f.log 2>&1
  echo "san $tool $filt rc=$? $(( $(date +%s)-s ))s $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $L/san_${tool}_$f.log | tail -1) | $(grep -E '^test result' $L/san_${tool}_$f.log | tail -1)" >> $S; }
CLI=$B/bin/kernels-cli
ktimes() { python3 -c "
import csv,collections
t=collections.OrderedDict()
for r in csv.reader(open('$1')):
    if len(r)>14 and r[-3]=='gpu__time_duration.sum':
        n=r[4].split('(')[0]+' '+r[8]; t[n]=t.get(n,0)+float(r[-1].replace(',',''))
for n,v in t.items(): print(f'  $2 {n:60s} {v:10.1f}')
" >> $S 2>&1; }
# Backward inputs /tmp/attn_bwd_$4.st: random q, k, v [$1, $2, $3, $4] bf16, the CLI forward's
# o and lse, random do.
bwd_inputs() {
  python3 - "$@" <<'PY'
import sys, torch
from safetensors.torch import save_file
b, s, h, d = map(int, sys.argv[1:5])
torch.manual_seed(0)
r=lambda *s: torch.randn(*s,device='cuda').bfloat16()
save_file({'q':r(b,s,h,d),'k':r(b,s,h,d),'v':r(b,s,h,d)}, f'/tmp/attn_in_{d}.st')
PY
  $CLI attention /tmp/attn_in_$4.st -o /tmp/attn_out_$4.st > $L/fwd_$4.log 2>&1
  python3 - $4 <<'PY'
import sys, torch
from safetensors.torch import load_file, save_file
d=sys.argv[1]
a=load_file(f'/tmp/attn_in_{d}.st'); o=load_file(f'/tmp/attn_out_{d}.st')
a['o']=o['o']; a['lse']=o['lse']; a['do']=torch.randn_like(o['o'].float()).bfloat16()
save_file(a,f'/tmp/attn_bwd_{d}.st')
PY
}
# CLI timings (median of 20 timed runs) and ncu per kernel of attention-backward on bwd_inputs'
# file at D $1, default and deterministic modes.
bwd_times() {
  local d=$1 mode
  for mode in "" "--deterministic"; do
    $CLI attention-backward /tmp/attn_bwd_$d.st -o /tmp/ab.st --repeat 20 $mode 2>&1 | grep -i "median\|error" | sed "s/^/D$d $mode /" >> $S
    ncu --metrics gpu__time_duration.sum --csv $CLI attention-backward /tmp/attn_bwd_$d.st -o /tmp/ab2.st $mode > $L/ncu_$d$mode.csv 2>&1
    ktimes $L/ncu_$d$mode.csv "D$d$mode"
  done
}
# The attention backward's GPU tests (dense, softcap and sinks, packed), props, negative
# controls and CLI tests.
bwd_tests() {
  t bwd $B/bin/test-attention attention_bwd/ --skip emulated
  t capb $B/bin/test-attention attention_capsink_bwd/ --skip emulated
  t vbwd $B/bin/test-attention attention_varlen_bwd/ --skip emulated
  t props $B/bin/test-reliability props
  t neg $B/bin/test-reliability negative
  t cli $B/bin/test-cli gpu/
}
# The four sanitizers on the attention test cases $1 (names, whitespace-separated).
san_cases() {
  local cases=$1 tool f
  echo "sanitized:" $cases >> $S
  for tool in memcheck racecheck synccheck initcheck; do
    for f in $cases; do
      san $tool attention $f
    done
  done
}
# The forward rows of kbench's attention results $1 (no value head dimension of their own), one
# line per shape: ours, then each impl named after it with its ratio to ours.
fwd_table() {
  python3 - "$@" <<'PY'
import json, sys
t = {}
for r in json.load(open(sys.argv[1]))['rows']:
    c = r['config']
    if r['kernel'] == 'attention_fwd' and 'dv' not in c:
        t.setdefault((c['d'], c['seq'], c['batch'], c['causal']), {})[r['impl']] = r['tflops']
for k in sorted(t):
    v = t[k]; o = v.get('ours') or 0
    cols = ' '.join(f"{i} {v.get(i) or 0:6.1f} ({(v.get(i) or 0) / o if o else 0:.3f})" for i in sys.argv[2:])
    print(f"d{k[0]} s{k[1]} b{k[2]} {'causal' if k[3] else 'full  '} ours {o:6.1f} {cols}")
PY
}
# The Python attention tests (dense and softcap/sinks backward), the wheel installed under $1.
py_attention() {
  local P=$1 f s
  python3 -m pip install --quiet --no-index --no-deps --target $P $B/python/*.whl > $L/pip.log 2>&1
  for f in attention attention_capsink_bwd; do
    s=$(date +%s); PYTHONPATH=$P timeout 150 python3 $B/python/test_$f.py > $L/py_$f.log 2>&1
    echo "py $f rc=$? $(( $(date +%s)-s ))s $(grep -E '^[0-9]+ passed, [0-9]+ failed' $L/py_$f.log | tail -1)" >> $S
    grep -E "^(SKIP|FAIL)" -A4 $L/py_$f.log | head -12 >> $S
  done
}
if [ "$part" = t ]; then
  t bwd $B/bin/test-attention attention_bwd/ --skip emulated
  t gla_bwd $B/bin/test-gla gla/backward/gpu
  t props $B/bin/test-reliability props
  t neg $B/bin/test-reliability negative
  t cli $B/bin/test-cli gpu/
  for tool in memcheck racecheck synccheck initcheck; do
    san $tool attention attention_bwd/gpu/bf16_d128_b2_sq113
    san $tool attention attention_bwd/gpu/f16_d64_b2_sq113
    san $tool gla 'gla/backward/gpu/tc/b2_t1000_h2_dk64_dv64_g[-0.05,0)'
    san $tool gla 'gla/backward/gpu/tc/b1_t1000_h2_dk128_dv128_g[-0.2,0)_seg96'
  done
  san racecheck reliability negative_gla_bwd_no_carry_barrier_racecheck_target
  python3 - <<'PY'
import torch, torch.nn.functional as F
from safetensors.torch import save_file
torch.manual_seed(0)
r=lambda *s: torch.randn(*s,device='cuda').bfloat16()
for d,b,s_,h in [(128,2,4096,16),(64,2,8192,16)]:
    save_file({'q':r(b,s_,h,d),'k':r(b,s_,h,d),'v':r(b,s_,h,d)}, f'/tmp/attn_in_{d}.st')
def gla(B,T,H,D,name):
    u=lambda: (torch.rand(B,T,H,D,device='cuda')*2-1).bfloat16()
    g=F.logsigmoid(torch.rand(B,T,H,D,device='cuda')*6-3).bfloat16()
    save_file({'q':u(),'k':u(),'v':u(),'g':g,'d_o':u()}, f'/tmp/{name}.st')
gla(4,1024,32,64,'gla_a'); gla(4,4096,32,64,'gla_c'); gla(1,16384,16,128,'gla_b')
PY
  for d in 128 64; do
    $CLI attention /tmp/attn_in_$d.st -o /tmp/attn_out_$d.st > $L/fwd_$d.log 2>&1
    python3 - $d <<'PY'
import sys, torch
from safetensors.torch import load_file, save_file
d=sys.argv[1]
a=load_file(f'/tmp/attn_in_{d}.st'); o=load_file(f'/tmp/attn_out_{d}.st')
a['o']=o['o']; a['lse']=o['lse']; a['do']=torch.randn_like(o['o'].float()).bfloat16()
save_file(a,f'/tmp/attn_bwd_{d}.st')
PY
    $CLI attention-backward /tmp/attn_bwd_$d.st -o /tmp/ab.st --repeat 20 2>&1 | grep -i "median" | sed "s/^/D$d /" >> $S
    ncu --metrics gpu__time_duration.sum --csv $CLI attention-backward /tmp/attn_bwd_$d.st -o /tmp/ab2.st > $L/ncu_$d.csv 2>&1
    ktimes $L/ncu_$d.csv D$d
  done
  for c in gla_a gla_c gla_b; do
    $CLI gla-backward /tmp/$c.st -o /tmp/${c}_g.st --repeat 20 2>&1 | grep -i "median" | sed "s/^/$c /" >> $S
    ncu --metrics gpu__time_duration.sum --csv $CLI gla-backward /tmp/$c.st -o /tmp/${c}_g2.st > $L/ncu_$c.csv 2>&1
    ktimes $L/ncu_$c.csv $c
  done
  ncu --set full -k regex:dqkg_tc -c 1 -o $OUT/dqkg $CLI gla-backward /tmp/gla_a.st -o /tmp/x.st > $L/ncu_dqkg.log 2>&1
  ncu -i $OUT/dqkg.ncu-rep --page details > $OUT/dqkg.txt 2>&1; rm -f $OUT/dqkg.ncu-rep
  P=/tmp/pyd9; python3 -m pip install --quiet --no-index --no-deps --target $P $B/python/*.whl > $L/pip.log 2>&1
  for f in attention attention_varlen gla; do
    s=$(date +%s); PYTHONPATH=$P timeout 150 python3 $B/python/test_$f.py > $L/py_$f.log 2>&1
    echo "py $f rc=$? $(( $(date +%s)-s ))s $(grep -E '^[0-9]+ passed, [0-9]+ failed' $L/py_$f.log | tail -1)" >> $S
    grep -E "^(SKIP|FAIL)" -A4 $L/py_$f.log | head -12 >> $S
  done
fi
if [ "$part" = v ] || [ "$part" = vb ]; then
  t bwd $B/bin/test-attention attention_bwd/ --skip emulated
  t gla_bwd $B/bin/test-gla gla/backward/gpu
  t neg $B/bin/test-reliability negative
  for tool in racecheck memcheck synccheck initcheck; do
    san $tool attention attention_bwd/gpu/bf16_d128_b2_sq113
  done
  san racecheck attention attention_bwd/gpu/f16_d64_b2_sq113
  for tool in racecheck memcheck; do
    san $tool gla 'gla/backward/gpu/tc/b2_t1000_h2_dk64_dv64_g[-0.05,0)'
  done
  san racecheck reliability negative_gla_bwd_no_carry_barrier_racecheck_target
fi
if [ "$part" = b ] || [ "$part" = vb ]; then
  P=/tmp/pyd9b
  python3 -m pip install --quiet --no-index --no-deps --target $P $B/wheels/*.whl > $L/pip.log 2>&1
  export PYTHONPATH=$P KERNELS_PEERS_DIR=$B/peers KBENCH_ATTENTION_DIMS=${DIMS:-64,128,256} KBENCH_ATTENTION_SEQS=${SEQS:-4096,8192,16384}
  s=$(date +%s); timeout -k 5 ${T:-330} $B/bin/kbench attention-backward --out $OUT > $L/bench.log 2>&1
  echo "bench rc=$? $(( $(date +%s)-s ))s" >> $S
  sed -n '/^== table/,$p' $L/bench.log | grep "attention_fwd_bwd" | tail -80 >> $S
  grep -i "note\|error\|MISMATCH" $L/bench.log | tail -5 >> $S
  s=$(date +%s); KBENCH_PEERS=0 timeout -k 5 ${TG:-200} $B/bin/kbench gla --out $OUT > $L/bench-gla.log 2>&1
  echo "bench gla rc=$? $(( $(date +%s)-s ))s" >> $S
  sed -n '/^== table/,$p' $L/bench-gla.log | grep -E "gla_fwd_bwd|gla_fwd " | tail -30 >> $S
fi
if [ "$part" = fla ]; then
  P=/tmp/pyd9f
  python3 -m pip install --quiet --no-index --no-deps --target $P $B/wheels/*.whl > $L/pip.log 2>&1
  export PYTHONPATH=$P KERNELS_PEERS_DIR=$B/peers TRITON_CACHE_DIR=/tmp/tc; mkdir -p /tmp/tc
  s=$(date +%s); timeout -k 5 ${T:-500} $B/bin/kbench gla --quick --out $OUT > $L/bench-gla-fla.log 2>&1
  echo "bench gla --quick (fla peer) rc=$? $(( $(date +%s)-s ))s" >> $S
  grep -E "peer |fla" $L/bench-gla-fla.log | tail -20 >> $S
  sed -n '/^== table/,$p' $L/bench-gla-fla.log | grep -E "gla_fwd_bwd|gla_fwd " | grep -v "ours-" | tail -30 >> $S
  tar -czf $OUT/triton-cache.tgz -C /tmp tc; ls -la $OUT >> $S
fi
if [ "$part" = cap ]; then
  TT=300 t capsink $B/bin/test-attention attention_capsink/ --skip emulated
  t fwd_h128 $B/bin/test-attention attention/hopper/bf16_d128
  t fwd_mma64 $B/bin/test-attention attention/mma/bf16_d64
  t varlen $B/bin/test-attention attention_varlen/ --skip emulated
  TT=300 t decode $B/bin/test-attention attention_decode/gpu
  t cli $B/bin/test-cli gpu/
  for tool in memcheck racecheck synccheck initcheck; do
    for f in attention_capsink/hopper/bf16_d128_b1_sq150_sk100_h2x2_causal_softcap10 \
             attention_capsink/mma/bf16_d64_b1_sq150_sk100_h2x2_causal \
             attention_capsink/varlen_hopper/bf16_d128 attention_capsink/hopper/bf16_d256_b1_sq140 \
             attention_decode/gpu/bf16_d128_sq3_h8x2_page64_ctx1_777_0_4099_64_1500_causal_splits1_softcap10_sinks \
             attention_decode/gpu/bf16_d128_sq3_h8x2_page64_ctx1_777_0_4099_64_1500_causal_auto_softcap10_sinks; do
      san $tool attention $f
    done
  done
  P=/tmp/pyd9c; python3 -m pip install --quiet --no-index --no-deps --target $P $B/python/*.whl > $L/pip.log 2>&1
  for f in attention_capsink attention attention_varlen attention_decode; do
    s=$(date +%s); PYTHONPATH=$P timeout 200 python3 $B/python/test_$f.py --quick > $L/py_$f.log 2>&1
    echo "py $f rc=$? $(( $(date +%s)-s ))s $(grep -E '^[0-9]+ passed, [0-9]+ failed' $L/py_$f.log | tail -1)" >> $S
    grep -E "^(SKIP|FAIL)" -A4 $L/py_$f.log | head -12 >> $S
  done
  python3 - <<'PY'
import torch
from safetensors.torch import save_file
torch.manual_seed(0)
for d in (64, 128, 256):
    r=lambda *s: torch.randn(*s,device='cuda').bfloat16()
    t={'q':r(2,4096,16,d),'k':r(2,4096,16,d),'v':r(2,4096,16,d)}
    save_file(t, f'/tmp/cap_plain_{d}.st')
    t['sinks']=torch.randn(16,device='cuda')
    save_file(t, f'/tmp/cap_sinks_{d}.st')
# Decode: B 32, Hq 32 / Hkv 8, D 128, pages of 64, contexts of 8k, pages in order.
b, ctx, page = 32, 8192, 64
pages = b * ctx // page
r=lambda *s: torch.randn(*s,device='cuda').bfloat16()
t={'q':r(b,1,32,128),'k_cache':r(pages,page,8,128),'v_cache':r(pages,page,8,128),
   'block_table':torch.arange(pages,device='cuda',dtype=torch.int32).view(b,-1),
   'cache_seqlens':torch.full((b,),ctx,device='cuda',dtype=torch.int32)}
save_file(t, '/tmp/dec_plain.st')
t['sinks']=torch.randn(32,device='cuda')
save_file(t, '/tmp/dec_sinks.st')
PY
  echo "CLI timings: B 2, S 4096, H 16, bf16, non-causal; median of 20 timed runs" >> $S
  for d in 64 128 256; do
    for path in auto mma-sync; do
      for v in "default:plain:" "softcap:plain:--softcap 30" "sinks:sinks:" "softcap+sinks:sinks:--softcap 30"; do
        IFS=: read name file extra <<< "$v"
        m=$($CLI attention /tmp/cap_${file}_$d.st -o /tmp/cap_out.st --path $path --repeat 20 $extra 2>&1 | grep -i median | head -1)
        echo "D$d $path $name: $m" >> $S
      done
    done
  done
  echo "CLI timings: decode B 32, Hq 32 / Hkv 8, D 128, page 64, contexts 8192, bf16; median of 20" >> $S
  for v in "default:plain:" "softcap:plain:--softcap 30" "sinks:sinks:" "softcap+sinks:sinks:--softcap 30"; do
    IFS=: read name file extra <<< "$v"
    m=$($CLI attention-decode /tmp/dec_$file.st -o /tmp/dec_out.st --repeat 20 $extra 2>&1 | grep -i median | head -1)
    echo "decode $name: $m" >> $S
  done
  cp $L/capsink.log $L/decode.log $L/cli.log $L/py_attention_capsink.log $OUT/ 2>/dev/null
fi
if [ "$part" = capb ]; then
  TT=400 t capbwd $B/bin/test-attention attention_capsink_bwd/ --skip emulated
  TT=300 t bwd $B/bin/test-attention attention_bwd/ --skip emulated
  t varlen_bwd $B/bin/test-attention attention_varlen_bwd/gpu
  t cli $B/bin/test-cli gpu/
  P=/tmp/pyd9c; python3 -m pip install --quiet --no-index --no-deps --target $P $B/python/*.whl > $L/pip.log 2>&1
  for f in attention_capsink_bwd attention_capsink attention attention_varlen; do
    s=$(date +%s); PYTHONPATH=$P timeout 300 python3 $B/python/test_$f.py --quick > $L/py_$f.log 2>&1
    echo "py $f rc=$? $(( $(date +%s)-s ))s $(grep -E '^[0-9]+ passed, [0-9]+ failed' $L/py_$f.log | tail -1)" >> $S
    grep -E "^(SKIP|FAIL)" -A4 $L/py_$f.log | head -12 >> $S
  done
  PYTHONPATH=$P python3 - <<'PY'
import torch
from safetensors.torch import save_file
from rustkernels import flash_attn_func
torch.manual_seed(0)
for d in (64, 128, 256):
    r=lambda *s: torch.randn(*s,device='cuda').bfloat16()
    q,k,v,do=r(2,4096,16,d),r(2,4096,16,d),r(2,4096,16,d),r(2,4096,16,d)
    sinks=torch.randn(16,device='cuda')
    for name, cap, s in (("plain", 0.0, None), ("cap", 30.0, None), ("sinks", 0.0, sinks), ("both", 30.0, sinks)):
        with torch.no_grad():
            o, lse, _ = flash_attn_func(q, k, v, softcap=cap, sinks=s, return_attn_probs=True)
        t={'q':q,'k':k,'v':v,'o':o,'lse':lse.contiguous(),'do':do}
        if s is not None:
            t['sinks']=s
        save_file(t, f'/tmp/capb_{name}_{d}.st')
PY
  echo "CLI timings: attention-backward B 2, S 4096, H 16, bf16, non-causal; median of 20 timed runs" >> $S
  for d in 64 128 256; do
    for v in "default:plain:" "softcap:cap:--softcap 30" "sinks:sinks:" "softcap+sinks:both:--softcap 30"; do
      IFS=: read name file extra <<< "$v"
      m=$($CLI attention-backward /tmp/capb_${file}_$d.st -o /tmp/capb_out.st --repeat 20 $extra 2>&1 | grep -i median | head -1)
      echo "D$d $name: $m" >> $S
    done
  done
  cp $L/capbwd.log $L/cli.log $L/py_attention_capsink_bwd.log $OUT/ 2>/dev/null
fi
if [ "$part" = capbsan ]; then
  for tool in memcheck racecheck synccheck initcheck; do
    for f in attention_capsink_bwd/auto/bf16_d128_b2_sq113_sk203_h4x2_softcap20_dlse_atomic \
             attention_capsink_bwd/mma/bf16_d128_b2_sq113_sk203_h4x2_softcap20_dlse_atomic \
             attention_capsink_bwd/auto/f16_d64_b1_sq300_sk300_h4x2_win40_7_softcap5 \
             attention_capsink_bwd/auto/bf16_d128_b1_sq239_sk130_h4x2_causal_sinks \
             attention_capsink_bwd/varlen/bf16_d64_h4x2_lens0x5_1x1_70x130_200x150_33x0_softcap5_sinks_dlse_atomic; do
      san $tool attention $f
    done
  done
fi
if [ "$part" = hd ]; then
  TT=300 t d96 $B/bin/test-attention d96 --skip emulated
  TT=300 t d192 $B/bin/test-attention d192 --skip emulated
  t gla_bwd $B/bin/test-gla gla/backward/gpu
  for tool in memcheck racecheck synccheck initcheck; do
    san $tool attention attention_bwd/gpu/bf16_d96_b2_sq113_sk203_h4x2_causal_atomic_mma
    san $tool attention attention/mma/bf16_d192_b2_sq113_sk203_h4x2_causal
  done
  san racecheck attention attention_bwd/gpu/f16_d192_b2_sq113_sk203_h4x2_det_mma
  san racecheck gla 'gla/backward/gpu/tc/b2_t1000_h2_dk64_dv64_g[-0.05,0)'
  P=/tmp/pyd9h; python3 -m pip install --quiet --no-index --no-deps --target $P $B/python/*.whl > $L/pip.log 2>&1
  s=$(date +%s); PYTHONPATH=$P timeout 150 python3 $B/python/test_attention.py > $L/py_attention.log 2>&1
  echo "py attention rc=$? $(( $(date +%s)-s ))s $(grep -E '^[0-9]+ passed, [0-9]+ failed' $L/py_attention.log | tail -1)" >> $S
  grep -E "^(SKIP|FAIL)" -A4 $L/py_attention.log | head -12 >> $S
  python3 -m pip install --quiet --no-index --no-deps --target $P $B/wheels/*.whl >> $L/pip.log 2>&1
  export PYTHONPATH=$P KERNELS_PEERS_DIR=$B/peers KBENCH_ATTENTION_DIMS=96,192 KBENCH_ATTENTION_SEQS=${SEQS:-4096,8192,16384}
  for k in attention attention-backward; do
    s=$(date +%s); timeout -k 5 ${T:-150} $B/bin/kbench $k --out $OUT > $L/bench-$k.log 2>&1
    echo "bench $k rc=$? $(( $(date +%s)-s ))s" >> $S
    sed -n '/^== table/,$p' $L/bench-$k.log | grep -E "attention_fwd |attention_fwd_bwd" | tail -40 >> $S
    grep -i "note\|error\|MISMATCH" $L/bench-$k.log | tail -5 >> $S
  done
fi
if [ "$part" = dec ]; then
  t dec $B/bin/test-attention attention_decode/gpu
  t cli $B/bin/test-cli decode
  for tool in memcheck racecheck synccheck initcheck; do
    san $tool attention attention_decode/gpu/bf16_d128_sq16_h32x8_page32_ctx5000_33_2048_causal_splits128
    san $tool attention attention_decode/gpu/f16_d96_sq3
  done
  san memcheck attention attention_decode/gpu/clamps_bad_tables
  san memcheck attention attention_decode/gpu/bf16_d192_sq3
  for tool in memcheck racecheck synccheck initcheck; do
    san $tool attention attention/hopper/bf16_d192_b2_sq113_sk203_h4x2_causal
  done
  P=/tmp/pyd9h; python3 -m pip install --quiet --no-index --no-deps --target $P $B/python/*.whl > $L/pip-w.log 2>&1
  for f in attention attention_varlen attention_decode; do
    s=$(date +%s); PYTHONPATH=$P timeout 200 python3 $B/python/test_$f.py > $L/py_$f.log 2>&1
    echo "py $f rc=$? $(( $(date +%s)-s ))s $(grep -E '^[0-9]+ passed, [0-9]+ failed' $L/py_$f.log | tail -1)" >> $S
    grep -E "^(SKIP|FAIL)" -A6 $L/py_$f.log | head -30 >> $S
  done
  TT=250 t d96 $B/bin/test-attention d96 --skip emulated
  TT=250 t d192 $B/bin/test-attention d192 --skip emulated
  P=/tmp/pyd9d; python3 -m pip install --quiet --no-index --no-deps --target $P $B/wheels/*.whl > $L/pip.log 2>&1
  export PYTHONPATH=$P KERNELS_PEERS_DIR=$B/peers
  s=$(date +%s); timeout -k 5 ${TD:-200} $B/bin/kbench attention-decode --out $OUT > $L/bench-decode.log 2>&1
  echo "bench attention-decode rc=$? $(( $(date +%s)-s ))s" >> $S
  sed -n '/^== table/,$p' $L/bench-decode.log | grep -E "attention_decode|memcpy" | tail -60 >> $S
  grep -i "note\|error\|MISMATCH\|panicked" $L/bench-decode.log | tail -5 >> $S
  s=$(date +%s); KBENCH_ATTENTION_DIMS=96,192 KBENCH_ATTENTION_SEQS=4096,8192,16384 timeout -k 5 ${T:-150} $B/bin/kbench attention --out $OUT > $L/bench-attention.log 2>&1
  echo "bench attention D96/192 rc=$? $(( $(date +%s)-s ))s" >> $S
  sed -n '/^== table/,$p' $L/bench-attention.log | grep -E "attention_fwd " | tail -40 >> $S
fi
if [ "$part" = hvar ]; then
  TT=300 t varlen $B/bin/test-attention attention_varlen/ --skip emulated
  t capvar $B/bin/test-attention attention_capsink/varlen
  t fwd_h128 $B/bin/test-attention attention/hopper/bf16_d128
  t varbwd $B/bin/test-attention attention_varlen_bwd/ --skip emulated
  P=/tmp/pyd9c; python3 -m pip install --quiet --no-index --no-deps --target $P $B/python/*.whl > $L/pip.log 2>&1
  for f in attention_varlen attention_capsink attention; do
    s=$(date +%s); PYTHONPATH=$P timeout 200 python3 $B/python/test_$f.py --quick > $L/py_$f.log 2>&1
    echo "py $f rc=$? $(( $(date +%s)-s ))s $(grep -E '^[0-9]+ passed, [0-9]+ failed' $L/py_$f.log | tail -1)" >> $S
    grep -E "^(SKIP|FAIL)" -A4 $L/py_$f.log | head -12 >> $S
  done
  FP=/tmp/fa4pkgs
  [ -d $FP ] && export PYTHONPATH=$FP/nvidia_cutlass_dsl/dsl_packages:$FP
  export KERNELS_PEERS_DIR=$B/peers
  s=$(date +%s); timeout -k 5 ${T:-300} $B/bin/kbench attention-varlen --out $OUT > $L/bench-varlen.log 2>&1
  echo "kbench attention-varlen rc=$? $(( $(date +%s)-s ))s" >> $S
  tail -30 $L/bench-varlen.log >> $S
  cp $L/varlen.log $L/bench-varlen.log $OUT/ 2>/dev/null
fi
if [ "$part" = hvarsan ]; then
  for tool in memcheck racecheck synccheck initcheck; do
    for f in attention_varlen/hopper/clamps_bad_boundaries \
             attention_varlen/hopper/bf16_d64_h4x4_lens500x700_700x500_33x1_win \
             attention_capsink/varlen_hopper/bf16_d128; do
      san $tool attention $f
    done
  done
fi
if [ "$part" = app ]; then
  t append $B/bin/test-attention attention_append/
  TT=300 t decode $B/bin/test-attention attention_decode/gpu
  for tool in memcheck racecheck synccheck initcheck; do
    san $tool attention attention_append/gpu/bf16_d128
  done
  P=/tmp/pyd9c; python3 -m pip install --quiet --no-index --no-deps --target $P $B/python/*.whl > $L/pip.log 2>&1
  s=$(date +%s); PYTHONPATH=$P timeout 200 python3 $B/python/test_attention_decode.py --quick > $L/py_decode.log 2>&1
  echo "py attention_decode rc=$? $(( $(date +%s)-s ))s $(grep -E '^[0-9]+ passed, [0-9]+ failed' $L/py_decode.log | tail -1)" >> $S
  grep -E "^(SKIP|FAIL|ok   decode: k)" -A4 $L/py_decode.log | head -12 >> $S
fi
if [ "$part" = hdall ]; then
  TT=400 t fwd $B/bin/test-attention attention/ --skip emulated
  TT=300 t varlen $B/bin/test-attention attention_varlen/ --skip emulated
  TT=300 t decode $B/bin/test-attention attention_decode/gpu
  TT=300 t capsink $B/bin/test-attention attention_capsink/ --skip emulated
  P=/tmp/pyd9e; python3 -m pip install --quiet --no-index --no-deps --target $P $B/python/*.whl > $L/pip.log 2>&1
  for f in test_attention test_attention_varlen test_attention_decode; do
    s=$(date +%s); PYTHONPATH=$P timeout 200 python3 $B/python/$f.py --quick > $L/py_$f.log 2>&1
    echo "py $f rc=$? $(( $(date +%s)-s ))s $(grep -E '^[0-9]+ passed, [0-9]+ failed' $L/py_$f.log | tail -1)" >> $S
    grep -E "^(SKIP|FAIL)" -A4 $L/py_$f.log | head -12 >> $S
  done
fi
if [ "$part" = hdsan ]; then
  for tool in memcheck racecheck synccheck initcheck; do
    san $tool attention attention/hopper/bf16_d80_b2_sq113_sk203_h4x2_causal
    san $tool attention attention/mma/bf16_d144_b2_sq113_sk203_h4x2_causal
    san $tool attention attention/hopper/bf16_d240_b2_sq113_sk203_h4x2
    san $tool attention attention/hopper/bf16_d192_b2_sq113_sk203_h4x2_causal
    san $tool attention attention_varlen/hopper/bf16_d256_
    san $tool attention attention_capsink/hopper/bf16_d144_b2_sq113_sk203_h4x2
    san $tool attention attention_decode/gpu/bf16_d80_sq3_h8x2_page64
  done
fi
if [ "$part" = hdbench ]; then
  P=/tmp/pyd9e; python3 -m pip install --quiet --no-index --no-deps --target $P $B/wheels/*.whl > $L/pip.log 2>&1
  export PYTHONPATH=$P KERNELS_PEERS_DIR=$B/peers KBENCH_ATTENTION_SEQS=${SEQS:-4096,16384}
  export KBENCH_ATTENTION_DIMS=${DIMS:-32,48,64,80,96,112,128,144,160,176,192,208,224,240,256}
  s=$(date +%s); timeout -k 5 ${T:-500} $B/bin/kbench attention --out $OUT > $L/bench-attention.log 2>&1
  echo "bench attention rc=$? $(( $(date +%s)-s ))s" >> $S
  sed -n '/^== table/,$p' $L/bench-attention.log | grep -E "attention_fwd " | tail -130 >> $S
  grep -i "note\|error\|MISMATCH" $L/bench-attention.log | tail -5 >> $S
fi
if [ "$part" = ncu64 ]; then
  for d in 64 128; do
    python3 - $d <<'PY'
import sys, torch
from safetensors.torch import save_file
d = int(sys.argv[1]); h = 2048 // d
g = torch.Generator().manual_seed(7)
t = lambda: (torch.rand(2, 8192, h, d, generator=g) * 2 - 1).bfloat16()
save_file({"q": t(), "k": t(), "v": t()}, f"/tmp/ncu_in_{d}.st")
PY
    timeout 200 ncu --set full -k regex:attention_fwd_hopper -c 1 -o $OUT/fwd_d$d $CLI attention /tmp/ncu_in_$d.st -o /tmp/ncu_out.st > $L/ncu_$d.log 2>&1
    echo "ncu D$d rc=$?" >> $S
    ncu -i $OUT/fwd_d$d.ncu-rep --page details > $OUT/fwd_d$d.txt 2>&1; rm -f $OUT/fwd_d$d.ncu-rep
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued|No Eligible" $OUT/fwd_d$d.txt | sed "s/^/D$d /" >> $S
  done
fi
if [ "$part" = grid ]; then
  P=/tmp/pyd9e; python3 -m pip install --quiet --no-index --no-deps --target $P $B/wheels/*.whl > $L/pip.log 2>&1
  FP=/tmp/fa4pkgs; export PYTHONPATH=$P
  [ -d $FP ] && export PYTHONPATH=$FP/nvidia_cutlass_dsl/dsl_packages:$FP:$P
  export KERNELS_PEERS_DIR=$B/peers
  s=$(date +%s); timeout -k 5 ${T:-540} $B/bin/kbench attention --out $OUT > $L/bench-attention.log 2>&1
  echo "bench attention rc=$? $(( $(date +%s)-s ))s" >> $S
  sed -n '/^== table/,$p' $L/bench-attention.log | grep -E "attention_fwd " | tail -200 >> $S
  grep -i "note\|error\|MISMATCH\|peer fa4" $L/bench-attention.log | tail -5 >> $S
fi
if [ "$part" = fq ]; then
  bwd_tests
  for d in 128 64; do
    [ $d = 128 ] && bwd_inputs 2 4096 16 128 || bwd_inputs 2 8192 16 64
    bwd_times $d
  done
  py_attention /tmp/pyd9fq
fi
# kbench attention-backward at head dimensions $1 with its peers (FA4 when under /tmp/fa4pkgs).
bwd_bench() {
  local P=/tmp/pyd9b FP=/tmp/fa4pkgs
  python3 -m pip install --quiet --no-index --no-deps --target $P $B/wheels/*.whl > $L/pip.log 2>&1
  export PYTHONPATH=$P
  [ -d $FP ] && export PYTHONPATH=$FP/nvidia_cutlass_dsl/dsl_packages:$FP:$P
  export KERNELS_PEERS_DIR=$B/peers KBENCH_ATTENTION_DIMS=$1 KBENCH_ATTENTION_SEQS=${SEQS:-4096,8192,16384}
  local s=$(date +%s); timeout -k 5 ${T:-500} $B/bin/kbench attention-backward --out $OUT > $L/bench.log 2>&1
  echo "bench rc=$? $(( $(date +%s)-s ))s" >> $S
  sed -n '/^== table/,$p' $L/bench.log | grep "attention_fwd_bwd" | tail -80 >> $S
  grep -i "note\|error\|MISMATCH\|peer fa4" $L/bench.log | tail -5 >> $S
}
if [ "$part" = fqb ]; then
  bwd_bench ${DIMS:-64,128,256}
fi
if [ "$part" = fqsan ]; then
  for tool in memcheck racecheck synccheck initcheck; do
    for f in ${FQSAN:-attention_bwd/gpu/bf16_d128_b2_sq113_sk203_h4x2_atomic attention_bwd/gpu/f16_d64_b2_sq113_sk203_h4x2_causal_atomic attention_capsink_bwd/auto/bf16_d128_b1_sq239_sk130_h4x2_causal_softcap20_atomic}; do
      san $tool attention $f
    done
  done
fi
if [ "$part" = ncufq ]; then
  bwd_inputs 2 4096 16 128
  ncu --set full -k regex:dkdvq -c 1 -o $OUT/dkdvq $CLI attention-backward /tmp/attn_bwd_128.st -o /tmp/x.st > $L/ncu.log 2>&1
  ncu -i $OUT/dkdvq.ncu-rep --page details > $OUT/dkdvq.txt 2>&1; rm -f $OUT/dkdvq.ncu-rep
  grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc Active|Warp Cycles Per Issued|No Eligible|Tensor|Stall|lts__" $OUT/dkdvq.txt | head -40 >> $S
fi
if [ "$part" = bwd96 ]; then
  t bwd96 $B/bin/test-attention _d96_ --skip emulated --skip attention_fwd --skip attention_varlen/ --skip attention_capsink/ --skip attention_decode
  for tool in memcheck racecheck synccheck initcheck; do
    for f in ${B96SAN:-attention_bwd/gpu/bf16_d96_b2_sq113_sk203_h4x2_causal_atomic attention_bwd/gpu/f16_d96_b2_sq113_sk203_h4x2_det}; do
      san $tool attention $f
    done
  done
  bwd_inputs 4 4096 16 96
  bwd_times 96
  bwd_bench 96
fi
if [ "$part" = wide ]; then
  bwd_tests
  list=$($B/bin/test-attention --list 2>/dev/null | sed 's/: test$//')
  cases="$(echo "$list" | grep -E '^attention_bwd/gpu/f16_d256_b2_sq113_sk203_h4x2_causal(_dlse)?_atomic$')
    $(echo "$list" | grep -E '^attention_bwd/gpu/bf16_d256_b1_sq300_sk300_h4x2_.*atomic$' | head -1)
    $(echo "$list" | grep -E '^attention_capsink_bwd/auto/bf16_d256_b1_sq239_sk130_h4x2_causal_softcap20.*atomic$' | head -1)"
  san_cases "$cases"
  py_attention /tmp/pyd9w
fi
if [ "$part" = wideb ]; then
  bwd_inputs 2 8192 8 256
  bwd_times 256
  bwd_bench 256
fi
if [ "$part" = ord ]; then
  bwd_tests
  grep -h "deterministic backward.*runs" $L/bwd.log >> $S
  list=$($B/bin/test-attention --list 2>/dev/null | sed 's/: test$//')
  cases="$(echo "$list" | grep -E '^attention_bwd/gpu/bf16_d128_b2_sq113_sk203_h4x2(_dlse)?_det$')
    $(echo "$list" | grep -E '^attention_bwd/gpu/f16_d64_b1_sq300_sk300_h4x2_causal(_dlse)?_det$')
    $(echo "$list" | grep -E '^attention_bwd/gpu/bf16_d64_b1_sq300_sk300_h2x2_win.*_det$' | head -1)
    $(echo "$list" | grep -E '^attention_capsink_bwd/auto/bf16_d64_b1_sq300_sk300_h4x2_win40_7_softcap20.*_det$' | head -1)"
  san_cases "$cases"
  py_attention /tmp/pyd9o
  bwd_inputs 2 4096 16 128
  bwd_times 128
  bwd_inputs 2 8192 16 64
  bwd_times 64
fi
if [ "$part" = nar ]; then
  bwd_tests
  grep -h "deterministic backward.*runs" $L/bwd.log >> $S
  san_cases "attention_bwd/gpu/f16_d64_b2_sq113_sk203_h4x2_causal_atomic
    attention_bwd/gpu/bf16_d64_b2_sq1_sk1_h4x2_atomic
    attention_bwd/gpu/bf16_d64_b1_sq300_sk300_h2x2_win40_7_dlse_det
    attention_bwd/gpu/f16_d64_b1_sq239_sk17_h4x2_det"
  bwd_inputs 2 8192 16 64
  bwd_times 64
  SEQS=4096,16384 T=200 bwd_bench 64
fi
if [ "$part" = rows ]; then
  t bwd $B/bin/test-attention attention_bwd/ --skip emulated
  t capb $B/bin/test-attention attention_capsink_bwd/ --skip emulated
  t vbwd $B/bin/test-attention attention_varlen_bwd/ --skip emulated
  san_cases "attention_bwd/gpu/bf16_d128_b2_sq113_sk203_h4x2_atomic
    attention_bwd/gpu/bf16_d256_b2_sq113_sk203_h4x2_causal_atomic
    attention_capsink_bwd/auto/bf16_d128_b1_sq239_sk130_h4x2_causal_softcap20_atomic"
  bwd_inputs 2 8192 16 64
  bwd_times 64
  bwd_inputs 2 4096 16 128
  bwd_times 128
  SEQS=4096,16384 T=250 bwd_bench 64,128
fi
if [ "$part" = bwdhd ]; then
  steps=" ${BWDHD_STEPS:-tests san py bench} "
  [[ $steps == *" tests "* ]] && bwd_tests
  [[ $steps == *" san "* ]] && san_cases "attention_bwd/gpu/bf16_d80_b2_sq113_sk203_h4x2_causal
    attention_bwd/gpu/f16_d160_b2_sq113_sk203_h4x2_win40_7
    attention_bwd/gpu/bf16_d176_b2_sq113_sk203_h4x2_causal
    attention_bwd/gpu/f16_d240_b2_sq113_sk203_h4x2_win40_7
    attention_varlen_bwd/gpu/bf16_d112_h4x2
    attention_capsink_bwd/auto/bf16_d224_b2_sq113_sk203_h4x2_softcap5"
  [[ $steps == *" py "* ]] && py_attention /tmp/pyd9hd
  [[ $steps == *" bench "* ]] && SEQS=4096,16384 T=300 bwd_bench 80,112,160,240
fi
if [ "$part" = pad ]; then
  bwd_tests
  san_cases "${PADSAN:-attention_bwd/gpu/bf16_d80_b2_sq113_sk203_h4x2_causal
    attention_bwd/gpu/f16_d112_b2_sq113_sk203_h4x2_win40_7
    attention_bwd/gpu/bf16_d32_b2_sq113_sk203_h4x2_dlse_atomic
    attention_bwd/gpu/f16_d48_b1_sq239_sk17_h4x2_causal
    attention_capsink_bwd/auto/bf16_d80_b2_sq113_sk203_h4x2_softcap5}"
  py_attention /tmp/pyd9pad
  SEQS=4096,16384 T=320 bwd_bench 32,48,80,112
fi
if [ "$part" = pad2 ]; then
  t bwd $B/bin/test-attention attention_bwd/ --skip emulated
  t capb $B/bin/test-attention attention_capsink_bwd/ --skip emulated
  t vbwd $B/bin/test-attention attention_varlen_bwd/ --skip emulated
  san_cases "attention_bwd/gpu/bf16_d160_b2_sq113_sk203_h4x2_causal_atomic
    attention_capsink_bwd/auto/bf16_d240_b2_sq113_sk203_h4x2_softcap5"
  py_attention /tmp/pyd9pad2
  SEQS=4096 T=100 bwd_bench 160,240
fi
if [ "$part" = e2e2 ]; then
  end=$(( $(date +%s) + ${E2E_BUDGET:-520} )); steps=${E2E_STEPS:-ddp tests py fla}
  left() { echo $(( end - $(date +%s) )); }
  has() { [[ " $steps " == *" $1 "* ]]; }
  P=/tmp/pyd9e2; E=python/e2e; TC=/tmp/tcache9
  python3 -m pip install --quiet --no-index --no-deps --upgrade --target $P $B/python/*.whl $B/wheels/*.whl > $L/pip.log 2>&1
  export PYTHONPATH=$P TRITON_CACHE_DIR=$TC NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1
  mkdir -p $TC; FT=bench/results/sweeps/fla-autotune-h100.tgz; [ -f $FT ] && tar -xzf $FT -C $TC
  echo "fla autotune results restored: $(find $TC -name '*.autotune.json' | wc -l)" >> $S
  nvidia-smi --query-gpu=index,name --format=csv,noheader >> $S
  [ -f /tmp/python9.json ] || cp bench/results/python.json /tmp/python9.json
  commit=$(sed -n 's/^commit=//p' $B/MANIFEST)
  harvest() { (cd $TC && find . -name '*.autotune.json' | tar -czf $OUT/fla-autotune-h100.tgz -T -); cp /tmp/python9.json $OUT/python.json; echo "fla autotune results saved: $(find $TC -name '*.autotune.json' | wc -l)" >> $S; }
  if has ddp; then
    s=$(date +%s); timeout $(left) python3 $E/ddp_llama.py /tmp/python9.json --commit $commit > $L/ddp.log 2>&1
    echo "e2e ddp_llama rc=$? $(( $(date +%s)-s ))s" >> $S
    grep -E "^(llama_ddp_train_step|FAIL|SKIP|ddp_llama|Traceback)" $L/ddp.log >> $S
  fi
  # fla's autotuning warmed on GPU 1 while GPU 0 runs the tests (on one GPU: after them).
  warm0="${WARM0:-dk64 dv128,dk64 dv128 padded}" warm1="${WARM1:-dk128 dv128,dk64 dv64}" w1=
  if has fla && [ $(nvidia-smi -L | wc -l) -ge 2 ]; then
    CUDA_VISIBLE_DEVICES=1 timeout $(( $(left) - 30 )) python3 $E/fla_gla.py /tmp/warm1.json \
      --layer-cases "$warm1" --models none > $L/fla_warm1.log 2>&1 &
    w1=$!
  else
    warm0="$warm0,$warm1"
  fi
  export CUDA_VISIBLE_DEVICES=0
  has tests && bwd_tests
  if has py; then
    for f in mhc gla semicrf attention attention_varlen attention_decode attention_capsink attention_capsink_bwd; do
      s=$(date +%s); timeout 200 python3 python/tests/test_$f.py > $L/py_$f.log 2>&1
      echo "py $f rc=$? $(( $(date +%s)-s ))s $(grep -E '^[0-9]+ passed' $L/py_$f.log)" >> $S
      grep -E "^FAIL" -A6 $L/py_$f.log | head -14 >> $S
    done
  fi
  if has fla; then
    s=$(date +%s); timeout $(( $(left) - 30 )) python3 $E/fla_gla.py /tmp/warm0.json \
      --layer-cases "$warm0" > $L/fla_warm0.log 2>&1
    echo "fla warm0 rc=$? $(( $(date +%s)-s ))s" >> $S
    [ -n "$w1" ] && { wait $w1; echo "fla warm1 rc=$?" >> $S; }
    grep -hE "^(fla_gla|FAIL)" $L/fla_warm*.log | sed 's/^/warm: /' >> $S
    harvest
    if [ $(left) -gt 120 ]; then
      s=$(date +%s); timeout $(( $(left) - 10 )) python3 $E/fla_gla.py /tmp/python9.json --commit $commit > $L/fla.log 2>&1
      echo "e2e fla_gla rc=$? $(( $(date +%s)-s ))s" >> $S
      grep -E "^(fla_gla|FAIL|SKIP)" $L/fla.log >> $S
    fi
  fi
  if has flafull; then
    s=$(date +%s); timeout $(( $(left) - 10 )) python3 $E/fla_gla.py /tmp/python9.json --commit $commit > $L/fla.log 2>&1
    echo "e2e fla_gla rc=$? $(( $(date +%s)-s ))s" >> $S
    grep -E "^(fla_gla|FAIL|SKIP)" $L/fla.log >> $S
  fi
  harvest; unset CUDA_VISIBLE_DEVICES
fi
if [ "$part" = fp8 ]; then
  steps=" ${FP8_STEPS:-tests san cli bench} "
  if [[ $steps == *" tests "* ]]; then
    t fp8 $B/bin/test-attention attention_fp8/ --nocapture
    grep -E "^test |max \|O|FP8 max" $L/fp8.log | head -80 > $OUT/fp8-tests.txt
    grep -E "accuracy|D (128|256): FP8" $L/fp8.log >> $S
    TT=400 t hopper $B/bin/test-attention attention/hopper/
  fi
  [[ $steps == *" san "* ]] && san_cases "${FP8SAN:-attention_fp8/bf16_d128_b2_sq113_sk203_h4x2_causal
    attention_fp8/bf16_d256_b1_sq500_sk700_h4x4_win64_32
    attention_fp8/bf16_d128_b1_sq129_sk389_h2x1
    attention_fp8/variant_hpp/bf16_d128_b1_sq1023_sk1024_h4x2_causal
    attention_fp8/variant_hlazy/bf16_d256_b2_sq113_sk203_h4x2}"
  if [[ $steps == *" cli "* ]]; then
    t cli $B/bin/test-cli gpu/
    python3 - <<'PY'
import torch
from safetensors.torch import save_file
torch.manual_seed(0)
r=lambda: (torch.rand(2,8192,16,128,device='cuda')*2-1).mul(448).to(torch.float8_e4m3fn)
one=lambda x: torch.tensor([x],dtype=torch.float32)
save_file({'q':r(),'k':r(),'v':r(),'q_descale':one(1/448),'k_descale':one(1/448),'v_descale':one(1/448)},'/tmp/fp8_in.st')
PY
    $CLI attention /tmp/fp8_in.st -o /tmp/fp8_out.st --repeat 20 2>&1 | grep -i "median\|error" | sed "s/^/fp8 D128 S8k B2 H16 /" >> $S
    ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy --metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active -k regex:attention_fwd_hopper_fp8_d128 -c 1 $CLI attention /tmp/fp8_in.st -o /tmp/fp8_out2.st > $OUT/ncu-fp8-d128.txt 2>&1
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|No Eligible|Registers Per|Eligible Warps|Warp Cycles Per Issued|Tensor is|pipe_xu" $OUT/ncu-fp8-d128.txt | head -20 >> $S
  fi
  if [[ $steps == *" py "* ]]; then
    python3 -m pip install --quiet --no-index --no-deps --target /tmp/pyd9f8 $B/python/*.whl > $L/pip.log 2>&1
    for f in attention_fp8 attention; do
      s=$(date +%s); PYTHONPATH=/tmp/pyd9f8 timeout 300 python3 $B/python/test_$f.py > $L/py_$f.log 2>&1
      echo "py $f rc=$? $(( $(date +%s)-s ))s $(grep -E '^[0-9]+ passed, [0-9]+ failed' $L/py_$f.log | tail -1)" >> $S
      grep -E "^(ok|SKIP|FAIL)" -A4 $L/py_$f.log | grep -v "^ok .*attention/" | head -30 >> $S
    done
  fi
  if [[ $steps == *" bench "* ]]; then
    export KBENCH_ATTENTION_DIMS=${DIMS:-128,256} KBENCH_ATTENTION_SEQS=${SEQS:-1024,2048,4096,8192,16384}
    s=$(date +%s); timeout -k 5 ${T:-300} $B/bin/kbench attention-fp8 --out $OUT > $L/bench.log 2>&1
    echo "bench rc=$? $(( $(date +%s)-s ))s" >> $S
    sed -n '/^== table/,$p' $L/bench.log | tail -90 >> $S
    grep -i "note\|error\|MISMATCH" $L/bench.log | tail -5 >> $S
  fi
fi
if [ "$part" = dyn ]; then
  steps=" ${DYN_STEPS:-tests san bench} "
  if [[ $steps == *" tests "* ]]; then
    t dynt $B/bin/test-attention hopper_variant_hdyn --nocapture
    grep -E "max \|O" $L/dynt.log | head -40 > $OUT/dyn-tests.txt
    TT=400 t hopper $B/bin/test-attention attention/hopper
    TT=400 t varlen $B/bin/test-attention attention_varlen/
  fi
  [[ $steps == *" san "* ]] && san_cases "${DYNSAN:-attention/hopper_variant_hdyn/bf16_d64_b2_sq1023_sk1024_h4x2_causal
    attention/hopper_variant_hdyn/bf16_d128_b1_sq500_sk700_h4x4_win64_32}"
  if [[ $steps == *" bench "* ]]; then
    s=$(date +%s); KBENCH_ATTENTION_DIMS=${DIMS:-64,128} KBENCH_ATTENTION_SEQS=${SEQS:-1024,2048,4096,8192,16384} KBENCH_ATTENTION_VARIANTS=${VARIANTS:-hdyn} timeout -k 5 ${T:-300} $B/bin/kbench attention --out $OUT > $L/bench.log 2>&1
    echo "bench rc=$? $(( $(date +%s)-s ))s" >> $S
    grep -i "note\|error\|MISMATCH" $L/bench.log | tail -5 >> $S
    fwd_table $OUT/attention.json ours-hdyn sdpa-cudnn >> $S
  fi
fi
if [ "$part" = auto ]; then
  steps=" ${AUTO_STEPS:-tests san py bench} "
  if [[ $steps == *" tests "* ]]; then
    TT=400 t hopper $B/bin/test-attention attention/hopper
    grep -E "^(b?f16)_d(64|128)_.*causal on|sk8192.*on sm|sk8200.*on sm" $L/hopper.log > $OUT/auto-tests.txt
    TT=400 t varlen $B/bin/test-attention attention_varlen/
    t cli $B/bin/test-cli gpu/
    TT=300 t props $B/bin/test-reliability props_
    t conc $B/bin/test-reliability concurrent
    t attn_rel $B/bin/test-reliability _attention
  fi
  [[ $steps == *" san "* ]] && san_cases "${AUTOSAN:-attention/hopper/f16_d64_b2_sq700_sk700_h4x2_causal
    attention/hopper/f16_d64_b2_sq200_sk8200_h4x2
    attention/hopper/f16_d128_b2_sq1023_sk1024_h4x2_causal}"
  [[ $steps == *" py "* ]] && py_attention /tmp/pyd9auto
  if [[ $steps == *" bench "* ]]; then
    s=$(date +%s); KBENCH_ATTENTION_DIMS=${DIMS:-64,128,256} KBENCH_ATTENTION_SEQS=${SEQS:-1024,2048,4096,8192,16384} KBENCH_ATTENTION_VARIANTS=hnp timeout -k 5 ${T:-300} $B/bin/kbench attention --out $OUT > $L/bench.log 2>&1
    echo "bench rc=$? $(( $(date +%s)-s ))s" >> $S
    mkdir -p $OUT/nocounter
    s=$(date +%s); KBENCH_ATTENTION_TILE_COUNTER=0 KBENCH_ATTENTION_DIMS=64,128 KBENCH_ATTENTION_SEQS=${SEQS:-1024,2048,4096,8192,16384} KBENCH_ATTENTION_VARIANTS=hnp timeout -k 5 ${T:-300} $B/bin/kbench attention --out $OUT/nocounter > $L/bench2.log 2>&1
    echo "bench nocounter rc=$? $(( $(date +%s)-s ))s" >> $S
    grep -i "note\|error\|MISMATCH" $L/bench.log $L/bench2.log | tail -5 >> $S
    python3 - $OUT/attention.json $OUT/nocounter/attention.json >> $S <<'PY'
import json, sys
def load(f):
    t = {}
    try:
        rows = json.load(open(f))['rows']
    except Exception as e:
        print(f"{f}: {e}"); return t
    for r in rows:
        c = r['config']
        if r['kernel'] == 'attention_fwd' and 'dv' not in c:
            t.setdefault((c['d'], c['seq'], c['batch'], c['causal']), {})[r['impl']] = r['tflops']
    return t
a, n = load(sys.argv[1]), load(sys.argv[2])
for k in sorted(a):
    v = a[k]; o = v.get('ours') or 0; p = n.get(k, {}).get('ours') or 0; cu = v.get('sdpa-cudnn') or 0
    hnp = v.get('ours-hnp') or 0
    print(f"d{k[0]} s{k[1]} b{k[2]} {'causal' if k[3] else 'full  '} ours {o:6.1f} nocounter {p:6.1f} ({o/p if p else 0:.3f}) hnp {hnp:6.1f} cudnn {cu:6.1f} ({o/cu if cu else 0:.3f})")
PY
  fi
fi
if [ "$part" = n192 ]; then
  steps=" ${N192_STEPS:-tests san bench} "
  if [[ $steps == *" tests "* ]]; then
    t n192 $B/bin/test-attention hopper_variant_hn192 --nocapture
    grep -E "max \|O" $L/n192.log > $OUT/n192-tests.txt
  fi
  [[ $steps == *" san "* ]] && san_cases "${N192SAN:-attention/hopper_variant_hn192/bf16_d64_b2_sq1023_sk1024_h4x2_causal
    attention/hopper_variant_hn192/bf16_d64_b1_sq500_sk700_h4x4_win64_32}"
  if [[ $steps == *" bench "* ]]; then
    s=$(date +%s); KBENCH_ATTENTION_TILE_COUNTER=0 KBENCH_ATTENTION_DIMS=64 KBENCH_ATTENTION_SEQS=${SEQS:-1024,2048,4096,8192,16384} KBENCH_ATTENTION_VARIANTS=${VARIANTS:-hn192,hpp64} timeout -k 5 ${T:-300} $B/bin/kbench attention --out $OUT > $L/bench.log 2>&1
    echo "bench rc=$? $(( $(date +%s)-s ))s" >> $S
    grep -i "note\|error\|MISMATCH" $L/bench.log | tail -5 >> $S
    fwd_table $OUT/attention.json ours-hn192 ours-hpp64 sdpa-cudnn >> $S
  fi
fi
if [ "$part" = ncu192 ]; then
  for s in 8191 8192; do
    python3 - $s <<'PY'
import sys, torch
from safetensors.torch import save_file
s = int(sys.argv[1]); torch.manual_seed(0)
r = lambda: (torch.rand(2, s, 32, 64, device='cuda') * 2 - 1).to(torch.bfloat16)
save_file({'q': r(), 'k': r(), 'v': r()}, f"/tmp/d64_{s}.st")
PY
    $CLI attention /tmp/d64_$s.st -o /tmp/d64_out.st --repeat 30 2>&1 | grep -i "median\|error\|kernel" | sed "s/^/D64 S$s B2 H32 /" >> $S
    ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum -k regex:attention_fwd_hopper -c 1 $CLI attention /tmp/d64_$s.st -o /tmp/d64_out2.st > $OUT/ncu-d64-$s.txt 2>&1
    echo "ncu S$s rc=$?" >> $S
    grep -E "attention_fwd_hopper|Duration|Compute \(SM\) Throughput|Issue Slots Busy|No Eligible|Eligible Warps|Warp Cycles Per Issued|pipe_xu|gmma_cycles|inst_executed.sum|Stall" $OUT/ncu-d64-$s.txt | head -24 | sed "s/^/S$s /" >> $S
  done
fi
if [ "$part" = ncudyn ]; then
  export KBENCH_ATTENTION_DIMS=128 KBENCH_ATTENTION_SEQS=16384 KBENCH_ATTENTION_VARIANTS=hdyn
  for k in attention_fwd_hopper_bf16_d128 attention_fwd_hopper_bf16_d128_hdyn; do
    timeout 300 ncu --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --metrics sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio,smsp__average_warp_latency_issue_stalled_barrier.ratio,smsp__average_warp_latency_issue_stalled_wait.ratio -k regex:"^$k\$" --launch-skip 70 -c 1 $B/bin/kbench attention --out /tmp/ncudyn-$k > $OUT/ncu-$k.txt 2>&1
    echo "ncu $k rc=$?" >> $S
    grep -E "^  attention_fwd_hopper|Duration|Issue Slots Busy|No Eligible|Eligible Warps|Warp Cycles Per Issued|pipe_xu|inst_executed.sum|stalled" $OUT/ncu-$k.txt | head -40 | sed "s/^/$k /" >> $S
  done
fi
if [ "$part" = detw ]; then
  steps=${DETW_STEPS:-tests san times bench}
  if [[ " $steps " == *" tests "* ]]; then bwd_tests; fi
  if [[ " $steps " == *" san "* ]]; then
    list=$($B/bin/test-attention --list 2>/dev/null | sed 's/: test$//')
    cases="$(echo "$list" | grep -E '^attention_bwd/gpu/f16_d256_b2_sq113_sk203_h4x2_causal(_dlse)?_det$' | head -1)
      $(echo "$list" | grep -E '^attention_bwd/gpu/bf16_d160_.*_det$' | head -1)
      $(echo "$list" | grep -E '^attention_capsink_bwd/auto/bf16_d256_.*softcap20.*_det$' | head -1)"
    san_cases "$cases"
  fi
  if [[ " $steps " == *" times "* ]]; then bwd_inputs 2 8192 8 256; bwd_times 256; fi
  if [[ " $steps " == *" bench "* ]]; then bwd_bench ${DIMS:-256,160}; fi
  if [[ " $steps " == *" neg "* ]]; then
    t neg $B/bin/test-reliability negative --nocapture
    grep -E "negative_attention_bwd_hopper_early_empty: " $L/neg.log >> $S
    for c in negative_attention_bwd_hopper_early_empty_racecheck_target \
      negative_attention_bwd_no_ds_barrier_racecheck_target; do
      san racecheck reliability $c
    done
  fi
fi
if [ "$part" = hvb ]; then
  steps=" ${HVB_STEPS:-tests san py bench} "
  if [[ $steps == *" tests "* ]]; then bwd_tests; fi
  if [[ $steps == *" vtests "* ]]; then
    t vbwd $B/bin/test-attention attention_varlen_bwd/ --skip emulated
    t capbv $B/bin/test-attention attention_capsink_bwd/varlen
  fi
  if [[ $steps == *" san "* ]]; then
    list=$($B/bin/test-attention --list 2>/dev/null | sed 's/: test$//')
    cases="attention_varlen_bwd/gpu/hopper_clamps_bad_boundaries
      $(echo "$list" | grep -E '^attention_varlen_bwd/gpu/bf16_d128_.*_win.*_det$' | head -1)
      $(echo "$list" | grep -E '^attention_varlen_bwd/gpu/bf16_d64_.*_dlse_atomic$' | head -1)
      $(echo "$list" | grep -E '^attention_varlen_bwd/gpu/f16_d256_.*_win.*_det$' | head -1)
      $(echo "$list" | grep -E '^attention_capsink_bwd/varlen/.*softcap.*_det$' | head -1)"
    san_cases "$cases"
  fi
  if [[ $steps == *" py "* ]]; then
    P=/tmp/pyd9c; python3 -m pip install --quiet --no-index --no-deps --target $P $B/python/*.whl > $L/pip.log 2>&1
    for f in ${PY_FILES:-attention_varlen attention_capsink_bwd attention}; do
      s=$(date +%s); PYTHONPATH=$P timeout 200 python3 $B/python/test_$f.py > $L/py_$f.log 2>&1
      echo "py $f rc=$? $(( $(date +%s)-s ))s $(grep -E '^[0-9]+ passed, [0-9]+ failed' $L/py_$f.log | tail -1)" >> $S
      grep -E "^(SKIP|FAIL)" -A4 $L/py_$f.log | head -12 >> $S
    done
  fi
  if [[ $steps == *" bench "* ]]; then
    FP=/tmp/fa4pkgs
    [ -d $FP ] && export PYTHONPATH=$FP/nvidia_cutlass_dsl/dsl_packages:$FP
    export KERNELS_PEERS_DIR=${PEERS:-$B/peers}
    s=$(date +%s); timeout -k 5 ${T:-300} $B/bin/kbench attention-varlen --out $OUT > $L/bench-varlen.log 2>&1
    echo "kbench attention-varlen rc=$? $(( $(date +%s)-s ))s" >> $S
    sed -n '/^== table/,$p' $L/bench-varlen.log | tail -60 >> $S
    grep -i "peer .*not available\|error\|MISMATCH" $L/bench-varlen.log | tail -8 >> $S
  fi
fi
if [ "$part" = vdim ]; then
  steps=" ${VDIM_STEPS:-tests san py} "
  if [[ $steps == *" tests "* ]]; then
    t hop $B/bin/test-attention attention/hopper
    t vhop $B/bin/test-attention attention_varlen/hopper
    t mvd $B/bin/test-attention attention/mma_value_dim
    t vmvd $B/bin/test-attention attention_varlen/mma_value_dim
    t vplan $B/bin/test-attention attention/value_dim_plans
    t cli $B/bin/test-cli gpu/
  fi
  if [[ $steps == *" san "* ]]; then
    list=$($B/bin/test-attention --list 2>/dev/null | sed 's/: test$//')
    cases="$(echo "$list" | grep -E '^attention/hopper_value_dim/bf16_d192_b2_sq113_sk203_h4x2_v128_causal$')
      $(echo "$list" | grep -E '^attention/hopper_value_dim/.*_win' | head -1)
      $(echo "$list" | grep -E '^attention_varlen/hopper_value_dim/bf16_.*64seqs.*_causal$' | head -1)
      $(echo "$list" | grep -E '^attention/mma_value_dim/bf16_d192_b2_sq113_sk203_h4x2_v128_causal$')
      $(echo "$list" | grep -E '^attention_varlen/mma_value_dim/bf16_.*64seqs.*_causal$' | head -1)"
    san_cases "$cases"
  fi
  if [[ $steps == *" py "* ]]; then
    P=/tmp/pyd9v; python3 -m pip install --quiet --no-index --no-deps --target $P $B/python/*.whl > $L/pip.log 2>&1
    for f in ${PY_FILES:-attention}; do
      s=$(date +%s); PYTHONPATH=$P timeout 300 python3 $B/python/test_$f.py > $L/py_$f.log 2>&1
      echo "py $f rc=$? $(( $(date +%s)-s ))s $(grep -E '^[0-9]+ passed, [0-9]+ failed' $L/py_$f.log | tail -1)" >> $S
      grep -E "^(SKIP|FAIL)" -A4 $L/py_$f.log | head -12 >> $S
      grep -E "dv128|value head" $L/py_$f.log >> $S
    done
  fi
  if [[ $steps == *" bench "* ]]; then
    FP=/tmp/fa4pkgs
    [ -d $FP ] && export PYTHONPATH=$FP/nvidia_cutlass_dsl/dsl_packages:$FP
    export KERNELS_PEERS_DIR=${PEERS:-$B/peers} KBENCH_ATTENTION_DIMS=128,192 \
      KBENCH_ATTENTION_SEQS=${SEQS:-4096,16384} KBENCH_ATTENTION_VARIANTS=hpp64
    s=$(date +%s); timeout -k 5 ${T:-300} $B/bin/kbench attention --out $OUT > $L/bench-fwd.log 2>&1
    echo "kbench attention rc=$? $(( $(date +%s)-s ))s" >> $S
    sed -n '/^== table/,$p' $L/bench-fwd.log | grep -v "ours-mma" | tail -40 >> $S
    grep -i "peer .*not available\|error\|MISMATCH" $L/bench-fwd.log | tail -8 >> $S
    unset KBENCH_ATTENTION_VARIANTS
  fi
  if [[ $steps == *" bwd "* ]]; then SEQS=${BSEQS:-4096,16384} bwd_bench ${BDIMS:-64,128}; fi
fi
if [ "$part" = vbwd ]; then
  steps=" ${VBWD_STEPS:-tests san bench} "
  [[ $steps == *" tests "* ]] && bwd_tests
  if [[ $steps == *" san "* ]]; then
    list=$($B/bin/test-attention --list 2>/dev/null | sed 's/: test$//')
    cases="$(echo "$list" | grep -E '^attention_bwd/hopper_value_dim/bf16_d192_b2_sq113_sk203_h4x2_v128_causal.*_(atomic|det)$')
      $(echo "$list" | grep -E '^attention_bwd/hopper_value_dim/.*_win' | head -1)
      $(echo "$list" | grep -E '^attention_varlen_bwd/hopper_value_dim/bf16_.*_causal.*_det$' | head -1)"
    san_cases "$cases"
  fi
  if [[ $steps == *" py "* ]]; then
    P=/tmp/pyd9w; python3 -m pip install --quiet --no-index --no-deps --target $P $B/python/*.whl > $L/pip-w.log 2>&1
    for f in attention attention_varlen; do
      s=$(date +%s); PYTHONPATH=$P timeout 300 python3 $B/python/test_$f.py > $L/py_$f.log 2>&1
      echo "py $f rc=$? $(( $(date +%s)-s ))s $(grep -E '^[0-9]+ passed, [0-9]+ failed' $L/py_$f.log | tail -1)" >> $S
      grep -E "^(SKIP|FAIL)" -A4 $L/py_$f.log | head -12 >> $S
      grep -E "dv128|value head" $L/py_$f.log >> $S
    done
  fi
  if [[ $steps == *" bench "* ]]; then SEQS=${BSEQS:-4096,16384} bwd_bench ${BDIMS:-192}; fi
  if [[ $steps == *" dec "* ]]; then
    P=/tmp/pyd9d FP=/tmp/fa4pkgs
    python3 -m pip install --quiet --no-index --no-deps --target $P $B/wheels/*.whl > $L/pip.log 2>&1
    export PYTHONPATH=$P KERNELS_PEERS_DIR=$B/peers
    [ -d $FP ] && export PYTHONPATH=$FP/nvidia_cutlass_dsl/dsl_packages:$FP:$P
    s=$(date +%s); timeout -k 5 ${TD:-400} $B/bin/kbench attention-decode --out $OUT > $L/bench-decode.log 2>&1
    echo "bench attention-decode rc=$? $(( $(date +%s)-s ))s" >> $S
    sed -n '/^== table/,$p' $L/bench-decode.log | grep -E "attention_decode|memcpy" | tail -80 >> $S
    grep -i "note\|error\|MISMATCH\|panicked\|peer fa4" $L/bench-decode.log | tail -8 >> $S
  fi
fi
if [ "$part" = dec2 ]; then
  t dec $B/bin/test-attention attention_decode/
  t app $B/bin/test-attention attention_append/
  t capdec $B/bin/test-attention attention_capsink/ --skip emulated
  t cli $B/bin/test-cli decode
  for tool in memcheck racecheck synccheck initcheck; do
    for f in attention_decode/gpu/bf16_d128_sq16_h32x8_page32_ctx5000_33_2048_causal_splits128 \
             attention_decode/gpu/bf16_d128_sq3_h8x2_page64_ctx1_777_0_4099_64_1500_causal_auto_softcap10_sinks \
             attention_decode/gpu/f16_d96_sq3; do
      san $tool attention $f
    done
  done
  san memcheck attention attention_decode/gpu/clamps_bad_tables
  P=/tmp/pyd9d FP=/tmp/fa4pkgs
  python3 -m pip install --quiet --no-index --no-deps --target $P $B/python/*.whl > $L/pip-w.log 2>&1
  s=$(date +%s); PYTHONPATH=$P timeout 200 python3 $B/python/test_attention_decode.py > $L/py_decode.log 2>&1
  echo "py attention_decode rc=$? $(( $(date +%s)-s ))s $(grep -E '^[0-9]+ passed, [0-9]+ failed' $L/py_decode.log | tail -1)" >> $S
  grep -E "^(SKIP|FAIL)" -A4 $L/py_decode.log | head -12 >> $S
  python3 -m pip install --quiet --no-index --no-deps --target $P $B/wheels/*.whl >> $L/pip.log 2>&1
  export PYTHONPATH=$P KERNELS_PEERS_DIR=$B/peers
  [ -d $FP ] && export PYTHONPATH=$FP/nvidia_cutlass_dsl/dsl_packages:$FP:$P
  s=$(date +%s); timeout -k 5 ${TD:-400} $B/bin/kbench attention-decode --out $OUT > $L/bench-decode.log 2>&1
  echo "bench attention-decode rc=$? $(( $(date +%s)-s ))s" >> $S
  sed -n '/^== table/,$p' $L/bench-decode.log | grep -E "attention_decode|memcpy" | grep -E "ours|memcpy" | tail -30 >> $S
  grep -i "note\|error\|MISMATCH\|panicked" $L/bench-decode.log | tail -8 >> $S
fi
if [ "$part" = flab ]; then
  P=/tmp/pyd9f TC=/tmp/tc
  python3 -m pip install --quiet --no-index --no-deps --target $P $B/wheels/*.whl > $L/pip.log 2>&1
  mkdir -p $TC
  for FT in bench/results/sweeps/fla-autotune-h100.tgz bench/results/sweeps/fla-autotune-h200.tgz; do
    [ -f $FT ] && tar -xzf $FT -C $TC
  done
  echo "fla autotune results restored: $(find $TC -name '*.autotune.json' | wc -l)" >> $S
  export PYTHONPATH=$P KERNELS_PEERS_DIR=$B/peers TRITON_CACHE_DIR=$TC
  s=$(date +%s); timeout -k 5 ${T:-540} $B/bin/kbench gla --out $OUT > $L/bench-gla-fla.log 2>&1
  echo "kbench gla (fla peer) rc=$? $(( $(date +%s)-s ))s" >> $S
  (cd $TC && find . -name '*.autotune.json' | tar -czf $OUT/fla-autotune-h200.tgz -T -)
  echo "fla autotune results saved: $(find $TC -name '*.autotune.json' | wc -l)" >> $S
  grep -E "peer " $L/bench-gla-fla.log | tail -20 >> $S
  sed -n '/^== table/,$p' $L/bench-gla-fla.log | grep -E "gla_fwd_bwd|gla_fwd " | grep -v "ours-" | tail -30 >> $S
fi
# CLI medians of attention-backward (--repeat 30), both modes, causal and not, of the bundle in
# /tmp/old/bundle and of this one, alternating, on bwd_inputs' file for B $1, S $2, H $3, D $4.
bwd_ab() {
  local d=$4 c mode b cli
  bwd_inputs "$@"
  for c in "" "--causal"; do
    for mode in "" "--deterministic"; do
      for b in old new; do
        cli=$CLI; [ $b = old ] && cli=/tmp/old/bundle/bin/kernels-cli
        $cli attention-backward /tmp/attn_bwd_$d.st -o /tmp/ab.st --repeat 30 $c $mode 2>&1 |
          grep -o "median.*" | sed "s/^/$b B$1 S$2 H$3 D$d ${c:-full} ${mode:-default} /" >> $S
      done
    done
  done
}
if [ "$part" = pmask ]; then
  steps=" ${PMASK_STEPS:-tests san ab py bench} "
  if [[ $steps == *" tests "* ]]; then
    bwd_tests
    grep -h "deterministic backward.*runs" $L/bwd.log >> $S
  fi
  [[ $steps == *" san "* ]] && san_cases "${PMASKSAN:-attention_bwd/gpu/f16_d64_b2_sq113_sk203_h4x2_causal_atomic
    attention_bwd/gpu/bf16_d128_b1_sq300_sk300_h2x2_win40_7_dlse_det
    attention_bwd/gpu/bf16_d256_b2_sq113_sk203_h4x2_causal_atomic
    attention_bwd/gpu/bf16_d96_b1_sq300_sk300_h2x2_win40_7_dlse_atomic
    attention_varlen_bwd/gpu/bf16_d128_h4x2_lens113x203_0x7_1x1_239x17_5x0_causal_dlse_atomic
    attention_capsink_bwd/auto/bf16_d128_b1_sq239_sk130_h4x2_causal_softcap20_atomic}"
  if [[ $steps == *" ab "* ]]; then
    bwd_ab 4 4096 32 64; bwd_ab 1 16384 32 64
    bwd_ab 4 4096 16 128; bwd_ab 1 16384 16 128
    bwd_ab 2 8192 8 256
  fi
  if [[ $steps == *" abbench "* ]]; then
    # kbench attention-backward without peers, the bundle before (old/) then this one (new/).
    for b in old new; do
      kb=$B/bin/kbench; [ $b = old ] && kb=/tmp/old/bundle/bin/kbench
      mkdir -p $OUT/$b; s=$(date +%s)
      KBENCH_PEERS=0 KBENCH_ATTENTION_DIMS=${ABDIMS:-64,128} KBENCH_ATTENTION_SEQS=${ABSEQS:-4096,16384} \
        timeout 280 $kb attention-backward --out $OUT/$b > $L/abbench-$b.log 2>&1
      echo "abbench $b rc=$? $(( $(date +%s)-s ))s" >> $S
      sed -n '/^== table/,$p' $L/abbench-$b.log | grep -E "attention_(fwd_)?bwd .* ours(-deterministic)? " | sed "s/^/$b /" >> $S
    done
  fi
  [[ $steps == *" py "* ]] && py_attention /tmp/pyd9pm
  [[ $steps == *" bench "* ]] && T=${T:-560} bwd_bench ${DIMS:-64,128,256}
fi
tar -czf $OUT/logs-$part.tgz -C /tmp logs9-$part
cat $S
