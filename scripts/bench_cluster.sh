#!/usr/bin/env bash
# Pools across processes, measured on loopback (bench/bench_cluster.py): one worker vs two, and
# kv_aware vs round_robin routing over two, on the same generated workload; per-bucket TTFT, tok/s
# and hit rates side by side with ratios.
#   bash scripts/bench_cluster.sh [--requests 60] [--rate 3] [--scale 0.5] [--workdir out/bench_cluster]
#   STEWARD_BUILD=dir (default build)
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 bench/bench_cluster.py "${STEWARD_BUILD:-build}/steward" "$@"
