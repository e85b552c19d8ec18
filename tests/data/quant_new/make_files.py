#!/usr/bin/env python3
"""Writes the llama-quantize files of tests/data/quant_new and llama.cpp's greedy ids on them: a shape
and seed other than ../shared/testdata/quant's, for tests/unit/cpu/test_quant_models.cpp.

  python3 tests/data/quant_new/make_files.py ./build/steward > tests/data/quant_new/llama_greedy.tsv

1. `steward model synth --dim 256 --layers 1 --heads 4 --kv-heads 1 --ffn 256 --vocab 512 --ctx 256
   --seed 99` writes the F32 file (not kept);
2. ../shared/peers/llama-bench.sh with PEER_TOOL=llama-quantize quantizes it into the 13 types of the
   shared quant set: new-<TYPE>.gguf here;
3. per file, PEER_TOOL=llama-server (-c 256 -t 2 -fa off -ctk f32 -ctv f32 --no-warmup -np 1) tokenizes
   "the quick brown fox jumps over the lazy dog" (BOS added) and returns 16 greedy ids at temperature 0.
Columns: file name, llama.cpp's prompt ids, its greedy ids (space-separated).
"""
import os, subprocess, sys, tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from llama_server import PEER, llama_server  # noqa: E402

steward = sys.argv[1]
here = os.path.dirname(os.path.abspath(__file__))
types = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_S", "Q4_K_M", "Q5_K_M", "Q6_K",
         "IQ4_NL", "IQ4_XS"]
text = "the quick brown fox jumps over the lazy dog"


with tempfile.TemporaryDirectory() as tmp:
    base = os.path.join(tmp, "new-F32.gguf")
    subprocess.run([steward, "model", "synth", "-o", base, "--dim", "256", "--layers", "1", "--heads", "4",
                    "--kv-heads", "1", "--ffn", "256", "--vocab", "512", "--ctx", "256", "--seed", "99"], check=True,
                   stdout=subprocess.DEVNULL)
    for t in types:
        out = os.path.join(here, "new-" + t + ".gguf")
        subprocess.run(["bash", PEER, base, out, t], env=dict(os.environ, PEER_TOOL="llama-quantize"), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with llama_server(out, 8094, 256) as srv:
            prompt = srv.tokenize(text)
            ids = srv.greedy(prompt, 16)
            print("new-" + t + ".gguf\t" + " ".join(map(str, prompt)) + "\t" + " ".join(map(str, ids)))
