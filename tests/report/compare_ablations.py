#!/usr/bin/env python3
"""`steward run --compare`: the same workload through the baseline config and its ablations in one
run. With the prefix cache off, no prompt token is served from the prefix cache (only agent sessions'
pinned KV remains), while the baseline serves some; every variant runs every request; the table
names each variant and a bad variant is refused naming the choices.

  compare_ablations.py STEWARD TEST_TINY_TOML WORKDIR
"""
import json
import os
import subprocess
import sys

from tiny_config import write_tiny_config


def main():
    steward, tiny, workdir = sys.argv[1:4]
    os.makedirs(workdir, exist_ok=True)
    config = write_tiny_config(tiny, workdir, "compare.toml")
    out = os.path.join(workdir, "compare.json")
    p = subprocess.run([steward, "run", "-c", config, "--requests", "24", "--rate", "8", "--scale", "0.25", "--tenants", "1",
                        "--compare", "no_prefix_cache,eviction=lru", "-o", out], capture_output=True, text=True, timeout=300)
    print(p.stdout[-4000:])
    failures = []
    if p.returncode != 0:
        print(p.stderr[-2000:])
        failures.append(f"steward run --compare exited {p.returncode}")
    else:
        with open(out) as f:
            r = json.load(f)
        if r["variants"] != ["baseline", "no_prefix_cache", "eviction=lru"]:
            failures.append(f"variants {r['variants']}")
        hits = {}
        for name, run in r["runs"].items():
            m = run["metrics"]
            if run["failed"] or m["all"]["requests"]["total"] != 24:
                failures.append(f"{name}: {run['failed']} failed of {m['all']['requests']['total']}")
            hits[name] = sum(b["prefix_cache"]["hits_tokens"] for k, b in m["buckets"].items() if k != "agent")
        print("prefix-cache hit tokens outside agent sessions:", hits)
        if not hits["baseline"] > 0 or hits["no_prefix_cache"] != 0:
            failures.append(f"hit tokens baseline {hits['baseline']}, no_prefix_cache {hits['no_prefix_cache']}")
        for v in ("baseline", "no_prefix_cache", "eviction=lru"):
            if v not in p.stdout.split("ablations: the same")[-1]:
                failures.append(f"the table does not name {v}")
    bad = subprocess.run([steward, "run", "-c", config, "--requests", "2", "--compare", "no_cache"], capture_output=True,
                         text=True, timeout=60)
    if bad.returncode == 0 or "unknown variant 'no_cache'" not in bad.stderr or "no_prefix_cache" not in bad.stderr:
        failures.append(f"a bad variant: exit {bad.returncode}, {bad.stderr.strip()!r}")
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
