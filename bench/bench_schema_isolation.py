#!/usr/bin/env python3
"""A 100,000-value enum JSON Schema in one request against the same pool's other requests.

Starts `steward serve` on the default config, then runs one round of 48 streamed completions to the
small pool (4 clients at once, short prompts, 16 tokens) twice: alone, and with one request carrying
a json_schema whose property is an enum of 100,000 strings (about 0.9 MB, under the 1 MiB limit) sent to the same pool at
the start of the round. Prints the other requests' TTFT p50 / p99 both ways and their ratio, and
how long the schema request took.
  python3 bench/bench_schema_isolation.py [steward binary, default build/steward] [--port 18290]
"""
import http.client, json, os, subprocess, sys, threading, time

steward = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "build/steward"
port = int(sys.argv[sys.argv.index("--port") + 1]) if "--port" in sys.argv else 18290


def stream_ttft(body, timeout=300):
    """Seconds to the first streamed token of a /v1/completions request, and to its end."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.monotonic()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    ttft = None
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    for line in r:
        if line.startswith(b"data: ") and line.strip() != b"data: [DONE]" and ttft is None:
            ttft = time.monotonic() - t0
    c.close()
    return ttft, time.monotonic() - t0


def round_of(n=48, clients=4, schema_body=None):
    ttfts, lock, extra = [], threading.Lock(), {}
    queue = list(range(n))

    def client():
        while True:
            with lock:
                if not queue:
                    return
                i = queue.pop()
            t, _ = stream_ttft({"model": "small", "prompt": f"Question {i}: what is {i} plus {i}?", "max_tokens": 16,
                                "temperature": 0, "stream": True})
            with lock:
                ttfts.append(t * 1e3)

    def schema_client():
        t0 = time.monotonic()
        try:
            extra["ttft"], extra["e2e"] = stream_ttft(schema_body)
        except Exception as e:  # a refusal is an answer too
            extra["error"] = str(e)[:200]
        extra["wall"] = time.monotonic() - t0

    threads = [threading.Thread(target=client) for _ in range(clients)]
    if schema_body:
        threads.insert(0, threading.Thread(target=schema_client))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ttfts.sort()
    q = lambda p: ttfts[min(len(ttfts) - 1, int(p * len(ttfts)))]
    return q(0.5), q(0.99), extra


def main():
    cfg = open("configs/default.toml").read().replace('"../models/', f'"{os.getcwd()}/models/')
    os.makedirs("out/bench_isolation", exist_ok=True)
    path = "out/bench_isolation/serve.toml"
    open(path, "w").write(cfg)
    server = subprocess.Popen([steward, "serve", "--config", path, "--port", str(port)], stdout=subprocess.DEVNULL,
                              stderr=open("out/bench_isolation/serve.log", "w"))
    try:
        for _ in range(600):
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        values = [f"k{(i * 7919) % 1000003}" for i in range(100000)]  # under the 1 MiB limit
        schema = {"type": "object", "properties": {"v": {"enum": values}}, "required": ["v"]}
        body = {"model": "small", "prompt": "Pick one:", "max_tokens": 8, "temperature": 0, "stream": True,
                "response_format": {"type": "json_schema", "json_schema": {"name": "pick", "schema": schema}}}
        cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][:1]
        print(f"cpu: {cpu[0] if cpu else '?'}")
        print(f"schema request body: {len(json.dumps(body)) / 1e6:.2f} MB")
        round_of(12)  # warm-up
        base = round_of()
        with_schema = round_of(schema_body=body)
        again = round_of()
        print(f"{'round':<28} {'ttft p50 ms':>12} {'p99 ms':>9}")
        for name, r in (("alone", base), ("with the 100k-enum request", with_schema), ("alone again", again)):
            print(f"{name:<28} {r[0]:12.1f} {r[1]:9.1f}")
        ref99 = max(base[1], again[1])
        print(f"p99 with / alone (the larger of the two alone rounds): {with_schema[1] / ref99:.2f}x")
        print(f"the schema request: {with_schema[2]}")
    finally:
        server.terminate()
        server.wait()


main()
