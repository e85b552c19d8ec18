#!/usr/bin/env python3
"""Writes llama_greedy.tsv: llama.cpp's tokenization and 32 greedy ids for synthetic mixtures of experts
(qwen3moe, and Mixtral: llama with experts), the independent reference tests/unit/cpu/test_moe.cpp
checks Steward's MoE forward against.

  python3 tests/data/moe/make_llama_reference.py ./build/steward > tests/data/moe/llama_greedy.tsv

Per architecture and dtype (f32, f16, q8_0) it writes the file the test writes in memory:
  steward model synth --arch qwen3moe --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 512 --expert-ffn 128
      --experts 8 --experts-used 2 --vocab 1024 --ctx 512 --seed 11 --dtype DTYPE
  steward model synth --arch mixtral --dim 256 --layers 2 --heads 4 --kv-heads 2 --ffn 256
      --experts 4 --experts-used 2 --vocab 1024 --ctx 512 --seed 11 --dtype DTYPE
and runs ../shared/peers/llama-bench.sh with PEER_TOOL=llama-server on it:
  -m FILE --port 8093 -c 512 -t 2 -fa off -ctk f32 -ctv f32 --no-warmup -np 1
asking POST /tokenize for the prompt (BOS added) and POST /completion for 32 tokens at temperature 0.
Columns: arch/dtype, llama.cpp's prompt ids, its 32 greedy ids (space-separated).
"""
import os, subprocess, sys, tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from llama_server import llama_server  # noqa: E402

steward = sys.argv[1]
text = "the quick brown fox jumps over the lazy dog and the cat"
shapes = {
    "qwen3moe": ["--ffn", "512", "--expert-ffn", "128", "--experts", "8", "--experts-used", "2"],
    "mixtral": ["--ffn", "256", "--experts", "4", "--experts-used", "2"],
}


with tempfile.TemporaryDirectory() as tmp:
    for arch, dtype in [(a, d) for a in ["qwen3moe", "mixtral"] for d in ["f32", "f16", "q8_0"]]:
        path = os.path.join(tmp, arch + "-" + dtype + ".gguf")
        subprocess.run([steward, "model", "synth", "--arch", arch, "-o", path, "--dim", "256", "--layers", "2",
                        "--heads", "4", "--kv-heads", "2", "--vocab", "1024", "--ctx", "512", "--seed", "11",
                        "--dtype", dtype] + shapes[arch], check=True, stdout=subprocess.DEVNULL)
        with llama_server(path, 8093, 512) as srv:
            prompt = srv.tokenize(text)
            ids = srv.greedy(prompt, 32)
            print(arch + "/" + dtype + "\t" + " ".join(map(str, prompt)) + "\t" + " ".join(map(str, ids)))
