#!/usr/bin/env bash
# The main job: installs what is missing, builds, writes the default synthetic model when it is
# missing, and runs it. Extra arguments go to `steward generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
mkdir -p models
[ -f models/default.gguf ] || ./build/steward model synth -o models/default.gguf --dim 512 --layers 8 --heads 8 --kv-heads 4 --ffn 1376 --vocab 8192
./build/steward generate -m models/default.gguf -p "Once upon a time" -n 64 --temp 0 "$@"
