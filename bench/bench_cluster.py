#!/usr/bin/env python3
"""Pools across processes on loopback, measured: the same generated workload (the six buckets, with
their arrival times) replayed by a front (`steward bench replay -c front.toml`, the embedded runtime
with [[pool]] remote = ...) against

  one     one worker (`steward worker`, 1 thread)
  rr      two workers (1 thread each), every bucket routed round_robin over both
  kv      two workers, every bucket routed kv_aware over both (cached prefix blocks vs load)

Workers start afresh for each run (empty caches). Prints per bucket TTFT p50/p99, output tok/s and
prefix-cache hit rate side by side, with the ratios kv/one and kv/rr, and requests per worker.

  bench_cluster.py STEWARD [--requests N] [--rate R] [--scale S] [--workdir DIR]
(scripts/bench_cluster.sh builds and runs it.)
"""
import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

BUCKETS = ["short_qa", "long_doc", "long_output", "agent", "high_temp", "structured"]

WORKER = """
[cluster]
insecure_loopback = true  # every process on loopback (docs/cluster.md#threat-model)

[limits]
request_timeout_ms = 600000
max_tokens_default = 64

[reload]
watch = false

[[pool]]
name = "model"
model = "{model}"
threads = 1
kv_blocks = 4096
block_size = 16
max_batch = 32
max_batch_tokens = 512
[pool.synth]
dim = 512
layers = 8
heads = 8
kv_heads = 4
ffn = 1376
vocab = 4096
ctx = 8192
seed = 11

[[bucket]]
name = "default"
pool = "model"
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def front_config(ports, plugin):
    out = "[limits]\nrequest_timeout_ms = 600000\nmax_tokens_default = 64\n\n[reload]\nwatch = false\n\n"
    out += "[cluster]\ninsecure_loopback = true\nheartbeat_ms = 100\nheartbeat_timeout_ms = 3000\n\n"
    names = []
    for i, p in enumerate(ports):
        names.append(f"w{i + 1}")
        out += f'[[pool]]\nname = "w{i + 1}"\nremote = "127.0.0.1:{p}"\nremote_pool = "model"\n\n'
    for b in BUCKETS + ["default"]:
        out += f'[[bucket]]\nname = "{b}"\npool = "w1"\n'
        if b != "default":
            out += f'[bucket.match]\nhint = "{b}"\n'
        if plugin:
            out += f'[bucket.routing]\nplugin = "{plugin}"\npools = "{",".join(names)}"\n'
        out += "\n"
    return out


def start_worker(steward, cfg, port, log):
    p = subprocess.Popen([steward, "worker", "-c", cfg, "--listen", f"127.0.0.1:{port}"], stdout=subprocess.PIPE,
                         stderr=log, text=True)
    for line in p.stdout:
        if "listening" in line:
            return p
    sys.exit(f"steward worker on port {port} exited; see the worker log in the work folder")


def run(steward, workdir, name, n_workers, plugin, workload):
    wcfg = os.path.join(workdir, "worker.toml")
    log = open(os.path.join(workdir, f"{name}_workers.log"), "w")
    ports = [free_port() for _ in range(n_workers)]
    workers = [start_worker(steward, wcfg, p, log) for p in ports]
    try:
        fcfg = os.path.join(workdir, f"front_{name}.toml")
        with open(fcfg, "w") as f:
            f.write(front_config(ports, plugin))
        out = os.path.join(workdir, f"{name}.json")
        outputs = os.path.join(workdir, f"{name}.jsonl")
        t0 = time.time()
        p = subprocess.run([steward, "bench", "replay", "-w", workload, "-c", fcfg, "-o", out, "--outputs", outputs],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stdout[-3000:], p.stderr[-3000:])
            sys.exit(f"{name}: steward bench replay exited {p.returncode}")
        print(f"  {name}: {n_workers} worker(s), routing {plugin or 'rules'}: {time.time() - t0:.1f} s", flush=True)
        with open(out) as f:
            metrics = json.load(f)["metrics"]
        with open(outputs) as f:
            recs = [json.loads(l) for l in f if l.strip()]
        return metrics, recs
    finally:
        for w in workers:
            w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(timeout=60)
            except subprocess.TimeoutExpired:
                w.kill()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("steward")
    ap.add_argument("--requests", type=int, default=60)
    ap.add_argument("--rate", type=float, default=3.0)
    ap.add_argument("--scale", type=float, default=0.5)
    ap.add_argument("--workdir", default="out/bench_cluster")
    a = ap.parse_args()
    os.makedirs(a.workdir, exist_ok=True)
    with open(os.path.join(a.workdir, "worker.toml"), "w") as f:
        f.write(WORKER.format(model=os.path.join(os.path.abspath(a.workdir), "model.gguf")))
    # The model is written once (by a throwaway worker) so that no run pays for it.
    subprocess.run([a.steward, "config", "check", os.path.join(a.workdir, "worker.toml")], capture_output=True)
    workload = os.path.join(a.workdir, "workload.jsonl")
    subprocess.run([a.steward, "bench", "gen", "-o", workload, "--requests", str(a.requests), "--rate", str(a.rate),
                    "--scale", str(a.scale)], check=True, capture_output=True)
    print(f"bench_cluster: {a.requests} requests at {a.rate}/s (scale {a.scale}), a 24M-parameter synthetic model, "
          f"workers of 1 thread each, front and workers on loopback")
    runs = {}
    for name, n, plugin in (("one", 1, ""), ("rr", 2, "round_robin"), ("kv", 2, "kv_aware")):
        runs[name] = run(a.steward, a.workdir, name, n, plugin, workload)

    def fig(m, key):
        if m is None:
            return None
        if key == "ttft_p50":
            return m["ttft_ms"]["p50"]
        if key == "ttft_p99":
            return m["ttft_ms"]["p99"]
        if key == "tok/s":
            return m["throughput_tok_s"]
        if key == "hit_rate":
            return m["prefix_cache"]["hit_rate"]
        raise KeyError(key)

    def fmt(v):
        return "-" if v is None else (f"{v:.3f}" if v < 10 else f"{v:.1f}")

    def ratio(x, y):
        return "-" if x is None or y is None or y == 0 else f"{x / y:.2f}"

    print(f"\n{'bucket':<12} {'figure':<10} {'one':>9} {'rr':>9} {'kv':>9} {'kv/one':>7} {'kv/rr':>7}")
    for b in BUCKETS + ["all"]:
        ms = {k: (v[0]["all"] if b == "all" else v[0]["buckets"].get(b)) for k, v in runs.items()}
        if all(m is None for m in ms.values()):
            continue
        for key in ("ttft_p50", "ttft_p99", "tok/s", "hit_rate"):
            v = {k: fig(m, key) for k, m in ms.items()}
            print(f"{b:<12} {key:<10} {fmt(v['one']):>9} {fmt(v['rr']):>9} {fmt(v['kv']):>9} "
                  f"{ratio(v['kv'], v['one']):>7} {ratio(v['kv'], v['rr']):>7}")
    print("\nrequests per worker and their prefix-cache hit rates (cached / prompt tokens):")
    for name, (_, recs) in runs.items():
        per = {}
        for r in recs:
            c = per.setdefault(r["pool"] or "-", [0, 0, 0])
            c[0] += 1
            c[1] += r["cached_tokens"]
            c[2] += r["prompt_tokens"]
        print(f"  {name:<4} " + ", ".join(f"{p}: {n} requests, hit {c / max(1, t):.2f}" for p, (n, c, t) in sorted(per.items())))


if __name__ == "__main__":
    main()
