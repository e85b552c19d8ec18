#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test; the unit tests again
# with the CPU kernels forced to the AVX2 and the scalar level; the default build on emulated older
# CPUs (scripts/check_portable.sh); then the unit tests under AddressSanitizer +
# UndefinedBehaviorSanitizer, and the fuzz targets for 30 s each (scripts/fuzz.sh). Prints how
# long each stage took. Set STEWARD_SKIP_ASAN=1 or STEWARD_SKIP_FUZZ=1 to skip those.
set -euo pipefail
cd "$(dirname "$0")/.."
stages=()
t_all=$(date +%s)
stage() {  # name command...: runs the command and records its wall time
  local name=$1 t0 rc=0
  shift
  t0=$(date +%s)
  echo "== test.sh: $name"
  "$@" || rc=$?
  stages+=("$(printf '%-34s %5d s' "$name" $(( $(date +%s) - t0 )))")
  if [ "$rc" -ne 0 ]; then
    echo "== test.sh: stage '$name' failed (exit $rc)" >&2
    printf '%s\n' "${stages[@]}" >&2
    exit "$rc"
  fi
}
unit_at_level() {  # level: the unit tests with the kernels forced to it
  STEWARD_CPU_LEVEL=$1 ./build/steward_unit_tests >"build/unit_$1.log" 2>&1 \
    || { tail -40 "build/unit_$1.log" >&2; return 1; }
  tail -2 "build/unit_$1.log"
}
stage setup bash scripts/setup.sh
stage "build (Release)" bash scripts/build.sh build
stage "ctest (Release)" bash -c 'cd build && ctest --output-on-failure --timeout 600 -j "$(nproc)"'
stage "unit tests, kernels at avx2" unit_at_level avx2
stage "unit tests, kernels at scalar" unit_at_level scalar
stage "older CPUs under qemu" bash scripts/check_portable.sh build
stage "custom plugin" bash scripts/check_custom_plugin.sh build
stage "install" bash scripts/check_install.sh build
if [ "${STEWARD_SKIP_ASAN:-0}" != "1" ]; then
  stage "build (ASan/UBSan)" bash scripts/build.sh build-asan -DSTEWARD_SANITIZE=ON -DSTEWARD_BENCH=OFF
  stage "ctest (ASan/UBSan)" bash -c 'cd build-asan && ctest --output-on-failure --timeout 900 -j "$(nproc)"'
fi
if [ "${STEWARD_SKIP_FUZZ:-0}" != "1" ]; then
  stage "fuzz (build + run)" bash scripts/fuzz.sh "${STEWARD_FUZZ_SECONDS:-30}"
fi
echo "== test.sh: every stage passed; wall time per stage:"
printf '%s\n' "${stages[@]}"
printf '%-34s %5d s\n' total $(( $(date +%s) - t_all ))
command -v ccache >/dev/null && ccache -s | grep -Ei 'hits|misses' || true
