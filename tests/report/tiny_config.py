"""The tests' config: test_tiny.toml's pool with its model in WORKDIR, room for a whole run's
prefixes (no eviction: the figures are the workload's, not the cache size's) and a context for the
generated prompts. Shared by the steward-run tests in this folder."""
import os
import re


def write_tiny_config(tiny, workdir, name, buckets=None, server_port=None):
    """Writes WORKDIR/NAME and returns its path. buckets: names of hint-matched buckets replacing
    test_tiny's (a "default" bucket is added last); server_port: a [server] table on loopback."""
    with open(tiny) as f:
        cfg = f.read()
    cfg = re.sub(r'model = "[^"]*"', f'model = "{os.path.join(os.path.abspath(workdir), "tiny.gguf")}"', cfg)
    cfg = cfg.replace("kv_blocks = 64", "kv_blocks = 1024").replace("max_batch_tokens = 64", "max_batch_tokens = 256")
    cfg = cfg.replace("ctx = 512", "ctx = 2048")
    if buckets is not None:
        cfg = cfg[: cfg.index("[[bucket]]")]
        for b in buckets:
            cfg += f'\n[[bucket]]\nname = "{b}"\npool = "tiny"\n[bucket.match]\nhint = "{b}"\n'
        cfg += '\n[[bucket]]\nname = "default"\npool = "tiny"\n'
    if server_port is not None:
        cfg += f'\n[server]\nhost = "127.0.0.1"\nport = {server_port}\n\n[reload]\nwatch = false\n'
    path = os.path.join(workdir, name)
    with open(path, "w") as f:
        f.write(cfg)
    return path
