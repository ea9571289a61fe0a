#!/usr/bin/env python3
"""tests/test_probe_table.py - scripts/probe_table.py on attn_probe JSON written by the test, with known answers.

Why: the capture table of docs/reproduction.md is redrawn by probe_table.py from stored attn_probe --json
files; here the files are synthetic (the same schema dev/attn_probe.cu writes), so every cell and every
per-step median is known: the run name comes from the capture's folder, errors print in percent, the
median of an even count is the mean of the middle two, a synthetic (non-capture) input and CPU results are
left out, and a file that is not attn_probe's is refused with its name.

Usage: python3 tests/test_probe_table.py   (ends with "N passed, N failed")
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testing import check, summary  # noqa: E402

SCRIPT = os.path.join(ROOT, "scripts", "probe_table.py")


def stat(med, mx=None):
    return {"median": med, "max": mx if mx is not None else med, "count": 16, "zero_ref_heads": 0}


def capture(run, step, layer, rho, errs, cpu_noise=True):
    results = [{"impl": "run", "mode": "captured O", "O": stat(0.0017)}]
    for mode, (dq, dk) in errs.items():
        results.append({"impl": "gpu", "mode": mode, "O": stat(0.0017), "dQ": stat(dq), "dK": stat(dk),
                        "dV": stat(0.002)})
        if cpu_noise:  # CPU emulation rows must not enter the GPU table
            results.append({"impl": "cpu", "mode": mode, "O": stat(0.5), "dQ": stat(0.5), "dK": stat(0.5),
                            "dV": stat(0.5)})
    return {"name": "x", "source": "capture", "path": "/r/g/%s/attn_step%08d_layer%02d.bin" % (run, step, layer),
            "layer": layer, "step": step, "run_mode": run.split("_")[0], "capture_dtype": "bf16",
            "B": 1, "NH": 16, "T": 256, "HS": 64, "rho": stat(rho[0], rho[1]), "max_abs_q": stat(5),
            "max_abs_k": stat(9), "results": results}


def write(d, name, inputs, tool="attn_probe"):
    p = os.path.join(d, name)
    with open(p, "w") as f:
        json.dump({"tool": tool, "reference": "fp64 CPU", "gpu": True, "cpu_emulation": True,
                   "tile_max_shift": False, "inputs": inputs}, f)
    return p


def run(*args):
    r = subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True, text=True)
    return r.returncode, r.stdout, r.stderr


def main():
    with tempfile.TemporaryDirectory() as d:
        synthetic = {"name": "offset keys", "source": "synthetic", "B": 1, "NH": 1, "T": 8, "HS": 8,
                     "rho": stat(9), "max_abs_q": stat(1), "max_abs_k": stat(1), "results": []}
        a = write(d, "probe_bf16_s7_30000.json", [
            synthetic,
            capture("bf16_s7", 30000, 0, (29.6, 88.3), {"bf16": (0.0406, 0.00448), "gproj": (0.0018, 0.00417)}),
            capture("bf16_s7", 30000, 1, (0.47, 0.694), {"bf16": (0.0175, 0.00269), "gproj": (0.00203, 0.00216)})])
        b = write(d, "probe_repair_s8_30000.json", [
            capture("repair_s8", 30000, 0, (2.15, 35.8), {"bf16": (0.00902, 0.00282), "gproj": (0.00191, 0.00238)}),
            capture("repair_s8", 30000, 1, (0.81, 2.31), {"bf16": (0.0164, 0.00286), "gproj": (0.00205, 0.00227)})])
        c = write(d, "probe_bf16_s7_50000.json", [
            capture("bf16_s7", 50000, 0, (40, 120), {"bf16": (0.10, 0.006), "gproj": (0.002, 0.005)})])
        rc, out, err = run("--modes", "bf16 gproj", c, b, a)
        check(rc == 0, "three files: exit 0 (%s)" % err.strip())
        lines = out.splitlines()
        rows = [l for l in lines if l.startswith("| bf16_s7") or l.startswith("| repair_s8")]
        check(len(rows) == 5, "one row per capture input, synthetic input left out (%d rows)" % len(rows))
        check(rows[0] == "| bf16_s7 | 30000 | 0 | 29.6 / 88.3 | 4.06% / 0.448% | 0.18% / 0.417% |",
              "first row: run from the folder, rho, errors in percent, sorted by step then run (%s)" % rows[0])
        check(rows[-1].startswith("| bf16_s7 | 50000 | 0 |"), "step 50000 sorts last")
        check("50%" not in out, "CPU emulation results are left out")
        s30 = lines.index(next(l for l in lines if l.startswith("| step 30000, 4 captures")))
        # dQ over 4 captures: bf16 0.0406, 0.0175, 0.00902, 0.0164 -> median (0.0164+0.0175)/2 = 1.695%;
        # gproj 0.0018, 0.00203, 0.00191, 0.00205 -> (0.00191+0.00203)/2 = 0.197%; dK bf16 -> (0.00282+0.00286)/2
        check(lines[s30 + 2] == "| dQ | 1.7% (max 4.06%) | 0.197% (max 0.205%) |",
              "step 30000 dQ: median of an even count, max (%s)" % lines[s30 + 2])
        check(lines[s30 + 3] == "| dK | 0.284% (max 0.448%) | 0.232% (max 0.417%) |",
              "step 30000 dK (%s)" % lines[s30 + 3])
        check(any(l.startswith("| step 50000, 1 captures") for l in lines), "a summary per capture step")

        bad = write(d, "other.json", [], tool="something")
        rc, out, err = run(bad)
        check(rc != 0 and "other.json" in err and "attn_probe" in err, "a foreign JSON is refused by name (%s)" % err.strip())
        broken = os.path.join(d, "broken.json")
        open(broken, "w").write('{"tool": "attn_probe", "inputs": [')
        rc, out, err = run(broken)
        check(rc != 0 and "broken.json" in err, "a truncated file is refused by name")
        empty = write(d, "empty.json", [synthetic])
        rc, out, err = run(empty)
        check(rc != 0 and "no capture inputs" in err, "no captures: an error, not an empty table")

        # --whole: the all-heads error ("dQ_whole") replaces the per-head median; a file without it is refused
        w_in = capture("bf16_s7", 30000, 0, (29.6, 88.3), {"bf16": (5.0, 0.4), "gproj": (0.0018, 0.0021)})
        for r in w_in["results"]:
            if r["impl"] == "gpu":
                r["dQ_whole"] = {"rel": 0.031 if r["mode"] == "bf16" else 0.00195, "err_norm": 1.0, "ref_norm": 2.0}
                r["dK_whole"] = {"rel": 0.0044 if r["mode"] == "bf16" else 0.0021, "err_norm": 1.0, "ref_norm": 2.0}
        wf = write(d, "probe_whole.json", [w_in])
        rc, out, err = run("--modes", "bf16 gproj", "--whole", wf)
        row = [l for l in out.splitlines() if l.startswith("| bf16_s7 |")]
        check(rc == 0 and row == ["| bf16_s7 | 30000 | 0 | 29.6 / 88.3 | 3.1% / 0.44% | 0.195% / 0.21% |"],
              "--whole: the all-heads errors, not the per-head medians (%s)" % (row or err.strip()))
        rc, out, err = run("--whole", a)
        check(rc != 0 and "dQ_whole" in err and "probe_bf16_s7_30000.json" in err,
              "--whole on a file without all-heads errors: refused by name (%s)" % err.strip())
    return summary()


if __name__ == "__main__":
    sys.exit(main())
