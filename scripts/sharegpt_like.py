#!/usr/bin/env python3
"""A ShareGPT-shaped workload file (Steward's JSONL, docs/workloads.md) for comparing the
simulated backend with published vLLM / SGLang benchmarks: N requests arriving at once (request
rate inf, as their offline throughput runs), prompt and output lengths log-normal with the means of
those benchmarks' ShareGPT samples (202 prompt tokens, as vLLM's v0.6.0 blog states; 194 output
tokens, what SGLang's 5000-prompt run implies: 3856 output tok/s at 19.84 req/s), prompts of
random token ids above the control and byte tokens, ignore-EOS lengths (the sim never ends early).

    python3 scripts/sharegpt_like.py --requests 5000 --out out/sharegpt_like.jsonl
"""
import argparse
import json
import math
import random


def lognormal_int(rng, mean, sigma, lo, hi):
    mu = math.log(mean) - sigma * sigma / 2  # E[exp(N(mu, sigma^2))] = mean
    return max(lo, min(hi, int(round(rng.lognormvariate(mu, sigma)))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--prompt-mean", type=float, default=202)
    ap.add_argument("--output-mean", type=float, default=194)
    ap.add_argument("--sigma", type=float, default=0.9, help="log-normal shape (ShareGPT's lengths are heavy-tailed)")
    ap.add_argument("--max-len", type=int, default=2048, help="cap on either length")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    n_in = n_out = 0
    with open(a.out, "w") as f:
        for i in range(a.requests):
            p = lognormal_int(rng, a.prompt_mean, a.sigma, 4, a.max_len)
            o = lognormal_int(rng, a.output_mean, a.sigma, 1, a.max_len)
            n_in += p
            n_out += o
            ids = [rng.randrange(259, a.vocab) for _ in range(p)]
            f.write(json.dumps({"arrival_ms": 0, "tenant": "bench", "bucket": "sharegpt", "prompt_ids": ids,
                                "max_tokens": o, "temperature": 0}) + "\n")
    print(f"wrote {a.requests} requests to {a.out}: mean prompt {n_in / a.requests:.1f}, mean output {n_out / a.requests:.1f} tokens")


if __name__ == "__main__":
    main()
