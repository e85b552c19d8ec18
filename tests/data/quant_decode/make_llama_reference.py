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
import glob, json, os, subprocess, sys, time, urllib.request

testdata = sys.argv[1]
peer = os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../../shared/peers/llama-bench.sh")
peer = os.environ.get("PEER_SCRIPT", peer)
for path in sorted(glob.glob(os.path.join(testdata, "*.gguf"))):
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
        body = json.dumps({"prompt": [1], "n_predict": 32, "temperature": 0, "top_k": 1, "samplers": ["top_k"],
                           "ignore_eos": True, "return_tokens": True, "cache_prompt": False}).encode()
        req = urllib.request.Request("http://127.0.0.1:8093/completion", body, {"Content-Type": "application/json"})
        ids = json.loads(urllib.request.urlopen(req, timeout=120).read())["tokens"]
        assert len(ids) == 32, (path, ids)
        print(os.path.basename(path) + "\t" + " ".join(str(i) for i in ids))
    finally:
        srv.terminate()
        srv.wait()
