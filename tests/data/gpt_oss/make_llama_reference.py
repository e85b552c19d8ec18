#!/usr/bin/env python3
"""Writes llama_greedy.tsv: llama.cpp's tokenization and 32 greedy ids for synthetic gpt-oss files, the
independent reference tests/unit/cpu/test_gpt_oss.cpp checks Steward's gpt-oss forward against.

  python3 tests/data/gpt_oss/make_llama_reference.py ./build/steward > tests/data/gpt_oss/llama_greedy.tsv

Per dtype (f32, f16, mxfp4_moe) it writes the file the test writes in memory:
  steward model synth --arch gpt-oss --dim 256 --layers 4 --heads 4 --kv-heads 2 --head-dim 64 --ffn 256
      --expert-ffn 128 --experts 8 --experts-used 4 --vocab 1024 --ctx 512 --seed 11 --sliding-window 8
      --dtype DTYPE
(YaRN factor 32 over 4096 tokens and RoPE base 150000, as the released models) and runs
../shared/peers/llama-bench.sh with PEER_TOOL=llama-server on it:
  -m FILE --port 8093 -c 512 -t 2 -fa off -ctk f32 -ctv f32 --no-warmup -np 1
asking POST /tokenize for the prompt (BOS added) and POST /completion for 32 tokens at temperature 0.
Columns: arch/dtype, llama.cpp's prompt ids, its 32 greedy ids (space-separated).

It also quantizes the F32 file with llama.cpp's own tool (PEER_TOOL=llama-quantize ... MXFP4_MOE) and
checks that every tensor of that file has the type and the bytes of Steward's mxfp4_moe file (so the
MXFP4 row is llama-quantize's file too); it stops with an error otherwise.
"""
import os, struct, subprocess, sys, tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, ".."))
from llama_server import llama_server  # noqa: E402

steward = sys.argv[1]
peer = os.path.join(here, "..", "..", "..", "..", "shared", "peers", "llama-bench.sh")
text = "the quick brown fox jumps over the lazy dog and the cat"
shape = ["--dim", "256", "--layers", "4", "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--ffn", "256",
         "--expert-ffn", "128", "--experts", "8", "--experts-used", "4", "--vocab", "1024", "--ctx", "512",
         "--seed", "11", "--sliding-window", "8"]


def gguf_tensors(path):
    """{name: (type id, data bytes)} of a GGUF file (the types these files hold: F32, F16, Q8_0, MXFP4)."""
    data = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = data[pos:pos + n].decode()
        pos += n
        return s

    sizes = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(sizes[t])

    assert data[:4] == b"GGUF"
    pos = 4
    take("I")
    n_tensors, n_kv = take("Q"), take("Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        ne = [take("Q") for _ in range(take("I"))]
        infos.append((name, ne, take("I"), take("Q")))
    align = meta.get("general.alignment", 32)
    base = (pos + align - 1) // align * align
    block = {0: (1, 4), 1: (1, 2), 8: (32, 34), 39: (32, 17)}
    out = {}
    for name, ne, t, off in infos:
        n = 1
        for d in ne:
            n *= d
        be, bb = block[t]
        out[name] = (t, data[base + off:base + off + n // be * bb])
    return out


with tempfile.TemporaryDirectory() as tmp:
    paths = {}
    for dtype in ["f32", "f16", "mxfp4_moe"]:
        paths[dtype] = os.path.join(tmp, "gpt-oss-" + dtype + ".gguf")
        subprocess.run([steward, "model", "synth", "--arch", "gpt-oss", "-o", paths[dtype], "--dtype", dtype] + shape,
                       check=True, stdout=subprocess.DEVNULL)
    lq = os.path.join(tmp, "gpt-oss-llama-quantize.gguf")
    subprocess.run(["bash", peer, paths["f32"], lq, "MXFP4_MOE"], env=dict(os.environ, PEER_TOOL="llama-quantize"),
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ours, theirs = gguf_tensors(paths["mxfp4_moe"]), gguf_tensors(lq)
    if ours.keys() != theirs.keys() or any(ours[n] != theirs[n] for n in ours):
        bad = sorted(n for n in ours if ours[n] != theirs.get(n))
        sys.exit("llama-quantize MXFP4_MOE differs from steward's mxfp4_moe in " + ", ".join(bad[:8]))
    print("llama-quantize MXFP4_MOE: all %d tensors equal steward's mxfp4_moe file (types and bytes)" % len(ours),
          file=sys.stderr)
    for dtype, path in paths.items():
        with llama_server(path, 8093, 512) as srv:
            prompt = srv.tokenize(text)
            ids = srv.greedy(prompt, 32)
            print("gpt-oss/" + dtype + "\t" + " ".join(map(str, prompt)) + "\t" + " ".join(map(str, ids)))
