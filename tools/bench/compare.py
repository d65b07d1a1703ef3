#!/usr/bin/env python3
"""Side-by-side table of `rtattn bench --json-out` and peers.py's peers.json (same device command): TFLOPS and
ratios. Usage: compare.py OURS.json PEERS.json  -> markdown table on stdout."""
import json
import sys


def main(ours_path, peers_path):
    ours = json.load(open(ours_path))
    ours = ours["results"] if isinstance(ours, dict) else ours  # schema 2 wraps the rows; older files are the rows
    peers = {(r["d"], r["S"], r["causal"]): r for r in json.load(open(peers_path))}
    print("| d | S | BxH | causal | ours | flash | cuDNN | ours/flash | ours/cuDNN | kernel |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for o in ours:
        p = peers.get((o["d"], o["S"], o["causal"]), {})
        flash = p.get("flash", {}).get("fwd")
        cudnn = p.get("cudnn", {}).get("fwd")
        fmt = lambda x: f"{x:.0f}" if x else "n/a"
        ratio = lambda x: f"{o['tflops'] / x:.2f}" if x else "n/a"
        print(f"| {o['d']} | {o['S']} | {o['B']}x{o['H']} | {'yes' if o['causal'] else 'no'} | {o['tflops']:.0f} | "
              f"{fmt(flash)} | {fmt(cudnn)} | {ratio(flash)} | {ratio(cudnn)} | {o.get('tile', '')} "
              f"{o.get('kernel', '')} |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
