#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test; then the unit tests
# again under AddressSanitizer + UndefinedBehaviorSanitizer, and the fuzz targets for 45 s each
# (scripts/fuzz.sh). Set STEWARD_SKIP_ASAN=1 or STEWARD_SKIP_FUZZ=1 to skip those.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
(cd build && ctest --output-on-failure --timeout 600 -j "$(nproc)")
bash scripts/check_custom_plugin.sh build
bash scripts/check_install.sh build
if [ "${STEWARD_SKIP_ASAN:-0}" != "1" ]; then
  bash scripts/build.sh build-asan -DSTEWARD_SANITIZE=ON -DSTEWARD_BENCH=OFF
  (cd build-asan && ctest --output-on-failure --timeout 900 -j "$(nproc)")
fi
if [ "${STEWARD_SKIP_FUZZ:-0}" != "1" ]; then
  bash scripts/fuzz.sh "${STEWARD_FUZZ_SECONDS:-30}"
fi
