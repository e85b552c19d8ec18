#!/usr/bin/env bash
# The serving bench, one command: writes the standard workload (as `steward run --requests N
# --save-workload` does), starts `steward serve` on configs/bench_serve.toml (the large model alone
# in one pool, 2 threads, no routing plugins), replays the workload with its arrival times over
# HTTP (bench_serve: streaming /v1/completions, greedy, ignore_eos, so every request produces its
# max_tokens) and prints the per-bucket table. With --peer it then starts llama-server on the same
# GGUF (-t 2 -np 8, prompt cache on, through ../shared/peers/llama-bench.sh), replays the same file
# and prints both tables and the side-by-side ratios.
#   bash scripts/bench_serve.sh [--peer] [--requests 40] [--seed 1] [--rate 2]
#   STEWARD_BUILD=dir (default build), CONFIG (default configs/bench_serve.toml), PORT (default 18180; the peer gets PORT+1), OUT (default out/bench_serve)
set -euo pipefail
cd "$(dirname "$0")/.."
peer=0; requests=40; seed=1; rate=2
while [[ $# -gt 0 ]]; do
  case $1 in
    --peer) peer=1; shift ;;
    --requests) requests=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    *) echo "bench_serve.sh: unknown argument $1 (see the header)" >&2; exit 1 ;;
  esac
done
build="${STEWARD_BUILD:-build}"; port="${PORT:-18180}"; out="${OUT:-out/bench_serve}"
config="${CONFIG:-configs/bench_serve.toml}"
model=models/steward-large.gguf
mkdir -p "$out"
wl="$out/workload.jsonl"
"$build/bench_serve" --requests "$requests" --seed "$seed" --rate "$rate" --save-workload "$wl"
echo "workload: $wl ($requests requests, seed $seed, rate $rate/s)"

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
wait_health() {  # port pid what
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
    kill -0 "$2" 2>/dev/null || { echo "bench_serve.sh: $3 exited; its log: $out/$3.log" >&2; tail -20 "$out/$3.log" >&2; exit 1; }
    sleep 0.2
  done
  echo "bench_serve.sh: $3 not healthy after 120 s" >&2; exit 1
}

# Steward (writes the synthetic model on first start when it is missing).
"$build/steward" serve --config "$config" --port "$port" >"$out/steward.log" 2>&1 &
spid=$!; pids+=("$spid")
wait_health "$port" "$spid" steward
"$build/bench_serve" --port "$port" --workload "$wl" --greedy --session-field --name steward --out "$out/steward.json" || true
curl -sf "http://127.0.0.1:$port/metrics" >"$out/steward_metrics.txt" || true
kill "$spid"; wait "$spid" 2>/dev/null || true; pids=()

if [[ $peer == 1 ]]; then
  pport=$((port + 1))
  # -c: 8 slots of the model's 2048-token context each (llama-server splits -c across -np slots;
  # the default -c, the model's 2048, would give each slot 256 tokens and refuse long_doc prompts).
  PEER_TOOL=llama-server ../shared/peers/llama-bench.sh -m "$model" -t 2 -np 8 -c 16384 --port "$pport" \
    >"$out/llama-server.log" 2>&1 &
  lpid=$!; pids+=("$lpid")
  wait_health "$pport" "$lpid" llama-server
  "$build/bench_serve" --port "$pport" --workload "$wl" --greedy --name llama-server --out "$out/llama-server.json" || true
  kill "$lpid"; wait "$lpid" 2>/dev/null || true; pids=()
  echo
  "$build/bench_serve" --compare "$out/steward.json" "$out/llama-server.json"
fi
