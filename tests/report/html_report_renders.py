#!/usr/bin/env python3
# The HTML report opened in headless Chromium renders its plots: `steward run` writes a report, Chromium
# takes a screenshot and dumps the rendered DOM, and every <svg> there must hold drawn shapes, the only
# <script> must be the embedded JSON (which must read back as the JSON report), and Chromium must log
# no script error. Exits 77 (ctest: Skipped) when chromium is not installed.
# Usage: html_report_renders.py STEWARD CONFIG OUT_DIR   (OUT_DIR keeps report.html and screenshot.png)
import html.parser
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

SKIP = 77
SHAPES = {"rect", "line", "polyline", "polygon", "path", "circle", "ellipse"}


def chromium_run(chromium, url, extra):
    """Runs headless Chromium on url; returns (stdout, stderr)."""
    profile = tempfile.mkdtemp(prefix="steward_chromium_")
    try:
        cmd = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--enable-logging=stderr", "--v=0", "--user-data-dir=" + profile] + extra + [url]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=50)
        if r.returncode != 0:
            raise SystemExit(f"chromium exited {r.returncode}: {r.stderr[-2000:]}")
        return r.stdout, r.stderr
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def script_errors(stderr):
    """Chromium's log lines for page console messages and uncaught exceptions."""
    return [l for l in stderr.splitlines() if "CONSOLE" in l or "Uncaught" in l]


class DomCheck(html.parser.HTMLParser):
    """Per <svg>: how many drawn shapes it holds; every <script>'s type and text."""

    def __init__(self):
        super().__init__()
        self.svg_shapes = []   # one count per <svg>
        self.depth = 0         # inside an <svg> when > 0
        self.scripts = []      # [type, text]
        self.in_script = False

    def handle_starttag(self, tag, attrs):
        if tag == "svg":
            if self.depth == 0:
                self.svg_shapes.append(0)
            self.depth += 1
        elif self.depth > 0 and tag in SHAPES:
            self.svg_shapes[-1] += 1
        if tag == "script":
            self.scripts.append([dict(attrs).get("type", ""), ""])
            self.in_script = True

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag == "svg":
            self.depth -= 1

    def handle_endtag(self, tag):
        if tag == "svg":
            self.depth -= 1
        if tag == "script":
            self.in_script = False

    def handle_data(self, data):
        if self.in_script:
            self.scripts[-1][1] += data


def main():
    if len(sys.argv) != 4:
        raise SystemExit("usage: html_report_renders.py STEWARD CONFIG OUT_DIR")
    steward, config, out_dir = sys.argv[1:]
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("chromium is not installed (bash scripts/setup.sh installs it): skipped")
        return SKIP
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    report_json = os.path.join(out_dir, "report.json")
    report_html = os.path.join(out_dir, "report.html")
    shot = os.path.join(out_dir, "screenshot.png")

    r = subprocess.run([steward, "run", "-c", config, "--requests", "16", "--rate", "50", "--scale", "0.1",
                        "-o", report_json], capture_output=True, text=True, timeout=60)
    if r.returncode not in (0, 3):  # 3: some requests failed; the report is written all the same
        raise SystemExit(f"steward run exited {r.returncode}: {r.stderr[-2000:]}")
    line = f"report written to {report_json} and {report_html}"
    if line not in r.stdout:
        raise SystemExit(f"steward run did not print '{line}':\n{r.stdout[-2000:]}")
    with open(report_json) as f:
        report = json.load(f)

    # The harness can see a script error: a page that throws is caught.
    broken = os.path.join(out_dir, "broken.html")
    with open(broken, "w") as f:
        f.write("<!DOCTYPE html><html><body><script>no_such_function();</script></body></html>")
    _, err = chromium_run(chromium, "file://" + broken, ["--dump-dom"])
    if not script_errors(err):
        raise SystemExit("the harness did not see the deliberate script error; its check would prove nothing")
    os.remove(broken)

    url = "file://" + os.path.abspath(report_html)
    _, err = chromium_run(chromium, url, ["--screenshot=" + shot, "--window-size=1200,3000"])
    errors = script_errors(err)
    dom, err = chromium_run(chromium, url, ["--dump-dom", "--window-size=1200,3000"])
    errors += script_errors(err)
    if errors:
        raise SystemExit("script errors in the report page:\n" + "\n".join(errors))

    # The screenshot: a PNG of the window's size, and not a blank page (a blank 1200x3000 PNG is ~20 KB).
    with open(shot, "rb") as f:
        png = f.read()
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise SystemExit(f"{shot} is not a PNG")
    width, height = struct.unpack(">II", png[16:24])
    if (width, height) != (1200, 3000) or len(png) < 50_000:
        raise SystemExit(f"{shot}: {width}x{height}, {len(png)} bytes: expected 1200x3000 with content")

    d = DomCheck()
    d.feed(dom)
    if len(d.svg_shapes) < 10:
        raise SystemExit(f"the rendered DOM holds {len(d.svg_shapes)} <svg>, expected at least 10")
    empty = [i for i, n in enumerate(d.svg_shapes) if n == 0]
    if empty:
        raise SystemExit(f"<svg> number(s) {empty} of {len(d.svg_shapes)} have no drawn shape")
    if [t for t, _ in d.scripts] != ["application/json"]:
        raise SystemExit(f"expected one script, the JSON; found types {[t for t, _ in d.scripts]}")
    if json.loads(d.scripts[0][1]) != report:
        raise SystemExit("the JSON embedded in the page is not the JSON report")
    print(f"ok: {len(d.svg_shapes)} SVGs, {sum(d.svg_shapes)} shapes, screenshot {len(png)} bytes at {shot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
