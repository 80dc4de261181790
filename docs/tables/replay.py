"""What the table scripts share: running the replay with $FAIRWAY and
writing its figures as Markdown."""
import json
import os
import re
import subprocess
import tempfile

FAIRWAY = os.environ.get("FAIRWAY", "target/release/fairway")


def replay(*args):
    """Runs `fairway replay ARGS --json`; returns (document, stdout)."""
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "r.json")
        p = subprocess.run(
            [FAIRWAY, "replay", *args, "--json", out], capture_output=True, text=True
        )
        if p.returncode != 0:
            raise SystemExit(f"fairway replay {' '.join(args)}: {p.stderr}")
        with open(out, encoding="utf-8") as f:
            return json.load(f), p.stdout


def raw(*args):
    """The replay's own table, as it prints it (without the wall time)."""
    _, stdout = replay(*args)
    text = re.sub(r", [0-9.]+ s wall$", "", stdout.rstrip(), flags=re.M)
    return f"`fairway replay {' '.join(args)}`:\n\n```\n{text}\n```\n"


def routing(run):
    """The run's routing as the replay's tables name it."""
    events = run["kv_events"] and run["strategy"] in ("prefix_aware", "prefix_greedy")
    if events and run["strategy"] == "prefix_greedy":
        return "oracle"
    return run["strategy"] + ("+events" if events else "")


def label(run):
    return run["discipline"] + ("+slo" if run["slo_admission"] else "")


def pct(x):
    return "-" if x is None else f"{100 * x:.1f} %"


def ms(x):
    if x is None:
        return "-"
    return f"{1000 * x:.0f} ms" if x < 1 else f"{x:.2f} s"


def num(x, digits=2):
    return "-" if x is None else f"{x:,.{digits}f}"


def count(x):
    return "-" if x is None else f"{x:,}"


def table(headers, rows):
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def policy_with(base, edits):
    """A copy of policy file `base` with `key = value` lines replaced or,
    in the `[section]` named, added (edits: {(section, key): value}); the
    path of the copy, in a temporary folder kept for the process's life."""
    text = open(base, encoding="utf-8").read()
    for (section, key), value in edits.items():
        line = f"{key} = {value}"
        pattern = re.compile(rf"^{re.escape(key)} = .*$", re.M)
        head = re.search(rf"^\[{re.escape(section)}\]\n", text, re.M)
        if head is None:
            text += f"\n[{section}]\n{line}\n"
            continue
        end = re.search(r"^\[", text[head.end():], re.M)
        stop = head.end() + (end.start() if end else len(text) - head.end())
        body = text[head.end():stop]
        body = pattern.sub(line, body) if pattern.search(body) else line + "\n" + body
        text = text[: head.end()] + body + text[stop:]
    path = os.path.join(_TMP.name, f"policy-{len(os.listdir(_TMP.name))}.toml")
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


_TMP = tempfile.TemporaryDirectory()


def tenant(run, name, field):
    return run["tenants"].get(name, {}).get(field)


def by(runs, discipline=None, routing_name=None, slo=None):
    """The one run matching the given discipline, routing and admission."""
    for r in runs:
        if discipline is not None and r["discipline"] != discipline:
            continue
        if routing_name is not None and routing(r) != routing_name:
            continue
        if slo is not None and r["slo_admission"] != slo:
            continue
        return r
    raise SystemExit(f"no run {discipline} {routing_name} {slo}")
