#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, in one go (under 6 minutes on one H100 / H200): configure and
# build only what the GPU check needs (Release), run the GPU tests (kernels, forward, the engine on
# the device), `steward run` on the device against the CPU when they pass, and the GPU bench, and
# write every log and result into OUT_DIR.
#   gpu/check.sh OUT_DIR [extra CMake arguments, e.g. -DCMAKE_CUDA_ARCHITECTURES=80]
# With STEWARD_GPU_PREBUILT=DIR it builds nothing and runs DIR's steward, steward_gpu_tests and
# bench_gpu (and DIR/plugins), as gpu/pack_prebuilt.sh lays them out: for a GPU machine that lacks
# the Debian packages the build needs.
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

if [ -n "${STEWARD_GPU_PREBUILT:-}" ]; then
    build="$STEWARD_GPU_PREBUILT"
    say "build: prebuilt binaries in $build ($(cat "$build/BUILT_FROM" 2>/dev/null || echo 'origin unknown'))"
elif ! cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSTEWARD_CUDA=ON -DSTEWARD_TESTS=ON \
      -DSTEWARD_BENCH=ON "$@" > "$out/configure.log" 2>&1; then
    say "configure: FAILED (see configure.log)"
    exit 1
fi
if [ -z "${STEWARD_GPU_PREBUILT:-}" ]; then
    grep "gpu/:" "$out/configure.log" | tee -a "$summary"
    if ! timeout 300 cmake --build "$build" -j "$(nproc)" --target steward_gpu_tests bench_gpu steward > "$out/build.log" 2>&1; then
        say "build: FAILED (see build.log)"
        tail -30 "$out/build.log"
        exit 1
    fi
    say "build: ok ($(( $(date +%s) - start )) s)"
fi

timeout 180 "$build/steward_gpu_tests" --durations yes > "$out/gpu_tests.log" 2>&1
rc=$?
case $rc in
    0) say "gpu tests: passed" ;;
    77) say "gpu tests: SKIPPED (no usable device: $(head -1 "$out/gpu_tests.log"))" ;;
    *) say "gpu tests: FAILED (rc $rc, see gpu_tests.log)"; grep -E "FAILED|failed|with expansion" "$out/gpu_tests.log" | head -20 | tee -a "$summary" ;;
esac

# End to end, when the tests passed: `steward run` on the default config's pools with
# backend = "cuda" against the same config on the CPU, greedy and one request at a time, so the two
# runs' outputs must be the same text (F32 models; a near-tie in the logits could differ).
erc=0
e2e="$out/e2e"
rm -rf "$e2e"
if [ $rc -eq 0 ]; then
    mkdir -p "$e2e"
    sed -e "s|\"\.\./models/|\"$PWD/models/|" configs/default.toml > "$e2e/cpu.toml"
    sed -e 's|^\[\[pool\]\]$|[[pool]]\nbackend = "cuda"|' "$e2e/cpu.toml" > "$e2e/cuda.toml"
    for b in cpu cuda; do
        timeout 120 "$build/steward" run -c "$e2e/$b.toml" --greedy --sequential --requests 24 --mix long_doc=0 \
            --outputs "$e2e/$b.jsonl" -o "$e2e/$b.json" > "$e2e/$b.log" 2>&1
        r=$?
        [ $r -eq 0 ] || erc=1
        say "e2e steward run on $b: rc $r ($(grep -m1 -E "runs on cuda" "$e2e/$b.log" || echo "cpu backend"))"
    done
    python3 - "$e2e/cpu.jsonl" "$e2e/cuda.jsonl" <<'PY' | tee -a "$summary"
import json, sys
try:
    a = [json.loads(l) for l in open(sys.argv[1])]
    b = [json.loads(l) for l in open(sys.argv[2])]
except OSError as e:
    print("e2e outputs: missing (%s)" % e); sys.exit(1)
same = 0
for x, y in zip(a, b):
    if x["text"] == y["text"] and x["finish"] == y["finish"]:
        same += 1
    else:
        print("  line %d differs: cpu pool %s upgraded %s finish %s; cuda pool %s upgraded %s finish %s error %r" % (
            x["line"], x["pool"], x["upgraded"], x["finish"], y["pool"], y["upgraded"], y["finish"], y["error"]))
ok = sum(1 for y in b if not y["error"])
def med(rows, k):
    v = sorted(r[k] for r in rows if isinstance(r.get(k), (int, float)) and r[k] > 0)
    return v[len(v) // 2] if v else float("nan")
print("e2e median ms (one request at a time, 30M-parameter default models): tpot cpu %.2f cuda %.2f; e2e cpu %.1f cuda %.1f" % (
    med(a, "tpot_ms"), med(b, "tpot_ms"), med(a, "e2e_ms"), med(b, "e2e_ms")))
print("e2e outputs: %d of %d requests the same text on cuda as on cpu; %d of %d served without error on cuda" % (same, len(a), ok, len(b)))
sys.exit(0 if len(a) > 0 and same == len(a) == len(b) and ok == len(b) else 1)
PY
    [ "${PIPESTATUS[0]}" -eq 0 ] || erc=1
else
    say "e2e: skipped (the GPU tests did not pass)"
fi

timeout 240 "$build/bench_gpu" > "$out/bench_gpu.log" 2>&1
brc=$?
say "bench_gpu: rc $brc"
grep -E "device:|==|prefill|decode" "$out/bench_gpu.log" | tee -a "$summary"
# Decode through CUDA graphs must choose the plain launches' tokens, and no capture may be refused.
if grep -qE "TOKENS DIFFER|turned off:" "$out/bench_gpu.log"; then
    say "bench_gpu: CUDA graphs FAILED (tokens differ or a capture was refused; see above)"
    brc=1
fi
say "total: $(( $(date +%s) - start )) s"
[ $rc -eq 0 ] && [ $brc -eq 0 ] && [ $erc -eq 0 ]
