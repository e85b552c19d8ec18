#!/usr/bin/env bash
# KV tiers on vs off in one run, on the same requests: many agent sessions (total KV >= 8x the pool)
# with long tool pauses. Prints per bucket hit rate, saved prefill tokens, TTFT p50/p99 and tok/s side
# by side with ratios, then the tiers' own table. Usage: bash scripts/bench_kv_tiers.sh [extra run flags]
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${STEWARD_BIN:-./build/steward}
rm -rf out/bench-kv-tiers-disk  # a cold disk tier: the "on" side earns its hits in this run
mkdir -p out
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p')"
exec "$BIN" run --config configs/bench_kv_tiers.toml --mix short_qa=0,long_doc=0,long_output=0,high_temp=0,structured=0,agent=1 \
    --requests "${REQUESTS:-120}" --rate "${RATE:-1.5}" --scale "${SCALE:-1}" --tool-pause-ms "${PAUSE_MS:-4000}" --agent-turns "${TURNS:-10}" --greedy \
    --compare kv_tiers=off -o out/bench-kv-tiers.json "$@"
