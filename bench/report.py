"""The README's "Measured" tables, in Markdown, from the results files the
benchmarks and the muse-decode tool wrote (bench/results/*.json): nothing is
typed by hand.

    python3 bench/report.py [results_dir]
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def load(results, name):
    path = os.path.join(results, f"{name}.json")
    return json.load(open(path)) if os.path.exists(path) else None


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def fmt(v, nd=2):
    if v is None:
        return "-"
    return f"{v:.{nd}f}" if isinstance(v, float) else str(v)


def tool_section(doc):
    lines = [f"### muse-decode (the main job): TP{doc['tp']}, context {doc['context']}, "
             f"{doc['requests']} request(s), {doc['layer']} layer, {doc['device']}, {doc.get('date', 'undated')}"]
    rows = []
    for r in doc.get("gpu", []):
        rows.append([r["op"], r["check"], fmt(r["us_per_call"]), fmt(r["gb_per_s"], 0), fmt(r["pct_of_copy_bw"], 1),
                     fmt(r["floor_us"]), fmt(r["unfused_us"]), f"{r['speedup']:.1f}x"])
    lines.append(table(["op", "check", "us per call", "GB/s", "% copy BW", "floor us", "unfused us", "speed-up"], rows))
    return "\n\n".join(lines)


def route_section(doc):
    rows = [[r["b"], fmt(r["us_per_call"]), fmt(r["us_l2_hot"]), fmt(r["us_no_pdl"]), fmt(r["us_no_metadata"]),
             fmt(r["stock_route_only_us"], 1), fmt(r["stock_torch_us"], 1), fmt(r["host_us_per_call"])]
            for r in doc["rows"]]
    head = (f"### route, with metadata ({doc['rows'][0]['local_experts']} local experts, tile_n "
            f"{doc['rows'][0]['tile_n']}), {doc['date']}\n\nBar: {doc['rows'][0]['bar_us']} us per call. "
            f"An empty kernel costs {doc['rows'][0]['empty_kernel_us']} us in the same graphs.")
    return head + "\n\n" + table(["b", "us per call", "L2 hot", "without PDL", "routing only", "stock routing",
                                  "stock routing + metadata", "host us (Python call)"], rows)


def qkv_section(doc):
    rows = [[r["tp"], r["tokens"], fmt(r["us_per_call"]), fmt(r["floor_us"]), fmt(r["bar_us"]), fmt(r["x_floor"], 3),
             fmt(r["pct_copy_bw"], 1), fmt(r["cublas_matmul_us"]), fmt(r["stock_chain_us"], 1)] for r in doc["rows"]]
    return (f"### qkv_front (RoPE layer, weights rotated past the L2), {doc['date']}\n\n"
            + table(["TP", "T", "us per call", "floor", "bar", "x floor", "% copy BW", "cuBLAS matmul alone",
                     "stock chain"], rows))


def attn2_section(doc):
    rows = []
    for r in doc["rows"]:
        shape = r["shape"]
        fi = r.get("flashinfer_us")
        rows.append([shape, r["seq_len"], r["window"], fmt(r["us_per_call"]), fmt(r.get("us_no_pdl")),
                     fmt(r["floor_us"]), fmt(r["bar_us"]), fmt(r["pct_of_copy_bw"], 1), fmt(r.get("stock_us"), 1),
                     fmt(fi) + (f" ({r.get('flashinfer_backend')})" if fi else ""),
                     fmt(r.get("speedup_vs_flashinfer"))])
    return (f"### attn2 (one launch, o-norm and gate fused), {doc['date']}\n\n"
            + table(["shape", "L", "window", "us per call", "without PDL", "floor", "bar", "% copy BW", "stock PyTorch",
                     "FlashInfer (attention only)", "x FlashInfer"], rows))


def launch_section(results):
    """Host time per launch form and per C++ op call (bench/bench_launch.cu's JSON lines)."""
    path = os.path.join(results, "launch_kernel.jsonl")
    if not os.path.exists(path):
        return None
    rows = [[r["form"], fmt(r["host_us"])] for r in map(json.loads, open(path)) if r.get("op") == "launch"]
    return ("### Host time of one launch (bench/bench_launch.cu, same run)\n\n"
            + table(["launch form or call", "host us"], rows))


def main():
    results = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "results")
    parts = []
    for name, fn in (("muse_decode", tool_section), ("route", route_section), ("qkv_front", qkv_section),
                     ("attn2", attn2_section)):
        doc = load(results, name)
        if doc is not None:
            parts.append(fn(doc))
    launches = launch_section(results)
    if launches:
        parts.append(launches)
    print("\n\n".join(parts))


if __name__ == "__main__":
    main()
