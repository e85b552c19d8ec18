#!/usr/bin/env python3
"""Writes llama_embedding.tsv: llama.cpp's llama-embedding vectors for the real test models, the
independent reference tests/unit/cpu/test_embed.cpp checks Steward's embeddings against.

  python3 tests/data/embeddings/make_llama_reference.py ../shared/testdata/real > tests/data/embeddings/llama_embedding.tsv

Runs ../shared/peers/llama-bench.sh with PEER_TOOL=llama-embedding, per model and pooling:
  -m MODEL -p "<prompts, one a line>" --pooling P --embd-normalize 2 --embd-output-format array
  --verbose-prompt -ctk f32 -ctv f32 -fa off -t 1
Columns: model file, pooling, prompt, llama.cpp's token ids (BOS added), the unit vector (%.7f as
llama-embedding prints it).
"""
import json, os, re, subprocess, sys

testdata = sys.argv[1]
peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../shared/peers/llama-bench.sh")
peer = os.environ.get("PEER_SCRIPT", peer)
models = ["TinyStories-656K.f32.gguf", "stories260K.f32.gguf"]
prompts = [
    "Once upon a time",
    "The little bird was sad because",
    "Lily and Ben went to the park. They saw a big dog with a red ball. The dog ran to them and",
    "One day, a little girl named Sue found a shiny stone in the garden. She wanted to show it to her mom, "
    "so she ran inside the house as fast as she could. Her mom smiled and said it was the most beautiful "
    "stone she had ever seen, and they put it on the window where the sun could make it shine.",
]
for model in models:
    for pooling in ["mean", "last", "cls"]:
        cmd = ["bash", peer, "-m", os.path.join(testdata, model), "-p", "\n".join(prompts), "--pooling", pooling,
               "--embd-normalize", "2", "--embd-output-format", "array", "--verbose-prompt",
               "-ctk", "f32", "-ctv", "f32", "-fa", "off", "-t", "1"]
        out = subprocess.run(cmd, env=dict(os.environ, PEER_TOOL="llama-embedding"), capture_output=True,
                             text=True, check=True).stdout
        arr = out[out.index("[["):]
        vecs = json.loads(arr)
        # --verbose-prompt: per prompt, lines "<id> -> '<piece>'", prompts separated by blank lines.
        ids, cur = [], []
        for line in out[:out.index("[[")].splitlines():
            m = re.match(r"^\s*(\d+) -> '", line)
            if m:
                cur.append(int(m.group(1)))
            elif cur:
                ids.append(cur)
                cur = []
        if cur:
            ids.append(cur)
        assert len(vecs) == len(prompts) == len(ids), (model, pooling, len(vecs), len(ids))
        for p, t, v in zip(prompts, ids, vecs):
            print("\t".join([model, pooling, p, " ".join(map(str, t)), " ".join("%.7f" % x for x in v)]))
