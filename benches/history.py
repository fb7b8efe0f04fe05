#!/usr/bin/env python3
"""Print the history of a benchmark figure from benches/results.jsonl.

Each line of benches/results.jsonl is one measurement run: its scenario id, date,
commit, machine, its figures (named numbers, the unit in the name) and an optional
note. BENCHMARKS.md and RELIABILITY.md name each row's scenario id.

Usage:
    python3 benches/history.py                   # the scenarios, with their number of runs
    python3 benches/history.py SCENARIO          # that scenario's runs, oldest first, as a table
    python3 benches/history.py SCENARIO --json   # the same runs, as the lines are stored
    python3 benches/history.py --json            # every line
    python3 benches/history.py --file PATH ...   # another results file

Standard library only.
"""

import argparse
import json
import os
import sys

DEFAULT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results.jsonl")


def load(path):
    runs = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                run = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not JSON: {e}")
            runs.append((line, run))
    return runs


def fmt(v):
    if v is None:
        return ""
    if isinstance(v, float) and v.is_integer() and abs(v) >= 1000:
        return str(int(v))
    return str(v)


def table(runs):
    keys = []
    for _, r in runs:
        for k in r.get("figures", {}):
            if k not in keys:
                keys.append(k)
    head = ["date", "commit", "machine"] + keys + ["note"]
    body = []
    for _, r in runs:
        figs = r.get("figures", {})
        body.append([r.get("date", ""), r.get("commit") or "", r.get("machine") or ""]
                    + [fmt(figs.get(k)) for k in keys] + [r.get("note", "")])
    widths = [max(len(row[i]) for row in [head] + body) for i in range(len(head))]
    numeric = [3 <= i < 3 + len(keys) for i in range(len(head))]

    def line(row):
        cells = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(row, widths, numeric)]
        return "  ".join(cells).rstrip()

    print(line(head))
    print("  ".join("-" * w for w in widths))
    for row in body:
        print(line(row))


def main():
    p = argparse.ArgumentParser(description="The history of a benchmark figure.",
                                epilog="Without SCENARIO: the scenario ids and their number of runs.")
    p.add_argument("scenario", nargs="?", help="a scenario id, as in the id column of BENCHMARKS.md")
    p.add_argument("--json", action="store_true", help="print the lines as they are stored")
    p.add_argument("--file", default=DEFAULT, help="the results file (default: benches/results.jsonl)")
    a = p.parse_args()

    runs = load(a.file)
    if a.scenario:
        runs = [x for x in runs if x[1].get("scenario") == a.scenario]
        if not runs:
            known = sorted({r.get("scenario") for _, r in load(a.file)})
            sys.exit(f"no runs of {a.scenario!r}; scenarios: {', '.join(known)}")
    runs.sort(key=lambda x: x[1].get("date", ""))  # stable: the file's order within a day

    if a.json:
        for line, _ in runs:
            print(line)
    elif a.scenario:
        table(runs)
    else:
        counts, last = {}, {}
        for _, r in runs:
            s = r.get("scenario", "?")
            counts[s] = counts.get(s, 0) + 1
            last[s] = r.get("date", "")
        w = max(len(s) for s in counts)
        print(f"{'scenario'.ljust(w)}  runs  last")
        for s in sorted(counts):
            print(f"{s.ljust(w)}  {counts[s]:>4}  {last[s]}")


if __name__ == "__main__":
    try:
        main()
    except BrokenPipeError:
        sys.exit(0)
