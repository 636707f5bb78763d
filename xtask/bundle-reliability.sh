#!/usr/bin/env bash
# The reliability sweep, on a machine with an NVIDIA driver and compute-sanitizer:
#   1. every GPU test executable under each sanitizer tool (memcheck, racecheck, synccheck,
#      initcheck), several runs at once (SWEEP_JOBS), negative controls and CPU-only tests left
#      out (SANITIZER_SKIP). Each run has KERNELS_SANITIZER=<tool> in its environment: under
#      racecheck the largest problems (large_offsets_*, semicrf scale/) shrink the dimensions
#      that do not change any shared-memory protocol and print the size they ran
#      (tests/src/lib.rs, racecheck_size); memcheck, synccheck and initcheck run them in full;
#   2. the negative controls: racecheck must report hazards on the kernels without a barrier
#      (the block reduction, the attention backward's dS^T tile, the GLA backward's carry), the
#      reference tests must catch the reduction's, the GLA backward's and the semi-CRF's, and
#      the emulator the three barrier controls (test-reliability negative_*);
#   3. RESULTS_DIR/reliability.json (device, driver, commit, date, family "reliability", rows of
#      {kernel: test binary, tool, errors, hazards, status, seconds}) and a summary table.
# Exit status 0 only if every sanitizer run is clean and every control is caught.
# Usage: reliability.sh RESULTS_DIR [--tools "memcheck racecheck synccheck initcheck"]
#                                   [--tests "smoke attention ..."] [--every-gpu-test]
# --every-gpu-test: the GPU property runs too (props_gpu_*; only the CPU-only tests and the
# negative controls left out), with SANITIZER_TIMEOUT 600 and SWEEP_DEADLINE 1500 by default.
# Environment: SANITIZER_SKIP (test-name substrings, commas or spaces; default below),
# SWEEP_JOBS (concurrent sanitizer runs, default 4), SANITIZER_TIMEOUT (seconds per run,
# default 300), SWEEP_DEADLINE (seconds for the whole sanitizer phase, default 420: runs not
# started by then are reported as "not run" and fail the sweep).
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:?usage: reliability.sh RESULTS_DIR [options]}"
shift
tools="memcheck racecheck synccheck initcheck" only_tests="" every=0
while [ $# -gt 0 ]; do
  case "$1" in
    --tools) tools="$2"; shift ;;
    --tests) only_tests="$2"; shift ;;
    --every-gpu-test) every=1 ;;
    *) echo "reliability.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
# CPU-only tests (emulator, references, CPU chunked forms, host-API properties, limits) gain
# nothing under a sanitizer and are slow there; the GPU property runs (props_gpu_*) are left to
# --every-gpu-test for time; the negative controls are run on their own below. The largest GPU
# problems stay in: under racecheck they shrink (KERNELS_SANITIZER above).
cpu_only="emulated cpu_chunked reference/ _validate_or_typed_error props_attention_view_bounds limits_ nonfinite_semicrf_rejected nonfinite_attention_reference nonfinite_gla_reference"
if [ "$every" = 1 ]; then
  skip_default="negative_ $cpu_only"
  timeout_default=600 deadline_default=1500
else
  skip_default="negative_ props_ $cpu_only"
  timeout_default=300 deadline_default=420
fi
skip="${SANITIZER_SKIP-$skip_default}"
jobs="${SWEEP_JOBS:-4}"
deadline=$(( $(date +%s) + ${SWEEP_DEADLINE:-$deadline_default} ))
per_run="${SANITIZER_TIMEOUT:-$timeout_default}"
mkdir -p "$out/logs/reliability"
logs="$out/logs/reliability"
rows="$logs/rows.tsv"
: > "$rows"
export KERNELS_WATCHDOG_SECS=900
command -v compute-sanitizer >/dev/null || { echo "reliability.sh: compute-sanitizer not found" >&2; exit 1; }

skips=()
IFS=', ' read -ra patterns <<< "$skip"
for pat in "${patterns[@]}"; do [ -n "$pat" ] && skips+=(--skip "$pat"); done

# Errors and hazards of a sanitizer log: "ERROR SUMMARY: N errors" (memcheck, synccheck,
# initcheck) and "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)".
count() {
  local log="$1" errors hazards
  errors=$(grep -oE 'ERROR SUMMARY: [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
  hazards=$(grep -oE 'RACECHECK SUMMARY: [0-9]+' "$log" | grep -oE '[0-9]+$' | tail -1)
  echo "${errors:-0} ${hazards:-0}"
}

# One sanitizer run: a row "name tool errors hazards status seconds".
sanitize() {
  local bin="$1" tool="$2" name="${1##*/test-}" log start rc errors hazards status left
  log="$logs/$tool-$name.log"
  left=$(( deadline - $(date +%s) ))
  if [ "$left" -le 0 ]; then
    printf '%s\t%s\t0\t0\tnot run (deadline)\t0\n' "$name" "$tool" >> "$rows"
    return
  fi
  [ "$left" -gt "$per_run" ] && left="$per_run"
  local extra=()
  [ "$tool" = racecheck ] && extra=(--racecheck-report all)
  start=$(date +%s)
  KERNELS_SANITIZER="$tool" timeout -k 10 "$left" \
    compute-sanitizer --tool "$tool" --error-exitcode 86 "${extra[@]}" \
    "$bin" --test-threads 1 "${skips[@]}" > "$log" 2>&1
  rc=$?
  read -r errors hazards < <(count "$log")
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then status="timeout"
  elif [ "$rc" = 0 ] && [ "$errors" = 0 ] && [ "$hazards" = 0 ]; then status="clean"
  elif [ "$rc" = 86 ] || [ "$errors" != 0 ] || [ "$hazards" != 0 ]; then status="FAIL (reported)"
  else status="FAIL (tests rc=$rc)"
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$tool" "$errors" "$hazards" "$status" \
    "$(( $(date +%s) - start ))" >> "$rows"
}

bins=()
for b in "$here"/bin/test-*; do
  name="${b##*/test-}"
  [ "$name" = host ] && continue
  if [ -n "$only_tests" ] && ! grep -qw "$name" <<<"$only_tests"; then continue; fi
  bins+=("$b")
done

echo "reliability: ${#bins[@]} test executables x tools ($tools), $jobs at a time"
# Slowest first (racecheck), so the deadline cuts the cheap runs last.
ordered=""
grep -qw racecheck <<<"$tools" && ordered="racecheck"
for t in $tools; do [ "$t" = racecheck ] || ordered="$ordered $t"; done
for tool in $ordered; do
  for b in "${bins[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
    sanitize "$b" "$tool" &
  done
done
wait

# Negative controls.
rel="$here/bin/test-reliability"
control() { # name tool expect-hazards|expect-pass -- test
  local label="$1" tool="$2" expect="$3" test="$4" log start rc errors hazards status
  log="$logs/control-$label-$tool.log"
  start=$(date +%s)
  if [ "$tool" = none ]; then
    timeout -k 10 300 "$rel" --exact "$test" > "$log" 2>&1
    rc=$?
    errors=0 hazards=0
    if [ "$rc" = 0 ] && grep -qE '^test result: ok. 1 passed' "$log"; then status="caught"
    else status="FAIL (not caught, rc=$rc)"; fi
  else
    KERNELS_SANITIZER="$tool" timeout -k 10 300 compute-sanitizer --tool "$tool" --racecheck-report all \
      "$rel" --exact "$test" --test-threads 1 > "$log" 2>&1
    read -r errors hazards < <(count "$log")
    if [ "$hazards" != 0 ] || [ "$errors" != 0 ]; then status="caught"
    else status="FAIL (no hazard reported)"; fi
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "control:$label" "$tool" "$errors" "$hazards" "$status" \
    "$(( $(date +%s) - start ))" >> "$rows"
}
control negative_block_reduce_no_barrier racecheck hazards negative_reduce_no_barrier_racecheck_target
control negative_block_reduce_no_barrier none pass negative_reduce_no_barrier_wrong
control negative_semicrf_marginals_aliased none pass negative_semicrf_aliased_wrong
control emulator_no_barrier none pass negative_emulated_reduce_barrier_hazard
control negative_attention_bwd_no_ds_barrier racecheck hazards negative_attention_bwd_no_ds_barrier_racecheck_target
control emulator_attention_bwd_no_ds_barrier none pass negative_emulated_attention_bwd_ds_barrier_hazard
control negative_gla_bwd_no_carry_barrier racecheck hazards negative_gla_bwd_no_carry_barrier_racecheck_target
control emulator_gla_bwd_no_carry_barrier none pass negative_emulated_gla_bwd_carry_barrier_hazard

# reliability.json and the table.
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
device="${gpu%%,*}" driver="${gpu##*, }"
commit=$(sed -n 's/^commit=//p' "$here/MANIFEST")
json="$out/reliability.json"
{
  printf '{\n  "device": "%s",\n  "driver": "%s",\n  "commit": "%s",\n' \
    "${device:-unknown}" "${driver:-unknown}" "${commit:-unknown}"
  printf '  "date": "%s",\n  "family": "reliability",\n  "ptx_target": "",\n' \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  printf '  "notes": ["sanitizer runs skip tests matching: %s", "each run has KERNELS_SANITIZER set to its tool: under racecheck `large_offsets_*` and the semi-CRF `scale/` test run smaller problems (same kernels and tiles), under the other tools the full size"],\n  "rows": [\n' "$skip"
  sort "$rows" | awk -F'\t' '{
    printf "%s    {\"kernel\": \"%s\", \"tool\": \"%s\", \"errors\": %d, \"hazards\": %d, \"status\": \"%s\", \"seconds\": %d}",
      (NR > 1 ? ",\n" : ""), $1, $2, $3, $4, $5, $6 }'
  printf '\n  ]\n}\n'
} > "$json"

status=0
echo
echo "===== reliability sweep ($json) ====="
printf '%-44s %-10s %7s %8s %6s  %s\n' "test binary / control" tool errors hazards secs status
while IFS=$'\t' read -r name tool errors hazards st secs; do
  printf '%-44s %-10s %7s %8s %6s  %s\n' "$name" "$tool" "$errors" "$hazards" "$secs" "$st"
  case "$st" in clean|caught) ;; *) status=1 ;; esac
done < <(sort "$rows")
echo "reliability: $([ $status = 0 ] && echo passed || echo FAILED)"
exit $status
