#!/usr/bin/env bash
# Runs everything in this bundle on a machine with an NVIDIA driver; no Rust needed.
#   1. tests: every test executable, each under a time limit (GPU tests also have an
#      in-process watchdog that fails a hung kernel within KERNELS_WATCHDOG_SECS);
#   2. compute-sanitizer memcheck, racecheck, synccheck and initcheck over the GPU test
#      executables (the negative controls, test-reliability negative_*, are always left out:
#      they race by design; bundle/reliability.sh runs them and expects the hazards), each run
#      with KERNELS_SANITIZER=<tool> (under racecheck the largest problems shrink, see
#      reliability.sh);
#   3. the Python package: the rustkernels wheel installed offline into <results>/pydeps, and
#      its GPU checks, one per family (python/test_{attention,attention_varlen,attention_decode,
#      attention_capsink,attention_capsink_bwd,gla,semicrf,mhc}.py:
#      f64 references, bad input, opcheck, torch.compile), each then again in quick mode on
#      the portable PTX (KERNELS_ARCH=sm_80); then python/e2e/llama_train.py (a transformers
#      Llama trained with our attention; writes <results>/python.json), python/e2e/ddp_llama.py
#      (the same under DDP on 2 GPUs against one GPU; SKIP with fewer), python/e2e/soak.py and
#      python/e2e/fla_gla.py (fla's own GLA layer and model with our chunk_gla swapped in, rows
#      into python.json; needs the peers' wheels, installed first);
#   4. benchmarks: bin/kbench <family> for each family, writing <results>/<family>.json
#      (peers run through python3 on the same inputs; the peers' packages are installed first
#      from wheels/ into <results>/pydeps, offline).
# Usage: run.sh RESULTS_DIR [--no-tests] [--no-sanitizer] [--no-python] [--no-bench] [--families "a b"]
#                           [--tests "smoke host"] [--tools "memcheck racecheck synccheck initcheck"]
#                           [--bench-args "..."]
# Environment: EXTRA_WHEELS (a folder of more peer wheels, e.g. FlashAttention-4's, brought to the
# machine separately: installed with the shipped ones), SANITIZER_SKIP (test-name substrings,
# separated by commas or spaces, left out of the sanitizer passes), SANITIZER_THREADS,
# SANITIZER_TIMEOUT, TEST_TIMEOUT, PYTHON_TIMEOUT, BENCH_TIMEOUT.
# Prints a summary table last; full logs go to RESULTS_DIR/logs.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: run.sh RESULTS_DIR [options]}"
shift
do_tests=1 do_san=1 do_python=1 do_bench=1 families="smoke" only_tests="" bench_args=""
tools="memcheck racecheck synccheck initcheck"
while [ $# -gt 0 ]; do
  case "$1" in
    --no-tests) do_tests=0 ;;
    --no-sanitizer) do_san=0 ;;
    --no-python) do_python=0 ;;
    --no-bench) do_bench=0 ;;
    --families) families="$2"; shift ;;
    --tests) only_tests="$2"; shift ;;
    --bench-args) bench_args="$2"; shift ;;
    --tools) tools="$2"; shift ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out/logs"
summary="$out/summary.txt"
: > "$summary"
note() { echo "$*" | tee -a "$summary"; }
status=0

note "bundle: $(tr '\n' ' ' < "$here/MANIFEST")"
note "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo none)"
export KERNELS_WATCHDOG_SECS="${KERNELS_WATCHDOG_SECS:-60}"

# The peers' pure-Python packages (fla, flash-linear-attention's layers and models,
# flash-semicrf, torch-struct), shipped as wheels: installed offline into the results folder,
# never system-wide, once (the Python section's fla end-to-end check and the benchmarks use
# them). Sets peers_ok=1 when they are there.
peers_done=0 peers_ok=0
install_peers() {
  [ "$peers_done" = 1 ] && return
  peers_done=1
  local wheels=("$here"/wheels/*.whl)
  if [ -n "${EXTRA_WHEELS:-}" ]; then wheels+=("$EXTRA_WHEELS"/*.whl); fi
  if compgen -G "$here/wheels/*.whl" >/dev/null || [ -n "${EXTRA_WHEELS:-}" ]; then
    if python3 -m pip install --quiet --disable-pip-version-check --no-index --no-deps \
        --upgrade --target "$out/pydeps" "${wheels[@]}" > "$out/logs/pip.log" 2>&1; then
      peers_ok=1
      note "peers: $(for w in "${wheels[@]}"; do printf '%s ' "${w##*/}"; done)installed into $out/pydeps"
    else
      note "peers: installing the shipped wheels failed (logs/pip.log): those peers record a note"
    fi
  fi
}

test_bins=()
for b in "$here"/bin/test-*; do
  name="${b##*/test-}"
  if [ -n "$only_tests" ] && ! grep -qw "$name" <<<"$only_tests"; then continue; fi
  test_bins+=("$b")
done

if [ "$do_tests" = 1 ]; then
  for b in "${test_bins[@]}"; do
    name="${b##*/test-}"
    log="$out/logs/test-$name.log"
    start=$(date +%s)
    timeout -k 10 "${TEST_TIMEOUT:-600}" "$b" > "$log" 2>&1
    rc=$?
    line=$(grep -E '^test result:' "$log" | tail -1)
    note "test $name: rc=$rc $(( $(date +%s) - start ))s ${line:-no result line}"
    grep -E '^(SKIP|WATCHDOG)|FAILED|failed' "$log" | head -20 | sed 's/^/    /' | tee -a "$summary"
    [ "$rc" = 0 ] || status=1
  done
fi

if [ "$do_san" = 1 ]; then
  if ! command -v compute-sanitizer >/dev/null; then
    note "sanitizer: compute-sanitizer not found"
    status=1
  else
    for tool in $tools; do
      for b in "${test_bins[@]}"; do
        name="${b##*/test-}"
        [ "$name" = host ] && continue
        log="$out/logs/sanitizer-$tool-$name.log"
        extra=()
        [ "$tool" = racecheck ] && extra=(--racecheck-report all)
        skips=(--skip negative_)
        IFS=', ' read -ra patterns <<< "${SANITIZER_SKIP:-}"
        for pat in "${patterns[@]}"; do [ -n "$pat" ] && skips+=(--skip "$pat"); done
        start=$(date +%s)
        KERNELS_SANITIZER="$tool" KERNELS_WATCHDOG_SECS=900 timeout -k 10 "${SANITIZER_TIMEOUT:-1200}" \
          compute-sanitizer --tool "$tool" --error-exitcode 86 "${extra[@]}" \
          "$b" --test-threads "${SANITIZER_THREADS:-1}" "${skips[@]}" > "$log" 2>&1
        rc=$?
        errors=$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1 | sed 's/=* *//')
        tests=$(grep -E '^test result:' "$log" | tail -1)
        note "sanitizer $tool $name: rc=$rc $(( $(date +%s) - start ))s ${errors:-no summary} | ${tests:-no result line}"
        [ "$rc" = 0 ] || status=1
      done
    done
  fi
fi

if [ "$do_python" = 1 ]; then
  # The rustkernels wheel, installed offline into the results folder (never system-wide), and
  # its GPU checks (one per family); a second, quick pass of each loads the portable (sm_80) PTX.
  if ! compgen -G "$here/python/*.whl" >/dev/null; then
    note "python: no rustkernels wheel in this bundle"
  elif ! python3 -m pip install --quiet --disable-pip-version-check --no-index --no-deps \
      --upgrade --target "$out/pydeps" "$here"/python/*.whl > "$out/logs/pip-rustkernels.log" 2>&1; then
    note "python: installing the rustkernels wheel failed (logs/pip-rustkernels.log)"
    status=1
  else
    for family in attention attention_varlen attention_decode attention_capsink \
        attention_capsink_bwd gla semicrf mhc; do
      test="$here/python/test_$family.py"
      if [ ! -f "$test" ]; then
        note "python $family: no $test in this bundle"
        status=1
        continue
      fi
      for pass in default sm_80; do
        log="$out/logs/python-$family-$pass.log"
        start=$(date +%s)
        if [ "$pass" = sm_80 ]; then
          KERNELS_ARCH=sm_80 PYTHONPATH="$out/pydeps${PYTHONPATH:+:$PYTHONPATH}" timeout -k 10 \
            "${PYTHON_TIMEOUT:-900}" python3 "$test" --quick > "$log" 2>&1
        else
          PYTHONPATH="$out/pydeps${PYTHONPATH:+:$PYTHONPATH}" timeout -k 10 "${PYTHON_TIMEOUT:-900}" \
            python3 "$test" > "$log" 2>&1
        fi
        rc=$?
        line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -1)
        note "python $family ($pass): rc=$rc $(( $(date +%s) - start ))s ${line:-no result line}"
        grep -E '^(SKIP|FAIL)' "$log" | head -20 | sed 's/^/    /' | tee -a "$summary"
        [ "$rc" = 0 ] || status=1
      done
    done
    # End to end: a transformers Llama trained with our attention against transformers' own
    # (results file <results>/python.json), then the soak through the Python layer.
    if [ -f "$here/python/e2e/llama_train.py" ]; then
      start=$(date +%s)
      PYTHONPATH="$out/pydeps${PYTHONPATH:+:$PYTHONPATH}" timeout -k 10 "${PYTHON_TIMEOUT:-900}" \
        python3 "$here/python/e2e/llama_train.py" "$out/python.json" \
        --commit "$(sed -n 's/^commit=//p' "$here/MANIFEST")" > "$out/logs/python-e2e-llama.log" 2>&1
      rc=$?
      note "python e2e llama: rc=$rc $(( $(date +%s) - start ))s -> $out/python.json"
      grep -E '^(llama_train_step|note:)' "$out/logs/python-e2e-llama.log" | sed 's/^/    /' | tee -a "$summary"
      [ "$rc" = 0 ] || status=1
      # The same model under DistributedDataParallel over NCCL (2 processes), against one GPU
      # (prints 'SKIP: needs 2 GPUs' and exits 0 on a machine with one).
      if [ -f "$here/python/e2e/ddp_llama.py" ]; then
        start=$(date +%s)
        PYTHONPATH="$out/pydeps${PYTHONPATH:+:$PYTHONPATH}" timeout -k 10 "${PYTHON_TIMEOUT:-900}" \
          python3 "$here/python/e2e/ddp_llama.py" "$out/python.json" \
          --commit "$(sed -n 's/^commit=//p' "$here/MANIFEST")" > "$out/logs/python-e2e-ddp.log" 2>&1
        rc=$?
        note "python e2e ddp llama: rc=$rc $(( $(date +%s) - start ))s -> $out/python.json"
        grep -E '^(llama_ddp_train_step|SKIP|FAIL|note:)' "$out/logs/python-e2e-ddp.log" | sed 's/^/    /' | tee -a "$summary"
        [ "$rc" = 0 ] || status=1
      fi
      start=$(date +%s)
      PYTHONPATH="$out/pydeps${PYTHONPATH:+:$PYTHONPATH}" timeout -k 10 "${PYTHON_TIMEOUT:-900}" \
        python3 "$here/python/e2e/soak.py" > "$out/logs/python-e2e-soak.log" 2>&1
      rc=$?
      note "python e2e soak: rc=$rc $(( $(date +%s) - start ))s $(grep '^python soak' "$out/logs/python-e2e-soak.log")"
      [ "$rc" = 0 ] || status=1
    fi
    # fla's own GLA layer and GLA model with our chunk_gla swapped in, against fla's kernels
    # (needs the peers' wheels: fla-core and flash-linear-attention; rows into python.json).
    if [ -f "$here/python/e2e/fla_gla.py" ]; then
      install_peers
      start=$(date +%s)
      PYTHONPATH="$out/pydeps${PYTHONPATH:+:$PYTHONPATH}" timeout -k 10 "${PYTHON_TIMEOUT:-900}" \
        python3 "$here/python/e2e/fla_gla.py" "$out/python.json" \
        --commit "$(sed -n 's/^commit=//p' "$here/MANIFEST")" > "$out/logs/python-e2e-fla-gla.log" 2>&1
      rc=$?
      note "python e2e fla gla: rc=$rc $(( $(date +%s) - start ))s -> $out/python.json"
      grep -E '^(fla_gla|FAIL|SKIP)' "$out/logs/python-e2e-fla-gla.log" | sed 's/^/    /' | tee -a "$summary"
      [ "$rc" = 0 ] || status=1
    fi
  fi
fi

if [ "$do_bench" = 1 ]; then
  export KERNELS_PEERS_DIR="$here/peers"
  install_peers
  if [ "$peers_ok" = 1 ]; then
    export PYTHONPATH="$out/pydeps${PYTHONPATH:+:$PYTHONPATH}"
    # CUTLASS's DSL (FlashAttention-4) finds its packages through a .pth file, which a
    # --target install does not read.
    if [ -d "$out/pydeps/nvidia_cutlass_dsl/dsl_packages" ]; then
      export PYTHONPATH="$out/pydeps/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH"
    fi
  fi
  for fam in $families; do
    log="$out/logs/bench-$fam.log"
    start=$(date +%s)
    # shellcheck disable=SC2086
    timeout -k 10 "${BENCH_TIMEOUT:-1200}" "$here/bin/kbench" "$fam" --out "$out" $bench_args > "$log" 2>&1
    rc=$?
    note "bench $fam: rc=$rc $(( $(date +%s) - start ))s -> $out/$fam.json"
    sed -n '/^== table/,$p' "$log" | tee -a "$summary"
    [ "$rc" = 0 ] || status=1
  done
fi

echo
echo "===== summary ($out/summary.txt) ====="
cat "$summary"
exit $status
