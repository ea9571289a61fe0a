#!/usr/bin/env python3
"""scripts/probe_table.py JSON... - the capture table of a matched-run group, from attn_probe --json files.

Why: the reproduction's accuracy claim ("on the keys the runs learned, bf16 and repair leave dQ off by X%,
gproj by Y%") is a table over many captures (run x step x layer), each evaluated in every mode against the
fp64 reference. This turns attn_probe's JSON (one file per run and capture step) into that table in
markdown, so the numbers in docs/ are redrawn from the stored JSON by one command rather than copied by
hand.

Per capture it prints the run (the capture file's folder name), step, layer, the key offset rho
(median / max over heads), and each GPU mode's dQ and dK error (median over heads, relative Frobenius, in
percent). Then, per capture step, the median over captures of those medians and the largest of them, per
mode and tensor. --whole takes each tensor's error over all heads of the capture together instead
(||X - X_ref||_F / ||X_ref||_F summed over heads, attn_probe's "dQ_whole"): a head whose exact gradient is near
zero, where the per-head error can be huge, then weighs as little as its gradient does.

Usage: scripts/probe_table.py [--modes "bf16 repair gproj fp32"] [--tensors "dQ dK"] [--whole] JSON...
"""
import argparse
import json
import os
import statistics
import sys


def load(paths, whole=False, tensors=("O", "dQ", "dK", "dV")):
    """Every capture input of the given files: dicts with run, step, layer, rho, err[(mode, tensor)]
    (the per-head median, or with whole the all-heads error)."""
    rows = []
    for p in paths:
        try:
            with open(p, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            sys.exit("probe_table: error: %s: %s (an attn_probe --json file was expected)" % (p, e))
        if doc.get("tool") != "attn_probe" or not isinstance(doc.get("inputs"), list):
            sys.exit("probe_table: error: %s is not an attn_probe --json file (no tool/inputs)" % p)
        for inp in doc["inputs"]:
            if "path" not in inp:
                continue  # a synthetic case, not a capture
            err = {}
            for r in inp["results"]:
                if r.get("impl") != "gpu":
                    continue
                for t in tensors:
                    if t not in r:
                        continue
                    if whole:
                        if t + "_whole" not in r:
                            sys.exit("probe_table: error: %s has no all-heads errors (%s_whole) for %s: rerun "
                                     "build/attn_probe --json on the capture, or drop --whole" % (p, t, inp["path"]))
                        value = r[t + "_whole"]["rel"]
                    else:
                        value = r[t]["median"]
                    if value is not None:
                        err[(r["mode"], t)] = value
            rows.append({"run": os.path.basename(os.path.dirname(inp["path"])) or "?",
                         "step": inp["step"], "layer": inp["layer"],
                         "rho": (inp["rho"]["median"], inp["rho"]["max"]), "err": err})
    rows.sort(key=lambda r: (r["step"], r["run"], r["layer"]))
    return rows


def pct(x):
    return "n/a" if x is None else "%.3g%%" % (100.0 * x)


def table(rows, modes, tensors):
    out = ["| run | step | layer | rho med / max | " + " | ".join("%s %s" % (m, "/".join(tensors)) for m in modes) + " |",
           "|---|---:|---:|---|" + "---|" * len(modes)]
    for r in rows:
        cells = [" / ".join(pct(r["err"].get((m, t))) for t in tensors) for m in modes]
        out.append("| %s | %d | %d | %.3g / %.3g | %s |" % (r["run"], r["step"], r["layer"], r["rho"][0], r["rho"][1],
                                                         " | ".join(cells)))
    for step in sorted({r["step"] for r in rows}):
        at = [r for r in rows if r["step"] == step]
        out += ["", "| step %d, %d captures: median of the per-capture medians (max) | %s |" % (step, len(at), " | ".join(modes)),
                "|---|" + "---|" * len(modes)]
        for t in tensors:
            cells = []
            for m in modes:
                v = [r["err"][(m, t)] for r in at if (m, t) in r["err"]]
                cells.append("%s (max %s)" % (pct(statistics.median(v)), pct(max(v))) if v else "n/a")
            out.append("| %s | %s |" % (t, " | ".join(cells)))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", nargs="+")
    ap.add_argument("--modes", default="bf16 repair gproj fp32")
    ap.add_argument("--tensors", default="dQ dK")
    ap.add_argument("--whole", action="store_true", help="each tensor's error over all heads together")
    a = ap.parse_args()
    rows = load(a.json, a.whole, a.tensors.split())
    if not rows:
        sys.exit("probe_table: error: no capture inputs in %s" % " ".join(a.json))
    print(table(rows, a.modes.split(), a.tensors.split()))


if __name__ == "__main__":
    main()
