#!/bin/bash
# Issue 9 sweep (run from the repo root after a build; STEWARD overrides the binary): every case must
# end in a clear error or a clean run, never a crash (rc > 1 outside usage errors) or a hang (timeout).
# Mutates each key of a small valid config through type and range extremes; runs `config check`.
B=$(realpath ${STEWARD:-build/steward})
cd "$(mktemp -d)" && trap 'rm -rf "$PWD"' EXIT
$B model synth -o m.gguf --dim 64 --layers 2 --heads 2 --kv-heads 2 --ffn 128 --vocab 512 --ctx 256 2>/dev/null
vals=('true' '"s"' '-1' '0' '2147483647' '4294967297' '9223372036854775807' 'nan' 'inf' '-inf' '1e300' '-0.0' '[]' '0.5')
pool_keys=(threads kv_blocks kv_gib block_size max_batch max_batch_tokens max_queue kv_overcommit prefix_cache price_prompt price_output price_cached quality kv_dtype backend)
ok=0; err=0; crash=0; hang=0; accepted=()
try() { # $1 = toml text, $2 = label
  printf '%s' "$1" > c.toml
  timeout 10 $B config check c.toml > out.txt 2>&1; rc=$?
  if [ $rc = 124 ]; then hang=$((hang+1)); echo "HANG $2";
  elif [ $rc = 0 ]; then ok=$((ok+1)); accepted+=("$2");
  elif [ $rc = 1 ] && grep -q "steward: error:" out.txt; then err=$((err+1));
  else crash=$((crash+1)); echo "CRASH rc=$rc $2"; cat out.txt; fi
}
base=$'[[pool]]\nname = "p"\nmodel = "m.gguf"\nkv_blocks = 64\n'
for k in "${pool_keys[@]}"; do for v in "${vals[@]}"; do
  t=$(printf '[[pool]]\nname = "p"\nmodel = "m.gguf"\n%s = %s\n' "$k" "$v"); [ $k != kv_blocks ] && t="$t"$'\nkv_blocks = 64'
  try "$t"$'\n' "pool.$k=$v"; done; done
for k in request_timeout_ms session_ttl_ms max_tokens_default max_draft_tokens; do for v in "${vals[@]}"; do
  try "$base"$'[limits]\n'"$k = $v"$'\n' "limits.$k=$v"; done; done
for k in dim layers heads kv_heads ffn vocab ctx seed keep_layers; do for v in "${vals[@]}"; do
  try $'[[pool]]\nname = "p"\nmodel = "nope.gguf"\nkv_blocks = 64\n[pool.synth]\n'"$k = $v"$'\n' "synth.$k=$v"; done; done
for k in salt kv_quota; do for v in "${vals[@]}"; do
  try "$base"$'[[tenant]]\nname = "t"\n'"$k = $v"$'\n' "tenant.$k=$v"; done; done
for k in priority slo_ttft_ms slo_tpot_ms; do for v in "${vals[@]}"; do
  try "$base"$'[[bucket]]\nname = "b"\n'"$k = $v"$'\n' "bucket.$k=$v"; done; done
for k in min_prompt_tokens max_prompt_tokens min_max_tokens max_max_tokens min_temperature max_temperature tools; do for v in "${vals[@]}"; do
  try "$base"$'[[bucket]]\nname = "b"\n[bucket.match]\n'"$k = $v"$'\n' "match.$k=$v"; done; done
for v in "${vals[@]}"; do try "$base"$'[server]\nport = '"$v"$'\n' "server.port=$v"; try "$base"$'[reload]\ndebounce_ms = '"$v"$'\n' "reload.debounce_ms=$v"; done
echo "cases $((ok+err+crash+hang)) accepted $ok errors $err crashes $crash hangs $hang"
printf 'accepted: %s\n' "${accepted[@]}"
