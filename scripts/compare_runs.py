#!/usr/bin/env python3
"""scripts/compare_runs.py - compare runs that differ in --attn (and seed): plots, tables, verdicts.

Why: the question this project answers ("does BF16 attention spoil training, and does the fix work?") is
a comparison of runs that differ only in --attn, and one seed per mode is an anecdote. This script reads
each run's JSON-lines log (RUN_DIR/log.jsonl, written by both trainers), groups the runs by mode, and
reports only what the seeds support:
  - per metric (train loss, validation loss, gradient norm, max rho, in-run dQ error, key-bias norm:
    whatever the logs hold) one PNG in --out: per mode a band (min-max over its seeds) and every seed as
    a thin line; each attn_warning event of a run is a short vertical tick at the bottom of the axes;
  - a table per run and a table per mode: number of seeds, final train loss (mean over the last --last-k
    steps) and final validation loss with mean, std and min-max, the gap to fp32 (paired by seed where
    fp32 has the same seed, else the difference of the means), and per seed whether and where it broke;
  - one verdict line per mode, and the early-warning record: first warning per run, lead time (break
    step - first warning step) for runs that broke, false alarms (warnings in runs that never broke);
  - --threshold-sweep: for warning thresholds around the defaults, the lead each would have given before
    each break and the runs that never broke but crossed it, per mode, from the diag records;
  - per run that broke, its trace (--trace-every N steps, default 2000): train loss and gradient norm
    beside the key offset, max |q| and max logit of the layer whose offset rose highest in the run, and
    the same layer of the fp32 run of the same seed: the order in which things went wrong;
  - --json FILE: the same numbers for machine checks;
  - --thin-to DIR: per-run thinned logs (every --thin-every-th step record, the last 200 step records,
    every non-finite step and every other record except text samples) that --from-thinned DIR reads
    back, so a figure can be redrawn from the thinned logs kept next to it (each thinned log carries the
    break found on its full log, with the definition used: too few step records survive thinning to find it
    again).

Grouping: a run folder named MODE, MODE_zkbg (the gauge arm), MODE_sSEED or MODE_zkbg_sSEED (the names
scripts/matched_runs.sh gives) is grouped by that name; any other run by its log's config record (the
--attn flag, plus _zkbg with --zero-key-bias-grad 1, and its --seed).

"Broke" (printed with the table; --break-margin M, --break-steps N, --break-ema E): a run broke at step s
when the exponential moving average of its train loss (span E steps) rises more than M nats above its
own running minimum at s and stays above it through step s + N; or when a train loss is non-finite, or
the log ends in a divergence stop: the trainer's "stop" event with a reason "diverged: ..." (a non-finite
loss or gradient norm, or a loss past --diverge-margin; train/run_driver.c) or "non-finite ...".

The comparison step: --at-step, else the last step every run reached, not counting runs that ended at a
divergence stop (a run stopped early by a time limit would otherwise be compared at another point of
its schedule). Breaks and warnings are read from the whole log.

A bad line in a log (invalid UTF-8, JSON cut short by a killed run) is skipped and named once per file.

Usage: scripts/compare_runs.py RUN_DIR [RUN_DIR ...] [--out DIR] [--json FILE] [--smooth N] [--at-step N]
           [--last-k K] [--break-margin M] [--break-steps N] [--break-ema E] [--thin-to DIR [--thin-every N]]
       scripts/compare_runs.py --from-thinned DIR [--out DIR] ...   (every DIR/*/log.jsonl)
"""
import argparse
import bisect
import glob
import io
import json
import math
import os
import re
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
    ("probe_dq_err", "in-run dQ relative error vs recompute", True, False),
    ("key_bias_norm", "norm of the key bias (all layers)", True, False),
]
SMOOTHED = {key: smoothed for key, _, _, smoothed in SERIES}
MODES = ["fp32", "bf16", "repair", "gproj", "cudnn"]
LABEL_RE = re.compile(r"^(fp32|bf16|repair|gproj|cudnn)(_zkbg)?(?:_s(\d+))?$")
THIN_KEEP_LAST = 200  # step records kept in full at the end of a thinned log (the final-loss window)


def fnum(x):
    """x as a float when it is a finite JSON number, else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return float(x) if math.isfinite(x) else None


# ---------------------------------------------------------------- reading logs
def read_log(run_dir):
    """(path, rows) of one run; unreadable lines are skipped and named once (stderr)."""
    path = run_dir if run_dir.endswith(".jsonl") else os.path.join(run_dir, "log.jsonl")
    if not os.path.isfile(path):
        sys.exit(f"compare_runs: error: no log at {path} (expected a run folder written with --out-dir)")
    with open(path, "rb") as f:
        raw = f.read().split(b"\n")
    rows, bad, replaced = [], [], []
    for lineno, b in enumerate(raw, 1):
        if not b.strip():
            continue
        line = b.decode("utf-8", errors="replace")
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            bad.append(lineno)
            continue
        if not isinstance(rec, dict):
            bad.append(lineno)
            continue
        if "\ufffd" in line and "\ufffd".encode() not in b:
            replaced.append(lineno)
        rows.append(rec)
    if bad:
        lines = ", ".join(map(str, bad[:10])) + (f" and {len(bad) - 10} more" if len(bad) > 10 else "")
        print(f"note: {path}: skipped {len(bad)} unreadable line(s) (not JSON or cut short): line {lines}",
              file=sys.stderr)
    if replaced:
        print(f"note: {path}: invalid UTF-8 replaced in line {', '.join(map(str, replaced[:10]))} (records kept)",
              file=sys.stderr)
    return path, rows


def config_of(rows):
    """The flags of the last config/resume record ({} when none)."""
    cfg = {}
    for r in rows:
        if r.get("event") in ("config", "resume") and isinstance(r.get("flags"), dict):
            cfg = r["flags"]
    return cfg


def mode_of(rows):
    cfg = config_of(rows)
    if isinstance(cfg.get("attn"), str):
        return cfg["attn"]
    return next((r["attn"] for r in rows if isinstance(r.get("attn"), str)), None)


def group_and_seed(label, rows):
    """(group, seed) of a run: from its MODE[_zkbg][_sSEED] name, else from its config record."""
    m = LABEL_RE.match(label)
    cfg = config_of(rows)
    if m:
        seed = int(m.group(3)) if m.group(3) else (int(cfg["seed"]) if fnum(cfg.get("seed")) is not None else None)
        return m.group(1) + (m.group(2) or ""), seed
    mode = mode_of(rows)
    if mode is None:
        return label, None
    arm = "_zkbg" if cfg.get("zero-key-bias-grad") in (1, True, "1") else ""
    return mode + arm, (int(cfg["seed"]) if fnum(cfg.get("seed")) is not None else None)


def step_records(rows):
    """The per-step records (train loss), as the trainers write them: a "loss" and no "event"."""
    return [r for r in rows if "loss" in r and "event" not in r and isinstance(r.get("step"), int)]


def series(rows, key):
    pts = [(r["step"], fnum(r.get(key))) for r in rows if key in r and isinstance(r.get("step"), int)]
    return [p for p in pts if p[1] is not None]


# ---------------------------------------------------------------- per-run numbers
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


def plotted(rows, key, n):
    """The (steps, values) drawn for one run's series KEY with --smooth N: the per-step series averaged
    over the last N logged steps, the sparse ones (validation, diagnostics) as logged."""
    pts = series(rows, key)
    ys = [p[1] for p in pts]
    return [p[0] for p in pts], (smooth(ys, n) if SMOOTHED[key] else ys)


def median(values):
    """Median (NaN for none): step times, robust to the slow steps that run diagnostics or evals."""
    v = sorted(values)
    if not v:
        return float("nan")
    return v[len(v) // 2] if len(v) % 2 else 0.5 * (v[len(v) // 2 - 1] + v[len(v) // 2])


def mean(values):
    return sum(values) / len(values) if values else float("nan")


def std(values):
    """Sample standard deviation (NaN for fewer than two values)."""
    if len(values) < 2:
        return float("nan")
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def upto(pts, step):
    return pts if step is None else [p for p in pts if p[0] <= step]


def final_train(pts, at, last_k):
    """Mean train loss over the steps in (end - last_k, end], end = the last logged step <= at."""
    pts = upto(pts, at)
    if not pts:
        return float("nan")
    end = pts[-1][0]
    return mean([v for s, v in pts if s > end - last_k])


def diverged_stop(r):
    """1 for the stop record of a run its trainer stopped as diverged (train/run_driver.c's stop_diverged:
    "diverged: the gradient norm is not finite", "diverged: the loss is NaN or infinite", "diverged: the loss
    ... --diverge-margin ..."), or of a log that says "non-finite ..."."""
    reason = str(r.get("reason", ""))
    return r.get("event") == "stop" and (reason.startswith("diverged") or reason.startswith("non-finite"))


def find_break(rows, margin, span, ema_steps):
    """(step, why) of the first break of a run, or (None, None); see the module comment."""
    bad = next((r for r in step_records(rows) if fnum(r.get("loss")) is None), None)
    stop = next((r for r in rows if diverged_stop(r) and isinstance(r.get("step"), int)), None)
    found = [(bad["step"], "non-finite loss")] if bad else []
    if stop:
        found.append((stop["step"], f"stop event: {stop.get('reason')}"))
    alpha = 2.0 / (ema_steps + 1)
    ema, prev, run_min, start = None, None, float("inf"), None
    for s, v in series(rows, "loss"):
        # EMA per step, also across gaps in the steps (a thinned log): the weight of the old value decays
        # by (1 - alpha) for every step in between
        ema = v if ema is None else ema + (1 - (1 - alpha) ** max(s - prev, 1)) * (v - ema)
        prev = s
        if ema > run_min + margin:
            start = s if start is None else start
            if s - start >= span:
                found.append((start, f"loss EMA > running minimum + {margin:g} nats for {span} steps"))
                break
        else:
            start = None
        run_min = min(run_min, ema)
    return min(found) if found else (None, None)


def run_break(rows, args):
    """find_break on a full log. A thinned log keeps too few step records for the EMA test (one sample in
    hundreds of steps is noise, not a level), so it carries the break that --thin-to found on the full log,
    with the definition used; a different definition asked of a thinned log is refused."""
    head = rows[0] if rows and rows[0].get("event") == "thinned" else None
    if head is None or "break_definition" not in head:
        return find_break(rows, args.break_margin, args.break_steps, args.break_ema)
    asked = {"margin": args.break_margin, "steps": args.break_steps, "ema": args.break_ema}
    if head["break_definition"] != asked:
        sys.exit(f"compare_runs: error: {head.get('source')} is thinned: its breaks were found on the full log with "
                 f"{head['break_definition']}, not {asked}; run on the full logs for another definition")
    return tuple(head["break"]) if head["break"] else (None, None)


def crashed(rows):
    """1 when the run ended diverged (a null step loss or a divergence stop, diverged_stop)."""
    return any(diverged_stop(r) for r in rows) or any(fnum(r.get("loss")) is None for r in step_records(rows))


def warnings_of(rows):
    return [r for r in rows if r.get("event") == "attn_warning" and isinstance(r.get("step"), int)]


def fmt_step(s):
    if s is None:
        return "-"
    if s < 1000:
        return str(s)
    return f"{s / 1000:.0f}k" if s >= 100000 else f"{s / 1000:.3g}k"


def fmt(x, spec="+.3f"):
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


# ---------------------------------------------------------------- per-mode numbers and verdicts
def order_groups(groups):
    def key(g):
        base = g.replace("_zkbg", "")
        return (MODES.index(base) if base in MODES else len(MODES), g != base, g)
    return sorted(groups, key=key)


def gap_stats(mode_runs, ref_runs, field):
    """The gap of field (final train/val loss) to fp32: paired by seed when every seed of the mode has an
    fp32 run of the same seed, else the difference of the means (spread: the standard error)."""
    have = [r for r in mode_runs if not math.isnan(r[field])]
    mine = {r["seed"]: r[field] for r in have}
    ref = {r["seed"]: r[field] for r in ref_runs if not math.isnan(r[field])}
    if not mine or not ref:
        return None
    if len(mine) == len(have) and all(s in ref for s in mine):
        gaps = [mine[s] - ref[s] for s in mine]
        return {"kind": "paired", "n": len(gaps), "mean": mean(gaps), "std": std(gaps), "min": min(gaps),
                "max": max(gaps)}
    a, b = list(mine.values()), list(ref.values())
    se = math.sqrt((std(a) ** 2 if len(a) > 1 else 0) / len(a) + (std(b) ** 2 if len(b) > 1 else 0) / len(b))
    return {"kind": "unpaired", "n": len(a), "mean": mean(a) - mean(b), "std": se if len(a) > 1 or len(b) > 1
            else float("nan"), "min": min(a) - max(b), "max": max(a) - min(b)}


def summarise(runs, groups):
    out = {}
    ref = groups.get("fp32", [])
    for g in order_groups(groups):
        rs = groups[g]
        tr = [r["train"] for r in rs if not math.isnan(r["train"])]
        va = [r["val"] for r in rs if not math.isnan(r["val"])]
        unbroken = [r for r in rs if r["break_step"] is None]
        out[g] = {
            "seeds": len(rs), "seed_list": [r["seed"] for r in rs],
            "train": {"n": len(tr), "mean": mean(tr), "std": std(tr), "min": min(tr, default=float("nan")),
                      "max": max(tr, default=float("nan"))},
            "val": {"n": len(va), "mean": mean(va), "std": std(va), "min": min(va, default=float("nan")),
                    "max": max(va, default=float("nan"))},
            "broke": [{"run": r["label"], "seed": r["seed"], "step": r["break_step"], "why": r["break_why"]}
                      for r in rs if r["break_step"] is not None],
            "gap_train": gap_stats(unbroken, ref, "train") if g != "fp32" else None,
            "gap_val": gap_stats(unbroken, ref, "val") if g != "fp32" else None,
            "unbroken": len(unbroken),
        }
    return out


def verdict(g, s, ref):
    n = s["seeds"]
    broke = sorted((b["step"] for b in s["broke"]), key=lambda x: x if x is not None else -1)
    parts = []
    if n < 3:
        parts.append(f"anecdote ({n} seed{'s' if n != 1 else ''})")
    if broke:
        names = [fmt_step(b) for b in broke]
        where = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
        parts.append(f"broke in {len(broke)} of {n} seeds, at {where}")
    else:
        parts.append(f"0 of {n} broke")
    if g == "fp32":
        t = s["train"]
        parts.append(f"reference: final train loss {fmt(t['mean'], '.3f')} +- {fmt(t['std'], '.3f')}"
                     f" (min-max {fmt(t['min'], '.3f')}..{fmt(t['max'], '.3f')})")
        return f"{g}: " + "; ".join(parts)
    gap = s["gap_train"]
    if ref is None:
        parts.append("no fp32 runs to compare with")
    elif gap is None:
        parts.append("no final loss to compare (every seed broke or ended before the comparison step)")
    else:
        txt = f"gap to fp32 {fmt(gap['mean'])} +- {fmt(gap['std'], '.3f')}" + (
            f" (the {s['unbroken']} unbroken)" if broke else "")
        rt, mt = ref["train"], s["train"]
        if n < 3 or ref["seeds"] < 3:
            if n >= 3:
                txt += f" (fp32 has {ref['seeds']} seed{'s' if ref['seeds'] != 1 else ''}: no spread to judge by)"
            parts.append(txt)
        elif not broke and rt["min"] <= mt["mean"] <= rt["max"]:
            parts.append(f"final loss within the fp32 seed spread ({n} seeds); {txt}")
        elif mt["max"] < rt["min"] or mt["min"] > rt["max"]:
            side = "above" if mt["min"] > rt["max"] else "below"
            parts.append(f"final loss {side} fp32's in every seed: {txt} (outside the fp32 seed spread)")
        else:
            parts.append(f"{txt} (inside the spread: not a result)")
    return f"{g}: " + "; ".join(parts)


# ---------------------------------------------------------------- thinning
def save_png(fig, path):
    """The figure as a 256-colour PNG: a few colours on white lose nothing visible, and the file is about a
    third of the RGBA one, which matters for plots kept in the repository. Pillow comes with matplotlib."""
    from PIL import Image
    buf = io.BytesIO()
    fig.savefig(buf, dpi=110)
    buf.seek(0)
    Image.open(buf).convert("RGB").quantize(colors=256).save(path, optimize=True)


def thin(runs, out_dir, every, at, args):
    """DIR/RUN/log.jsonl per run: every `every`-th step record, every step record of the last THIN_KEEP_LAST
    steps of the run and of the THIN_KEEP_LAST steps up to the comparison step `at` (so the final losses
    read back the same for --last-k up to that), every non-finite step, and every other record except the
    text samples; a first record {"event": "thinned", ...} says how it was made."""
    for r in runs:
        rows = r["rows"]
        steps = step_records(rows)
        end = steps[-1]["step"] if steps else 0
        kept = [{"event": "thinned", "every": every, "keep_last": THIN_KEEP_LAST, "at_step": at, "source": r["path"],
                 "break_definition": {"margin": args.break_margin, "steps": args.break_steps, "ema": args.break_ema},
                 "break": [r["break_step"], r["break_why"]] if r["break_step"] is not None else None}]
        for x in rows:
            if x.get("event") == "sample":
                continue
            if "loss" in x and "event" not in x and isinstance(x.get("step"), int):
                s = x["step"]
                full = s > end - THIN_KEEP_LAST or (at is not None and at - THIN_KEEP_LAST < s <= at)
                if s % every and not full and fnum(x.get("loss")) is not None:
                    continue
            kept.append(x)
        d = os.path.join(out_dir, r["label"])
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "log.jsonl"), "w") as f:
            for x in kept:
                f.write(json.dumps(x) + "\n")
        print(f"wrote {os.path.join(d, 'log.jsonl')} ({len(kept)} of {len(rows)} records)")


# --threshold-sweep: the warning thresholds tried against the logged diagnostics (the defaults, 20 and 5%, among
# them): (kind, diag field, thresholds)
SWEEP_KINDS = (("rho", "rho_max", (10.0, 20.0, 50.0, 100.0)),
               ("dq_err", "probe_dq_err", (0.02, 0.05, 0.10, 0.50)))


def threshold_sweep(runs):
    """Per kind and threshold, what a warning at that threshold would have said over these runs, from their diag
    records (the largest rho over layers, the in-run probe's dQ error): for each run that broke, the lead (break
    step - the first diag step above the threshold; None when none came before the break); per mode, the runs
    that never broke and still crossed it (false alarms)."""
    out = []
    for kind, field, thresholds in SWEEP_KINDS:
        values = [(r, series(r["rows"], field)) for r in runs]
        for th in thresholds:
            row = {"kind": kind, "threshold": th, "lead": {}, "false_alarms": {}, "unbroken": {}}
            for r, pts in values:
                first = next((s for s, v in pts if v > th), None)
                if r["break_step"] is not None:
                    row["lead"][r["label"]] = r["break_step"] - first if first is not None and \
                        first < r["break_step"] else None
                else:
                    row["unbroken"][r["group"]] = row["unbroken"].get(r["group"], 0) + 1
                    row["false_alarms"][r["group"]] = row["false_alarms"].get(r["group"], 0) + (first is not None)
            out.append(row)
    return out


def print_threshold_sweep(sweep, groups):
    print("threshold sweep (from the diag records: max rho over layers, the in-run probe's dQ error):")
    print(f"  {'kind':<7} {'threshold':>9}  {'lead before each break (steps)':<34} false alarms (unbroken runs that crossed)")
    for row in sweep:
        th = f"{row['threshold']:g}" if row["kind"] == "rho" else f"{100 * row['threshold']:g}%"
        lead = ", ".join(f"{k} {'-' if v is None else v}" for k, v in sorted(row["lead"].items())) or "no run broke"
        fa = ", ".join(f"{g} {row['false_alarms'][g]}/{row['unbroken'][g]}" for g in order_groups(groups)
                       if g in row["unbroken"])
        print(f"  {row['kind']:<7} {th:>9}  {lead:<34} {fa}")


def break_trace(run, ref, every):
    """How a broken run got there, from its diag records: every `every` steps up to its last diag, the train loss
    and gradient norm of the nearest step record at or before, and the key offset rho, max |q| and max logit of
    the layer whose rho rose highest in the run (its in-run probe's dQ error where the probe was on that layer),
    with the same layer of `ref` (fp32, same seed) beside it. None without per-layer diagnostics."""
    diags = [d for d in run["rows"] if d.get("event") == "diag" and isinstance(d.get("step"), int)
             and isinstance(d.get("layer_rho_max"), list)]
    if not diags:
        return None
    peak = max(((fnum(v) or 0.0, l) for d in diags for l, v in enumerate(d["layer_rho_max"])), default=(0.0, 0))
    layer = peak[1]
    steps = sorted(step_records(run["rows"]), key=lambda x: x["step"])
    step_numbers = [x["step"] for x in steps]
    ref_diag = {d["step"]: d for d in (ref["rows"] if ref else []) if d.get("event") == "diag"}

    def at(d, key):
        v = d.get(key)
        return fnum(v[layer]) if isinstance(v, list) and layer < len(v) else None

    rows = []
    for d in diags:
        if d["step"] % every and d is not diags[-1]:
            continue
        i = bisect.bisect_right(step_numbers, d["step"])
        rec = steps[i - 1] if i else None
        rd = ref_diag.get(d["step"])
        rows.append({"step": d["step"], "loss": fnum(rec.get("loss")) if rec else None,
                     "grad_norm": fnum(rec.get("grad_norm")) if rec else None,
                     "rho": at(d, "layer_rho_max"), "q": at(d, "layer_q_absmax"), "logit": at(d, "layer_logit_max"),
                     "probe_dq_err": fnum(d.get("probe_dq_err")) if d.get("probe_layer") == layer else None,
                     "ref_rho": at(rd, "layer_rho_max") if rd else None, "ref_q": at(rd, "layer_q_absmax") if rd
                     else None, "ref_logit": at(rd, "layer_logit_max") if rd else None})
    return {"layer": layer, "ref": ref["label"] if ref else None, "every": every, "rows": rows}


def print_trace(run, ref, t):
    g = lambda v: fmt(v, ".3g")  # noqa: E731
    pct = lambda v: "" if v is None else f"{100 * v:.3g}%"  # noqa: E731
    print(f"how {run['label']} broke (at step {run['break_step']}): layer {t['layer']}, the one whose key offset rose"
          f" highest, every {t['every']} steps{'; beside it ' + t['ref'] + ', same layer' if ref else ''}")
    print(f"{'step':>7} {'loss':>7} {'grad norm':>10} {'rho':>7} {'max|q|':>8} {'max logit':>10} {'probe dQ':>9}"
          + (f" | {'rho':>6} {'max|q|':>7} {'max logit':>9}" if ref else ""))
    for x in t["rows"]:
        print(f"{x['step']:>7} {g(x['loss']):>7} {g(x['grad_norm']):>10} {g(x['rho']):>7} {g(x['q']):>8}"
              f" {g(x['logit']):>10} {pct(x['probe_dq_err']):>9}"
              + (f" | {g(x['ref_rho']):>6} {g(x['ref_q']):>7} {g(x['ref_logit']):>9}" if ref else ""))


def band(curves):
    """Per mode band over seeds: (grid, lo, hi, have) on the union of the seeds' steps, each seed
    interpolated linearly inside its own range only; `have` marks the steps where at least two seeds
    have a value (elsewhere lo/hi are NaN and no band is drawn)."""
    import numpy as np
    grid = np.unique(np.concatenate([np.asarray(x, float) for x, _ in curves]))
    vals = np.full((len(curves), len(grid)), np.nan)
    for i, (x, y) in enumerate(curves):
        x, y = np.asarray(x, float), np.asarray(y, float)
        inside = (grid >= x[0]) & (grid <= x[-1])
        vals[i, inside] = np.interp(grid[inside], x, y)
    have = np.sum(~np.isnan(vals), axis=0) >= 2
    lo = np.full(len(grid), np.nan)
    hi = np.full(len(grid), np.nan)
    lo[have] = np.nanmin(vals[:, have], axis=0)
    hi[have] = np.nanmax(vals[:, have], axis=0)
    return grid, lo, hi, have


# ---------------------------------------------------------------- plots
def plot(runs, groups, args):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy  # noqa: F401 (band() needs it)
    except ImportError:
        sys.exit("compare_runs: error: matplotlib (and numpy) are needed for the plots (Debian: apt-get install "
                 "python3-matplotlib); the tables above were printed without them")
    os.makedirs(args.out, exist_ok=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    written = []
    for key, ylabel, logy, smoothed in SERIES:
        if not any(series(r["rows"], key) for r in runs):
            continue
        fig, ax = plt.subplots(figsize=(7.5, 4.5))
        for gi, g in enumerate(order_groups(groups)):
            c = colours[gi % len(colours)]
            curves = []
            for r in groups[g]:
                xs, ys = plotted(r["rows"], key, args.smooth)
                if xs:
                    curves.append((xs, ys))
                    ax.plot(xs, ys, color=c, lw=0.7, alpha=0.85, marker=None if smoothed else ".", ms=2)
            if len(curves) >= 2:
                grid, lo, hi, have = band(curves)
                if have.any():
                    ax.fill_between(grid, lo, hi, where=have, color=c, alpha=0.2, lw=0)
            n = len(groups[g])
            ax.plot([], [], color=c, lw=6, alpha=0.4, label=f"{g} ({n} seed{'s' if n != 1 else ''})")
            for r in groups[g]:
                for w in r["warnings"]:
                    ax.axvline(w["step"], ymin=0, ymax=0.05, color=c, lw=1.2)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title("band: min-max over seeds; lines: seeds; ticks at the bottom: attn_warning", fontsize=8)
        fig.tight_layout()
        out = os.path.join(args.out, f"{key}.png")
        save_png(fig, out)
        plt.close(fig)
        written.append(out)
        print(f"wrote {out}")
    return written


# ---------------------------------------------------------------- main
def json_clean(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: json_clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [json_clean(v) for v in x]
    return x


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="*", help="run folders (each with log.jsonl) or .jsonl files")
    ap.add_argument("--from-thinned", metavar="DIR", help="read every DIR/*/log.jsonl (written by --thin-to)")
    ap.add_argument("--out", default="compare", help="folder for the PNG plots (default: compare)")
    ap.add_argument("--json", metavar="FILE", help="also write the per-run and per-mode numbers as JSON")
    ap.add_argument("--no-plots", action="store_true", help="tables only")
    ap.add_argument("--smooth", type=int, default=1,
                    help="moving average over N logged steps for the per-step plots (train loss, gradient norm)")
    ap.add_argument("--at-step", type=int, default=None,
                    help="compare the runs at this step (default: the last step every run reached)")
    ap.add_argument("--last-k", type=int, default=20,
                    help="final train loss = mean over the last K steps up to the comparison step (default 20)")
    ap.add_argument("--break-margin", type=float, default=0.5,
                    help="broke: loss EMA this many nats above its running minimum (default 0.5)")
    ap.add_argument("--break-steps", type=int, default=100,
                    help="... for at least this many steps (default 100)")
    ap.add_argument("--break-ema", type=int, default=50, help="span in steps of the loss EMA (default 50)")
    ap.add_argument("--thin-to", metavar="DIR", help="write thinned per-run logs DIR/RUN/log.jsonl")
    ap.add_argument("--thin-every", type=int, default=10, help="keep every Nth step record (default 10)")
    ap.add_argument("--threshold-sweep", action="store_true",
                    help="what warnings at other thresholds (rho 10/20/50/100, dQ error 2/5/10/50%%) would have "
                         "said: the lead before each break and the false alarms per mode, from the diag records")
    ap.add_argument("--trace-every", type=int, default=2000,
                    help="the trace of each run that broke (its fastest-drifting layer beside the same seed's "
                         "fp32 run): a row every N steps of its diag records (default 2000)")
    args = ap.parse_args()
    if args.last_k < 1 or args.break_steps < 0 or args.break_ema < 1 or args.thin_every < 1 or args.break_margin <= 0:
        sys.exit("compare_runs: error: --last-k, --break-ema and --thin-every must be >= 1, --break-steps >= 0 and "
                 "--break-margin > 0")
    if args.smooth < 1 or (args.at_step is not None and args.at_step < 0):
        sys.exit("compare_runs: error: --smooth must be >= 1 and --at-step >= 0")
    if args.json and os.path.isdir(args.json):
        sys.exit(f"compare_runs: error: --json {args.json} is a folder: name a file (e.g. {args.json}/compare.json)")
    if not args.no_plots and os.path.exists(args.out) and not os.path.isdir(args.out):
        sys.exit(f"compare_runs: error: --out {args.out} is a file: the plots go into a folder; name another")
    sources = list(args.runs)
    if args.from_thinned:
        found = sorted(glob.glob(os.path.join(args.from_thinned, "*", "log.jsonl")))
        if not found:
            sys.exit(f"compare_runs: error: --from-thinned {args.from_thinned}: no RUN/log.jsonl in it "
                     "(write them with --thin-to)")
        sources += [os.path.dirname(p) for p in found]
    if not sources:
        sys.exit("compare_runs: error: no runs given (run folders, .jsonl files or --from-thinned DIR)")

    runs = []
    for d in sources:
        path, rows = read_log(d)
        label = (mode_of(rows) or os.path.basename(d)) if d.endswith(".jsonl") else \
            os.path.basename(os.path.normpath(d))
        group, seed = group_and_seed(label, rows)
        brk, why = run_break(rows, args)
        runs.append({"label": label, "path": path, "rows": rows, "group": group, "seed": seed,
                     "break_step": brk, "break_why": why, "warnings": warnings_of(rows)})
    labels = [r["label"] for r in runs]
    if len(set(labels)) != len(labels):
        sys.exit(f"compare_runs: error: two runs share a name ({labels}); give run folders distinct names")

    # the comparison step
    at = args.at_step
    ends = {r["label"]: series(r["rows"], "loss")[-1][0] for r in runs if series(r["rows"], "loss")
            and not crashed(r["rows"])}
    # (also when the runs that did not diverge all end together: the diverged ones then have no final loss)
    if at is None and ends and (min(ends.values()) != max(ends.values()) or len(ends) < len(runs)):
        at = min(ends.values())
        if at != max(ends.values()):
            short = [k for k, v in ends.items() if v == at]
            print(f"note: the runs end at different steps ({at}..{max(ends.values())}); all are compared at step"
                  f" {at}, where {', '.join(short)} ended (--at-step to choose another)")

    if args.thin_to:
        thin(runs, args.thin_to, args.thin_every, at, args)

    # The validation step: an evaluation record carries the steps completed before it, so the one after training
    # record `at` is at+1 (a finished run logs its final eval there). Compared is the latest evaluation step up to
    # at+1 that every run reaching `at` logged, so that all runs are compared at the same evaluation.
    losses = {id(r): (series(r["rows"], "loss"), series(r["rows"], "val_loss")) for r in runs}
    val_at = at
    if at is not None:
        common = None
        for r in runs:
            train_pts, val_pts = losses[id(r)]
            if not train_pts or train_pts[-1][0] < at:
                continue  # a run that did not reach `at`
            steps = {s for s, _ in upto(val_pts, at + 1)}
            common = steps if common is None else common & steps
        if common:
            val_at = max(common)

    groups = {}
    for r in runs:
        train_pts, val_pts = losses[id(r)]
        tr = upto(train_pts, at)
        r["steps"] = tr[-1][0] if tr else None
        r["train"] = final_train(train_pts, at, args.last_k)
        va = upto(val_pts, val_at)
        r["val"] = va[-1][1] if va else float("nan")
        if at is not None and r["steps"] is not None and r["steps"] < at:
            r["train"] = r["val"] = float("nan")  # ended (non-finite) before the comparison step
        rho = upto(series(r["rows"], "rho_max"), at)
        r["rho"] = rho[-1][1] if rho else float("nan")
        probe = upto(series(r["rows"], "probe_dq_err"), at)
        r["dq"] = mean([v for _, v in probe[-5:]])
        r["ms"] = median([v for _, v in series(r["rows"], "ms")[1:]])
        r["first_warning"] = r["warnings"][0]["step"] if r["warnings"] else None
        groups.setdefault(r["group"], []).append(r)
    for g in groups:
        groups[g].sort(key=lambda r: (r["seed"] is None, r["seed"] or 0, r["label"]))

    # the per-run table; gaps against the fp32 run of the same seed (else fp32's mean)
    ref_by_seed = {r["seed"]: r for r in groups.get("fp32", [])}
    ref_mean = {f: mean([r[f] for r in groups.get("fp32", []) if not math.isnan(r[f])]) for f in ("train", "val")}
    print(f"{'run':<18} {'mode':<10} {'seed':>5} {'steps':>7} {'train':>8} {'gap':>8} {'val':>8} {'gap':>8}"
          f" {'max rho':>8} {'dQ err':>8} {'broke':>7} {'warned':>7} {'ms/step':>8}")
    for g in order_groups(groups):
        for r in groups[g]:
            ref = ref_by_seed.get(r["seed"])
            gt = r["train"] - (ref["train"] if ref else ref_mean["train"])
            gv = r["val"] - (ref["val"] if ref else ref_mean["val"])
            r["gap_train"], r["gap_val"] = gt, gv
            print(f"{r['label']:<18} {g:<10} {r['seed'] if r['seed'] is not None else '-':>5}"
                  f" {r['steps'] if r['steps'] is not None else '-':>7} {fmt(r['train'], '.4f'):>8}"
                  f" {fmt(gt, '+.4f'):>8} {fmt(r['val'], '.4f'):>8} {fmt(gv, '+.4f'):>8} {fmt(r['rho'], '.3g'):>8}"
                  f" {fmt(r['dq'], '.3g'):>8} {fmt_step(r['break_step']):>7} {fmt_step(r['first_warning']):>7}"
                  f" {fmt(r['ms'], '.2f'):>8}")
    print(f"(train: mean loss over the last {args.last_k} steps up to {'step ' + str(at) if at is not None else 'the end'};"
          " val: the last validation then; gaps to the fp32 run of the same seed, else to fp32's mean;"
          " max rho: last logged; dQ err: mean of the last 5 in-run probes; broke / warned: first step)")

    stats = summarise(runs, groups)
    print()
    print(f"{'mode':<10} {'seeds':>5} {'train mean':>10} {'std':>7} {'min..max':>15} {'val mean':>9} {'std':>7}"
          f" {'gap to fp32':>12} {'+-':>6} {'gap min..max':>17} {'broke':>6}")
    for g, s in stats.items():
        t, v, gp = s["train"], s["val"], s["gap_train"]
        print(f"{g:<10} {s['seeds']:>5} {fmt(t['mean'], '.4f'):>10} {fmt(t['std'], '.4f'):>7}"
              f" {fmt(t['min'], '.3f') + '..' + fmt(t['max'], '.3f'):>15} {fmt(v['mean'], '.4f'):>9}"
              f" {fmt(v['std'], '.4f'):>7} {fmt(gp and gp['mean'], '+.4f'):>12} {fmt(gp and gp['std'], '.4f'):>6}"
              f" {(fmt(gp['min'], '+.3f') + '..' + fmt(gp['max'], '+.3f')) if gp else 'n/a':>17}"
              f" {len(s['broke'])}/{s['seeds']:<4}")
    print("(std: sample standard deviation over seeds; gap: per seed against fp32 of the same seed ('paired'),"
          " else the difference of the means with its standard error ('unpaired'); seeds that broke are left"
          " out of the gap)")
    for g, s in stats.items():
        if s["train"]["n"] < s["seeds"]:
            ended = [f"{r['label']} ended at step {r['steps']}" for r in groups[g] if math.isnan(r["train"])]
            print(f"  {g}: train and val over {s['train']['n']} of {s['seeds']} seeds ({', '.join(ended)},"
                  f" before step {at})")
        for b in s["broke"]:
            print(f"  {g} seed {b['seed']}: broke at step {b['step']} ({b['why']})")
    definition = (f"broke = the train-loss EMA (span {args.break_ema} steps) rises more than {args.break_margin:g}"
                  f" nats above its running minimum and stays there for {args.break_steps} steps (the step where"
                  " it first rose is reported), or a non-finite loss, or the trainer's divergence stop")
    print(definition)

    print()
    print("verdicts (fewer than 3 seeds = anecdote):")
    verdicts = {g: verdict(g, s, stats.get("fp32")) for g, s in stats.items()}
    for g in verdicts:
        print("  " + verdicts[g])

    # early warning
    warned = [r for r in runs if r["warnings"]]
    broke_runs = [r for r in runs if r["break_step"] is not None]
    unbroken = [r for r in runs if r["break_step"] is None]
    false_alarm_runs = [r for r in unbroken if r["warnings"]]
    lead = {}
    for r in broke_runs:
        fw = r["first_warning"]
        lead[r["label"]] = None if fw is None else r["break_step"] - fw
    warn_summary = {
        "runs_warned": len(warned), "runs_broke": len(broke_runs),
        "false_alarm_runs": [r["label"] for r in false_alarm_runs],
        "false_alarm_warnings": sum(len(r["warnings"]) for r in false_alarm_runs),
        "lead_steps": lead,
    }
    if warned or broke_runs:
        print()
        print("early warning (attn_warning events):")
        for r in broke_runs:
            l = lead[r["label"]]
            txt = "no warning before it" if l is None or l < 0 else f"first warning at step {r['first_warning']}, " \
                  f"lead {l} steps"
            print(f"  {r['label']}: broke at step {r['break_step']}; {txt}")
        print(f"  false alarms: {len(false_alarm_runs)} of {len(unbroken)} runs that never broke warned"
              f" ({warn_summary['false_alarm_warnings']} warnings"
              f"{': ' + ', '.join(warn_summary['false_alarm_runs']) if false_alarm_runs else ''})")

    sweep = threshold_sweep(runs) if args.threshold_sweep else None
    if sweep:
        print()
        print_threshold_sweep(sweep, groups)

    traces = {}
    for r in broke_runs:
        ref = next((x for x in groups.get("fp32", []) if x["seed"] == r["seed"]), None)
        t = break_trace(r, ref, args.trace_every)
        if t:
            traces[r["label"]] = t
            print()
            print_trace(r, ref, t)

    if args.json:
        doc = {"at_step": at, "last_k": args.last_k, "definition": definition, "traces": traces,
               "threshold_sweep": sweep,
               "break": {"margin": args.break_margin, "steps": args.break_steps, "ema": args.break_ema},
               "runs": {r["label"]: {k: r[k] for k in ("group", "seed", "steps", "train", "val", "gap_train",
                                                       "gap_val", "rho", "dq", "break_step", "break_why",
                                                       "first_warning", "ms")}
                        | {"warnings": len(r["warnings"])} for r in runs},
               "modes": stats, "verdicts": verdicts, "warnings": warn_summary}
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(json_clean(doc), f, indent=1)
        print(f"wrote {args.json}")

    if not args.no_plots:
        plot(runs, groups, args)


if __name__ == "__main__":
    main()
