#!/usr/bin/env python3
"""Writes llama_bos_greedy.tsv: llama.cpp's greedy ids from BOS alone for llama-quantize's files
(../shared/testdata/quant), the independent reference tests/unit/cpu/test_quant_models.cpp checks
Steward's decode path against (every step a one-token forward: no prefill GEMM on either side).

  python3 tests/data/quant_decode/make_llama_reference.py ../shared/testdata/quant > tests/data/quant_decode/llama_bos_greedy.tsv

Per file, runs ../shared/peers/llama-bench.sh with PEER_TOOL=llama-server:
  -m FILE --port 8093 -c 512 -t 2 -fa off -ctk f32 -ctv f32 --no-warmup -np 1
and asks POST /completion {"prompt": [1], "n_predict": 32, "temperature": 0, "top_k": 1,
"samplers": ["top_k"], "ignore_eos": true, "return_tokens": true, "cache_prompt": false}.
Columns: file name, the 32 generated ids (space-separated).
"""
import glob, os, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from llama_server import llama_server  # noqa: E402

testdata = sys.argv[1]
for path in sorted(glob.glob(os.path.join(testdata, "*.gguf"))):
    with llama_server(path, 8093, 512) as srv:
        ids = srv.greedy([1], 32)
        print(os.path.basename(path) + "\t" + " ".join(str(i) for i in ids))
