#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, Clang + ASan + UBSan, in build-fuzz/) and runs each for a
# bounded time on a copy of its seed corpus (the repo is never written). Prints per target the
# executions, exec/s, coverage (cov: edges, ft: features) and crashes; exits non-zero on a crash and
# leaves the crashing inputs in the temp directory it names.
#   bash scripts/fuzz.sh [seconds per target, default 45] [target...]
#   STEWARD_FUZZ_BUILD=dir (default build-fuzz), STEWARD_FUZZ_KEEP=1 keeps the work directory.
# A long run: bash scripts/fuzz.sh 3600 (then merge new inputs worth keeping with -merge=1, see docs/testing.md).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-45}"; shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_gguf fuzz_tokenizer_spm fuzz_tokenizer_bpe fuzz_config fuzz_workload fuzz_plugin_decision
  fuzz_jinja fuzz_openai_body fuzz_http_request fuzz_basp_frame fuzz_kv_tier_file)
# Small fixed formats saturate their coverage in seconds: their runs stop at this cap (or sooner).
declare -A caps=([fuzz_kv_tier_file]=20)
dir="${STEWARD_FUZZ_BUILD:-build-fuzz}"
launcher=()
export CCACHE_NOHASHDIR="${CCACHE_NOHASHDIR:-1}"  # with -g, ccache would otherwise hash the build directory
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$PWD}"  # paths relative to the checkout: a clone elsewhere hits the cache
command -v ccache >/dev/null && launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)

t0=$(date +%s)
CC=clang CXX=clang++ cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSTEWARD_FUZZ=ON \
  -DSTEWARD_SANITIZE=ON -DSTEWARD_TESTS=OFF -DSTEWARD_BENCH=OFF -DSTEWARD_NATIVE=OFF "${launcher[@]}" >/dev/null
cmake --build "$dir" -j "$(nproc)" --target steward_fuzz
echo "fuzz: build took $(( $(date +%s) - t0 )) s"

work="$(mktemp -d "${TMPDIR:-/tmp}/steward-fuzz.XXXXXX")"
declare -A dicts=([fuzz_gguf]=gguf [fuzz_config]=toml [fuzz_workload]=workload [fuzz_jinja]=jinja)
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
printf '%-22s %12s %9s %7s %7s %8s\n' target executions exec/s cov ft crashes
for t in "${targets[@]}"; do
  corpus="$work/$t/corpus"; art="$work/$t/crashes"
  mkdir -p "$corpus" "$art"
  cp -r "tests/fuzz/corpus/$t/." "$corpus/"
  t_secs="$secs"
  [ -n "${caps[$t]:-}" ] && [ "${caps[$t]}" -lt "$secs" ] && t_secs="${caps[$t]}"
  args=(-max_total_time="$t_secs" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 -artifact_prefix="$art/")
  # Text targets stop at 16 KiB (their harnesses skip longer inputs); GGUF seeds are whole files.
  [ "$t" != fuzz_gguf ] && args+=(-max_len=16384)
  [ -n "${dicts[$t]:-}" ] && args+=(-dict="tests/fuzz/dict/${dicts[$t]}.dict")
  rc=0
  "$dir/tests/fuzz/$t" "${args[@]}" "$corpus" >"$work/$t/log" 2>&1 || rc=$?
  done_line=$(grep -aE '^#[0-9]+.*(DONE|cov:)' "$work/$t/log" | tail -1 || true)
  execs=$(grep -aoE 'stat::number_of_executed_units: *[0-9]+' "$work/$t/log" | grep -aoE '[0-9]+$' || echo "${done_line%% *}")
  eps=$(grep -aoE 'stat::average_exec_per_sec: *[0-9]+' "$work/$t/log" | grep -aoE '[0-9]+$' || echo "?")
  cov=$(grep -aoE 'cov: [0-9]+' <<<"$done_line" | grep -aoE '[0-9]+' || echo "?")
  ft=$(grep -aoE 'ft: [0-9]+' <<<"$done_line" | grep -aoE '[0-9]+' || echo "?")
  n_crash=$(find "$art" -type f | wc -l)
  printf '%-22s %12s %9s %7s %7s %8s\n' "$t" "${execs:-?}" "$eps" "$cov" "$ft" "$n_crash"
  if [ "$rc" -ne 0 ] || [ "$n_crash" -gt 0 ]; then
    failed+=("$t")
    echo "fuzz: $t failed (exit $rc); inputs in $art, log $work/$t/log:" >&2
    grep -aE 'ERROR|invariant|runtime error|SUMMARY' "$work/$t/log" | head -5 >&2 || true
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes in ${failed[*]}; work directory kept: $work" >&2
  exit 1
fi
if [ "${STEWARD_FUZZ_KEEP:-0}" = "1" ]; then echo "fuzz: work directory kept: $work"; else rm -rf "$work"; fi
echo "fuzz: no crashes in ${#targets[@]} targets x ${secs} s"
