#!/usr/bin/env python3
"""Writes llama_greedy.tsv: llama.cpp's tokenization and 32 greedy ids for synthetic gemma2 and gemma3
files, the independent reference tests/unit/cpu/test_gemma.cpp checks Steward's Gemma forward against.

  python3 tests/data/gemma/make_llama_reference.py ./build/steward > tests/data/gemma/llama_greedy.tsv

Per architecture and dtype (f32, f16, q8_0) it writes the file the test writes in memory:
  steward model synth --arch gemma2 --dim 256 --layers 4 --heads 4 --kv-heads 2 --ffn 512 --vocab 1024
      --ctx 512 --seed 7 --sliding-window 8 --attn-softcap 5 --final-softcap 3 --dtype DTYPE
  steward model synth --arch gemma3 --dim 256 --layers 6 --heads 4 --kv-heads 2 --ffn 512 --vocab 1024
      --ctx 512 --seed 7 --sliding-window 8 --dtype DTYPE
and runs ../shared/peers/llama-bench.sh with PEER_TOOL=llama-server on it:
  -m FILE --port 8093 -c 512 -t 2 -fa off -ctk f32 -ctv f32 --no-warmup -np 1
asking POST /tokenize for the prompt (BOS added) and POST /completion for 32 tokens at temperature 0.
Columns: arch/dtype, llama.cpp's prompt ids, its 32 greedy ids (space-separated).
"""
import json, os, subprocess, sys, tempfile, time, urllib.request

steward = sys.argv[1]
peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../shared/peers/llama-bench.sh")
peer = os.environ.get("PEER_SCRIPT", peer)
text = "the quick brown fox jumps over the lazy dog and the cat"  # 28 tokens: past the window of 8
shapes = {
    "gemma2": ["--layers", "4", "--sliding-window", "8", "--attn-softcap", "5", "--final-softcap", "3"],
    "gemma3": ["--layers", "6", "--sliding-window", "8"],
}


def post(path, body):
    req = urllib.request.Request("http://127.0.0.1:8093" + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=120).read())


with tempfile.TemporaryDirectory() as tmp:
    for arch, dtype in [(a, d) for a in ["gemma2", "gemma3"] for d in ["f32", "f16", "q8_0"]]:
        path = os.path.join(tmp, arch + "-" + dtype + ".gguf")
        subprocess.run([steward, "model", "synth", "--arch", arch, "-o", path, "--dim", "256", "--heads", "4",
                        "--kv-heads", "2", "--ffn", "512", "--vocab", "1024", "--ctx", "512", "--seed", "7",
                        "--dtype", dtype] + shapes[arch], check=True, stdout=subprocess.DEVNULL)
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
            assert len(ids) == 32, (dtype, ids)
            print(arch + "/" + dtype + "\t" + " ".join(map(str, prompt)) + "\t" + " ".join(map(str, ids)))
        finally:
            srv.terminate()
            srv.wait()
