#!/usr/bin/env bash
# llama.cpp as an AVX2-only peer: the same llama.cpp source that ../shared/peers/llama-bench.sh
# fetches, built without -march=native (GGML_NATIVE=OFF: SSE4.2, AVX, AVX2, FMA, F16C, BMI2, the
# Haswell / Zen 3 set, no AVX-512) into its own folder, then one of its tools run. With Steward held
# to the same level (STEWARD_CPU_LEVEL=avx2), an AVX-512 host then compares the AVX2 paths of both,
# as an AVX2-only host (Zen 2/3, Haswell to Alder Lake) would run them:
#   STEWARD_CPU_LEVEL=avx2 ./build/bench_model --peer --peer-script scripts/peer_avx2.sh [...]
#   PEER_TOOL=llama-server bash scripts/peer_avx2.sh [llama-server args...]
# PEER_CACHE (default ~/.cache/steward-peers) is llama-bench.sh's cache; the build goes to
# $PEER_CACHE/build-avx2 (first run of a tool ~10 min on 2 cores, then cached).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
peer="${PEER_SCRIPT:-$here/../../shared/peers/llama-bench.sh}"
cache=${PEER_CACHE:-$HOME/.cache/steward-peers}
tool=${PEER_TOOL:-llama-bench}
if [[ ! -f $cache/src/CMakeLists.txt ]]; then
  # The native peer fetches the source on its first run; its --help does nothing else.
  [[ -x $peer || -f $peer ]] || { echo "peer_avx2.sh: no $peer (set PEER_SCRIPT to llama-bench.sh)" >&2; exit 1; }
  bash "$peer" --help >/dev/null 2>&1 || true
  [[ -f $cache/src/CMakeLists.txt ]] || { echo "peer_avx2.sh: $peer left no llama.cpp source in $cache/src" >&2; exit 1; }
fi
build=$cache/build-avx2
bin=$build/bin/$tool
if [[ ! -x $bin ]]; then
  echo "peer_avx2.sh: building $tool (AVX2, no AVX-512) from llama.cpp $(git -C "$cache/src" log -1 --format=%cd --date=short) (once)..." >&2
  cmake -S "$cache/src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF \
    >"$cache/configure-avx2.log" 2>&1 || { tail -20 "$cache/configure-avx2.log" >&2; exit 1; }
  grep -q 'GGML_AVX2' "$cache/configure-avx2.log" && ! grep -q 'GGML_AVX512' "$cache/configure-avx2.log" \
    || { echo "peer_avx2.sh: the configure did not select AVX2 without AVX-512 (see $cache/configure-avx2.log)" >&2; exit 1; }
  cmake --build "$build" -j"$(nproc)" --target "$tool" >"$cache/build-avx2-$tool.log" 2>&1 \
    || { tail -30 "$cache/build-avx2-$tool.log" >&2; exit 1; }
fi
exec "$bin" "$@"
