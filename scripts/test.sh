#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test; then the unit tests
# again under AddressSanitizer + UndefinedBehaviorSanitizer. Set STEWARD_SKIP_ASAN=1 to skip that.
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
