#!/usr/bin/env bash
# The actor path's overhead over the Engine alone, pooled over several processes: on a small VM one
# process's paired median leans by several per cent either way (each path's memory lands
# differently in each process), so this runs `bench_runtime --overhead-only` N times and takes the
# median of all their paired rounds. Its 95% interval resamples whole processes (their rounds lean
# together, so resampling single rounds would claim too much) (docs/benchmarks.md, "Runtime overhead").
# Usage: bash scripts/bench_runtime_pooled.sh [PROCESSES (16)] [ROUNDS EACH (41)]
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-16}
reps=${2:-41}
if ! [[ "$n" =~ ^[1-9][0-9]{0,2}$ && "$reps" =~ ^[1-9][0-9]{0,3}$ ]]; then
  echo "usage: bash scripts/bench_runtime_pooled.sh [PROCESSES 1-999] [ROUNDS EACH 1-9999]" >&2
  exit 2
fi
[ -x build/bench_runtime ] || { echo "build/bench_runtime is missing: run bash scripts/build.sh first" >&2; exit 1; }
echo "$(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores; $n processes of bench_runtime --overhead-only --reps $reps"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for i in $(seq "$n"); do
  ./build/bench_runtime --overhead-only --reps "$reps" | grep -E "^actor-path overhead \(paired|^actor system threads" | tee -a "$out"
done
python3 - "$out" <<'PY'
import random, re, statistics, sys
procs = []
for line in open(sys.argv[1]):
    if line.startswith("actor-path overhead (paired"):
        procs.append([float(v) for v in re.findall(r"([+-]\d+\.\d+)%", line.split("beside it):")[1].split("; median")[0])])
if not procs:
    sys.exit("no paired rounds were printed")
rounds = [v for p in procs for v in p]
medians = [statistics.median(p) for p in procs]
random.seed(1)
boot = sorted(statistics.median([v for p in random.choices(procs, k=len(procs)) for v in p]) for _ in range(2000))
print("per-process paired medians: " + " ".join(f"{m:+.1f}%" for m in medians))
print(f"pooled over {len(medians)} processes ({len(rounds)} rounds): actor path vs engine alone, median {statistics.median(rounds):+.1f}% "
      f"(95% interval over resampled processes {boot[50]:+.1f}% to {boot[1949]:+.1f}%), mean {statistics.mean(rounds):+.1f}%")
PY
