#!/usr/bin/env bash
# Checks the install tree and the out-of-tree plugin workflow of examples/custom_plugin:
#   1. cmake --install <build dir> (default build) into a temporary prefix;
#   2. copies examples/custom_plugin out of the tree and builds it with find_package(steward)
#      against that prefix;
#   3. with the INSTALLED steward: `config check` of its custom.toml, then a one-request run.
# Prints every command; exits non-zero at the first failure. STEWARD_KEEP_TMP=1 keeps the
# temporary directories.
set -euo pipefail
cd "$(dirname "$0")/.."
build="$(cd "${1:-build}" && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/steward-custom-plugin.XXXXXX")"
if [ "${STEWARD_KEEP_TMP:-0}" = "1" ]; then
  echo "check_custom_plugin: keeping $tmp"
else
  trap 'rm -rf "$tmp"' EXIT
fi
prefix="$tmp/prefix"
src="$tmp/custom_plugin"

run() { echo "+ $*"; "$@"; }
step() { echo; echo "== check_custom_plugin: $*"; }

step "install $build into $prefix"
run cmake --install "$build" --prefix "$prefix" >/dev/null
(cd "$prefix" && find . -type f | sort)
for f in bin/steward include/steward/policy.h lib/cmake/steward/steward-config.cmake \
         lib/cmake/steward/steward-config-version.cmake lib/cmake/steward/StewardPlugin.cmake; do
  [ -e "$prefix/$f" ] || { echo "check_custom_plugin: the install tree lacks $f" >&2; exit 1; }
done

step "build examples/custom_plugin out of tree against the prefix"
cp -r examples/custom_plugin "$src"
rm -rf "$src/build"  # a build someone made in the source tree
gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
run cmake -S "$src" -B "$src/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
run cmake --build "$src/build"
so="$src/build/steward_routing_shortest_queue.so"
[ -f "$so" ] || { echo "check_custom_plugin: $so was not built" >&2; exit 1; }
exports="$(nm -D --defined-only "$so" | awk '$2 == "T" { print $3 }')"
echo "exported functions: $exports"
[ "$exports" = "steward_plugin_entry" ] || {
  echo "check_custom_plugin: the plugin must export steward_plugin_entry only" >&2; exit 1; }

step "load it with the installed steward"
run "$prefix/bin/steward" config check "$src/custom.toml"
run "$prefix/bin/steward" run -c "$src/custom.toml" -w "$src/workload.jsonl" -o "$tmp/report.json"
echo
echo "check_custom_plugin: OK"
