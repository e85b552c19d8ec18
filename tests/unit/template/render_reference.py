#!/usr/bin/env python3
# The reference renderer for tests/unit/template/test_chat_templates.cpp: Python's jinja2 set up as
# transformers' apply_chat_template sets it up (ImmutableSandboxedEnvironment, trim_blocks,
# lstrip_blocks, loopcontrols, the generation tag, tojson without HTML escaping, raise_exception,
# strftime_now). Reads a JSON list of cases, writes a JSON list of results:
#   python3 render_reference.py CASES.json OUT.json
#   case: {"template": str, "context": {...}, "now": unix seconds or null}
#   result: {"ok": true, "text": str} or {"ok": false, "error": str}
import json
import sys
from datetime import datetime, timezone

try:
    import jinja2
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    sys.stderr.write("render_reference.py: python3-jinja2 is missing: run scripts/setup.sh\n")
    sys.exit(2)


class AssistantTracker(Extension):
    # transformers' {% generation %} tag; it renders its body unchanged.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        if now is not None:
            return datetime.fromtimestamp(now, tz=timezone.utc).strftime(format)
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    results = []
    envs, compiled = {}, {}
    for case in cases:
        try:
            now = case.get("now")
            if now not in envs:
                envs[now] = make_env(now)
            key = (now, case["template"])
            if key not in compiled:
                compiled[key] = envs[now].from_string(case["template"])
            text = compiled[key].render(**case["context"])
            results.append({"ok": True, "text": text})
        except Exception as e:  # any failure of the template: the C++ side must fail too
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
