#!/usr/bin/env python3
"""tests/test_compare_runs.py - scripts/compare_runs.py across seeds, on synthetic logs with known answers.

Why: the verdict "bf16 broke in 2 of 3 seeds; repair's gap is inside the spread" is only as honest as
the statistics and the break detector behind it. Here every log is written by the test, with noise that
cancels exactly over each aligned 20-step window (so the final-loss means and gaps are known to rounding)
and with breaks at known steps, and the test checks what compare_runs.py prints and writes (--json):
per-mode seeds, means, spreads and paired gaps; breaks found near the step where the loss jumped (and
the earlier of a break and a later non-finite stop); no false break on a noisy healthy run with spikes
and a short bump; runs of uneven length and a cut-short seed compared at the last common step; a bad
UTF-8 line skipped and named; the verdict wording (broke k of N, within the fp32 spread, inside the
spread: not a result, above in every seed, anecdote); the early-warning lead times and false alarms;
the band of the plots; the thinned logs and the figures redrawn from them.

Usage: python3 tests/test_compare_runs.py   (from anywhere; needs matplotlib: if this python3 lacks it,
the test re-runs itself under /usr/bin/python3; ends with "N passed, N failed")
"""
import json
import math
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import testing  # noqa: E402
testing.require(["matplotlib"], "python3-matplotlib")
from testing import summary  # noqa: E402
import compare_runs  # noqa: E402


def check(ok, msg, detail=""):
    if not testing.check(ok, msg) and detail != "":
        print("       " + str(detail).strip().replace("\n", "\n       ")[:3000])


def base(s):
    return 4.0 + 6.0 * math.exp(-s / 300.0)


# The stop reasons of the trainer's divergence check (train/run_driver.c: "diverged: " + the check's words),
# read from its source so that a change of wording there fails here.
_DRIVER = open(os.path.join(ROOT, "train", "run_driver.c")).read()
assert 'snprintf(reason, sizeof(reason), "diverged: %s", what);' in _DRIVER and \
    '"the %s is %s", isfinite(loss) ? "gradient norm" : "loss",' in _DRIVER and \
    'isfinite(loss) ? "not finite" : "NaN or infinite"' in _DRIVER, "train/run_driver.c's stop reasons changed"
DIVERGED_REASONS = ("diverged: the gradient norm is not finite", "diverged: the loss is NaN or infinite")


def write_run(path, mode, seed, steps, offset, rng, jump_at=None, nonfinite_at=None, spikes=False,
              cut_last=False, bad_utf8_line=None, warnings=(), null_loss=False, rho_per_step=0.001):
    """A log like the trainers write. Train loss = base + offset + noise, the noise uniform in [-0.4, 0.4]
    for the first 10 steps of each aligned 20-step window and its negation for the last 10 (each window
    sums to zero); jump_at: +2 nats from that step on; nonfinite_at: a null loss there and a non-finite
    stop (the log ends); spikes: +2 for single steps and a +0.6 bump over 50 steps (no break).
    Validation and diagnostics every 100 steps."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lines = [json.dumps({"event": "config", "start_step": 0, "flags": {"attn": mode, "seed": seed,
                                                                        "zero-key-bias-grad": 0}})]
    noise = []
    for s in range(steps):
        if s % 20 == 0:
            noise = [rng.uniform(-0.4, 0.4) for _ in range(10)]
            noise += [-x for x in noise]
        loss = base(s) + offset + noise[s % 20]
        if jump_at is not None and s >= jump_at:
            loss += 2.0
        if spikes and s in (700, 1500, 2200):
            loss += 2.0
        if spikes and 1000 <= s < 1050:
            loss += 0.6
        if nonfinite_at is not None and s == nonfinite_at:
            if null_loss:  # another writer's form: a step record with a null loss, then a stop
                lines.append(json.dumps({"step": s, "loss": None, "grad_norm": None, "ms": 2.0, "attn": mode}))
                lines.append(json.dumps({"event": "stop", "step": s, "reason": "non-finite loss"}))
            else:  # train/run_driver.c's stop_diverged: no record of the step it refused, then the stop
                lines.append(json.dumps({"event": "stop", "step": s, "reason": DIVERGED_REASONS[s % 2]}))
            break
        lines.append(json.dumps({"step": s, "loss": loss, "grad_norm": 1.0, "ms": 2.0, "attn": mode}))
        if s % 100 == 0:
            lines.append(json.dumps({"step": s, "val_loss": base(s) + offset + 0.5, "val_batches": 2}))
            # per layer as the trainers write them: layer 0 drifts (3x faster under bf16), layer 1 stays; the probe
            # alternates between the layers
            rho0 = (1 + s / 1000) * (3 if mode == "bf16" else 1)
            lines.append(json.dumps({"event": "diag", "step": s, "rho_max": 1 + rho_per_step * s, "probe_dq_err": 0.003,
                                     "key_bias_norm": 1.0, "layer_rho_max": [rho0, 0.5],
                                     "layer_q_absmax": [2.0 + s / 100, 1.0], "layer_logit_max": [5.0, 4.0],
                                     "probe_layer": (s // 100) % 2}))
        for w in warnings:
            if w[0] == s:
                lines.append(json.dumps({"event": "attn_warning", "step": s, "kind": w[1], "layer": 0,
                                         "value": 50.0, "threshold": 20.0}))
        if s % 500 == 0:
            lines.append(json.dumps({"event": "sample", "step": s, "text": "x" * 200}))
    data = ("\n".join(lines) + "\n").encode()
    if bad_utf8_line is not None:
        parts = data.split(b"\n")
        parts[bad_utf8_line - 1] = b'{"step": 5\xff\xfe, "loss": 3.0}'
        data = b"\n".join(parts)
    if cut_last:
        data += b'{"step": %d, "lo' % steps
    with open(path, "wb") as f:
        f.write(data)


def compare(*args):
    with tempfile.TemporaryDirectory() as d:
        js = os.path.join(d, "c.json")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "compare_runs.py"), *args, "--json", js],
                           capture_output=True, text=True)
        doc = json.load(open(js)) if os.path.exists(js) else {}
    return r.returncode, r.stdout, r.stderr, doc


def near(a, b, tol=1e-9):
    return a is not None and b is not None and abs(a - b) <= tol


with tempfile.TemporaryDirectory() as tmp:
    rng = random.Random(1)
    g = f"{tmp}/grp"
    fp32_off = {7: -0.01, 8: 0.0, 9: 0.01}
    gap = {"gproj": {7: 0.002, 8: -0.004, 9: 0.005}, "repair": {7: 0.03, 8: 0.08, 9: -0.02},
           "bf16_zkbg": {7: 0.30, 8: 0.31, 9: 0.29}, "bf16": {7: 0.0, 8: 0.0, 9: 0.05}}
    for s in (7, 8, 9):
        write_run(f"{g}/fp32_s{s}/log.jsonl", "fp32", s, 3000, fp32_off[s], rng, spikes=(s == 8))
        write_run(f"{g}/gproj_s{s}/log.jsonl", "gproj", s, 2500 if s == 9 else 3000, fp32_off[s] + gap["gproj"][s],
                  rng, cut_last=(s == 9))
        write_run(f"{g}/repair_s{s}/log.jsonl", "repair", s, 3000, fp32_off[s] + gap["repair"][s], rng,
                  bad_utf8_line=(40 if s == 8 else None),
                  warnings=((1000, "rho"), (1200, "dq_err")) if s == 7 else ())
        write_run(f"{g}/bf16_zkbg_s{s}/log.jsonl", "bf16", s, 3000, fp32_off[s] + gap["bf16_zkbg"][s], rng)
    write_run(f"{g}/bf16_s7/log.jsonl", "bf16", 7, 3000, fp32_off[7], rng, jump_at=1350, warnings=((900, "rho"),))
    write_run(f"{g}/bf16_s8/log.jsonl", "bf16", 8, 3000, fp32_off[8], rng, jump_at=2100, nonfinite_at=2300,
              warnings=((1500, "dq_err"), (1600, "rho")))
    write_run(f"{g}/bf16_s9/log.jsonl", "bf16", 9, 3000, fp32_off[9] + gap["bf16"][9], rng)

    dirs = sorted(os.path.join(g, d) for d in os.listdir(g))
    rc, out, err, js = compare(*dirs, "--out", f"{tmp}/plots", "--thin-to", f"{tmp}/thin", "--thin-every", "10",
                               "--trace-every", "1000")
    check(rc == 0 and js, "compare_runs.py ran on 15 runs of 5 modes x 3 seeds", out[-2000:] + err)
    runs, modes, verdicts = js.get("runs", {}), js.get("modes", {}), js.get("verdicts", {})

    # grouping, the common step, damaged lines
    check(sorted(modes) == ["bf16", "bf16_zkbg", "fp32", "gproj", "repair"] and
          all(modes[m]["seeds"] == 3 for m in modes), "grouped by MODE_sSEED name: 5 modes, 3 seeds each",
          {m: modes[m]["seed_list"] for m in modes})
    check(js.get("at_step") == 2499, "compared at step 2499: the cut-short gproj seed, not bf16_s8's crash (2300)",
          js.get("at_step"))
    cut_line = len(open(f"{g}/gproj_s9/log.jsonl", "rb").read().split(b"\n"))
    check("gproj_s9/log.jsonl: skipped 1 unreadable line(s)" in err and f"line {cut_line}" in err,
          "the cut-short last line of gproj_s9 is skipped and named with its line", err)
    check("repair_s8/log.jsonl: skipped 1 unreadable line(s)" in err and ": line 40" in err and
          err.count("repair_s8") == 1, "the bad UTF-8 line of repair_s8 is skipped and named once", err)

    # final losses and gaps: noise cancels over 2480..2499, so the numbers are exact
    f_at = sum(base(s) for s in range(2480, 2500)) / 20
    check(near(runs.get("fp32_s8", {}).get("train"), f_at, 1e-9) and
          near(runs.get("fp32_s7", {}).get("train"), f_at - 0.01, 1e-9),
          "final train loss = mean over steps 2480-2499 (fp32_s8 %.6f)" % f_at, runs.get("fp32_s8"))
    fm = modes.get("fp32", {})
    check(near(fm.get("train", {}).get("mean"), f_at, 1e-9) and near(fm["train"]["std"], 0.01, 1e-9) and
          near(fm["train"]["min"], f_at - 0.01, 1e-9) and near(fm["train"]["max"], f_at + 0.01, 1e-9),
          "fp32: mean, std 0.01, min-max over 3 seeds", fm.get("train"))
    check(near(fm.get("val", {}).get("mean"), base(2400) + 0.5, 1e-9), "fp32 final validation = the one at step 2400",
          fm.get("val"))
    rg = modes.get("repair", {}).get("gap_train") or {}
    check(rg.get("kind") == "paired" and near(rg.get("mean"), 0.03, 1e-9) and near(rg.get("std"), 0.05, 1e-9) and
          near(rg.get("min"), -0.02, 1e-9) and near(rg.get("max"), 0.08, 1e-9),
          "repair: paired gap +0.03, std 0.05, min-max -0.02..+0.08", rg)
    gg = modes.get("gproj", {}).get("gap_train") or {}
    check(near(gg.get("mean"), 0.001, 1e-9), "gproj: paired gap +0.001", gg)
    bg = modes.get("bf16", {}).get("gap_train") or {}
    check(bg.get("n") == 1 and near(bg.get("mean"), 0.05, 1e-9), "bf16: the gap uses only the unbroken seed (+0.05)",
          bg)
    check(near(runs.get("bf16_s8", {}).get("train"), None) or runs.get("bf16_s8", {}).get("train") is None,
          "bf16_s8 (ended at 2300) has no final loss at step 2499", runs.get("bf16_s8"))
    check(modes.get("bf16", {}).get("train", {}).get("n") == 2 and
          "  bf16: train and val over 2 of 3 seeds (bf16_s8 ended at step 2299, before step 2499)" in out,
          "the per-mode table says bf16's means cover 2 of 3 seeds and which run ended early", out[-2500:])

    # the trace of a broken run: its most drifted layer beside the same seed's fp32 run
    tr = js.get("traces", {}).get("bf16_s7") or {}
    rows7 = {x["step"]: x for x in tr.get("rows", [])}
    loss1000 = next(json.loads(l)["loss"] for l in open(f"{g}/bf16_s7/log.jsonl")
                    if l.startswith('{"step": 1000, "loss"'))
    check(tr.get("layer") == 0 and tr.get("ref") == "fp32_s7" and sorted(rows7) == [0, 1000, 2000, 2900] and
          near(rows7[1000]["rho"], 6.0) and near(rows7[1000]["q"], 12.0) and near(rows7[1000]["ref_rho"], 2.0) and
          near(rows7[1000]["loss"], loss1000) and near(rows7[1000]["probe_dq_err"], 0.003) and
          rows7[2900]["probe_dq_err"] is None and "how bf16_s7 broke (at step" in out,
          "bf16_s7's trace: layer 0 (the most drifted), every 1000 steps and the last diag, the step's loss, "
          "the probe only where it was on that layer, fp32_s7's layer 0 beside it", tr)
    check(sorted(js.get("traces", {})) == ["bf16_s7", "bf16_s8"], "a trace for each run that broke, and only those",
          sorted(js.get("traces", {})))

    # breaks: at the jump (the EMA needs a few steps), the earlier of a break and a later crash; none elsewhere
    b7, b8 = runs.get("bf16_s7", {}).get("break_step"), runs.get("bf16_s8", {}).get("break_step")
    check(b7 is not None and 1350 <= b7 <= 1365, "bf16_s7 broke within 15 steps after its jump at 1350", b7)
    check(b8 is not None and 2100 <= b8 <= 2115, "bf16_s8 broke at its jump (2100), before its non-finite stop (2300)",
          b8)
    check(all(runs[k]["break_step"] is None for k in runs if k not in ("bf16_s7", "bf16_s8")),
          "no false break: 13 healthy runs, fp32_s8 with +2 spikes and a 50-step +0.6 bump",
          {k: runs[k]["break_step"] for k in runs})
    rc2, _, _, js2 = compare(f"{g}/fp32_s8", "--no-plots", "--break-steps", "30", "--break-margin", "0.3")
    b = js2.get("runs", {}).get("fp32_s8", {}).get("break_step")
    check(b is not None and 1000 <= b <= 1030,
          "the same bump (steps 1000-1049) is a break with --break-margin 0.3 --break-steps 30 (the flags are used)", b)
    write_run(f"{tmp}/crash/bf16_s1/log.jsonl", "bf16", 1, 500, 0.0, rng, nonfinite_at=400, null_loss=True)
    _, _, _, js3 = compare(f"{tmp}/crash/bf16_s1", "--no-plots")
    check(js3.get("runs", {}).get("bf16_s1", {}).get("break_step") == 400,
          "a non-finite loss with no rise before it is a break at that step", js3.get("runs"))
    # --threshold-sweep: rho 1 + 0.02 s in the bf16 runs (above 10 from the diag at 500, 20 at 1000, 50 only after
    # the break at 2000), flat under fp32
    write_run(f"{tmp}/sweep/bf16_s1/log.jsonl", "bf16", 1, 3000, 0.0, rng, jump_at=2000, rho_per_step=0.02)
    write_run(f"{tmp}/sweep/bf16_s2/log.jsonl", "bf16", 2, 3000, 0.0, rng, rho_per_step=0.02)
    write_run(f"{tmp}/sweep/fp32_s1/log.jsonl", "fp32", 1, 3000, 0.0, rng, rho_per_step=0.0)
    write_run(f"{tmp}/sweep/fp32_s2/log.jsonl", "fp32", 2, 3000, 0.0, rng, rho_per_step=0.0)
    _, out5, _, js5 = compare(*sorted(f"{tmp}/sweep/{d}" for d in os.listdir(f"{tmp}/sweep")), "--no-plots",
                              "--threshold-sweep")
    sw = {(r["kind"], r["threshold"]): r for r in js5.get("threshold_sweep") or []}
    b1 = js5.get("runs", {}).get("bf16_s1", {}).get("break_step")
    r10, r20, r50, d5 = sw.get(("rho", 10.0), {}), sw.get(("rho", 20.0), {}), sw.get(("rho", 50.0), {}), \
        sw.get(("dq_err", 0.05), {})
    check(b1 is not None and r10.get("lead") == {"bf16_s1": b1 - 500} and r20.get("lead") == {"bf16_s1": b1 - 1000}
          and r50.get("lead") == {"bf16_s1": None} and r10.get("false_alarms") == {"bf16": 1, "fp32": 0} and
          r10.get("unbroken") == {"bf16": 1, "fp32": 2} and d5.get("false_alarms") == {"bf16": 0, "fp32": 0} and
          "threshold sweep (from the diag records" in out5,
          "--threshold-sweep: lead = break - the first diag above the threshold (none after the break), false alarms"
          " per mode among the unbroken runs", {"break": b1, "rho10": r10, "rho50": r50})

    # a group whose other runs all end at one step: compared there, the diverged run without a final loss
    write_run(f"{tmp}/crash2/fp32_s1/log.jsonl", "fp32", 1, 500, 0.0, rng)
    write_run(f"{tmp}/crash2/repair_s1/log.jsonl", "repair", 1, 500, 0.0, rng)
    write_run(f"{tmp}/crash2/bf16_s1/log.jsonl", "bf16", 1, 500, 0.0, rng, nonfinite_at=300)
    _, out4, _, js4 = compare(f"{tmp}/crash2/fp32_s1", f"{tmp}/crash2/repair_s1", f"{tmp}/crash2/bf16_s1", "--no-plots")
    r4 = js4.get("runs", {})
    check(js4.get("at_step") == 499 and r4.get("bf16_s1", {}).get("train") is None and
          r4.get("repair_s1", {}).get("train") is not None and
          "bf16: train and val over 0 of 1 seeds (bf16_s1 ended at step 299, before step 499)" in out4,
          "a diverged run beside runs that all end at 499: compared at 499, no final loss for it, and said so",
          {"at": js4.get("at_step"), "runs": {k: v.get("train") for k, v in r4.items()}})
    # the trainers' convention: an evaluation record carries the steps completed before it, so a 30-step run's
    # final val is logged at step 30, after training record 29; a diverged run beside it must not drop it
    for label, stop in (("fp32_s1", None), ("bf16_s1", 12)):
        recs = [{"event": "config", "start_step": 0, "flags": {"attn": label[:4], "seed": 1, "zero-key-bias-grad": 0}}]
        for s in range(30 if stop is None else stop):
            recs.append({"step": s, "loss": 5.0 - s / 100, "grad_norm": 1.0, "ms": 2.0, "attn": label[:4]})
            if (s + 1) % 10 == 0:
                recs.append({"step": s + 1, "val_loss": 6.0 - (s + 1) / 100, "val_batches": 2})
        if stop is not None:
            recs.append({"event": "stop", "step": stop, "reason": DIVERGED_REASONS[0]})
        os.makedirs(f"{tmp}/final_val/{label}")
        with open(f"{tmp}/final_val/{label}/log.jsonl", "w") as f:
            f.write("".join(json.dumps(x) + "\n" for x in recs))
    _, _, _, js_alone = compare(f"{tmp}/final_val/fp32_s1", "--no-plots")
    _, _, _, js_both = compare(f"{tmp}/final_val/fp32_s1", f"{tmp}/final_val/bf16_s1", "--no-plots")
    v_alone = js_alone.get("runs", {}).get("fp32_s1", {}).get("val")
    v_both = js_both.get("runs", {}).get("fp32_s1", {}).get("val")
    check(near(v_alone, 5.7) and near(v_both, 5.7) and js_both.get("at_step") == 29,
          "the final val (logged at step 30, after training record 29) counts when a diverged run sets the step",
          {"alone": v_alone, "beside a diverged run": v_both, "at": js_both.get("at_step")})
    check("broke = the train-loss EMA (span 50 steps) rises more than 0.5 nats above its running minimum" in out,
          "the definition of broke is printed with the table", out)

    # verdicts
    check(verdicts.get("bf16", "").startswith("bf16: broke in 2 of 3 seeds, at %s and %s" % (
        compare_runs.fmt_step(b7), compare_runs.fmt_step(b8))), "bf16 verdict: broke in 2 of 3 seeds, at 1.35k and 2.1k",
        verdicts.get("bf16"))
    check("final loss within the fp32 seed spread (3 seeds)" in verdicts.get("gproj", ""),
          "gproj verdict: within the fp32 seed spread", verdicts.get("gproj"))
    check(verdicts.get("repair", "") == "repair: 0 of 3 broke; gap to fp32 +0.030 +- 0.050 (inside the spread: "
          "not a result)", "repair verdict: 0 of 3 broke; gap +0.030 +- 0.050 (inside the spread: not a result)",
          verdicts.get("repair"))
    check("final loss above fp32's in every seed: gap to fp32 +0.300 +- 0.010" in verdicts.get("bf16_zkbg", ""),
          "bf16_zkbg verdict: above fp32 in every seed (outside the spread)", verdicts.get("bf16_zkbg"))
    check(all(v in out for v in verdicts.values()), "every verdict is printed", out[-1500:])

    # early warning: first warning, lead time, false alarms
    w = js.get("warnings", {})
    check(w.get("lead_steps", {}).get("bf16_s7") == b7 - 900 and w["lead_steps"].get("bf16_s8") == b8 - 1500,
          "lead time = break step - first warning step (bf16_s7: %s, bf16_s8: %s)" % (
              b7 - 900 if b7 else None, b8 - 1500 if b8 else None), w)
    check(w.get("false_alarm_runs") == ["repair_s7"] and w.get("false_alarm_warnings") == 2,
          "false alarms: repair_s7, 2 warnings in a run that never broke", w)
    check(runs.get("bf16_s8", {}).get("first_warning") == 1500, "first warning per run (bf16_s8: 1500)",
          runs.get("bf16_s8"))
    check("false alarms: 1 of 13 runs that never broke warned" in out, "the early-warning summary is printed", out)

    # the plots and the band
    pngs = sorted(os.listdir(f"{tmp}/plots")) if os.path.isdir(f"{tmp}/plots") else []
    check(pngs == ["grad_norm.png", "key_bias_norm.png", "loss.png", "probe_dq_err.png", "rho_max.png",
                   "val_loss.png"] and all(os.path.getsize(f"{tmp}/plots/{p}") > 5000 for p in pngs),
          "one PNG per logged metric", pngs)
    grid, lo, hi, have = compare_runs.band([([0, 10, 20], [1.0, 2.0, 3.0]), ([0, 10], [3.0, 0.0]),
                                            ([5, 30], [2.0, 2.0])])
    check(list(grid) == [0, 5, 10, 20, 30] and list(have) == [True, True, True, True, False] and
          list(lo[:4]) == [1.0, 1.5, 0.0, 2.0] and list(hi[:4]) == [3.0, 2.0, 2.0, 3.0] and math.isnan(lo[4]),
          "band: min-max over the seeds present at each step (interpolated inside each seed's range)",
          (grid, lo, hi, have))

    # thinned logs: smaller, and the same numbers and verdicts read back from them
    thinned = sorted(os.listdir(f"{tmp}/thin")) if os.path.isdir(f"{tmp}/thin") else []
    check(thinned == sorted(os.path.basename(d) for d in dirs), "--thin-to: one thinned log per run", thinned)
    if thinned:
        full = os.path.getsize(f"{g}/fp32_s7/log.jsonl")
        small = os.path.getsize(f"{tmp}/thin/fp32_s7/log.jsonl")
        recs = [json.loads(l) for l in open(f"{tmp}/thin/bf16_s8/log.jsonl")]
        check(small < full / 2 and not any(r.get("event") == "sample" for r in recs),
              "thinned: under half the size, no text samples (%d of %d bytes)" % (small, full))
        check(sum(1 for r in recs if r.get("event") == "diag") == 23 and
              any(r.get("event") == "stop" and r.get("reason") == DIVERGED_REASONS[0] for r in recs) and
              sum(1 for r in recs if r.get("event") == "attn_warning") == 2,
              "thinned: every diag, stop and warning record kept (bf16_s8's divergence stop)", len(recs))
        rc, out2, err2, jt = compare("--from-thinned", f"{tmp}/thin", "--out", f"{tmp}/replot")
        check(rc == 0 and jt.get("at_step") == 2499 and
              all(near(jt["runs"][k]["train"], runs[k]["train"], 1e-9) or runs[k]["train"] is None
                  for k in runs),
              "--from-thinned: the same comparison step and final train losses", err2[-500:])
        check(all(jt["verdicts"][m] == verdicts[m] for m in verdicts),
              "--from-thinned: the same verdicts", jt.get("verdicts"))
        tb = {k: jt["runs"][k]["break_step"] for k in runs}
        check(tb == {k: runs[k]["break_step"] for k in runs},
              "--from-thinned: every run's break step is the full log's (%s vs %s)" % (tb, [b7, b8]))
        rc, out3, err3, _ = compare("--from-thinned", f"{tmp}/thin", "--no-plots", "--break-margin", "0.3")
        check(rc != 0 and "thinned" in err3 and "full logs" in err3,
              "--from-thinned with another break definition is refused (breaks need the full logs)", err3[-300:])
        check(os.path.isfile(f"{tmp}/replot/loss.png"), "--from-thinned redraws the figures")

    # fewer than 3 seeds is an anecdote
    rc, out, err, js = compare(f"{g}/fp32_s7", f"{g}/repair_s7", "--no-plots")
    check(js.get("verdicts", {}).get("repair", "").startswith("repair: anecdote (1 seed); 0 of 1 broke; gap to fp32 "
                                                               "+0.030"), "one seed: 'anecdote (1 seed)'",
          js.get("verdicts"))

sys.exit(summary())
