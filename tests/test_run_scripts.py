#!/usr/bin/env python3
"""tests/test_run_scripts.py - the run recipes' own logic, without training anything.

Why: scripts/compare_runs.py decides which numbers a matched-run report shows
(the gap to fp32, the step it is read at) and scripts/matched_runs.sh decides
which runs exist, what each is named and given (--seeds, --stop-at, the gauge
arms), which share a GPU (--per-gpu batches) and which a --resume continues,
starts or leaves alone. The end-to-end recipe test
(tests/test_train_cpu_diag.sh, CPU trainer, runs of equal length) cannot
reach most of that: runs stopped at different steps by a time limit, a log
whose last record was cut short, batches of runs per GPU, a half-finished
group. Here the logs and run folders are synthetic and matched_runs.sh runs
with --dry-run, so every expected command and number is known exactly.
The per-mode statistics across seeds are tested in tests/test_compare_runs.py.

Usage: python3 tests/test_run_scripts.py   (from anywhere; ends with "N passed, N failed")
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testing  # noqa: E402
from testing import summary  # noqa: E402


def check(ok, msg, detail=""):
    """testing.check, plus what was seen when it fails."""
    if not testing.check(ok, msg) and detail:
        print("       " + str(detail).strip().replace("\n", "\n       ")[:2000])

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write_log(path, mode, steps, loss_offset, cut_last=False, damage_line=None):
    """A run log like the trainers write: loss falls by 0.01 per step from 5 + offset;
    validation and diagnostics every 10 steps (rho = 1 + step/100, probe = 0.01)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    lines = [json.dumps({"event": "config", "attn": mode})]
    for s in range(steps):
        lines.append(json.dumps({"step": s, "loss": 5 - 0.01 * s + loss_offset, "grad_norm": 1.0, "ms": 2.0}))
        if s % 10 == 0:
            lines.append(json.dumps({"event": "diag", "step": s, "rho_max": 1 + s / 100, "probe_dq_err": 0.01}))
            lines.append(json.dumps({"step": s, "val_loss": 5.5 - 0.01 * s + loss_offset}))
    if damage_line is not None:
        lines[damage_line] = lines[damage_line][:10]
    text = "\n".join(lines) + "\n"
    if cut_last:
        text += '{"step": %d, "lo' % steps
    with open(path, "w") as f:
        f.write(text)


def compare(*args):
    """compare_runs.py with --json (tables only, no plots): (exit code, stdout, stderr, the JSON document)."""
    with tempfile.TemporaryDirectory() as d:
        js = os.path.join(d, "c.json")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "compare_runs.py"), *args, "--json", js,
                            "--no-plots"], capture_output=True, text=True)
        doc = json.load(open(js)) if os.path.exists(js) else {}
    return r.returncode, r.stdout, r.stderr, doc


def matched(*args):
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", "matched_runs.sh"), *args],
                          capture_output=True, text=True, cwd=ROOT)


def commands(stdout):
    """The trainer command lines a --dry-run printed."""
    return [l for l in stdout.splitlines() if "train_gpt" in l and not l.startswith("matched_runs:")]


def out_dir(cmd):
    parts = cmd.split()
    return parts[parts.index("--out-dir") + 1]


def table(stdout):
    """{run: [columns]} of the printed per-run table (run, mode, seed, steps, train, gap, val, gap, ...)."""
    rows = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 13 and parts[3].isdigit():
            rows[parts[0]] = parts
    return rows


with tempfile.TemporaryDirectory() as tmp:
    # fp32 ran 100 steps, bf16 was stopped at 80 (its last record cut short), bf16 is 0.1 worse throughout
    write_log(f"{tmp}/g/fp32/log.jsonl", "fp32", 100, 0.0)
    write_log(f"{tmp}/g/bf16/log.jsonl", "bf16", 80, 0.1, cut_last=True)
    rc, out, err, js = compare(f"{tmp}/g/fp32", f"{tmp}/g/bf16")
    runs = js.get("runs", {})
    check(rc == 0 and set(runs) == {"fp32", "bf16"} and set(table(out)) == {"fp32", "bf16"},
          "compare_runs: a table row and a JSON entry per run", out + err)
    check("compared at step 79" in out and js.get("at_step") == 79,
          "runs of different lengths are compared at the last common step (79)", out)
    check("bf16/log.jsonl: skipped 1 unreadable line(s)" in err and "line 98" in err,
          "a cut-short last record is skipped and named (file and line)", err)
    if set(runs) == {"fp32", "bf16"}:
        # mean of the 20 losses at steps 60..79: 5 - 0.01 * 69.5 = 4.305 (fp32), +0.1 for bf16
        check(runs["fp32"]["steps"] == 79 and runs["bf16"]["steps"] == 79, "both runs read at step 79", str(runs))
        check(abs(runs["fp32"]["train"] - 4.305) < 1e-9, "fp32 train loss = mean of steps 60-79 = 4.305",
              runs["fp32"]["train"])
        check(abs(runs["bf16"]["gap_train"] - 0.1) < 1e-9, "bf16 gap to fp32 = +0.1", runs["bf16"]["gap_train"])
        # validation at step 70 (the last at or before 79): 5.5 - 0.7 = 4.8; rho 1.7
        check(abs(runs["fp32"]["val"] - 4.8) < 1e-9, "validation read at step 70 (4.8), not at 90",
              runs["fp32"]["val"])
        check(abs(runs["bf16"]["gap_val"] - 0.1) < 1e-9, "bf16 validation gap +0.1", runs["bf16"]["gap_val"])
        check(abs(runs["fp32"]["rho"] - 1.7) < 1e-9, "max rho read at step 70 (1.7)", runs["fp32"]["rho"])
        check(abs(runs["bf16"]["dq"] - 0.01) < 1e-12, "in-run dQ error = mean of the last 5 probes",
              runs["bf16"]["dq"])
        check(table(out)["bf16"][5] == "+0.1000", "the printed table shows the same gap (+0.1000)", out)

    # --at-step overrides the common step
    rc, out, err, js = compare(f"{tmp}/g/fp32", f"{tmp}/g/bf16", "--at-step", "39")
    check(js.get("runs", {}).get("fp32", {}).get("steps") == 39 and "compared at step" not in out,
          "--at-step 39 reads every run at step 39", out)

    # a damaged record in the middle is skipped and named with its line; the rest of the log is read
    write_log(f"{tmp}/h/fp32/log.jsonl", "fp32", 30, 0.0, damage_line=5)
    rc, out, err, js = compare(f"{tmp}/h/fp32")
    check(rc == 0 and "h/fp32/log.jsonl: skipped 1 unreadable line(s)" in err and "line 6" in err and
          js.get("runs", {}).get("fp32", {}).get("steps") == 29,
          "a damaged record before the end is skipped, named by file:line, the rest read", err)

    # matched_runs.sh: --per-gpu puts several runs on one GPU at once, --gauge-arm takes a list
    r = matched("--dry-run", "--per-gpu", "3", "--modes", "fp32 bf16", "--gauge-arm", "bf16 gproj", "--",
                "--steps", "10")
    cmds = commands(r.stdout)
    check(r.returncode == 0 and len(cmds) == 4, "matched_runs --dry-run: 4 runs (2 modes + 2 gauge arms)",
          r.stdout + r.stderr)
    check(all(c.startswith("CUDA_VISIBLE_DEVICES=0 ") for c in cmds), "--per-gpu: all on GPU 0 (parallel)",
          "\n".join(cmds))
    check(sum("--zero-key-bias-grad 1" in c for c in cmds) == 2 and
          any("--attn gproj --out-dir runs/matched_gpu/gproj_zkbg" in c for c in cmds),
          "--gauge-arm \"bf16 gproj\": bf16_zkbg and gproj_zkbg with the arm on", "\n".join(cmds))
    check(all(" --seed 1337 " in c for c in cmds) and all("_s" not in out_dir(c) for c in cmds),
          "without --seeds: folders named MODE, every run with --seed 1337", "\n".join(cmds))
    check(all(" --diverge-margin 0 " in c for c in cmds),
          "every run with --diverge-margin 0 (a rising loss is watched, not stopped)", "\n".join(cmds))
    r = matched("--dry-run", "--per-gpu", "0")
    check(r.returncode != 0 and "--per-gpu '0'" in r.stderr, "--per-gpu 0 is refused with the value named",
          r.stderr)

    # --seeds: every mode x seed, named MODE_sSEED, each with its own --seed (weights and data order), scheduled
    # seed by seed in batches of --per-gpu (a "wait" line where a batch ends); --stop-at reaches every run
    r = matched("--dry-run", "--seeds", "7 8 9", "--per-gpu", "4", "--gauge-arm", "bf16", "--stop-at", "500",
                "--", "--steps", "1000")
    cmds = commands(r.stdout)
    want = [f"{m}_s{s}" for s in (7, 8, 9) for m in ("fp32", "bf16", "repair", "gproj", "bf16_zkbg")]
    got = [os.path.basename(out_dir(c)) for c in cmds]
    check(r.returncode == 0 and got == want, "--seeds \"7 8 9\": 15 runs MODE_sSEED, seed by seed", got)
    check(all(f" --seed {o.rsplit('_s', 1)[1]} " in c and c.count("--seed ") == 1 for o, c in zip(got, cmds)),
          "each run gets exactly one --seed, its own", "\n".join(cmds))
    check(all(c.rstrip().endswith("--stop-at 500 --steps 1000") for c in cmds), "--stop-at 500 on every run",
          "\n".join(cmds[:2]))
    lines = [l for l in r.stdout.splitlines() if "train_gpt" in l or l == "wait"]
    batches = " ".join(lines).split("wait")
    check([b.count("train_gpt") for b in batches] == [4, 4, 4, 3], "--per-gpu 4: batches of 4, 4, 4, 3", lines)
    check(sum("--zero-key-bias-grad 1" in c for c in cmds) == 3 and
          all(("--zero-key-bias-grad 1" in c) == ("_zkbg_" in o) for o, c in zip(got, cmds)),
          "gauge arm per seed, named bf16_zkbg_sSEED", got)
    for bad, what in ((["--seeds", "7 x"], "'x' is not a seed"), (["--seeds", "7 7"], "names a seed twice"),
                      (["--seeds", "7", "--", "--seed", "3"], "say the same thing twice"),
                      (["--stop-at", "0"], "--stop-at '0'"), (["--", "--resume"], "pass --resume to matched_runs")):
        r = matched("--dry-run", *bad)
        check(r.returncode != 0 and what in r.stderr, f"refused: {' '.join(bad)} ({what})", r.stderr)

    # --resume: each run of an existing group continues from its own folder; finished runs, runs already at
    # --stop-at and missing folders are handled, a folder without a state is refused
    name = f"test_run_scripts_{os.getpid()}"
    grp = os.path.join(ROOT, "runs", name)
    try:
        for label, states, done in (("fp32_s1", [100, 200], False), ("bf16_s1", [200], True),
                                    ("fp32_s2", [100, 300], False)):
            os.makedirs(os.path.join(grp, label))
            for st in states:
                open(os.path.join(grp, label, f"state_{st:08d}.bin"), "w").close()
            with open(os.path.join(grp, label, "log.jsonl"), "w") as f:
                f.write('{"event": "config"}\n')
                if done:
                    f.write('{"event": "stop", "step": 200, "reason": "done", "val_loss": 4.5}\n')
        r = matched("--dry-run", "--name", name, "--seeds", "1 2", "--modes", "fp32 bf16", "--resume",
                    "--stop-at", "300", "--", "--steps", "400", "--init-from", "x.bin")
        cmds = commands(r.stdout)
        by = {os.path.basename(out_dir(c)): c for c in cmds}
        check(r.returncode == 0 and sorted(by) == ["bf16_s2", "fp32_s1"],
              "--resume: runs fp32_s1 (state 200 < 300) and bf16_s2 (new), not bf16_s1 (done) or fp32_s2 (at 300)",
              r.stdout + r.stderr)
        check("fp32_s1" in by and "--resume" in by["fp32_s1"] and "--init-from" not in by["fp32_s1"],
              "a resumed run gets --resume and loses --init-from (its weights are in its folder)", by.get("fp32_s1"))
        check("bf16_s2" in by and "--resume" not in by["bf16_s2"] and "--init-from x.bin" in by["bf16_s2"],
              "a run without a folder starts fresh, with the given --init-from", by.get("bf16_s2"))
        check("bf16_s1 finished" in r.stdout and "fp32_s2 is at step 300" in r.stdout,
              "what is left alone is said, with why", r.stdout)
        os.makedirs(os.path.join(grp, "bf16_s2"))
        open(os.path.join(grp, "bf16_s2", "log.jsonl"), "w").close()
        r = matched("--dry-run", "--name", name, "--seeds", "1 2", "--modes", "fp32 bf16", "--resume")
        check(r.returncode != 0 and "bf16_s2 holds no state_NNNNNNNN.bin" in r.stderr,
              "--resume refuses a run folder without a state, naming it", r.stderr)
        r = matched("--dry-run", "--name", name + "_none", "--resume")
        check(r.returncode != 0 and "no run group" in r.stderr, "--resume of a group that does not exist is refused",
              r.stderr)
        r = matched("--dry-run", "--name", name, "--resume", "--", "--overwrite", "1")
        check(r.returncode != 0 and "give one" in r.stderr, "--resume with --overwrite is refused", r.stderr)
    finally:
        shutil.rmtree(grp, ignore_errors=True)

    # --smooth averages the per-step series only: a moving average over sparse validation records would
    # pull the step-0 evaluation into later points (the 2026-11-29 450m plot showed 8.4 at step 100 for a
    # logged 5.7)
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    import compare_runs  # noqa: E402
    _, rows = compare_runs.read_log(f"{tmp}/g/fp32")
    xs, ys = compare_runs.plotted(rows, "val_loss", 5)
    logged = [v for _, v in compare_runs.series(rows, "val_loss")]
    check(xs[:3] == [0, 10, 20] and ys == logged, "--smooth 5 leaves validation points as logged", (xs[:5], ys[:5]))
    xs, ys = compare_runs.plotted(rows, "rho_max", 5)
    check(abs(ys[1] - 1.1) < 1e-12, "--smooth 5 leaves diagnostics (rho) as logged", ys[:5])
    xs, ys = compare_runs.plotted(rows, "loss", 5)
    check(abs(ys[4] - (5 - 0.01 * 2)) < 1e-12 and abs(ys[10] - (5 - 0.01 * 8)) < 1e-12,
          "--smooth 5 averages train loss over the last 5 logged steps", ys[:12])

sys.exit(summary())
