"""Print the short table of every results file in bench/results."""

import glob
import json
import os

here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def main():
    for path in sorted(glob.glob(os.path.join(here, "*.json"))):
        doc = json.load(open(path))
        if "benchmark" not in doc:  # the muse-decode tool's --json report
            print(f"\nmuse-decode TP{doc['tp']}, context {doc['context']}, {doc['requests']} request(s), "
                  f"{doc['layer']} layer on {doc['device']}: {'pass' if doc['pass'] else 'FAIL'}")
            rows = [{k: r.get(k, "") for k in ("op", "check", "us_per_call", "floor_us", "unfused_us", "speedup")}
                    for r in doc.get("gpu", [])]
        else:
            print(f"\n{doc['benchmark']} on {doc['device']} ({doc['date']})")
            rows = doc["rows"]
        if not rows:
            continue
        keys = list(rows[0].keys())
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
