#!/usr/bin/env bash
# The simulated backend, measured (docs/sim.md), in three parts:
#   1. calibration: the cost model with this CPU's measured figures against the CPU backend's
#      measured step times over batch sizes and context lengths (build/bench_sim);
#   2. the speculation incident at production scale: Llama 3.1 70B (FP8) on a simulated H200,
#      --requests of the standard workload (scaled x2) at --rate, through per-bucket adaptive
#      speculation (the config), none, and a fixed k = 4 on every bucket (global);
#   3. a published comparison: Llama 3.1 70B BF16 on 4 x H100 (TP 4), a ShareGPT-shaped workload of
#      5000 requests at once, beside the figures vLLM 0.6.0 and SGLang 0.3.0 published for it.
#   bash scripts/bench_sim.sh [--requests 10000] [--rate 120] [--skip-calibration] [--out out/bench_sim]
#   STEWARD_BUILD=dir (default build). About 12 minutes on the 2-core VM; run it alone.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${STEWARD_BUILD:-build}"
REQUESTS=10000
RATE=120
OUT=out/bench_sim
CALIBRATE=1
while [ $# -gt 0 ]; do
    case "$1" in
        --requests) REQUESTS="$2"; shift 2 ;;
        --rate) RATE="$2"; shift 2 ;;
        --out) OUT="$2"; shift 2 ;;
        --skip-calibration) CALIBRATE=0; shift ;;
        *) echo "bench_sim.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT"

if [ "$CALIBRATE" = 1 ]; then
    echo "== 1. calibration: the cost model vs the CPU backend's step times"
    "$BUILD/bench_sim" --json "$OUT/calibration.json"
fi

echo
echo "== 2. Llama 3.1 70B FP8 on a simulated H200: $REQUESTS requests at $RATE/s (standard workload, --scale 2)"
echo "   baseline: per-bucket adaptive speculation; no_speculation; speculation=fixed (k = 4 on every bucket)"
"$BUILD/steward" run -c configs/sim-h200-70b.toml --requests "$REQUESTS" --rate "$RATE" --scale 2 \
    --compare no_speculation,speculation=fixed -o "$OUT/h200_70b.json" 2>&1 | grep -v '^progress'

echo
echo "== 3. Llama 3.1 70B BF16 on 4 x simulated H100 (TP 4), ShareGPT-shaped, 5000 requests at once"
python3 scripts/sharegpt_like.py --requests 5000 --out "$OUT/sharegpt_like.jsonl"
"$BUILD/steward" run -c configs/sim-4xh100-70b.toml --workload "$OUT/sharegpt_like.jsonl" \
    -o "$OUT/h100x4_70b.json" 2>&1 | grep -v '^progress' | grep -E '^(bucket|all) |simulated'
python3 - "$OUT/h100x4_70b.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))["metrics"]["all"]
sim = m["throughput_tok_s"]
# sgl-project/sglang benchmark/benchmark_vllm_060/README.md: Llama 3.1 70B Instruct, 4 x H100 80G,
# TP 4, ShareGPT, 5000 prompts, request rate inf: output token throughput (tok/s).
published = [("vLLM 0.6.0 (--num-scheduler-steps 10)", 3700.64), ("SGLang 0.3.0", 3856.01)]
print(f"output tok/s: sim {sim:.0f}")
for name, v in published:
    print(f"  vs {name}: {v:.0f} published -> sim / published = {sim / v:.2f}")
PY
