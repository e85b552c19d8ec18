#!/bin/bash
# Issue 9 sweep (run from the repo root after a build; STEWARD overrides the binary): every case must
# end in a clear error or a clean run, never a crash (rc > 1 outside usage errors) or a hang (timeout).
# steward generate with hostile options and model paths.
B=$(realpath ${STEWARD:-build/steward})
cd "$(mktemp -d)" && trap 'rm -rf "$PWD"' EXIT
$B model synth -o m.gguf --dim 64 --layers 2 --heads 2 --kv-heads 2 --ffn 128 --vocab 512 --ctx 256 2>/dev/null
[ -p fifo ] || mkfifo fifo; ln -sf /dev/zero zero.gguf; mkdir -p adir
ok=0; err=0; crash=0; hang=0
try() {
  timeout 30 $B generate $1 > out.txt 2>&1; rc=$?
  if [ $rc = 124 ]; then hang=$((hang+1)); echo "HANG $1";
  elif [ $rc = 0 ]; then ok=$((ok+1)); echo "OK $1";
  elif { [ $rc = 1 ] || [ $rc -ge 100 -a $rc -lt 120 ]; } && grep -qi "error\|required\|run with" out.txt; then err=$((err+1));
  else crash=$((crash+1)); echo "CRASH rc=$rc $1"; tail -2 out.txt; fi
}
for o in "--temp nan" "--temp -1" "--temp inf" "--temp 1e39" "--top-p 0" "--top-p -1" "--top-p 2" "--top-p nan" "--top-k -1" "--top-k 2147483648" "-t 100000" "-t -1" "-t 9" "-n -1" "-n 2147483647" "-n 0" "--seed -1" "--seed -2" "--seed 18446744073709551616" "--seed abc"; do
  case "$o" in -n*) try "-m m.gguf -p hi $o";; *) try "-m m.gguf -p hi -n 2 $o";; esac; done
for m in fifo zero.gguf adir nope.gguf /dev/null; do try "-m $m -p hi -n 2"; done
echo "cases $((ok+err+crash+hang)) accepted $ok errors $err crashes $crash hangs $hang"
