#!/usr/bin/env python3
"""new/old TFLOPS per shape from alternating `rtattn bench` runs of two builds (scripts/device_ab.sh).
Usage: ab_compare.py OLD1.json OLD2.json ... -- NEW1.json NEW2.json ...  -> markdown table on stdout.
Each round's ratio is new_i / old_i (runs of one round ran back to back); the table shows their median and range."""
import json
import statistics
import sys


def rows(path):
    doc = json.load(open(path))
    return {(r["d"], r["S"], r["causal"], r["dtype"]): r for r in (doc["results"] if isinstance(doc, dict) else doc)}


def main(args):
    split = args.index("--")
    olds, news = [rows(p) for p in args[:split]], [rows(p) for p in args[split + 1:]]
    print("| d | S | causal | old TFLOPS (median) | new TFLOPS (median) | new/old median | new/old range | kernel |")
    print("|---|---|---|---|---|---|---|---|")
    for key in sorted(olds[0]):
        ratios = [n[key]["tflops"] / o[key]["tflops"] for o, n in zip(olds, news) if key in o and key in n]
        old_t = statistics.median(o[key]["tflops"] for o in olds if key in o)
        new_t = statistics.median(n[key]["tflops"] for n in news if key in n)
        d, s, causal, _ = key
        print(f"| {d} | {s} | {'yes' if causal else 'no'} | {old_t:.0f} | {new_t:.0f} | {statistics.median(ratios):.3f} | "
              f"{min(ratios):.3f}-{max(ratios):.3f} | {news[0][key].get('kernel', '')} |")


if __name__ == "__main__":
    if "--" not in sys.argv:
        sys.exit(__doc__)
    main(sys.argv[1:])
