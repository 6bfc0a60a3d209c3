"""Print the short table of every results file in bench/results."""

import glob
import json
import os

import report  # bench/report.py, beside this file

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def main():
    for path in sorted(glob.glob(os.path.join(here, "*.json"))):
        doc = json.load(open(path))
        if "benchmark" not in doc:  # the muse-decode tool's --json report: the README's table of it
            print("\n" + report.tool_section(doc))
            continue
        print(f"\n{doc['benchmark']} on {doc['device']} ({doc['date']})")
        rows = doc["rows"]
        if not rows:
            continue
        keys = report.all_keys(rows)  # the block's file holds rows of two kinds
        widths = [max(len(k), *(len(str(r.get(k, ""))) for r in rows)) for k in keys]
        print("  ".join(k.rjust(w) for k, w in zip(keys, widths)))
        for r in rows:
            print("  ".join(str(r.get(k, "")).rjust(w) for k, w in zip(keys, widths)))
    for path in sorted(glob.glob(os.path.join(here, "*.jsonl"))):
        print(f"\n{os.path.basename(path)}")
        for line in open(path):
            print(" ", line.strip())


if __name__ == "__main__":
    main()
