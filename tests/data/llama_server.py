"""llama.cpp's llama-server as the make_llama_reference scripts under tests/data ask it: started on one
GGUF through ../shared/peers/llama-bench.sh (PEER_SCRIPT overrides the path) with
  -m FILE --port PORT -c CTX -t 2 -fa off -ctk f32 -ctv f32 --no-warmup -np 1
polled until /health answers, and stopped on leaving the `with` block. greedy() asks /completion for
n tokens at temperature 0 (top-k 1, end-of-generation ignored, no prompt cache)."""
import contextlib, json, os, subprocess, time, urllib.request

PEER = os.environ.get("PEER_SCRIPT",
                      os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../shared/peers/llama-bench.sh"))


class Server:
    def __init__(self, port):
        self.port = port

    def post(self, path, body):
        req = urllib.request.Request("http://127.0.0.1:%d%s" % (self.port, path), json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(req, timeout=120).read())

    def tokenize(self, text):
        return self.post("/tokenize", {"content": text, "add_special": True})["tokens"]

    def greedy(self, prompt, n):
        ids = self.post("/completion", {"prompt": prompt, "n_predict": n, "temperature": 0, "top_k": 1,
                                        "samplers": ["top_k"], "ignore_eos": True, "return_tokens": True,
                                        "cache_prompt": False})["tokens"]
        assert len(ids) == n, ids
        return ids


@contextlib.contextmanager
def llama_server(path, port=8093, ctx=512):
    srv = subprocess.Popen(["bash", PEER, "-m", path, "--port", str(port), "-c", str(ctx), "-t", "2", "-fa", "off",
                            "-ctk", "f32", "-ctv", "f32", "--no-warmup", "-np", "1"],
                           env=dict(os.environ, PEER_TOOL="llama-server"), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen("http://127.0.0.1:%d/health" % port, timeout=1).read()
                break
            except Exception:
                time.sleep(0.2)
        yield Server(port)
    finally:
        srv.terminate()
        srv.wait()
