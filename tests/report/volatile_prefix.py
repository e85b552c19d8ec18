#!/usr/bin/env python3
"""The volatile-prefix workload through `steward run` (issue: the workload bench's prefix-miss
diagnosis). Every short_qa / long_output / high_temp prompt carries a volatile line (request id and
timestamp): right after the public system prompt (early), the prefix cache loses what follows it and
the report's diagnosis names the line; at the end of the prompt (late), the hit rate comes back and
the diagnosis reports nothing.

  volatile_prefix.py STEWARD TEST_TINY_TOML WORKDIR
"""
import json
import os
import re
import subprocess
import sys

from tiny_config import write_tiny_config


def run(steward, config, workdir, at):
    out = os.path.join(workdir, f"{at}.json")
    cmd = [steward, "run", "-c", config, "--requests", "40", "--rate", "4", "--scale", "0.5",
           "--volatile-share", "1", "--volatile-at", at, "-o", out]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        print(p.stdout[-3000:], p.stderr[-3000:])
        sys.exit(f"steward run ({at}) exited {p.returncode}")
    with open(out) as f:
        return json.load(f), p.stdout


def main():
    steward, tiny, workdir = sys.argv[1:4]
    os.makedirs(workdir, exist_ok=True)
    config = write_tiny_config(tiny, workdir, "volatile.toml")

    early, early_out = run(steward, config, workdir, "early")
    late, _ = run(steward, config, workdir, "late")
    hit = lambda r: r["metrics"]["buckets"]["short_qa"]["prefix_cache"]["hit_rate"]
    diag = lambda r: {b["bucket"]: b for b in r["prefix_diagnosis"]}
    failures = []
    print(f"short_qa hit rate: early {hit(early):.3f}, late {hit(late):.3f}")
    if not hit(late) >= hit(early) + 0.1:
        failures.append("moving the volatile line to the end did not restore the short_qa hit rate")
    spots = diag(early)["short_qa"]["spots"]
    print("early spots:", json.dumps(spots)[:600])
    if not spots:
        failures.append("the diagnosis found no volatile text in short_qa with the line after the system prompt")
    else:
        s = spots[0]
        # The span is the id / timestamp: digits, and what separates them.
        allowed = set("0123456789 .:-TZ\n") | set("request at")  # "request 000012 at 2025-01-01T00:00:06.878Z"
        if not re.search(r"\d", s["example"]) or not all(c in allowed for c in s["example"]):
            failures.append(f"the reported span {s['example']!r} is not the volatile line's id / timestamp")
        if s["prompts"] < 5 or s["tokens_lost"] <= 0:
            failures.append(f"the spot covers {s['prompts']} prompts and {s['tokens_lost']} lost tokens")
        if "move it after the shared part" not in s["advice"] or "advice: " + s["advice"] not in early_out:
            failures.append("the advice line is missing from the report or steward run's output")
    late_spots = diag(late)["short_qa"]["spots"]
    if late_spots:
        failures.append(f"with the line at the end the diagnosis still reports {late_spots}")
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
