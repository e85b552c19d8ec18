#!/usr/bin/env bash
# Packs what gpu/check.sh needs to run on a GPU machine that cannot build Steward (no Debian build
# packages there): steward, steward_gpu_tests, bench_gpu and the built-in plugins from a CUDA build,
# with every shared library they load from outside glibc and the C++ runtime, into one tar.xz. On
# the GPU machine: tar -xJf BUNDLE -C DIR, LD_LIBRARY_PATH=DIR/lib, STEWARD_GPU_PREBUILT=DIR/bin
# gpu/check.sh OUT (libcublas.so.13 comes from that machine's CUDA).
#   gpu/pack_prebuilt.sh BUNDLE.tar.xz [build dir, default build]
set -euo pipefail
bundle="${1:?usage: gpu/pack_prebuilt.sh BUNDLE.tar.xz [build dir]}"
build="${2:-build}"
cd "$(dirname "$0")/.."
for b in steward steward_gpu_tests bench_gpu; do
  [ -x "$build/$b" ] || { echo "pack_prebuilt: $build/$b missing: build with CUDA first (bash scripts/build.sh)" >&2; exit 1; }
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin/plugins" "$tmp/lib"
cp "$build/steward" "$build/steward_gpu_tests" "$build/bench_gpu" "$tmp/bin/"
cp "$build"/plugins/*.so "$tmp/bin/plugins/"
echo "$(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes') built on $(hostname) $(date -u +%F)" > "$tmp/bin/BUILT_FROM"
strip --strip-unneeded "$tmp"/bin/steward "$tmp"/bin/steward_gpu_tests "$tmp"/bin/bench_gpu
ldd "$build/steward" "$build/steward_gpu_tests" "$build/bench_gpu" "$build"/plugins/*.so | awk '/=>/ {print $3}' | sort -u |
  grep -vE '/(libc|libm|libdl|libpthread|librt|libgcc_s|libstdc\+\+)\.so' | while read -r lib; do cp -L "$lib" "$tmp/lib/"; done
tar -cJf "$bundle" -C "$tmp" bin lib
echo "pack_prebuilt: $bundle ($(du -h "$bundle" | cut -f1)): $(ls "$tmp/lib" | tr '\n' ' ')"
