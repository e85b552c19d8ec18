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
import os, subprocess, sys, tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from llama_server import llama_server  # noqa: E402

steward = sys.argv[1]
text = "the quick brown fox jumps over the lazy dog and the cat"  # 28 tokens: past the window of 8
shapes = {
    "gemma2": ["--layers", "4", "--sliding-window", "8", "--attn-softcap", "5", "--final-softcap", "3"],
    "gemma3": ["--layers", "6", "--sliding-window", "8"],
}


with tempfile.TemporaryDirectory() as tmp:
    for arch, dtype in [(a, d) for a in ["gemma2", "gemma3"] for d in ["f32", "f16", "q8_0"]]:
        path = os.path.join(tmp, arch + "-" + dtype + ".gguf")
        subprocess.run([steward, "model", "synth", "--arch", arch, "-o", path, "--dim", "256", "--heads", "4",
                        "--kv-heads", "2", "--ffn", "512", "--vocab", "1024", "--ctx", "512", "--seed", "7",
                        "--dtype", dtype] + shapes[arch], check=True, stdout=subprocess.DEVNULL)
        with llama_server(path, 8093, 512) as srv:
            prompt = srv.tokenize(text)
            ids = srv.greedy(prompt, 32)
            print(arch + "/" + dtype + "\t" + " ".join(map(str, prompt)) + "\t" + " ".join(map(str, ids)))
