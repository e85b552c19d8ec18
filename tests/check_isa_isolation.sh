#!/usr/bin/env bash
# The kernel levels' objects (runtime/cpu/kernels_<level>.cpp, quant_dot_<level>.cpp) may use their
# level's instructions only in their own namespace (steward::<level>): a weak symbol outside it
# (an inline library function such as std::vector's) could be the copy the linker keeps for the
# whole program, which would then fault on an older CPU. Fails naming any such symbol that holds a
# VEX / EVEX instruction or a ymm / zmm / mask register.
#   tests/check_isa_isolation.sh BUILD_DIR
set -euo pipefail
objs=$(find "$1" -path '*steward_cpu.dir*' \( -name 'kernels_avx*.o' -o -name 'quant_dot_avx*.o' \))
[ -n "$objs" ] || { echo "check_isa_isolation: no level objects under $1" >&2; exit 1; }
bad=0; n_checked=0
for o in $objs; do
  for sym in $(nm --defined-only "$o" | awk '$2 ~ /^[WVu]$/ {print $3}'); do
    dem=$(c++filt "$sym")
    case "$dem" in steward::avx*) continue ;; esac
    n_checked=$((n_checked + 1))
    n=$(objdump -d --no-show-raw-insn --disassemble="$sym" "$o" | grep -cE '%[yz]mm|%k[0-7]|^\s+[0-9a-f]+:\s+v[a-z]' || true)
    if [ "$n" -gt 0 ]; then echo "check_isa_isolation: $o: $dem holds $n AVX instructions" >&2; bad=1; fi
  done
done
echo "check_isa_isolation: $(echo "$objs" | wc -w) objects, $n_checked weak symbols outside the level namespaces: $([ $bad = 0 ] && echo 'none with AVX code, ok' || echo FAIL)"
exit $bad
