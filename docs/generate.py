#!/usr/bin/env python3
"""Regenerates the parts of the docs that hold the binary's output.

A generated part sits between two comments in a Markdown file:

    <!-- generated: docs/tables/NAME.py [ARGS] -->
    ... what the script printed ...
    <!-- end generated -->

Each script runs the replay (deterministic per seed) with the binary in
$FAIRWAY (default target/release/fairway) and prints Markdown.

    docs/generate.py            rewrite every generated part
    docs/generate.py --check    exit 1, with a diff, where a committed part
                                differs from what the binary produces (CI)
"""
import difflib
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PART = re.compile(
    r"(<!-- generated: (?P<script>[^\n]*?) -->\n)(?P<body>.*?)(<!-- end generated -->)",
    re.S,
)


def produce(script):
    env = dict(os.environ)
    env.setdefault("FAIRWAY", os.path.join(ROOT, "target/release/fairway"))
    if not os.access(env["FAIRWAY"], os.X_OK):
        sys.exit(f"no binary at {env['FAIRWAY']}: cargo build --release, or set FAIRWAY")
    p = subprocess.run(
        [sys.executable, *shlex.split(script)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        sys.exit(f"{script} failed:\n{p.stderr}")
    return p.stdout


def main():
    check = "--check" in sys.argv[1:]
    docs = os.path.join(ROOT, "docs")
    stale = 0
    for name in sorted(os.listdir(docs)):
        if not name.endswith(".md"):
            continue
        path = os.path.join(docs, name)
        text = open(path, encoding="utf-8").read()

        def fill(m):
            nonlocal stale
            body = produce(m.group("script"))
            if body != m.group("body"):
                stale += 1
                where = f"docs/{name} ({m.group('script')})"
                diff = difflib.unified_diff(
                    m.group("body").splitlines(True), body.splitlines(True), where, "the binary"
                )
                sys.stdout.writelines(diff)
            return m.group(1) + body + m.group(4)

        new = PART.sub(fill, text)
        if not check and new != text:
            open(path, "w", encoding="utf-8").write(new)
    if check and stale:
        sys.exit(f"{stale} generated part(s) differ from the binary's output: run docs/generate.py")
    print(f"generated parts: {'all current' if not stale else f'{stale} rewritten'}")


if __name__ == "__main__":
    main()
