#!/usr/bin/env python3
"""The layers hold: asked of the compiler, not of the build files.

For every layer target (one static library per folder, cmake/StewardLayers.cmake) this takes the
compile command of one of its own sources from compile_commands.json and preprocesses a probe with
it: `__has_include("<folder>/<header>")` for one header of every folder. What a layer can see is
then what its real compile sees. Checked:
  * every layer sees its own folder (the probe is not vacuous);
  * the relation "sees" between folders has no cycle, so no folder can include one that can include
    it back: an include that runs upward does not compile;
  * the includes written in the sources, folder to folder, have no cycle either;
  * pairs a reader would name: kv cannot see pool, model cannot see kv, cpu cannot see sched,
    sched cannot see pool, pool cannot see actors, actors cannot see api, cpu and gpu cannot see
    backend, backend cannot see sched.
Usage: check_layers.py <build dir> <source dir>
"""
import json, os, re, subprocess, sys, tempfile

from compile_flags import probe_command

build, source = sys.argv[1], sys.argv[2]
FOLDERS = {f: f"runtime/{f}" for f in os.listdir(os.path.join(source, "runtime"))
           if os.path.isdir(os.path.join(source, "runtime", f))}
FOLDERS["actors"] = "actors"
FOLDERS["gpu"] = "gpu"

def one_header(folder):
    d = os.path.join(source, FOLDERS[folder])
    hs = sorted(h for h in os.listdir(d) if h.endswith((".h", ".hpp")))
    return hs[0] if hs else None

probe_lines = []
for f in sorted(FOLDERS):
    h = one_header(f)
    if h:
        leaf = os.path.basename(FOLDERS[f])
        probe_lines.append(f'#if __has_include("{leaf}/{h}")\nsees {f}\n#endif')
probe = "\n".join(probe_lines) + "\n"

commands = json.load(open(os.path.join(build, "compile_commands.json")))
# A layer target is steward_<name>; its folder is <name>'s, but for steward_http (runtime/serve's
# transport). libsteward.so (steward_lib) is no layer: it is made of them all.
by_target = {}
for c in commands:
    m = re.search(r"CMakeFiles/steward_([a-z_]+)\.dir/", c.get("output", "") or c["command"])
    if not m or not c["file"].endswith(".cpp") or m.group(1) in ("lib", "unit_tests", "integration_tests", "gpu_tests"):
        continue
    name = m.group(1)
    rel = os.path.relpath(c["file"], source)
    folder = rel.split("/")[1] if rel.startswith("runtime/") else rel.split("/")[0]
    if folder not in FOLDERS or name in by_target:
        continue
    by_target[name] = (folder, c)

failures = []
sees = {}
with tempfile.TemporaryDirectory() as tmp:
    probe_path = os.path.join(tmp, "probe.cpp")
    open(probe_path, "w").write(probe)
    for name, (folder, c) in sorted(by_target.items()):
        out = probe_command(c)
        r = subprocess.run(out + ["-E", "-P", probe_path], cwd=c["directory"], capture_output=True, text=True)
        if r.returncode != 0:
            failures.append(f"steward_{name}: probe did not preprocess: {r.stderr[:300]}")
            continue
        seen = set(re.findall(r"^sees (\S+)$", r.stdout, re.M))
        sees[name] = seen
        if folder not in seen:
            failures.append(f"steward_{name} does not see its own folder {folder}/: the probe is wrong")

def cycles(graph):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))
    for v in list(graph):
        if v not in index:
            visit(v)
    return out

# Layer A -> layer B when A's compile can include B's folder.
folder_of = {n: f for n, (f, _) in by_target.items()}
seen_graph = {a: {b for b in sees if folder_of[b] != folder_of[a] and folder_of[b] in s} for a, s in sees.items()}
for c in cycles(seen_graph):
    failures.append(f"folders that can include each other (a cycle of include views): {c}")

written = {}
for f, d in FOLDERS.items():
    for dp, _, files in os.walk(os.path.join(source, d)):
        for name in files:
            if not name.endswith((".cpp", ".h", ".hpp", ".cu", ".inc")):
                continue
            for line in open(os.path.join(dp, name), errors="ignore"):
                m = re.match(r'\s*#\s*include\s*"([a-z_]+)/', line)
                if m and m.group(1) in FOLDERS and m.group(1) != f:
                    written.setdefault(f, set()).add(m.group(1))
for c in cycles(written):
    failures.append(f"folders whose sources include each other: {c}")

for low_, high in [("kv", "pool"), ("model", "kv"), ("cpu", "sched"), ("sched", "pool"),
                   ("pool", "actors"), ("actors", "api"), ("util", "model"), ("cpu", "backend"),
                   ("gpu", "backend"), ("backend", "sched")]:
    if low_ in sees and high in sees[low_]:
        failures.append(f"{low_}/ can include {high}/ (it must not)")

for n in sorted(sees):
    print(f"{n:9s} sees {' '.join(sorted(f for f in sees[n] if f != folder_of[n])) or '-'}")
print(f"{len(by_target)} layer targets probed; folder include edges written: {sum(len(v) for v in written.values())}")
if len(by_target) < 15:
    failures.append(f"only {len(by_target)} layer targets found in compile_commands.json")
if failures:
    print("\n".join("FAIL: " + f for f in failures))
    sys.exit(1)
print("layers hold: no folder can include upward; 0 folder cycles")
