#!/usr/bin/env python3
"""Writes llama_greedy.tsv: llama.cpp's tokenization and 32 greedy ids for synthetic phi3 files, the
independent reference tests/unit/cpu/test_phi3.cpp checks Steward's phi3 forward against.

  python3 tests/data/phi3/make_llama_reference.py ./build/steward > tests/data/phi3/llama_greedy.tsv

Per dtype (f32, f16, q8_0) it writes the file the test writes in memory:
  steward model synth --arch phi3 --dim 256 --layers 2 --heads 8 --kv-heads 2 --ffn 512 --vocab 1024
      --ctx 512 --seed 31 --dtype DTYPE
and two F32 LongRoPE files, longrope256 and longrope1024 (--ctx 2048 --longrope-orig-ctx 256 / 1024:
served at 512 tokens, llama.cpp picks the long factors for the first and the short ones for the second),
and runs ../shared/peers/llama-bench.sh with PEER_TOOL=llama-server on it:
  -m FILE --port 8093 -c 512 -t 2 -fa off -ctk f32 -ctv f32 --no-warmup -np 1
asking POST /tokenize for the prompt (BOS added) and POST /completion for 32 tokens at temperature 0.
Columns: file, llama.cpp's prompt ids, its 32 greedy ids (space-separated).
"""
import os, subprocess, sys, tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from llama_server import llama_server  # noqa: E402

steward = sys.argv[1]
text = "the quick brown fox jumps over the lazy dog"


files = {"f32": ["--ctx", "512", "--dtype", "f32"], "f16": ["--ctx", "512", "--dtype", "f16"],
         "q8_0": ["--ctx", "512", "--dtype", "q8_0"],
         "longrope256": ["--ctx", "2048", "--longrope-orig-ctx", "256"],
         "longrope1024": ["--ctx", "2048", "--longrope-orig-ctx", "1024"]}


with tempfile.TemporaryDirectory() as tmp:
    for name, flags in files.items():
        path = os.path.join(tmp, "phi3-" + name + ".gguf")
        subprocess.run([steward, "model", "synth", "--arch", "phi3", "-o", path, "--dim", "256", "--layers", "2",
                        "--heads", "8", "--kv-heads", "2", "--ffn", "512", "--vocab", "1024",
                        "--seed", "31"] + flags, check=True, stdout=subprocess.DEVNULL)
        with llama_server(path, 8093, 512) as srv:
            prompt = srv.tokenize(text)
            ids = srv.greedy(prompt, 32)
            print(name + "\t" + " ".join(map(str, prompt)) + "\t" + " ".join(map(str, ids)))
