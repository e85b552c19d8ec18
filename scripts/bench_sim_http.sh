#!/usr/bin/env bash
# Host overhead at GPU rates: the simulated backend in real time ([sim] dilation = 1) behind the
# HTTP server, under N concurrent streaming clients (bench_http). configs/sim-h200-70b.toml with
# model = "sim/llama-8b.toml" (steps of a few ms). Prints per client count the clients' TTFT / TPOT
# beside the server's own account at shutdown: steps, device busy, the median step's device time,
# a stream's mean step (each step's time counted once per sequence that got a token in it), a
# stream's step p50 (each request's mean step after its first token, the median over requests) and
# the steps whose host work outlasted their device time (overruns). A stream gets one chunk per step
# (with speculation, several tokens), so a client TPOT p50 near a stream's step p50 and no overruns
# say the host (actors, HTTP, scheduling) keeps up with the device; the script prints that ratio.
# (The plain mean step, busy / steps, is pulled down by the small batches of the ramp up and down,
# and the median hides a mix of long drafted steps and short plain ones.)
#   bash scripts/bench_sim_http.sh [SECONDS=20] ["CLIENTS..." = "256 512"]
#   STEWARD_BUILD=dir (default build), PORT (default 18090), MAX_TOKENS (default 64)
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${1:-20}"; counts="${2:-256 512}"
build="${STEWARD_BUILD:-build}"; port="${PORT:-18090}"; max_tokens="${MAX_TOKENS:-64}"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/steward-sim-http.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
ln -s "$PWD/configs/sim" "$tmp/sim"
sed -e 's/^dilation = .*/dilation = 1   # real time/' -e 's|^model = "sim/llama-70b-fp8.toml"|model = "sim/llama-8b.toml"|' \
  configs/sim-h200-70b.toml >"$tmp/sim-h200-8b.toml"
grep -q '^model = "sim/llama-8b.toml"' "$tmp/sim-h200-8b.toml" || { echo "bench_sim_http: the config's model line moved" >&2; exit 1; }
echo "bench_sim_http: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; ${secs} s per run, max_tokens ${max_tokens}"
for n in $counts; do
  log="$tmp/serve_$n.log"
  "$build/steward" serve --config "$tmp/sim-h200-8b.toml" --port "$port" >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.1; done
  echo "== $n clients"
  "$build/bench_http" --port "$port" --clients "$n" --seconds "$secs" --max-tokens "$max_tokens" \
    --models short_qa,long_output | tee "$tmp/clients_$n.txt" || true
  kill -INT "$pid"; wait "$pid" || true
  line=$(grep -o "pool 'h200' (simulated.*" "$log" || true)
  echo "server: $line"
  steps=$(sed -n 's/.*(simulated [^)]*): \([0-9]*\) steps, device busy \([0-9.]*\) s.*/\1 \2/p' <<<"$line")
  if [ -n "$steps" ]; then
    read -r k busy <<<"$steps"
    med=$(sed -n 's/.*median step \([0-9.]*\) ms.*/\1/p' <<<"$line")
    stream=$(sed -n "s/.*a stream's mean step \([0-9.]*\) ms.*/\1/p" <<<"$line")
    p50=$(sed -n "s/.*a stream's step p50 \([0-9.]*\) ms.*/\1/p" <<<"$line")
    awk -v k="$k" -v b="$busy" -v m="${med:-0}" -v s="${stream:-0}" -v q="${p50:-0}" 'BEGIN { if (k > 0) printf "server: median step %.2f ms, mean step %.2f ms, a stream'"'"'s mean step %.2f ms, a stream'"'"'s step p50 %.2f ms (device busy %.1f s over %d steps)\n", m, 1e3 * b / k, s, q, b, k }'
    # Each bucket's client TPOT p50 (5th column, "46.20ms") over the server's p50 of its streams' steps.
    awk -v q="${p50:-0}" '$1 ~ /^(short_qa|long_output)$/ && $5 ~ /ms$/ && q > 0 { v = $5; sub(/ms$/, "", v); printf "clients: %s TPOT p50 / a stream'"'"'s step p50 = %.2fx\n", $1, v / q }' "$tmp/clients_$n.txt"
  fi
  sleep 1
done
