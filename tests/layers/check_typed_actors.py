#!/usr/bin/env python3
"""Every actor's interface is typed: a message an actor does not take fails to compile at the sender.

Asked of the compiler: with the compile command of actors/request_actor.cpp (compile_commands.json),
  * a probe that sends each interface (actors/messages.hpp) messages it takes compiles, so the probe
    is not vacuous and the interfaces are what the actors use;
  * a probe of wrong messages (a wrong payload, a wrong atom, an untyped handle where a typed one
    is due) does not, and the compiler names every one of its wrong lines.
Usage: check_typed_actors.py <build dir> <source dir>
"""
import json, os, re, subprocess, sys, tempfile

from compile_flags import probe_command

build, source = sys.argv[1], sys.argv[2]

HEADER = """#include "actors/messages.hpp"
using namespace steward;
"""

GOOD = HEADER + """
void good(RequestActor r, ExecutorActor e, KvAllocatorActor k, TimerActor t, PoolMonitorActor m, RelayActor rl,
          CacheActor c, RouterActor ro) {
    caf::anon_send(r, event_atom::value, EngineEvent{});
    caf::anon_send(r, admit_atom::value, AdmitAnswer{});
    caf::anon_send(r, deadline_atom::value, uint64_t{1});
    caf::anon_send(r, lost_atom::value, uint64_t{1}, std::string("why"));
    caf::anon_send(r, cancel_atom::value);
    caf::anon_send(r, req_deadline_atom::value);
    caf::anon_send(e, submit_atom::value, EngineRequest{});
    caf::anon_send(e, cancel_atom::value, uint64_t{1});
    caf::anon_send(k, release_atom::value, uint64_t{1});
    caf::anon_send(t, timer_add_atom::value, uint64_t{1}, 0.5, r, int32_t{0}, uint64_t{0});
    caf::anon_send(m, watch_atom::value, r);
    caf::anon_send(rl, relay_atom::value, StepOutput{});
    caf::anon_send(c, kv_drop_atom::value, uint64_t{1});
    (void)ro;
}
"""

# Each wrong send on a line of its own, marked with the comment the check looks for.
BAD_LINES = [
    "caf::anon_send(r, event_atom::value, RunFigures{});  // WRONG: a run reports an EngineEvent",
    "caf::anon_send(r, submit_atom::value, EngineRequest{});  // WRONG: a request takes no runs",
    "caf::anon_send(r, lost_atom::value, uint64_t{1});  // WRONG: a loss names why",
    "caf::anon_send(e, submit_atom::value, EngineEvent{});  // WRONG: an executor runs EngineRequests",
    "caf::anon_send(e, event_atom::value, EngineEvent{});  // WRONG: an executor takes no events",
    "caf::anon_send(t, timer_add_atom::value, uint64_t{1}, 0.5, a, int32_t{0}, uint64_t{0});  // WRONG: an untyped target",
    "caf::anon_send(m, watch_atom::value, a);  // WRONG: only a request actor watches a pool",
    "caf::anon_send(rl, relay_atom::value, EngineEvent{});  // WRONG: the relay takes a step's output",
    "caf::anon_send(k, admit_atom::value, AdmitAnswer{});  // WRONG: an allocator takes AdmitRequests",
]
BAD = HEADER + """
void bad(RequestActor r, ExecutorActor e, KvAllocatorActor k, TimerActor t, PoolMonitorActor m, RelayActor rl, caf::actor a) {
""" + "".join(f"    {l}\n" for l in BAD_LINES) + "}\n"

commands = json.load(open(os.path.join(build, "compile_commands.json")))
cmd = next((c for c in commands if c["file"].endswith("actors/request_actor.cpp")), None)
if cmd is None:
    print("FAIL: actors/request_actor.cpp is not in compile_commands.json")
    sys.exit(1)
flags = probe_command(cmd, drop_sanitizers=True)

failures = []
with tempfile.TemporaryDirectory() as tmp:
    def compile_probe(name, text):
        path = os.path.join(tmp, name)
        open(path, "w").write(text)
        return path, subprocess.run(flags + ["-fsyntax-only", "-fmax-errors=0", path], cwd=cmd["directory"],
                                    capture_output=True, text=True)

    _, good = compile_probe("good.cpp", GOOD)
    if good.returncode != 0:
        failures.append("the probe of messages the actors take does not compile:\n" + good.stderr[-3000:])
    bad_path, bad = compile_probe("bad.cpp", BAD)
    if bad.returncode == 0:
        failures.append("the probe of wrong messages compiled")
    bad_text = BAD.splitlines()
    named = set(int(n) for n in re.findall(re.escape(bad_path) + r":(\d+):\d+:", bad.stderr))
    for i, line in enumerate(bad_text, 1):
        if "// WRONG" in line:
            ok = i in named
            print(f"{'refused' if ok else 'ACCEPTED'}: {line.strip()}")
            if not ok:
                failures.append(f"the compiler did not refuse line {i}: {line.strip()}")

if failures:
    print("\n".join("FAIL: " + f for f in failures))
    sys.exit(1)
print(f"typed actors hold: {len(BAD_LINES)} wrong messages refused at compile time, the right ones compile")
