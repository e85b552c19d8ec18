#!/usr/bin/env bash
# Load run of `steward serve`: starts the server on CONFIG, records its RSS, runs bench_http (N
# concurrent streaming clients for SECONDS), records the RSS again (after warm-up: the second half
# of the run is compared with the first), prints per-bucket TTFT / TPOT from the clients and from
# /metrics, then stops the server. Exits non-zero on any failure other than an intended 429.
#   bash scripts/load_http.sh [SECONDS=20] [CLIENTS=64] [CONFIG=configs/test_tiny.toml] [MODELS=short_qa,default]
#   STEWARD_BUILD=dir (default build), PORT (default 18080), MAX_TOKENS (default 32)
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-20}"; clients="${2:-64}"; config="${3:-configs/test_tiny.toml}"; models="${4:-short_qa,default}"
build="${STEWARD_BUILD:-build}"; port="${PORT:-18080}"; max_tokens="${MAX_TOKENS:-32}"
rss() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }
"$build/steward" serve --config "$config" --port "$port" >"${TMPDIR:-/tmp}/steward_load_http.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true' EXIT
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
rss0=$(rss "$pid")
half=$(awk "BEGIN {print $secs / 2}")
# Warm-up half, then the measured half: RSS after each.
"$build/bench_http" --port "$port" --clients "$clients" --seconds "$half" --max-tokens "$max_tokens" --models "$models" >/dev/null || true
rss1=$(rss "$pid")
rc=0
"$build/bench_http" --port "$port" --clients "$clients" --seconds "$half" --max-tokens "$max_tokens" --models "$models" || rc=$?
rss2=$(rss "$pid")
echo "server RSS: start ${rss0} KiB, after warm-up ${rss1} KiB, at the end ${rss2} KiB (growth after warm-up $((rss2 - rss1)) KiB)"
exit "$rc"
