#!/usr/bin/env bash
# Installs every Debian package Steward builds, tests, fuzzes and runs with (Debian 12, as root).
# Safe to run again: apt-get skips what is already installed.
set -euo pipefail
pkgs=(build-essential cmake ninja-build pkg-config git
      libcaf-dev libtomlplusplus-dev libspdlog-dev libfmt-dev catch2
      libboost-dev libboost-system-dev libopenblas-dev nlohmann-json3-dev
      libssl-dev openssl  # the worker gate's TLS (libcaf-dev brings CAF's OpenSSL module); certificates in tests
      libcli11-dev libpcre2-dev curl ccache
      zlib1g-dev  # the KV tiers' block files carry zlib's CRC-32
      libicu-dev  # WordPiece (BERT) tokenization: NFD, Unicode categories and case
      chromium  # the HTML report test renders the report headless and screenshots it
      python3 python3-jinja2  # the chat-template tests render with jinja2 as the reference
      clang libclang-rt-14-dev  # the fuzz tree: Clang and libFuzzer's runtime
      qemu-user  # scripts/test.sh runs the default-built steward on an emulated older CPU (Haswell)
      prometheus)  # promtool checks the metrics exposition (vLLM's names too)
# Node.js and npm run the official OpenAI / Anthropic npm clients against `steward serve`
# (tests/clients). Debian's packages unless a node with npm is already installed (e.g. NodeSource's,
# which bundles npm and conflicts with Debian's npm package).
command -v node >/dev/null && command -v npm >/dev/null || pkgs+=(nodejs npm)
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

# The client tests' npm packages, at the versions package-lock.json pins (again when the lock changed).
clients="$(cd "$(dirname "$0")/../tests/clients" && pwd)"
if ! cmp -s "$clients/package-lock.json" "$clients/node_modules/.steward-lock" 2>/dev/null; then
  (cd "$clients" && npm ci --no-audit --no-fund --loglevel=error && cp package-lock.json node_modules/.steward-lock)
fi
