#!/usr/bin/env bash
# Checks the installed embedding API (libsteward.so, include/steward, steward::runtime):
#   1. cmake --install <build dir> (default build) into a temporary prefix; the library's SONAME,
#      its shared dependencies (ldd) and its exports (the public API only);
#   2. every installed public header compiles alone against the prefix's include directory and
#      nothing else (C++17 -Wall -Wextra -Werror; steward.h also as C99 -Wpedantic), and
#      steward/policy.h with steward/steward.h in one C translation unit (tests/public_headers.c);
#   3. copies examples/embed_cpp and examples/embed_c out of the tree, builds each with
#      find_package(steward) against the prefix only, runs both on a copy of configs/test_tiny.toml
#      (its model is synthesized next to it on first start) and checks what they print;
#   4. imports the installed Python module (lib/python3/dist-packages/steward) with Debian's
#      python3 from the prefix alone, and generates and streams through it.
# Prints every command; exits non-zero at the first failure. STEWARD_KEEP_TMP=1 keeps the
# temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
build="$(cd "${1:-build}" && pwd)"
tmp="$(mktemp -d "${TMPDIR:-/tmp}/steward-install.XXXXXX")"
if [ "${STEWARD_KEEP_TMP:-0}" = "1" ]; then
  echo "check_install: keeping $tmp"
else
  trap 'rm -rf "$tmp"' EXIT
fi
prefix="$tmp/prefix"

run() { echo "+ $*"; "$@"; }
step() { echo; echo "== check_install: $*"; }
fail() { echo "check_install: $*" >&2; exit 1; }
expect() {  # expect <file> <fixed string>: the program's output holds that line (or part of one)
  grep -qF -- "$2" "$1" || fail "$(basename "$1" .out) did not print \"$2\" (output above)"
}

step "install $build into $prefix"
run cmake --install "$build" --prefix "$prefix" >/dev/null
lib="$prefix/lib/libsteward.so"
for f in lib/libsteward.so include/steward/runtime.h include/steward/request.h include/steward/config.h \
         include/steward/expected.h include/steward/finish_reason.h include/steward/steward.h \
         include/steward/policy.h lib/cmake/steward/steward-config.cmake lib/cmake/steward/steward-targets.cmake; do
  [ -e "$prefix/$f" ] || fail "the install tree lacks $f"
done
soname="$(readelf -d "$lib" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
echo "SONAME: $soname"
[ -n "$soname" ] && [ -f "$prefix/lib/$soname" ] || fail "libsteward.so has no SONAME link in lib/ ($soname)"
run ldd "$lib" | tee "$tmp/ldd.out"
! grep -q "not found" "$tmp/ldd.out" || fail "a dependency of libsteward.so is not found"
for dep in libcaf_core libopenblas libspdlog libpcre2-8 libstdc++; do
  grep -q "$dep" "$tmp/ldd.out" || fail "libsteward.so does not record $dep as a shared dependency"
done
# Exports: C functions steward_* and C++ symbols in namespace steward, nothing else of ours.
nm -D --defined-only "$lib" | awk '$2 ~ /^[TWDBRV]$/ { print $3 }' >"$tmp/exports"
others="$(grep -v '^steward_' "$tmp/exports" | c++filt | grep -v '^steward::' || true)"
[ -z "$others" ] || fail "libsteward.so exports more than the public API: $others"
echo "exports: $(grep -c '^steward_' "$tmp/exports") C functions, $(grep -vc '^steward_' "$tmp/exports") C++ symbols"

step "the installed public headers stand alone"
if grep -n '#include "' "$prefix"/include/steward/*.h; then fail "a public header includes by quotes (a path outside <steward/...>)"; fi
for h in "$prefix"/include/steward/*.h; do
  name="steward/$(basename "$h")"
  echo "+ c++ -std=c++17 -Wall -Wextra -Werror -I\$prefix/include: #include <$name>"
  echo "#include <$name>" | c++ -std=c++17 -Wall -Wextra -Werror -fsyntax-only -I "$prefix/include" -x c++ -
done
for name in steward/steward.h steward/policy.h; do
  echo "+ cc -std=c99 -Wpedantic -Wall -Wextra -Werror -I\$prefix/include: #include <$name>"
  echo "#include <$name>" | cc -std=c99 -Wpedantic -Wall -Wextra -Werror -fsyntax-only -I "$prefix/include" -x c -
done
run cc -std=c99 -Wpedantic -Wall -Wextra -Werror -fsyntax-only -I "$prefix/include" tests/public_headers.c

gen=()
command -v ninja >/dev/null && gen=(-G Ninja)
mkdir -p "$tmp/run"
cp configs/test_tiny.toml "$tmp/run/"  # its model: ../build-models/tiny.gguf, i.e. $tmp/build-models
for ex in embed_cpp embed_c; do
  step "build examples/$ex out of tree against the prefix, run it"
  src="$tmp/$ex"
  cp -r "examples/$ex" "$src"
  rm -rf "$src/build"  # a build someone made in the source tree
  run cmake -S "$src" -B "$src/build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$prefix"
  run cmake --build "$src/build"
  ldd "$src/build/$ex" | grep -F "$prefix/lib/$soname" >/dev/null ||
    fail "$ex does not load libsteward from the prefix: $(ldd "$src/build/$ex" | grep steward)"
  if ! (cd "$tmp/run" && run "$src/build/$ex" test_tiny.toml) 2>&1 | tee "$tmp/$ex.out"; then
    fail "$ex failed (output above)"
  fi
done

step "a program embedding the installed libsteward finds the installed built-in plugins"
# The prefix is not the configured install prefix, and the program is not in the prefix's bin/:
# only libsteward's own location leads to <prefix>/lib/steward/plugins.
{ cat configs/test_tiny.toml; printf '[bucket.eviction]\nplugin = "lfu"\n[bucket.routing]\nplugin = "rules"\n'; } \
  > "$tmp/run/test_tiny_plugins.toml"
if ! (cd "$tmp/run" && env -u STEWARD_PLUGIN_PATH "$tmp/embed_cpp/build/embed_cpp" test_tiny_plugins.toml) \
     > "$tmp/embed_plugins.out" 2>&1; then
  cat "$tmp/embed_plugins.out"
  fail "embed_cpp could not load the installed plugins (output above)"
fi
expect "$tmp/embed_plugins.out" "embed_cpp: OK"

step "the installed Python module imports from the prefix, finds the prefix's libsteward and generates"
pydir="$prefix/lib/python3/dist-packages"
[ -f "$pydir/steward/__init__.py" ] && [ -f "$pydir/steward/_install.py" ] ||
  fail "the install tree lacks lib/python3/dist-packages/steward (__init__.py, _install.py)"
python=/usr/bin/python3  # Debian's
[ -x "$python" ] || python=python3
echo "+ PYTHONPATH=$pydir $python (import steward; generate; stream)"
if ! (cd "$tmp/run" && env -u STEWARD_LIB -u STEWARD_BUILD_DIR PYTHONPATH="$pydir" PYTHONDONTWRITEBYTECODE=1 "$python" - \
        > "$tmp/python.out" 2>&1 <<'PY'
import steward
print(f"python: library {steward.library_path}")
with steward.Runtime("test_tiny.toml") as rt:
    r = rt.generate("Once upon a time", max_tokens=16)
    print(f"python: finish {r.finish_reason}, pool {r.pool}, completion_tokens={r.usage.completion_tokens}")
    pieces = list(rt.stream("Once upon a time", max_tokens=16))
    print("python: streamed text matches" if "".join(pieces) == r.text else "python: streamed text differs")
print("python: OK")
PY
); then
  cat "$tmp/python.out"
  fail "the installed Python module failed (output above)"
fi
cat "$tmp/python.out"
expect "$tmp/python.out" "python: library $prefix/lib/libsteward.so"
expect "$tmp/python.out" "python: finish length, pool tiny, completion_tokens=16"
expect "$tmp/python.out" "python: streamed text matches"
expect "$tmp/python.out" "python: OK"

# What each must have shown: 16 streamed tokens ending by length, the figures, the metrics.
expect "$tmp/embed_cpp.out" "finish length, bucket default, pool tiny, upgraded 0, fallback 0"
expect "$tmp/embed_cpp.out" "completion_tokens=16"
expect "$tmp/embed_cpp.out" "streamed 16 tokens, text matches the result"
expect "$tmp/embed_cpp.out" "embed_cpp: OK"
expect "$tmp/embed_c.out" "status STEWARD_OK, finish length (STEWARD_RESULT_LENGTH), upgraded 0, fallback 0"
expect "$tmp/embed_c.out" "completion_tokens=16"
expect "$tmp/embed_c.out" "streamed 16 tokens"
expect "$tmp/embed_c.out" 'steward_generation_tokens_total{bucket="default"} 16'
expect "$tmp/embed_c.out" 'steward_request_success_total{bucket="default",finished_reason="length"} 1'
expect "$tmp/embed_c.out" "embed_c: OK"
echo
echo "check_install: OK"
