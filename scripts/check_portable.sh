#!/usr/bin/env bash
# The default build runs on older x86-64 CPUs: the built `steward generate` on a small synthetic
# model under Debian's qemu-user, emulating a Haswell (AVX2, no AVX-512: the AVX2 kernels must be
# chosen) and a Nehalem (x86-64-v2, no AVX: the scalar kernels), with no illegal instruction, and
# the same greedy ids as the native run at the same kernel level (STEWARD_CPU_LEVEL: the levels'
# prefill GEMMs round differently, the AVX2 one in int8 panels, the scalar one in F32, so a close
# call may go either way between levels; within a level the emulated CPU must agree).
#   bash scripts/check_portable.sh [build dir, default build]
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
command -v qemu-x86_64 >/dev/null || { echo "check_portable: qemu-x86_64 missing (apt-get install qemu-user)" >&2; exit 1; }
tmp="$(mktemp -d "${TMPDIR:-/tmp}/steward-portable.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
# The CPU plan pinned for every run: its stream/GEMM crossover decides which kernels a matmul of n
# tokens takes (and so an output's last bits), and an emulated CPU would measure a plan of its own
# (slowly) into the user's cache. The prefetch distance changes no result; pinned to skip the measurement.
export STEWARD_GEMM_MIN_TOKENS=16 STEWARD_PREFETCH_BYTES=4096 STEWARD_CACHE_DIR="$tmp"
"$build/steward" model synth -o "$tmp/m.gguf" --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --vocab 512 \
  --ctx 128 --dtype q8_0 --seed 3 2>/dev/null
# 20 prompt tokens: prefill takes the GEMM path (from 16, pinned above) as well as the streaming one.
prompt="one two three four five six seven eight nine ten eleven twelve thirteen fourteen"
status=0
for cpu_level in Haswell:avx2 Nehalem:scalar; do
  cpu=${cpu_level%%:*}; level=${cpu_level##*:}
  STEWARD_CPU_LEVEL="$level" OPENBLAS_CORETYPE="$cpu" "$build/steward" generate -m "$tmp/m.gguf" -p "$prompt" -n 12 \
    --temp 0 --ids -t 1 >"$tmp/native-$level.out" 2>"$tmp/native-$level.err"
  want=$(tail -1 "$tmp/native-$level.out")
  rc=0
  # OpenBLAS (the prefill GEMM) picks its kernels from CPUID too, but under qemu-user on some hosts
  # (an AMD EPYC) it reads Haswell for the emulated Nehalem and faults: this checks Steward's own code,
  # so OpenBLAS is told the emulated CPU (on a real Nehalem it finds it itself).
  OPENBLAS_CORETYPE="$cpu" qemu-x86_64 -cpu "$cpu" "$build/steward" generate -m "$tmp/m.gguf" -p "$prompt" -n 12 --temp 0 --ids -t 1 \
    >"$tmp/$cpu.out" 2>"$tmp/$cpu.err" || rc=$?
  got=$(tail -1 "$tmp/$cpu.out")
  if [ "$rc" -ne 0 ]; then
    echo "check_portable: FAIL on $cpu: exit $rc ($( [ "$rc" -eq 132 ] && echo 'illegal instruction' || tail -2 "$tmp/$cpu.err"))" >&2
    status=1
  elif ! grep -q "kernels $level " "$tmp/$cpu.err"; then
    echo "check_portable: FAIL on $cpu: expected the $level kernels; stderr: $(tail -1 "$tmp/$cpu.err")" >&2
    status=1
  elif ! grep -q "kernels $level " "$tmp/native-$level.err"; then
    echo "check_portable: $cpu ($level kernels): ok, ids $got (this CPU cannot run the $level kernels natively: not compared)"
  elif [ "$got" != "$want" ]; then
    echo "check_portable: FAIL on $cpu: greedy ids differ from the native run at $level: '$got' vs '$want'" >&2
    status=1
  else
    echo "check_portable: $cpu ($level kernels): ok, ids $got"
  fi
done
exit $status
