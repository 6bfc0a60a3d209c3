"""The attention block as a user's step pays it, two ways: qkv_front, attn2
and o_proj back to back on one stream (each launched with programmatic
dependent launch behind the one before), and attention_block, the three in
one cooperative launch; each captured in one CUDA graph, each iteration on
another layer's weights and KV cache, at TP8 with one request on a
sliding-window layer at 32k and full-attention layers at 32k and 128k.

The muse-decode tool measures both (its "block" and "attention_block" rows,
beside each op alone and the unfused path: cuBLAS GEMMs plus plain kernels);
this script runs the tool over those shapes and writes
bench/results/block.json: a row per shape of the chain (op "block") and of
attention_block (op "attention_block"; where the tool did not run it, the
reason). Floor: the bytes the block must move (the front's and o_proj's
weights, attn2's keys and values, the tokens' rows) / 4.2 TB/s. Bars, as
multiples of the floor: the chain 1.30 at 32k, 1.25 at 128k
(docs/block.md); attention_block 1.30 on the sliding layer at 32k, 1.20 on
the full layer at 32k, 1.15 at 128k (17.3, 20.5 and 33.4 us: SPEC section
12).

    python3 bench/bench_block.py [--tool build-gpu/muse-decode]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# (name, layer kind, context, the chain's bar and attention_block's, as multiples of the floor)
SHAPES = [
    ("TP8 sliding layer, 32k", "sliding", 32768, 1.30, 1.30),
    ("TP8 full layer, 32k", "full", 32768, 1.30, 1.20),
    ("TP8 full layer, 128k", "full", 131072, 1.25, 1.15),
]


def find_tool(given):
    for path in [given, os.environ.get("MUSE_DECODE_TOOL"), os.path.join(ROOT, "build-gpu", "muse-decode"),
                 os.path.join(ROOT, "build", "muse-decode")]:
        if path and os.access(path, os.X_OK):
            return path
    sys.exit("bench_block: no muse-decode binary (build it, or pass --tool)")


def attention_block_row(ops, name, layer, context, bar, alone):
    """attention_block's row of one shape: its time against its floor and bar,
    and against the chain and the ops alone measured in the same run; or the
    reason the tool did not run it."""
    row = dict(op="attention_block", shape=name, layer=layer, context=context)
    block, chain = ops.get("attention_block"), ops["block"]
    if block is None:
        return dict(row, check="FAIL", skipped="the tool printed no attention_block row")
    if "us_per_call" not in block:  # not run: the tool's reason
        return dict(row, check=block["check"], skipped=block.get("skipped", block["detail"]))
    us, floor = block["us_per_call"], block["floor_us"]
    return dict(row, check=block["check"], us_per_call=us, floor_us=floor, x_floor=round(us / floor, 3),
                bar_x_floor=bar, bar_us=round(bar * floor, 2), meets_bar=us <= bar * floor,
                pct_copy_bw=round(100 * floor / us, 1), chain_us=chain["us_per_call"],
                x_chain=round(us / chain["us_per_call"], 3), ops_alone_us=round(alone, 2),
                anchor="the three ops chained", anchor_us=chain["us_per_call"],
                unfused_us=block["unfused_us"], detail=block["detail"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tool", help="the muse-decode binary (default: build-gpu/ or build/)")
    args = ap.parse_args()
    tool = find_tool(args.tool)
    rows, device = [], None
    for name, layer, context, bar, block_bar in SHAPES:
        run = subprocess.run([tool, "--quiet", "--json", "--tp", "8", "--requests", "1", "--layer", layer,
                              "--context", str(context)], capture_output=True, text=True)
        if run.returncode != 0 and not run.stdout.strip():
            print(run.stderr, file=sys.stderr)
            return 1
        doc = json.loads(run.stdout)
        if not doc.get("gpu"):
            print("bench_block: the GPU part did not run:", doc.get("gpu_skipped"))
            return 0
        device = doc["device"]
        ops = {r["op"]: r for r in doc["gpu"]}
        block = ops["block"]
        alone = sum(ops[o]["us_per_call"] for o in ("qkv_front", "attn2", "o_proj"))
        us, floor = block["us_per_call"], block["floor_us"]
        rows.append(dict(op="block", shape=name, layer=layer, context=context, check=block["check"],
                         us_per_call=us, floor_us=floor, x_floor=round(us / floor, 3), bar_us=round(bar * floor, 2),
                         meets_bar=us <= bar * floor, pct_copy_bw=round(100 * floor / us, 1),
                         qkv_front_us=ops["qkv_front"]["us_per_call"], attn2_us=ops["attn2"]["us_per_call"],
                         o_proj_us=ops["o_proj"]["us_per_call"], ops_alone_us=round(alone, 2),
                         anchor="unfused (cuBLAS + plain kernels)", anchor_us=block["unfused_us"],
                         detail=block["detail"]))
        print(rows[-1], flush=True)
        rows.append(attention_block_row(ops, name, layer, context, block_bar, alone))
        print(rows[-1], flush=True)
    doc = dict(benchmark="block", device=device, date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               method="the muse-decode tool's block and attention_block rows: CUDA-graph replay of many blocks (the "
                      "three ops chained, or attention_block's one launch), each on another layer's weights and "
                      "cache, the L2 flushed before each replay, median of replays",
               rows=rows)
    path = os.path.join(HERE, "results", "block.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print("wrote", path)
    return 0 if all(r["check"] in ("pass", "skip") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
