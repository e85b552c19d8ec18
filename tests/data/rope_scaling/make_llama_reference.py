#!/usr/bin/env python3
"""Writes llama_greedy.tsv: llama.cpp's tokenization and 32 greedy ids for synthetic llama files with
RoPE scaling, the independent reference tests/unit/cpu/test_rope_scaling.cpp checks Steward against.

  python3 tests/data/rope_scaling/make_llama_reference.py ./build/steward > tests/data/rope_scaling/llama_greedy.tsv

Per variant it writes the file the test writes in memory:
  steward model synth --arch llama --dim 256 --layers 2 --heads 8 --kv-heads 2 --ffn 512 --vocab 1024
      --ctx 512 --seed 31 [variant flags]
with the variants none (no scaling), freqs8 (--rope-freqs-ramp 8: a rope_freqs.weight tensor as
Llama 3.1 files carry), linear4 (--rope-scale 4: rope.scaling.type linear, factor 4) and both
(--rope-freqs-ramp 8 --rope-scale 2), and runs ../shared/peers/llama-bench.sh with
PEER_TOOL=llama-server on it:
  -m FILE --port 8093 -c 512 -t 2 -fa off -ctk f32 -ctv f32 --no-warmup -np 1
asking POST /tokenize for the prompt (BOS added) and POST /completion for 32 tokens at temperature 0.
Columns: variant, llama.cpp's prompt ids, its 32 greedy ids (space-separated).
"""
import json, os, subprocess, sys, tempfile, time, urllib.request

steward = sys.argv[1]
peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../shared/peers/llama-bench.sh")
peer = os.environ.get("PEER_SCRIPT", peer)
text = "the quick brown fox jumps over the lazy dog"
variants = {"none": [], "freqs8": ["--rope-freqs-ramp", "8"], "linear4": ["--rope-scale", "4"],
            "both": ["--rope-freqs-ramp", "8", "--rope-scale", "2"]}


def post(path, body):
    req = urllib.request.Request("http://127.0.0.1:8093" + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())


with tempfile.TemporaryDirectory() as tmp:
    for name, flags in variants.items():
        path = os.path.join(tmp, name + ".gguf")
        subprocess.run([steward, "model", "synth", "--arch", "llama", "-o", path, "--dim", "256", "--layers", "2",
                        "--heads", "8", "--kv-heads", "2", "--ffn", "512", "--vocab", "1024", "--ctx", "512",
                        "--seed", "31"] + flags, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        srv = subprocess.Popen(["bash", peer, "-m", path, "--port", "8093", "-c", "512", "-t", "2", "-fa", "off",
                                "-ctk", "f32", "-ctv", "f32", "--no-warmup", "-np", "1"],
                               env=dict(os.environ, PEER_TOOL="llama-server"), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        try:
            for _ in range(600):
                try:
                    urllib.request.urlopen("http://127.0.0.1:8093/health", timeout=1).read()
                    break
                except Exception:
                    time.sleep(0.2)
            prompt = post("/tokenize", {"content": text, "add_special": True})["tokens"]
            ids = post("/completion", {"prompt": prompt, "n_predict": 32, "temperature": 0, "top_k": 1,
                                       "samplers": ["top_k"], "ignore_eos": True, "return_tokens": True,
                                       "cache_prompt": False})["tokens"]
            assert len(ids) == 32, (name, ids)
            print(name + "\t" + " ".join(map(str, prompt)) + "\t" + " ".join(map(str, ids)))
        finally:
            srv.terminate()
            srv.wait()
