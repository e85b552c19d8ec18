#!/usr/bin/env bash
# Installs every Debian package Steward builds, tests, fuzzes and runs with (Debian 12, as root).
# Safe to run again: apt-get skips what is already installed.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config git
      libcaf-dev libtomlplusplus-dev libspdlog-dev libfmt-dev catch2
      libboost-dev libboost-system-dev libopenblas-dev nlohmann-json3-dev
      libssl-dev openssl  # the worker gate's TLS (libcaf-dev brings CAF's OpenSSL module); certificates in tests
      libcli11-dev libpcre2-dev curl ccache
      chromium  # the HTML report test renders the report headless and screenshots it
      python3 python3-jinja2  # the chat-template tests render with jinja2 as the reference
      clang libclang-rt-14-dev  # the fuzz tree: Clang and libFuzzer's runtime
      qemu-user)  # scripts/test.sh runs the default-built steward on an emulated older CPU (Haswell)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
