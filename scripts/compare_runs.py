#!/usr/bin/env python3
"""scripts/compare_runs.py - overlay matched runs and report the final gap to fp32.

Why: the question this project answers ("does the attention mode change
training?") is a comparison of runs that differ only in --attn. This script
reads each run's JSON-lines log (RUN_DIR/log.jsonl, written by both trainers),
plots loss, validation loss, gradient norm, key offset rho and the in-run dQ
error per run into PNG files, and prints a table of final losses and their gap
to the fp32 run (or to the first run when none is fp32).

Usage: scripts/compare_runs.py RUN_DIR [RUN_DIR ...] [--out DIR] [--smooth N] [--at-step N]
Labels are the run folders' names (the logged mode for bare .jsonl files).
The table compares every run at the same step: --at-step, or by default the
last step that all runs reached (a run stopped early, e.g. by a time limit,
would otherwise be compared at a different point of its schedule).
"""
import argparse
import json
import math
import os
import sys

# Series that are plotted when present in the logs: (key, y label, log scale, smoothed). --smooth
# averages only the series logged at every step; validation and diagnostics records are sparse (every
# --val-every / --diag-every steps), and a moving average over them would drag the first evaluation
# (10.99 nats at step 0) hundreds of steps into the curve.
SERIES = [
    ("loss", "train loss", False, True),
    ("val_loss", "validation loss", False, False),
    ("grad_norm", "gradient norm (before clipping)", True, True),
    ("rho_max", "key offset rho, max over layers and heads", True, False),
    ("probe_dq_err", "in-run dQ relative error vs fp64 recompute", True, False),
    ("key_bias_norm", "norm of the key bias (all layers)", True, False),
]
SMOOTHED = {key: smoothed for key, _, _, smoothed in SERIES}


def read_log(run_dir):
    path = run_dir if run_dir.endswith(".jsonl") else os.path.join(run_dir, "log.jsonl")
    if not os.path.isfile(path):
        sys.exit(f"compare_runs: error: no log at {path} (expected a run folder written with --out-dir)")
    rows = []
    with open(path) as f:
        lines = f.read().split("\n")
    while lines and not lines[-1].strip():
        lines.pop()
    for lineno, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            if lineno == len(lines):  # a run stopped while writing its last record
                print(f"note: {path}:{lineno}: last record cut short; ignored", file=sys.stderr)
                break
            sys.exit(f"compare_runs: error: {path}:{lineno} is not JSON ({e}); is the log damaged?")
    return path, rows


def mode_of(rows):
    return next((r["attn"] for r in rows if isinstance(r.get("attn"), str)), None)


def label_of(run_dir, rows):
    """The run folder's name (matched_runs.sh names folders by mode, and extra
    arms such as bf16_zkbg by mode plus arm); the logged mode for bare .jsonl files."""
    if run_dir.endswith(".jsonl"):
        return mode_of(rows) or os.path.basename(run_dir)
    return os.path.basename(os.path.normpath(run_dir))


def series(rows, key):
    pts = [(r["step"], r[key]) for r in rows if key in r and "step" in r and r[key] is not None]
    return [p for p in pts if isinstance(p[1], (int, float)) and math.isfinite(p[1])]


def plotted(rows, key, n):
    """The (steps, values) drawn for one run's series KEY with --smooth N: the per-step series averaged
    over the last N logged steps, the sparse ones (validation, diagnostics) as logged."""
    pts = series(rows, key)
    ys = [p[1] for p in pts]
    return [p[0] for p in pts], (smooth(ys, n) if SMOOTHED[key] else ys)


def smooth(values, n):
    if n <= 1:
        return values
    out, acc = [], []
    for v in values:
        acc.append(v)
        if len(acc) > n:
            acc.pop(0)
        out.append(sum(acc) / len(acc))
    return out


def median(values):
    """Median (NaN for none): step times, robust to the slow steps that run diagnostics or evals."""
    v = sorted(values)
    if not v:
        return float("nan")
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


def final_mean(pts, last=20):
    vals = [v for _, v in pts[-last:]]
    return sum(vals) / len(vals) if vals else float("nan")


def upto(pts, step):
    """The points logged at or before step (all of them for step None)."""
    return pts if step is None else [p for p in pts if p[0] <= step]


def last_value(pts):
    return pts[-1][1] if pts else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", help="run folders (each with log.jsonl) or .jsonl files")
    ap.add_argument("--out", default="compare", help="folder for the PNG plots (default: compare)")
    ap.add_argument("--smooth", type=int, default=1,
                    help="moving average over N logged steps for the per-step plots (train loss, gradient norm)")
    ap.add_argument("--at-step", type=int, default=None,
                    help="compare the runs at this step (default: the last step every run reached)")
    args = ap.parse_args()

    runs = []
    for d in args.runs:
        path, rows = read_log(d)
        runs.append((label_of(d, rows), path, rows))

    ref = next((r for r in runs if r[0] == "fp32"), None) or \
        next((r for r in runs if mode_of(r[2]) == "fp32"), runs[0])
    ends = [series(rows, "loss")[-1][0] for _, _, rows in runs if series(rows, "loss")]
    at = args.at_step
    if at is None and ends and min(ends) != max(ends):
        at = min(ends)
        print(f"note: the runs end at different steps ({min(ends)}..{max(ends)}); all are compared at step {at}")
    ref_train = final_mean(upto(series(ref[2], "loss"), at))
    ref_val = last_value(upto(series(ref[2], "val_loss"), at))
    print(f"{'run':<12} {'steps':>7} {'train loss (last 20)':>21} {'gap':>8} {'final val':>10} {'gap':>8}"
          f" {'max rho':>8} {'grad norm':>10} {'dQ err':>8} {'ms/step':>8}")
    for label, path, rows in runs:
        tr = upto(series(rows, "loss"), at)
        va = upto(series(rows, "val_loss"), at)
        rho = upto(series(rows, "rho_max"), at)
        gn = upto(series(rows, "grad_norm"), at)
        probe = upto(series(rows, "probe_dq_err"), at)
        t = final_mean(tr)
        v = last_value(va)
        print(f"{label:<12} {tr[-1][0] if tr else 0:>7} {t:>21.4f} {t - ref_train:>+8.4f} {v:>10.4f}"
              f" {v - ref_val:>+8.4f} {last_value(rho):>8.3g}"
              f" {final_mean(gn):>10.4g} {final_mean(probe, 5):>8.3g}"
              f" {median([v for _, v in series(rows, 'ms')[1:]]):>8.2f}")
    print(f"(gaps are relative to the '{ref[0]}' run: {ref[1]}; max rho is the last logged value, dQ err the"
          " mean of the last 5 in-run probes; ms/step is the median over logged steps after the first)")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("compare_runs: error: matplotlib is needed for the plots (Debian: apt-get install "
                 "python3-matplotlib); the table above was printed without it")
    os.makedirs(args.out, exist_ok=True)
    for key, ylabel, logy, smoothed in SERIES:
        if not any(series(rows, key) for _, _, rows in runs):
            continue
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for label, _, rows in runs:
            xs, ys = plotted(rows, key, args.smooth)
            if xs:
                ax.plot(xs, ys, label=label, lw=1.2, marker=None if smoothed else ".")
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        out = os.path.join(args.out, f"{key}.png")
        fig.savefig(out, dpi=110)
        plt.close(fig)
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
