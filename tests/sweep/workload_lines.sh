#!/bin/bash
# Issue 9 sweep (run from the repo root after a build; STEWARD overrides the binary): every case must
# end in a clear error or a clean run, never a crash (rc > 1 outside usage errors) or a hang (timeout).
# Workload lines with hostile fields, through `steward run -w` on a tiny config (errors are refused before the runtime starts).
B=$(realpath ${STEWARD:-build/steward})
cd "$(mktemp -d)" && trap 'rm -rf "$PWD"' EXIT
$B model synth -o m.gguf --dim 64 --layers 2 --heads 2 --kv-heads 2 --ffn 128 --vocab 512 --ctx 256 2>/dev/null
cat > run.toml <<T
[[pool]]
name = "p"
model = "m.gguf"
kv_blocks = 64
threads = 1
[limits]
request_timeout_ms = 20000
T
ok=0; err=0; crash=0; hang=0
try() {
  printf '%s\n' "$1" > w.jsonl
  timeout 60 $B run -c run.toml -w w.jsonl -o r.json > out.txt 2>&1; rc=$?
  if [ $rc = 124 ]; then hang=$((hang+1)); echo "HANG $1";
  elif [ $rc = 0 ]; then ok=$((ok+1)); echo "OK $1";
  elif [ $rc = 1 ] || [ $rc = 3 ]; then err=$((err+1)); [ $rc = 3 ] && echo "FAILED-REQ $1: $(grep -m1 -i 'error\|fail' out.txt)";
  else crash=$((crash+1)); echo "CRASH rc=$rc $1"; tail -3 out.txt; fi
}
for f in 'arrival_ms' 'max_tokens' 'temperature' 'top_p' 'seed' 'tool_pause_ms' 'turn'; do
  for v in -1 0 1e13 1e300 2147483648 '"x"' true null 0.5; do
    try "{\"arrival_ms\": 0, \"prompt\": \"hi\", \"max_tokens\": 2, \"$f\": $v}"
  done
done
try '{"arrival_ms": 0, "prompt_ids": [999999], "max_tokens": 2}'
try '{"arrival_ms": 0, "prompt_ids": [-1], "max_tokens": 2}'
try '{"arrival_ms": 0, "prompt_ids": [], "max_tokens": 2}'
try '{"arrival_ms": 0, "prompt": "", "max_tokens": 2}'
try '{"arrival_ms": 0, "prompt": "hi", "max_tokens": 100000}'
try '{"arrival_ms": 0, "session": "s", "turn": 2, "prompt": "hi", "max_tokens": 2}'
echo "cases $((ok+err+crash+hang)) accepted $ok errors $err crashes $crash hangs $hang"
