#!/usr/bin/env python3
"""Writes llama_embeddings.tsv: llama.cpp's tokens and embeddings for synthetic encoder files (bert,
nomic-bert), the independent reference tests/unit/cpu/test_encoder.cpp checks Steward against.

  python3 tests/data/encoders/make_llama_reference.py ./build/steward > tests/data/encoders/llama_embeddings.tsv

Per architecture and dtype (f32, f16, q8_0) it writes the file the test writes in memory:
  steward model synth --arch ARCH --dim 128 --layers 2 --heads 4 --kv-heads 4 --ffn FFN --vocab 1024
      --ctx 512 --seed 41 --dtype DTYPE          (FFN: 512 for bert, 384 for nomic-bert)
and runs ../shared/peers/llama-bench.sh with PEER_TOOL=llama-embedding on it:
  -m FILE -t 2 --embd-normalize 2 --embd-output-format raw --verbose-prompt -p TEXTS --embd-separator '|'
(the model's own pooling: CLS for the bert file, mean for nomic-bert). Columns: arch, dtype, text
index, llama.cpp's token ids (space-separated), its unit-length embedding (space-separated).
"""
import os, re, subprocess, sys, tempfile

steward = sys.argv[1]
peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../shared/peers/llama-bench.sh")
peer = os.environ.get("PEER_SCRIPT", peer)
texts = [
    "Héllo, WORLD! the unknownish cats.",
    "the little story of a cat",
    "query: what does the model cache?",
    " ".join(["once upon a day the happy friend said the answer to the question of the story"] * 6),
]

with tempfile.TemporaryDirectory() as tmp:
    for arch, ffn in [("bert", "512"), ("nomic-bert", "384")]:
        for dtype in ["f32", "f16", "q8_0"]:
            path = os.path.join(tmp, arch + "-" + dtype + ".gguf")
            subprocess.run([steward, "model", "synth", "--arch", arch, "-o", path, "--dim", "128", "--layers", "2",
                            "--heads", "4", "--kv-heads", "4", "--ffn", ffn, "--vocab", "1024", "--ctx", "512",
                            "--seed", "41", "--dtype", dtype], check=True, stdout=subprocess.DEVNULL)
            r = subprocess.run(["bash", peer, "-m", path, "-t", "2", "--embd-normalize", "2", "--embd-output-format",
                                "raw", "--verbose-prompt", "-p", "|".join(texts), "--embd-separator", "|"],
                               env=dict(os.environ, PEER_TOOL="llama-embedding"), capture_output=True, text=True,
                               check=True)
            counts = [int(n) for n in re.findall(r"number of tokens in prompt = (\d+)", r.stderr)]
            assert len(counts) == len(texts), r.stderr[-2000:]
            ids = [int(m) for m in re.findall(r"^\s*(\d+) -> '", r.stdout, re.M)]
            assert len(ids) == sum(counts), (len(ids), counts)
            rows = [ln.split() for ln in r.stdout.splitlines() if len(ln.split()) == 128]
            assert len(rows) == len(texts), len(rows)
            k = 0
            for i, n in enumerate(counts):
                vec = [float(x) for x in rows[i]]
                print("\t".join([arch, dtype, str(i), " ".join(map(str, ids[k:k + n])),
                                 " ".join("%.7f" % x for x in vec)]))
                k += n
