#!/usr/bin/env python3
"""Writes llama_greedy.tsv: llama.cpp's tokenization and 32 greedy ids for synthetic llama files with
RoPE scaling, the independent reference tests/unit/cpu/test_rope_scaling.cpp checks Steward against.

  python3 tests/data/rope_scaling/make_llama_reference.py ./build/steward > tests/data/rope_scaling/llama_greedy.tsv

Per variant it writes the file the test writes in memory:
  steward model synth --arch llama --dim 256 --layers 2 --heads 8 --kv-heads 2 --ffn 512 --vocab 1024
      --ctx 512 --seed 31 [variant flags]
with the variants none (no scaling), freqs8 (--rope-freqs-ramp 8: a rope_freqs.weight tensor as
Llama 3.1 files carry), linear4 (--rope-scale 4: rope.scaling.type linear, factor 4) and both
(--rope-freqs-ramp 8 --rope-scale 2) and yarn4 (--yarn 4 --yarn-orig-ctx 64: rope.scaling.type yarn,
factor 4, original context 64), and runs ../shared/peers/llama-bench.sh with
PEER_TOOL=llama-server on it:
  -m FILE --port 8093 -c 512 -t 2 -fa off -ctk f32 -ctv f32 --no-warmup -np 1
asking POST /tokenize for the prompt (BOS added) and POST /completion for 32 tokens at temperature 0.
Columns: variant, llama.cpp's prompt ids, its 32 greedy ids (space-separated).
"""
import os, subprocess, sys, tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from llama_server import llama_server  # noqa: E402

steward = sys.argv[1]
text = "the quick brown fox jumps over the lazy dog"
variants = {"none": [], "freqs8": ["--rope-freqs-ramp", "8"], "linear4": ["--rope-scale", "4"],
            "both": ["--rope-freqs-ramp", "8", "--rope-scale", "2"], "yarn4": ["--yarn", "4", "--yarn-orig-ctx", "64"]}


with tempfile.TemporaryDirectory() as tmp:
    for name, flags in variants.items():
        path = os.path.join(tmp, name + ".gguf")
        subprocess.run([steward, "model", "synth", "--arch", "llama", "-o", path, "--dim", "256", "--layers", "2",
                        "--heads", "8", "--kv-heads", "2", "--ffn", "512", "--vocab", "1024", "--ctx", "512",
                        "--seed", "31"] + flags, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with llama_server(path, 8093, 512) as srv:
            prompt = srv.tokenize(text)
            ids = srv.greedy(prompt, 32)
            print(name + "\t" + " ".join(map(str, prompt)) + "\t" + " ".join(map(str, ids)))
