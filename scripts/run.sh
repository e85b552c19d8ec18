#!/usr/bin/env bash
# The main job: installs what is missing, builds, and runs `steward run` on the default config
# (its two synthetic models are written to models/ on first start) with the standard mixed
# workload; prints the per-bucket table and writes out/report.json. Extra arguments go to
# `steward run` (e.g. --requests 400 --scale 2 --burst).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
./build/steward run -c configs/default.toml -o out/report.json "$@"
