#!/usr/bin/env bash
# The serving bench, one command: writes the standard workload (as `steward run --requests N
# --save-workload` does), starts `steward serve` on configs/bench_serve.toml (the large model alone
# in one pool, 2 threads, no routing plugins), replays the workload with its arrival times over
# HTTP (bench_serve: streaming /v1/completions, greedy, ignore_eos, so every request produces its
# max_tokens) and prints the per-bucket table. With --peer it then starts llama-server on the same
# GGUF (-t 2 -np 8, prompt cache on, through ../shared/peers/llama-bench.sh), replays the same file
# and prints both tables and the side-by-side ratios.
#   bash scripts/bench_serve.sh [--peer] [--requests 40] [--seed 1] [--rate 2] [--pairs N]
# --pairs N (implies --peer; 1-99): N pairs of runs on the same workload, each server started afresh,
# the order alternating, and the medians and ranges of both sides' tok/s and TPOT mean and of their
# ratios over the pairs (one pair's ratio moves with the host's swings, ~10% on a shared VM).
#   STEWARD_BUILD=dir (default build), CONFIG (default configs/bench_serve.toml), PORT (default 18180; the peer gets PORT+1), OUT (default out/bench_serve)
set -euo pipefail
cd "$(dirname "$0")/.."
peer=0; requests=40; seed=1; rate=2; pairs=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --peer) peer=1; shift ;;
    --requests) requests=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --pairs) pairs=$2; peer=1; shift 2 ;;
    *) echo "bench_serve.sh: unknown argument $1 (see the header)" >&2; exit 1 ;;
  esac
done
[[ $pairs =~ ^[1-9][0-9]?$ ]] || { echo "bench_serve.sh: --pairs takes 1-99 (got '$pairs')" >&2; exit 2; }
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

# One server's replay of the workload into $out/NAME.json: start it, wait for /health, replay, stop.
run_steward() {  # json
  # Steward (writes the synthetic model on first start when it is missing).
  "$build/steward" serve --config "$config" --port "$port" >"$out/steward.log" 2>&1 &
  spid=$!; pids+=("$spid")
  wait_health "$port" "$spid" steward
  "$build/bench_serve" --port "$port" --workload "$wl" --greedy --session-field --name steward --out "$1" || true
  curl -sf "http://127.0.0.1:$port/metrics" >"$out/steward_metrics.txt" || true
  kill "$spid"; wait "$spid" 2>/dev/null || true; pids=()
}
run_peer() {  # json
  local pport=$((port + 1))
  # -c: 8 slots of the model's 2048-token context each (llama-server splits -c across -np slots;
  # the default -c, the model's 2048, would give each slot 256 tokens and refuse long_doc prompts).
  PEER_TOOL=llama-server ../shared/peers/llama-bench.sh -m "$model" -t 2 -np 8 -c 16384 --port "$pport" \
    >"$out/llama-server.log" 2>&1 &
  lpid=$!; pids+=("$lpid")
  wait_health "$pport" "$lpid" llama-server
  "$build/bench_serve" --port "$pport" --workload "$wl" --greedy --name llama-server --out "$1" || true
  kill "$lpid"; wait "$lpid" 2>/dev/null || true; pids=()
}

if [[ $pairs == 1 ]]; then
  run_steward "$out/steward.json"
  if [[ $peer == 1 ]]; then
    run_peer "$out/llama-server.json"
    echo
    "$build/bench_serve" --compare "$out/steward.json" "$out/llama-server.json"
  fi
  exit 0
fi

# --pairs N: N pairs of runs on the same workload file, each server started afresh for each run,
# the order alternating (Steward first in odd pairs, llama-server first in even ones) so that a
# drift of the host's speed during the pairs does not favour one side. Each pair's all-requests
# tok/s and TPOT mean side by side, then the medians over the pairs of each side and of the ratios.
summary="$out/pairs.tsv"; : >"$summary"
all_row() { awk -v k="$2" '$1 == "all" && $2 == k { print $3, $4, $5 }' "$1"; }
for i in $(seq "$pairs"); do
  # Each run's own table goes to $out/NAME-i.txt.
  if (( i % 2 == 1 )); then
    run_steward "$out/steward-$i.json" >"$out/steward-$i.txt"; run_peer "$out/llama-server-$i.json" >"$out/llama-server-$i.txt"
  else
    run_peer "$out/llama-server-$i.json" >"$out/llama-server-$i.txt"; run_steward "$out/steward-$i.json" >"$out/steward-$i.txt"
  fi
  "$build/bench_serve" --compare "$out/steward-$i.json" "$out/llama-server-$i.json" >"$out/compare-$i.txt"
  read -r st ls ratio < <(all_row "$out/compare-$i.txt" tok/s)
  read -r stt lst tratio < <(all_row "$out/compare-$i.txt" tpot_avg)
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$i" "$st" "$ls" "$ratio" "$stt" "$lst" "$tratio" >>"$summary"
  echo "pair $i: tok/s $st vs $ls (${ratio}x), TPOT mean $stt vs $lst (${tratio}x)"
done
echo
echo "$pairs pairs ($out/compare-N.txt each; the last pair's table: $out/compare-$pairs.txt)"
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
range() { sort -g | awk 'NR == 1 { lo = $1 } { hi = $1 } END { print lo "-" hi }'; }
strip() { sed 's/ms$//'; }
printf '%-22s %10s %12s %12s\n' "" steward llama-server ratio
for spec in "tok/s:2:3:4" "TPOT mean (ms):5:6:7"; do
  IFS=: read -r label a b r <<<"$spec"
  printf '%-22s %10s %12s %12s\n' "$label, median" "$(cut -f"$a" "$summary" | strip | median)" \
    "$(cut -f"$b" "$summary" | strip | median)" "$(cut -f"$r" "$summary" | median)"
  printf '%-22s %10s %12s %12s\n' "$label, range" "$(cut -f"$a" "$summary" | strip | range)" \
    "$(cut -f"$b" "$summary" | strip | range)" "$(cut -f"$r" "$summary" | range)"
done
