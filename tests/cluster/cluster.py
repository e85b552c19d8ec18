#!/usr/bin/env python3
"""Pools across processes on loopback: a front (`steward serve` with [[pool]] remote = ...) and two
workers (`steward worker`), each hosting a copy of one synthetic model.

  1. Requests flow through the front to a worker, streaming and not; a request naming a pool runs
     on that pool's worker (the decision trace names it).
  2. kv_aware routing sends prompts sharing a prefix to the worker holding it: its per-worker hit
     rates against round_robin's on the same kind of workload (fresh prefixes).
  3. kill -9 of a worker in the middle of streaming runs: every request finishes exactly once; those
     of a retry bucket go on on the other worker and end with all their tokens, none sent twice; those
     of a bucket with on_worker_loss = "fail" end with an error naming the worker.
  4. The worker, started again on its port, rejoins: a request naming its pool runs there again,
     without restarting the front.
  5. A worker of another wire protocol version is refused with a clear error.
  6. A peer that accepts and stays silent is refused after connect_timeout_ms, naming the cause.
  7. Tenants stay apart across workers (another tenant's identical prompt finds nothing cached), and
     a config reload of the front removes a worker's pool and adds it back.

  cluster.py STEWARD WORKDIR
"""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Everything here is on loopback without TLS ([cluster] insecure_loopback); tests/cluster/security.py
# runs fronts and workers with certificates.
WORKER_TOML = """
[cluster]
insecure_loopback = true

[limits]
request_timeout_ms = 120000
max_tokens_default = 16

[reload]
watch = false

[[pool]]
name = "tiny"
model = "{model}"
threads = 1
kv_blocks = 2048
block_size = 16
max_batch = 32
max_batch_tokens = 512
[pool.synth]
dim = 128
layers = 4
heads = 4
kv_heads = 2
ffn = 256
vocab = 512
ctx = 4096
seed = 7

[[bucket]]
name = "default"
pool = "tiny"
"""

FRONT_TOML = """
[limits]
request_timeout_ms = 120000
max_tokens_default = 16

[reload]
watch = false

[server]
host = "127.0.0.1"
port = {port}

[cluster]
insecure_loopback = true
heartbeat_ms = 100
heartbeat_timeout_ms = 10000
reconnect_ms = 200

[[tenant]]
name = "acme"
api_keys = ["k-acme"]
admin = true  # POST /admin/reload (step 7)

[[tenant]]
name = "globex"
api_keys = ["k-globex"]

[[pool]]
name = "w1"
remote = "127.0.0.1:{w1}"
remote_pool = "tiny"

{w2_pool}
[[bucket]]
name = "shared"
pool = "w1"
[bucket.match]
hint = "shared"
[bucket.routing]
plugin = "kv_aware"
pools = "w1,w2"

[[bucket]]
name = "rr"
pool = "w1"
[bucket.match]
hint = "rr"
[bucket.routing]
plugin = "round_robin"
pools = "w1,w2"

[[bucket]]
name = "failfast"
pool = "w1"
on_worker_loss = "fail"
[bucket.match]
hint = "failfast"

[[bucket]]
name = "default"
pool = "w1"
"""


class Procs:
    def __init__(self, workdir):
        self.workdir = workdir
        self.procs = {}

    def start(self, name, args, ready, timeout=120):
        log = open(os.path.join(self.workdir, name + ".log"), "w")
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
        self.procs[name] = p
        t0 = time.time()
        while time.time() - t0 < timeout:
            line = p.stdout.readline()
            if not line:
                sys.exit(f"{name} exited before it was ready; see {name}.log")
            log.write(line)
            log.flush()
            if ready in line:
                # Drain the rest of stdout in the background so the process never blocks on it.
                threading.Thread(target=lambda: [log.write(l) for l in p.stdout], daemon=True).start()
                return p
        sys.exit(f"{name} not ready after {timeout} s")

    def kill(self, name, sig=signal.SIGKILL):
        p = self.procs.pop(name)
        p.send_signal(sig)
        p.wait(timeout=30)

    def stop_all(self):
        for name, p in list(self.procs.items()):
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()


W2_POOL = """[[pool]]
name = "w2"
remote = "127.0.0.1:{w2}"
remote_pool = "tiny"
"""


def auth(key="k-acme"):
    return {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}


def post(port, body, timeout=120, key="k-acme"):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                 headers=auth(key))
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.headers.get("x-steward-request-id"), json.loads(r.read())


def get(port, path, key="k-acme", method="GET"):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=auth(key), method=method)
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def trace(port, rid):
    return get(port, f"/admin/requests/{rid}")


class Stream:
    """One streaming completion read on its own thread: text pieces, finish reasons, errors, usage."""

    def __init__(self, port, body):
        self.body = dict(body, stream=True, stream_options={"include_usage": True})
        self.port = port
        self.pieces, self.finish, self.errors, self.usage = [], [], [], None
        self.done = 0
        self.rid = None
        self.first = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        try:
            req = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions", data=json.dumps(self.body).encode(),
                                         headers=auth())
            with urllib.request.urlopen(req, timeout=300) as r:
                self.rid = r.headers.get("x-steward-request-id")
                for raw in r:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        self.done += 1
                        continue
                    ev = json.loads(data)
                    if "error" in ev:
                        self.errors.append(ev["error"].get("message", ""))
                        self.first.set()
                        continue
                    if ev.get("usage"):
                        self.usage = ev["usage"]
                    for c in ev.get("choices", []):
                        if c.get("text"):
                            self.pieces.append(c["text"])
                            self.first.set()
                        if c.get("finish_reason"):
                            self.finish.append(c["finish_reason"])
        except Exception as e:  # noqa: BLE001 - reported as a failure
            self.errors.append(f"client: {e}")
        self.first.set()


def main():
    steward, workdir = sys.argv[1:3]
    os.makedirs(workdir, exist_ok=True)
    procs = Procs(workdir)
    w1, w2, w3, port = free_port(), free_port(), free_port(), free_port()
    wcfg = os.path.join(workdir, "worker.toml")
    with open(wcfg, "w") as f:
        f.write(WORKER_TOML.format(model=os.path.join(os.path.abspath(workdir), "model.gguf")))
    fcfg = os.path.join(workdir, "front.toml")
    with open(fcfg, "w") as f:
        f.write(FRONT_TOML.format(port=port, w1=w1, w2_pool=W2_POOL.format(w2=w2)))
    try:
        procs.start("w1", [steward, "worker", "-c", wcfg, "--listen", f"127.0.0.1:{w1}"], "listening")
        procs.start("w2", [steward, "worker", "-c", wcfg, "--listen", f"127.0.0.1:{w2}"], "listening")
        procs.start("front", [steward, "serve", "--config", fcfg], "listening")
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except Exception:
                time.sleep(0.2)

        # 1. Requests flow, streaming and not; a pool named by the request runs on its worker.
        rid, r = post(port, {"model": "default", "prompt": "Once upon a time", "max_tokens": 12, "ignore_eos": True})
        check(r["usage"]["completion_tokens"] == 12 and r["choices"][0]["finish_reason"] == "length",
              f"non-streaming completion through the front: 12 tokens, finish length ({r['usage']})")
        t = trace(port, rid)
        check(t["runs"][0].get("worker") == f"127.0.0.1:{w1}", f"its trace names worker w1 ({t['runs']})")
        s = Stream(port, {"model": "default", "prompt": "Once upon a time", "max_tokens": 12, "ignore_eos": True})
        s.thread.join(120)
        check(s.finish == ["length"] and s.done == 1 and not s.errors and s.usage and s.usage["completion_tokens"] == 12,
              f"streaming completion: one finish, one [DONE], 12 tokens (finish {s.finish}, errors {s.errors})")
        check("".join(s.pieces) == r["choices"][0]["text"], "streamed text equals the non-streamed greedy text")
        rid, r = post(port, {"model": "w2", "prompt": "Once upon a time", "max_tokens": 12, "ignore_eos": True})
        t = trace(port, rid)
        check(t["runs"][0].get("worker") == f"127.0.0.1:{w2}", "a request naming pool w2 runs on worker w2")
        check(r["choices"][0]["text"] == "".join(s.pieces), "worker w2 (same model file) gives the same greedy text")

        # 2. kv_aware vs round_robin on shared-prefix prompts: three long prefixes, eight questions each,
        # one request at a time. Each bucket gets prefixes of its own (fresh caches).
        def prefix(tag):
            return " ".join(f"{tag} rule {i}: the agent reads section {i} of the {tag} manual before it answers." for i in range(40))

        def run_bucket(bucket, tags):
            by_pool, hits = {}, {}
            for q in range(8):
                for tag in tags:
                    rid, r = post(port, {"model": bucket, "prompt": prefix(tag) + f" Question {q}: what is rule {q}?",
                                         "max_tokens": 4, "ignore_eos": True})
                    pool = trace(port, rid)["route"]["pool"]
                    u = r["usage"]
                    by_pool.setdefault(tag, []).append(pool)
                    c = hits.setdefault(pool, [0, 0])
                    c[0] += u["prompt_tokens_details"]["cached_tokens"]
                    c[1] += u["prompt_tokens"]
            return by_pool, hits

        kv_pools, kv_hits = run_bucket("shared", ["alpha", "beta", "gamma"])
        rr_pools, rr_hits = run_bucket("rr", ["delta", "epsilon", "zeta"])

        def rate(h):
            return sum(c for c, _ in h.values()) / max(1, sum(p for _, p in h.values()))

        for name, h in (("kv_aware", kv_hits), ("round_robin", rr_hits)):
            print(f"     {name}: hit rate {rate(h):.3f}; per worker " +
                  ", ".join(f"{p} {c / max(1, n):.3f} ({c}/{n} tokens)" for p, (c, n) in sorted(h.items())))
        sticky = all(len(set(v[1:])) == 1 and v[1] == v[0] for v in kv_pools.values())
        check(sticky, f"kv_aware: every prefix's later requests go to the worker its first one filled ({kv_pools})")
        check(rate(kv_hits) > rate(rr_hits) + 0.1,
              f"kv_aware's hit rate {rate(kv_hits):.3f} is above round_robin's {rate(rr_hits):.3f}")
        check(len({p for v in rr_pools.values() for p in v}) == 2, "round_robin used both workers")

        # Tenants stay apart on the workers: globex's prompt, identical to one acme cached, finds
        # nothing cached anywhere (the salt travels with every run), then its own second one does.
        same = {"model": "shared", "prompt": prefix("alpha") + " Question 0: what is rule 0?", "max_tokens": 4,
                "ignore_eos": True}
        _, g1 = post(port, same, key="k-globex")
        _, g2 = post(port, same, key="k-globex")
        check(g1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and g2["usage"]["prompt_tokens_details"]["cached_tokens"] > 0,
              f"another tenant's identical prompt finds nothing cached on the workers ({g1['usage']}), its own repeat does "
              f"({g2['usage']['prompt_tokens_details']})")

        # 3. kill -9 of worker w1 while 8 retry-bucket and 2 fail-bucket streams run on it.
        n_tokens = 1500
        streams = [Stream(port, {"model": "default", "prompt": f"Story {i}: once upon a time", "max_tokens": n_tokens,
                                 "ignore_eos": True}) for i in range(8)]
        fails = [Stream(port, {"model": "failfast", "prompt": f"Tale {i}: long ago", "max_tokens": n_tokens,
                               "ignore_eos": True}) for i in range(2)]
        for x in streams + fails:
            x.first.wait(120)
        time.sleep(0.2)
        procs.kill("w1")
        t_kill = time.time()
        for x in streams + fails:
            x.thread.join(300)
        print(f"     the streams ended {time.time() - t_kill:.1f} s after the kill")
        for i, x in enumerate(streams):
            n = x.usage["completion_tokens"] if x.usage else -1
            check(x.finish == ["length"] and x.done == 1 and not x.errors and n == n_tokens,
                  f"retry stream {i}: finished once (finish {x.finish}, [DONE] x{x.done}, errors {x.errors}), "
                  f"{n} of {n_tokens} tokens")
        lost = 0
        for x in streams:
            runs = trace(port, x.rid)["runs"]
            if any("lost" in r for r in runs):
                lost += 1
                check(runs[-1].get("worker") == f"127.0.0.1:{w2}" and "finish" in runs[-1],
                      f"request {x.rid}: its run went on on worker w2 ({runs[-1]})")
        check(lost >= 1, f"{lost} of 8 retry-bucket runs were on w1 when it died and moved to w2")
        for i, x in enumerate(fails):
            check(x.done == 1 and len(x.errors) == 1 and "was lost" in x.errors[0] and "on_worker_loss" in x.errors[0],
                  f"fail-bucket stream {i}: one clear error naming the lost worker ({x.errors})")
        # A retried run's prompt is the request's prompt and the tokens already streamed; the answer
        # counts only the request's prompt (the exact token accounting is the request core's unit test).
        for x in streams:
            runs = trace(port, x.rid)["runs"]
            if any("lost" in r for r in runs):
                check(runs[-1]["prompt_tokens"] > runs[0]["prompt_tokens"] and x.usage["prompt_tokens"] == runs[0]["prompt_tokens"],
                      f"request {x.rid}: the retry's prompt {runs[-1]['prompt_tokens']} = {runs[0]['prompt_tokens']} + the tokens "
                      f"streamed before the loss; usage counts {x.usage['prompt_tokens']} prompt tokens")
                break

        # 4. Worker w1 starts again on its port and rejoins.
        procs.start("w1b", [steward, "worker", "-c", wcfg, "--listen", f"127.0.0.1:{w1}"], "listening")
        back = False
        t0 = time.time()
        while time.time() - t0 < 30 and not back:
            rid, r = post(port, {"model": "w1", "prompt": "hello", "max_tokens": 2, "ignore_eos": True})
            runs = trace(port, rid)["runs"]
            back = runs[-1].get("worker") == f"127.0.0.1:{w1}" and not any("lost" in x for x in runs)
            if not back:
                time.sleep(0.3)
        check(back, f"worker w1 rejoined {time.time() - t0:.1f} s after it started again; pool w1 serves requests")

        # A reload of the front removes pool w2 (worker and all), then adds it back.
        def models():
            return {m["id"] for m in get(port, "/v1/models")["data"]}

        with open(fcfg, "w") as f:
            f.write(FRONT_TOML.format(port=port, w1=w1, w2_pool="").replace('pools = "w1,w2"', 'pools = "w1"'))
        get(port, "/admin/reload", method="POST")
        gone = "w2" not in models()
        with open(fcfg, "w") as f:
            f.write(FRONT_TOML.format(port=port, w1=w1, w2_pool=W2_POOL.format(w2=w2)))
        get(port, "/admin/reload", method="POST")
        rid, r = post(port, {"model": "w2", "prompt": "hello", "max_tokens": 2, "ignore_eos": True})
        check(gone and "w2" in models() and trace(port, rid)["runs"][-1].get("worker") == f"127.0.0.1:{w2}",
              "a reload of the front removed worker w2's pool, and another added it back; it serves again")

        # 5. Another wire protocol version is refused, naming both versions.
        procs.start("w3", [steward, "worker", "-c", wcfg, "--listen", f"127.0.0.1:{w3}", "--wire-version", "99"], "listening")
        bad = os.path.join(workdir, "front_bad.toml")
        with open(bad, "w") as f:
            f.write(f'[cluster]\ninsecure_loopback = true\n\n[[pool]]\nname = "w3"\nremote = "127.0.0.1:{w3}"\nremote_pool = "tiny"\n\n'
                    '[[bucket]]\nname = "default"\npool = "w3"\n')
        p = subprocess.run([steward, "run", "-c", bad, "--requests", "1"], capture_output=True, text=True, timeout=120)
        check(p.returncode != 0 and "wire protocol 99" in p.stderr and "same Steward version" in p.stderr,
              f"a front refuses a worker of wire protocol 99 (exit {p.returncode}: {p.stderr.strip()[-300:]})")
        # A peer that accepts the connection and says nothing (not a worker): a clear error in bounded time.
        silent = socket.socket()
        silent.bind(("127.0.0.1", 0))
        silent.listen(4)
        accepted = []
        threading.Thread(target=lambda: [accepted.append(silent.accept()) for _ in range(4)], daemon=True).start()
        quiet = os.path.join(workdir, "front_quiet.toml")
        with open(quiet, "w") as f:
            f.write(f'[cluster]\ninsecure_loopback = true\nconnect_timeout_ms = 1000\n\n[[pool]]\nname = "q"\nremote = "127.0.0.1:{silent.getsockname()[1]}"\n\n'
                    '[[bucket]]\nname = "default"\npool = "q"\n')
        t0 = time.time()
        p = subprocess.run([steward, "run", "-c", quiet, "--requests", "1"], capture_output=True, text=True, timeout=60)
        check(p.returncode != 0 and "did not complete CAF's handshake" in p.stderr and time.time() - t0 < 30,
              f"a silent peer is refused after connect_timeout_ms ({time.time() - t0:.1f} s: {p.stderr.strip()[-200:]})")
    finally:
        procs.stop_all()
    if failures:
        print(f"FAIL: {len(failures)} checks failed")
        sys.exit(1)
    print("all cluster checks passed")


if __name__ == "__main__":
    main()
