#!/usr/bin/env python3
"""One workload replayed through the embedded runtime (`steward run -w`) and over HTTP against
`steward serve` (bench_serve, streaming /v1/completions): the same greedy outputs, request by
request, and the same prompt and output token counts per bucket. Both replay one request at a time
in file order (--sequential), so both see the same batches and the same prefix-cache states; the
HTTP side names each request's bucket as the model (--steward-fields), as the embedded side passes
it as the bucket hint, and asks JSON mode for the structured bucket as the embedded side does.

  replay_equivalence.py STEWARD BENCH_SERVE TEST_TINY_TOML WORKDIR
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

from tiny_config import write_tiny_config

BUCKETS = ["short_qa", "long_doc", "long_output", "agent", "high_temp", "structured"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    steward, bench_serve, tiny, workdir = sys.argv[1:5]
    os.makedirs(workdir, exist_ok=True)
    port = free_port()
    # One bucket per workload bucket, matched by its hint, so both sides classify by the same rule.
    config = write_tiny_config(tiny, workdir, "replay.toml", buckets=BUCKETS, server_port=port)

    wl = os.path.join(workdir, "workload.jsonl")
    subprocess.run([steward, "bench", "gen", "-o", wl, "--requests", "18", "--scale", "0.25", "--tenants", "1",
                    "--seed", "3"], check=True, timeout=60)
    emb_out = os.path.join(workdir, "embedded.jsonl")
    p = subprocess.run([steward, "run", "-c", config, "-w", wl, "--greedy", "--sequential", "--outputs", emb_out,
                        "-o", os.path.join(workdir, "embedded.json")], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        print(p.stdout[-2000:], p.stderr[-2000:])
        sys.exit(f"steward run exited {p.returncode}")
    with open(emb_out) as f:
        emb = [json.loads(l) for l in f if l.strip()]

    log = open(os.path.join(workdir, "serve.log"), "w")
    server = subprocess.Popen([steward, "serve", "--config", config], stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                if server.poll() is not None:
                    sys.exit("steward serve exited; see serve.log")
                time.sleep(0.2)
        http_out = os.path.join(workdir, "http.json")
        p = subprocess.run([bench_serve, "--port", str(port), "--workload", wl, "--greedy", "--stop-at-eos",
                            "--session-field", "--steward-fields", "--sequential", "--name", "steward-http",
                            "--out", http_out], capture_output=True, text=True, timeout=300)
        print(p.stdout[-1500:])
        if p.returncode != 0:
            print(p.stderr[-2000:])
            sys.exit(f"bench_serve exited {p.returncode}")
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
    with open(http_out) as f:
        http = json.load(f)["requests"]

    failures = []
    if len(emb) != len(http):
        failures.append(f"{len(emb)} embedded results against {len(http)} over HTTP")
    per_bucket = {}
    for e, h in zip(emb, http):
        line = e["line"]
        if e["finish"] not in ("stop", "length"):
            failures.append(f"line {line}: embedded finish {e['finish']}")
        if e["text"] != h["text"]:
            failures.append(f"line {line} ({e['bucket_hint']}): outputs differ:\n  embedded {e['text']!r}\n  http     {h['text']!r}")
        if e["completion_tokens"] != h["n_output"] or e["prompt_tokens"] != h["n_prompt"]:
            failures.append(f"line {line}: tokens (prompt, output) embedded ({e['prompt_tokens']}, "
                            f"{e['completion_tokens']}), http ({h['n_prompt']}, {h['n_output']})")
        b = per_bucket.setdefault(e["bucket"], [0, 0, 0, 0])
        b[0] += e["prompt_tokens"]; b[1] += e["completion_tokens"]; b[2] += h["n_prompt"]; b[3] += h["n_output"]
    print(f"{'bucket':12} {'prompt emb':>10} {'prompt http':>11} {'out emb':>8} {'out http':>8}")
    for name, (pe, oe, ph, oh) in per_bucket.items():
        print(f"{name:12} {pe:10} {ph:11} {oe:8} {oh:8}")
    if len(per_bucket) < 4:
        failures.append(f"only {len(per_bucket)} buckets in the run: {sorted(per_bucket)}")
    if sum(v[1] for v in per_bucket.values()) == 0:
        failures.append("no output tokens at all")
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
