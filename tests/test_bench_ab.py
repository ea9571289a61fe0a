#!/usr/bin/env python3
"""tests/test_bench_ab.py - dev/bench_ab.py on bench_attention consoles written by the test, with known answers.

Why: the A/B tables of dev/results/ come from this script, so its means over rounds, its changes against the
baseline (percent and ratio), whether a build's forward and backward rounds all lie below or above the
baseline's, the rows one build
lacks, and its refusals (a NaN/Inf row, a pattern that matches
nothing, a file with no rows, an argument that is not NAME=GLOB) are checked against consoles whose every number
is known.

Usage: python3 tests/test_bench_ab.py   (ends with "N passed, N failed")
"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from testing import check, summary  # noqa: E402

TOOL = os.path.join(ROOT, "dev", "bench_ab.py")
HEAD = ("bench_attention on NVIDIA H200 (sm_90, 132 SMs, L2 60 MiB); median of 30 launches after 5 warm-up\n"
        "shape                mode                 fwd ms     bwd ms     f+b ms    fwd TF/s    bwd TF/s    f+b TF/s "
        "NaN/Inf\n")


def row(shape, mode, fwd, bwd, nan=0):
    return (f"{shape:20s} {mode:20s} {fwd:.4f}     {bwd:.4f}     {fwd + bwd:.4f}       100.0       100.0       "
            f"100.0 {nan}  (fwd: hopper, bwd: hopper)\n")


def write(path, rows):
    with open(path, "w") as f:
        f.write(HEAD + "".join(rows) + "FLOPs: causal fwd 4*B*H*T*T*D/2\n")


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


def table(out):
    """the table's body rows as lists of cells"""
    return [[c.strip() for c in l.strip().strip("|").split("|")] for l in out.split("\n")[2:] if l.startswith("|")]


def main():
    with tempfile.TemporaryDirectory() as d:
        a, b = "B8 H16 T1024 D64", "B2 H16 T4096 D128"
        write(f"{d}/old_1.txt", [row(a, "bf16", 0.2, 0.6), row(a, "gproj", 0.2, 0.8), row(b, "bf16", 1.0, 3.0)])
        write(f"{d}/old_2.txt", [row(a, "bf16", 0.4, 0.6), row(a, "gproj", 0.2, 0.8), row(b, "bf16", 1.0, 3.0)])
        write(f"{d}/new_1.txt", [row(a, "bf16", 0.27, 0.66), row(a, "gproj", 0.1, 0.8)])
        write(f"{d}/new_2.txt", [row(a, "bf16", 0.27, 0.54), row(a, "gproj", 0.3, 0.8)])

        r = run(f"old={d}/old_*.txt", f"new={d}/new_*.txt")
        check(r.returncode == 0, f"exit status 0 ({r.stderr.strip()})")
        head = r.stdout.split("\n")[0]
        check("old fwd / bwd ms (rounds)" in head and "new vs old: fwd / bwd" in head, "header: " + head)
        t = table(r.stdout)
        check([c[:2] for c in t] == [[a, "bf16"], [a, "gproj"], [b, "bf16"]], "rows in the baseline's order")
        check(t[0][2] == "0.3000 / 0.6000 (2)", f"baseline mean over 2 rounds: {t[0][2]}")
        check(t[0][3] == "0.2700 / 0.6000 (2)", f"new mean: {t[0][3]}")
        check(t[0][4] == "-10.0% / +0.0%", f"fwd 0.27 against 0.30 is -10.0%, bwd equal: {t[0][4]}")
        check(t[1][4] == "+0.0% / +0.0%", f"gproj 0.1 and 0.3 average to the baseline's 0.2: {t[1][4]}")
        check(t[2][3] == "-" and t[2][4] == "-" and t[2][5] == "-", "a row the new build lacks: '-'")
        check(t[0][5] == "overlap / overlap",
              f"fwd rounds 0.27 / 0.27 against 0.2 / 0.4, bwd 0.66 / 0.54 against 0.6 / 0.6: {t[0][5]}")
        check(t[1][5] == "overlap / overlap", f"fwd 0.1 / 0.3 against 0.2 / 0.2, equal bwd rounds: {t[1][5]}")
        write(f"{d}/fast_1.txt", [row(a, "bf16", 0.15, 0.55)])
        write(f"{d}/fast_2.txt", [row(a, "bf16", 0.3, 0.59)])
        write(f"{d}/slow_1.txt", [row(a, "bf16", 0.45, 0.61)])
        r = run(f"old={d}/old_*.txt", f"fast={d}/fast_*.txt", f"slow={d}/slow_*.txt")
        t = table(r.stdout)
        check(r.stdout.split("\n")[0].count("fwd / bwd rounds vs old's") == 2,
              "one rounds column per build but the baseline")
        check(t[0][7] == "overlap / all below" and t[0][8] == "all above / all above",
              f"fwd 0.15 / 0.3 against 0.2 / 0.4 overlap, 0.45 all above; bwd 0.55 / 0.59 all below 0.6 / 0.6, "
              f"0.61 all above: {t[0][7:9]}")
        write(f"{d}/quick_1.txt", [row(a, "bf16", 0.15, 0.6)])
        r = run(f"old={d}/old_*.txt", f"quick={d}/quick_*.txt")
        check(table(r.stdout)[0][5] == "all below / overlap",
              f"fwd 0.15 all below 0.2 / 0.4, bwd 0.6 level with 0.6 / 0.6: {table(r.stdout)[0][5]}")

        r = run(f"old={d}/old_*.txt", f"new={d}/new_*.txt", "--ratio")
        check(table(r.stdout)[0][4] == "0.900 / 1.000", f"--ratio: {table(r.stdout)[0][4]}")

        write(f"{d}/bad_1.txt", [row(a, "bf16", 0.2, 0.6), row(a, "gproj", 0.2, 0.8, nan=5)])
        r = run(f"old={d}/old_*.txt", f"bad={d}/bad_*.txt")
        check(r.returncode != 0 and "bad_1.txt" in r.stderr and "NaN/Inf" in r.stderr and "gproj" in r.stderr,
              "a row with NaN/Inf outputs: refused, naming the file and the row")
        r = run(f"old={d}/old_*.txt", f"none={d}/nothing_*.txt")
        check(r.returncode != 0 and "matches no file" in r.stderr, "a pattern that matches nothing: refused")
        with open(f"{d}/empty_1.txt", "w") as f:
            f.write(HEAD)
        r = run(f"old={d}/old_*.txt", f"empty={d}/empty_*.txt")
        check(r.returncode != 0 and "empty_1.txt" in r.stderr and "no bench_attention row" in r.stderr,
              "a console with no rows: refused, naming it")
        r = run(f"{d}/old_1.txt")
        check(r.returncode != 0 and "NAME=GLOB" in r.stderr, "an argument that is not NAME=GLOB: refused")
    return summary()


if __name__ == "__main__":
    sys.exit(main())
