#!/usr/bin/env bash
# Control off the critical path, measured: the default config's standard workload, run twice on the
# same generated file, with short_qa routed by a plugin that sleeps 0 ms and then 40 ms per decision
# (tests/plugins/slow_routing.so, the same pool either way). Every other bucket's TTFT p50 and TPOT
# p50 side by side with their ratio (slow / fast): a bucket's plugin decisions run on its own thread,
# so the other buckets should not see the sleep.
# The two run in turn --pairs times (fast, slow, fast, ...): each figure is the median over its runs,
# and the ratio the median of the pairs' ratios, so a drift of the machine's speed cancels.
#   bash scripts/bench_isolation.sh [--requests 60] [--rate 2] [--seed 1] [--pairs 3]
#   STEWARD_BUILD=dir (default build; built with the tests, for slow_routing.so). Run it alone.
set -euo pipefail
cd "$(dirname "$0")/.."
build="${STEWARD_BUILD:-build}"; requests=60; rate=2; seed=1; pairs=3
while [ $# -gt 0 ]; do
  case $1 in
    --requests) requests=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    *) echo "bench_isolation.sh: unknown argument $1 (see the header)" >&2; exit 2 ;;
  esac
done
[ -f "$build/test_plugins/slow_routing.so" ] || { echo "bench_isolation.sh: $build/test_plugins/slow_routing.so missing (build with tests)" >&2; exit 1; }
out=out/bench_isolation
mkdir -p "$out" models
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p')"
"$build/steward" bench gen -o "$out/workload.jsonl" --requests "$requests" --rate "$rate" --seed "$seed" >/dev/null
python3 - "$build" "$out" "$PWD" "$pairs" <<'PY'
import json, re, statistics, subprocess, sys
build, out, root, pairs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
base = open(f"{root}/configs/default.toml").read().replace('"../models/', f'"{root}/models/')
# short_qa's routing: the slow plugin, choosing the small pool (index 1) as cascade starts there.
cascade = re.search(r'\[bucket\.routing\]\nplugin = "cascade"\n(?:[a-z_]+ = [^\n]*\n)*', base).group(0)
def config(sleep_ms):
    r = f'[bucket.routing]\nplugin = "{root}/{build}/test_plugins/slow_routing.so"\nsleep_ms = {sleep_ms}\npool = 1\n'
    return base.replace(cascade, r)
runs = {"fast": [], "slow": []}
for i in range(pairs):
    for name, sleep in (("fast", 0), ("slow", 40)):
        path = f"{out}/{name}.toml"
        open(path, "w").write(config(sleep))
        subprocess.run([f"{build}/steward", "run", "-c", path, "-w", f"{out}/workload.jsonl", "-o", f"{out}/{name}{i}.json"],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        runs[name].append(json.load(open(f"{out}/{name}{i}.json"))["metrics"]["buckets"])
def fig(b, k, q):
    v = b.get(k, {}).get(q)
    return v if isinstance(v, (int, float)) else None
def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None
print(f"routing plugin sleeping 0 ms vs 40 ms per decision in short_qa; steward run, same workload, {pairs} pairs")
cols = [("ttft_ms", "p50"), ("ttft_ms", "mean"), ("tpot_ms", "p50"), ("tpot_ms", "mean")]
print(f"{'bucket':<12}" + "".join(f" | {k[:4]} {q:<4} {'0ms':>7} {'40ms':>7} {'ratio':>6}" for k, q in cols))
for bucket in sorted(runs["fast"][0]):
    row = f"{bucket:<12}"
    for k, q in cols:
        a = med([fig(r.get(bucket, {}), k, q) for r in runs["fast"]])
        b = med([fig(r.get(bucket, {}), k, q) for r in runs["slow"]])
        ratios = [fig(s.get(bucket, {}), k, q) / fig(f.get(bucket, {}), k, q) for f, s in zip(runs["fast"], runs["slow"])
                  if fig(f.get(bucket, {}), k, q) and fig(s.get(bucket, {}), k, q)]
        r = f"{statistics.median(ratios):.2f}x" if ratios else "-"
        row += f" | {k[:4]} {q:<4} {a if a is not None else float('nan'):7.1f} {b if b is not None else float('nan'):7.1f} {r:>6}"
    print(row + ("   (the sleeping bucket)" if bucket == "short_qa" else ""))
PY
