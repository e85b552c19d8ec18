#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, in one go (under 6 minutes on one H100 / H200): configure and
# build only what the GPU check needs (Release), run the GPU tests, run the GPU bench, and write
# every log and result into OUT_DIR.
#   gpu/check.sh OUT_DIR [extra CMake arguments, e.g. -DCMAKE_CUDA_ARCHITECTURES=80]
set -uo pipefail
out="${1:?usage: gpu/check.sh OUT_DIR [cmake args]}"
shift
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "$0")/.."
build="${STEWARD_GPU_BUILD:-build-gpu}"
summary="$out/summary.txt"
: > "$summary"
say() { echo "$*" | tee -a "$summary"; }
start=$(date +%s)

command -v nvcc >/dev/null || export PATH="/usr/local/cuda/bin:$PATH"
{ nvidia-smi || true; nvcc --version || true; } > "$out/device.txt" 2>&1
say "gpu/check.sh at $(git rev-parse --short HEAD 2>/dev/null || echo '?'): $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi: none')"

if ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTEWARD_CUDA=ON -DSTEWARD_TESTS=ON \
      -DSTEWARD_BENCH=ON "$@" > "$out/configure.log" 2>&1; then
    say "configure: FAILED (see configure.log)"
    exit 1
fi
grep "gpu/:" "$out/configure.log" | tee -a "$summary"
if ! cmake --build "$build" -j "$(nproc)" --target steward_gpu_tests bench_gpu > "$out/build.log" 2>&1; then
    say "build: FAILED (see build.log)"
    tail -30 "$out/build.log"
    exit 1
fi
say "build: ok ($(( $(date +%s) - start )) s)"

timeout 180 "$build/steward_gpu_tests" --durations yes > "$out/gpu_tests.log" 2>&1
rc=$?
case $rc in
    0) say "gpu tests: passed" ;;
    77) say "gpu tests: SKIPPED (no usable device: $(head -1 "$out/gpu_tests.log"))" ;;
    *) say "gpu tests: FAILED (rc $rc, see gpu_tests.log)"; grep -E "FAILED|failed|with expansion" "$out/gpu_tests.log" | head -20 | tee -a "$summary" ;;
esac

timeout 240 "$build/bench_gpu" > "$out/bench_gpu.log" 2>&1
brc=$?
say "bench_gpu: rc $brc"
grep -E "device:|==|prefill|decode" "$out/bench_gpu.log" | tee -a "$summary"
say "total: $(( $(date +%s) - start )) s"
[ $rc -eq 0 ] && [ $brc -eq 0 ]
