"""One source's compile command from compile_commands.json, as a command to compile something else
with the same flags: the compiler and its options, without the output, dependency-file and source
arguments (and ccache). With drop_sanitizers, without -fsanitize / -flto options either."""
import os, shlex


def probe_command(entry, drop_sanitizers=False):
    args = shlex.split(entry["command"])
    if os.path.basename(args[0]) == "ccache":
        args = args[1:]
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "-c", "-MF", "-MT", "-MQ"):
            skip = a != "-c"
            continue
        if a in ("-MD", "-MMD") or a == entry["file"]:
            continue
        if drop_sanitizers and (a.startswith("-fsanitize") or a.startswith("-flto")):
            continue
        out.append(a)
    return out
