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
scripts/bench_vs_llmc.sh runs here with stand-ins for build/train_gpt (writes a
log.jsonl with known step times), llm.c's train_gpt2cu (prints its "total average
iteration time" line), dev/profile_gpu_step (prints its per-kernel table, PROFILE=1) and nvidia-smi, and with
fake llm.c tarballs for its build.

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
                      (["--stop-at", "0"], "--stop-at '0'"), (["--", "--resume"], "pass --resume to matched_runs"),
                      (["--modes", "fp32 fp32"], "names a mode twice"), (["--modes", " "], "names no mode")):
        r = matched("--dry-run", *bad)
        check(r.returncode != 0 and what in r.stderr, f"refused: {' '.join(bad)} ({what})", r.stderr)
    # a relative path after -- means the caller's folder (the script runs from the repository root)
    with tempfile.TemporaryDirectory() as caller:
        r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "matched_runs.sh"), "--cpu", "--dry-run", "--modes",
                            "fp32", "--", "--train-data", "d/t_*.bin", "--val-data=d/v_*.bin", "--init-from", "/m.bin"],
                           capture_output=True, text=True, cwd=caller)
        c = commands(r.stdout)
        check(r.returncode == 0 and len(c) == 1 and f"--train-data {caller}/d/t_\\*.bin" in c[0] and
              f"--val-data={caller}/d/v_\\*.bin" in c[0] and "--init-from /m.bin" in c[0],
              "relative file flags after -- are taken from the caller's folder (absolute ones kept)", r.stdout)
    # compare_runs.py: bad arguments get one line naming the problem, not a traceback
    for bad, what in ((["--json", ROOT], "is a folder: name a file"), (["--smooth", "-3"], "--smooth must be >= 1"),
                      (["--out", os.path.join(ROOT, "README.md")], "is a file: the plots go into a folder")):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "compare_runs.py"), *bad, "x"],
                           capture_output=True, text=True)
        check(r.returncode != 0 and what in r.stderr and "Traceback" not in r.stderr,
              f"compare_runs refuses {' '.join(bad)} ({what})", r.stderr)
    # cudnn is a GPU-only mode: the CPU recipe refuses it by name, the GPU recipe takes it
    r = matched("--cpu", "--dry-run", "--modes", "cudnn")
    check(r.returncode != 0 and "runs only on the GPU" in r.stderr, "--cpu refuses mode cudnn (GPU only)", r.stderr)
    r = matched("--cpu", "--dry-run", "--modes", "fast")
    check(r.returncode != 0 and "unknown attention mode 'fast'" in r.stderr, "an unknown mode is refused", r.stderr)

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
        check("bf16_s2" in by and "--resume" not in by["bf16_s2"] and f"--init-from {ROOT}/x.bin" in by["bf16_s2"],
              "a run without a folder starts fresh, with the given --init-from (relative to the caller's folder, "
              "made absolute)", by.get("bf16_s2"))
        check("bf16_s1 finished" in r.stdout and "fp32_s2 is at step 300" in r.stdout,
              "what is left alone is said, with why", r.stdout)
        f32 = by.get("fp32_s1", "").split()
        fresh = by.get("bf16_s2", "").split()
        check("--lr" not in f32 and "--warmup-steps" not in f32 and "--weight-decay" not in f32 and
              f32.count("--steps") == 1 and f32[f32.index("--steps") + 1] == "400" and
              fresh.count("--lr") == 1 and fresh.count("--steps") == 2,
              "a resumed run gets none of the script's schedule defaults (the trainer keeps its saved ones), only "
              "the flags given after --; a fresh run gets both", {"resumed": by.get("fp32_s1"),
                                                                 "fresh": by.get("bf16_s2")})
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

# ---------------------------------------------------------------- scripts/bench_vs_llmc.sh
# Stand-in trainers: ours writes step times of BASE + (step % 5) - 2 ms from step 10 on (median BASE) and 1000 ms
# before (the warm-up that must not count); BASE = model + mode - 4 * graph. llm.c prints MODEL ms, +1.5 for
# -r 1. STUB_FAIL / STUB_HANG / STUB_LLMC_FAIL name the runs that fail, hang, or fail in llm.c.
OURS_BASE = {"d12": 60, "d24": 80, "small": 8}
MODE_ADD = {"fp32": 20, "bf16": 0, "repair": 2, "gproj": 1}
LLMC_MS = {"d12": 58.0, "d24": 79.5}
STUB_OURS = r"""#!%s
import json, os, sys, time
a = sys.argv[1:]
f = {a[i][2:]: a[i + 1] for i in range(0, len(a) - 1, 2) if a[i].startswith("--")}
key = "%%s:%%s:%%s" %% (f["model"], f["attn"], f["cuda-graph"])
with open(os.environ["STUB_ARGV"], "a") as log:
    log.write(json.dumps(a) + "\n")
print("loading shards")
if key == os.environ.get("STUB_HANG"):
    open(os.environ["STUB_ARGV"] + ".hang_pid", "w").write(str(os.getpid()))
    time.sleep(30)
if key == os.environ.get("STUB_FAIL"):
    print("error: stub failure in " + key)
    sys.exit(3)
base = %r[f["model"]] + %r[f["attn"]] - 4 * int(f["cuda-graph"])
os.makedirs(f["out-dir"], exist_ok=True)
with open(os.path.join(f["out-dir"], "log.jsonl"), "w") as out:
    out.write(json.dumps({"event": "config"}) + "\n")
    for s in range(int(f["steps"])):
        out.write(json.dumps({"step": s, "loss": 5.0, "ms": 1000.0 if s < 10 else base + s %% 5 - 2}) + "\n")
open(os.path.join(f["out-dir"], "model_%%08d.bin" %% int(f["steps"])), "w").close()
"""
STUB_LLMC = r"""#!%s
import os, sys
a = sys.argv[1:]
f = {a[i][1:]: a[i + 1] for i in range(0, len(a) - 1, 2)}
with open(os.environ["STUB_ARGV"], "a") as log:
    log.write("llmc " + " ".join(a) + "\n")
print("| train_gpt2cu stand-in |")
if "%%s:%%s" %% (f["e"], f["r"]) == os.environ.get("STUB_LLMC_FAIL"):
    print("cuDNN error: stub failure")
    sys.exit(1)
print("step   50/50 | loss 7.0 | 12.3 ms")
print("total average iteration time: %%f ms" %% (%r[f["e"]] + 1.5 * int(f["r"])))
"""
# The profiler prints dev/profile_gpu_step.cu's lines (its printf formats): kind p (model/gpt_cuda.cuh's
# gpu_phase_names) takes (p + 1) / 4 ms, attention MODE_ADD more; the wall ms/step is the ours stand-in's BASE
# (graph 0) less 0.25. STUB_PROF_FAIL / STUB_PROF_GARBLE / STUB_PROF_HANG name the MODEL:MODE runs that exit 1,
# print no table (exit 0), or hang.
PHASES = ["encoder", "layernorm / rmsnorm", "matmul (cuBLASLt)", "attention (+ qk-norm, rope)", "gelu / swiglu",
          "classifier", "bias grads", "optimizer+norm", "other (memsets, loss sum)"]


def prof_ms(mode):
    return [(p + 1) / 4 + (MODE_ADD[mode] if p == 3 else 0) for p in range(len(PHASES))]


STUB_PROFILE = r"""#!%s
import os, sys, time
a = sys.argv[1:]
f = {a[i][2:]: a[i + 1] for i in range(0, len(a) - 1, 2)}
key = "%%s:%%s" %% (f["model"], f["attn"])
with open(os.environ["STUB_ARGV"], "a") as log:
    log.write("profile " + " ".join(a) + "\n")
B, T, steps = int(f["batch"]), int(f["seq"]), int(f["steps"])
print("profile_gpu_step: NVIDIA H200 stand-in, model %%s (124475904 params) B%%d T%%d recompute 0, %%d timed steps "
      "per mode" %% (f["model"], B, T, steps))
sys.stdout.flush()
if key == os.environ.get("STUB_PROF_HANG"):
    time.sleep(30)
if key == os.environ.get("STUB_PROF_FAIL"):
    print("profile_gpu_step: error: needs 200.00 GiB, 139.00 GiB free: lower --batch or raise --recompute")
    sys.exit(1)
wall = %r[f["model"]] + %r[f["attn"]] - 0.25
print("ours: model %%s B%%d T%%d attn=%%s recompute=0: %%.2f ms/step, %%.0f tokens/s, MFU %%.1f%%%% (989 TFLOP/s peak)"
      %% (f["model"], B, T, f["attn"], wall, B * T / wall * 1e3, 40.0))
if key == os.environ.get("STUB_PROF_GARBLE"):
    sys.exit(0)
names = %r
ms = [(p + 1) / 4 + (%r[f["attn"]] if p == 3 else 0) for p in range(len(names))]
print("  %%-28s %%10s %%7s" %% ("kernel kind", "ms/step", "share"))
for n, m in zip(names, ms):
    print("  %%-28s %%10.3f %%6.1f%%%%" %% (n, m, 100.0 * m / sum(ms)))
print("  %%-28s %%10.3f (GPU time between the first and last event; wall %%.3f)" %% ("total", sum(ms), wall))
"""


def prof_tables(path):
    """{(model, B): {"modes": [...], "rows": {kind: [cells]}}} of bench_vs_llmc's PROFILE=1 tables."""
    tables, cur = {}, None
    for line in open(path).read().splitlines() if os.path.exists(path) else []:
        if line.startswith("Where our step's time goes, "):
            model, b = line.split(", ")[1].split()[:2]
            cur = tables[(model, b[1:])] = {"modes": [], "rows": {}}
        elif cur is not None and line.startswith("| kernel kind"):
            cur["modes"] = [c.strip() for c in line.strip().strip("|").split("|")][1:]
        elif cur is not None and line.startswith("| ") and cur["modes"]:
            cols = [c.strip() for c in line.strip().strip("|").split("|")]
            cur["rows"][cols[0]] = cols[1:]
        elif cur is not None and cur["rows"] and not line.startswith("|"):
            cur = None
    return tables


def write_exe(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)


def bench(tmp, *args, cwd=None, **env):
    e = dict(os.environ, OURS_BIN=f"{tmp}/bin/train_gpt", PROFILE_BIN=f"{tmp}/bin/profile_gpu_step",
             STUB_ARGV=f"{tmp}/argv.txt", PATH=f"{tmp}/bin:" + os.environ["PATH"], PYTHON=sys.executable)
    e.update(env)
    return subprocess.run(["bash", os.path.join(ROOT, "scripts", "bench_vs_llmc.sh"), *args],
                          capture_output=True, text=True, env=e, cwd=cwd)


def md_rows(path, ncols):
    """{(model, B, mode, graph): [columns]} of the markdown table rows with NCOLS columns."""
    rows = {}
    for line in open(path).read().splitlines() if os.path.exists(path) else []:
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cols) == ncols and cols[1].isdigit():
            key = (cols[0], cols[1], cols[3], cols[4]) if ncols == 7 else (cols[0], cols[1], cols[2], cols[3])
            rows[key] = cols
    return rows


with tempfile.TemporaryDirectory() as tmp:
    os.makedirs(f"{tmp}/bin")
    os.makedirs(f"{tmp}/llmc")
    os.makedirs(f"{tmp}/shards")
    for i in range(2):
        open(f"{tmp}/shards/toy_train_{i:06d}.bin", "w").close()
    write_exe(f"{tmp}/bin/train_gpt", STUB_OURS % (sys.executable, OURS_BASE, MODE_ADD))
    write_exe(f"{tmp}/llmc/train_gpt2cu", STUB_LLMC % (sys.executable, LLMC_MS))
    write_exe(f"{tmp}/bin/profile_gpu_step", STUB_PROFILE % (sys.executable, OURS_BASE, MODE_ADD, PHASES, MODE_ADD))
    write_exe(f"{tmp}/bin/nvidia-smi", "#!/bin/sh\necho 'NVIDIA H200 stand-in'\n")
    glob_ = f"{tmp}/shards/toy_train_*.bin"
    md = f"{tmp}/out/bench.md"
    r = bench(tmp, md, f"{tmp}/llmc", glob_, SMALL_STEPS="30", OURS_TIMEOUT="5",
              STUB_FAIL="d24:repair:1", STUB_HANG="small:fp32:0", STUB_LLMC_FAIL="d24:1")
    rows, small = md_rows(md, 10), md_rows(md, 7)
    want = {(m, b, mode, g) for m, b in (("d12", "32"), ("d24", "16")) for mode in MODE_ADD for g in "01"}
    check(set(rows) == want, "bench_vs_llmc: a row per model (d12 B32, d24 B16), mode and graph by default",
          r.stdout + r.stderr)
    good = 0
    for (m, b, mode, g), cols in rows.items():
        if (m, mode, g) == ("d24", "repair", "1"):
            continue
        ours_ms = OURS_BASE[m] + MODE_ADD[mode] - 4 * int(g)
        fast, dflt = LLMC_MS[m], LLMC_MS[m] + 1.5
        ok = (cols[4] == "%.3f" % ours_ms and cols[5] == "%.3f" % fast and cols[7] == "%.2f" % (fast / ours_ms)
              and cols[9] == "-")
        ok = ok and (cols[6] == "n/a" and cols[8] == "n/a" if m == "d24" else
                     cols[6] == "%.3f" % dflt and cols[8] == "%.2f" % (dflt / ours_ms))
        good += ok
        if not ok:
            print("       row " + " | ".join(cols))
    check(good == 15, "ours = the median ms from step 10 on, llm.c = its average, ratios llm.c / ours (15 rows)")
    fr = rows.get(("d24", "16", "repair", "1"), [])
    check(fr[4:5] == ["n/a"] and fr[7:9] == ["n/a", "n/a"] and fr[5:6] == ["79.500"],
          "a failed run of ours shows n/a and n/a ratios; llm.c's column of that row stays", fr)
    check("FAILED ours d24 B16 T1024 repair graph 1 (rc 3" in r.stderr and "error: stub failure in d24:repair:1"
          in r.stderr, "a failed run is named, with its exit status and its last lines", r.stderr)
    check("FAILED llm.c d24 B16 -r 1 -ge 0 (rc 1" in r.stderr and "cuDNN error: stub failure" in r.stderr,
          "a failed llm.c run is named with its last lines, its column n/a", r.stderr)
    want_small = {("small", "16", mode, g) for mode in MODE_ADD for g in "01"}
    sm_ok = set(small) == want_small and all(
        c[5] == "%.3f" % (OURS_BASE["small"] + MODE_ADD[c[3]] - 4 * int(c[4])) and
        c[6] == "%.1f" % (1000 / (OURS_BASE["small"] + MODE_ADD[c[3]] - 4 * int(c[4])))
        for k, c in small.items() if k != ("small", "16", "fp32", "0"))
    check(sm_ok and small.get(("small", "16", "bf16", "1"), [""] * 7)[6] == "250.0",
          "small preset B16 T256: ms/step and steps/s (bf16 graph 1: 4 ms = 250.0 steps/s)", small)
    check(small.get(("small", "16", "fp32", "0"), [""] * 7)[5:] == ["n/a", "n/a"] and
          "FAILED ours small B16 T256 fp32 graph 0 (timed out" in r.stderr,
          "a run past its timeout is stopped, said and shown as n/a", r.stderr)
    check(r.returncode == 1, "exit status 1 when some run gave no time (the table is written anyway)", r.returncode)
    text = open(md).read() if os.path.exists(md) else ""
    check(text.startswith("## bench_vs_llmc ") and "on NVIDIA H200 stand-in" in text,
          "the table names the date and the GPU", text[:200])
    argv = open(f"{tmp}/argv.txt").read().splitlines()
    check(not any(l.startswith("profile ") for l in argv) and "Where our step's time goes" not in text and
          "Profile:" not in text, "PROFILE unset: no profiler run, no per-kernel table", text[-600:])
    ours_argv = [json.loads(l) for l in argv if not l.startswith("llmc ")]
    llmc_argv = [l.split()[1:] for l in argv if l.startswith("llmc ")]
    d12 = [a for a in ours_argv if a[a.index("--model") + 1] == "d12"]
    check(len(d12) == 8 and all(a[a.index("--seq-len") + 1] == "1024" and a[a.index("--steps") + 1] == "50" and
                                a[a.index("--train-data") + 1] == glob_ and a[a.index("--val-data") + 1] == ""
                                and a[a.index("--batch-size") + 1] == "32" for a in d12),
          "ours: B32 T1024 50 steps on the given shards, no validation", d12[:1])
    check(len(llmc_argv) == 4 and all(l[l.index("-i") + 1] == glob_ and l[l.index("-t") + 1] == "1024" and
                                      l[l.index("-x") + 1] == "50" for l in llmc_argv) and
          sorted(" ".join(l[-4:]) for l in llmc_argv) == ["-r 0 -ge 1"] * 2 + ["-r 1 -ge 0"] * 2 and
          any(l[l.index("-e") + 1] == "d24" and l[l.index("-b") + 1] == "16" and l[l.index("-d") + 1] == "16384"
              for l in llmc_argv),
          "llm.c: the same shards, T1024, 50 steps, -d B*1024, both flag sets", llmc_argv)
    tgz = f"{tmp}/out/bench_logs.tgz"
    names = subprocess.run(["tar", "-tzf", tgz], capture_output=True, text=True).stdout.split() \
        if os.path.exists(tgz) else []
    check("logs/ours_d12_b32_t1024_bf16_g0.jsonl" in names and "logs/llmc_d24_b16_-r1-ge0.log" in names,
          "raw logs (console + log.jsonl) in OUT_MD's _logs.tgz", names[:6])

    # every run giving a time: exit status 0; bad arguments: exit status 2 with the problem named
    os.makedirs(f"{tmp}/rr")
    open(f"{tmp}/argv.txt", "w").close()
    r = bench(tmp, "out/one.md", "llmc", "shards/toy_train_*.bin", "d12:32", MODES="gproj", GRAPHS="1",
              SMALL_STEPS="0", RUN_ROOT="rr", OURS_BIN="bin/train_gpt", cwd=tmp)
    one = md_rows(f"{tmp}/out/one.md", 10)
    a = json.loads(open(f"{tmp}/argv.txt").read().splitlines()[-1])
    check(a[a.index("--out-dir") + 1].startswith(f"{tmp}/rr/bench_vs_llmc.") and os.listdir(f"{tmp}/rr") == [],
          "run folders under RUN_ROOT, deleted with their checkpoints when the call ends", os.listdir(f"{tmp}/rr"))
    check(r.returncode == 0 and list(one) == [("d12", "32", "gproj", "1")] and "Small preset" not in r.stdout,
          "MODES/GRAPHS/SMALL_STEPS=0 pick the runs; relative paths from the caller's folder; exit status 0 when "
          "every run gave a time", r.stdout + r.stderr)
    # TWIN=1: the twin's printed ms/step in its column (PYTHON is a stand-in that answers for dev/gpt_twin.py)
    write_exe(f"{tmp}/bin/py", '#!/bin/sh\nif [ "$1" = dev/gpt_twin.py ]; then echo "$@" >> "$STUB_ARGV"\n'
              'echo "twin: 15 steps in 1.000 s: 66.70 ms/step, 491000 tokens/s, peak 1 GiB"; exit 0; fi\n'
              f'exec {sys.executable} "$@"\n')
    r = bench(tmp, f"{tmp}/out/twin.md", f"{tmp}/llmc", glob_, "d12:32", MODES="gproj", GRAPHS="1",
              SMALL_STEPS="0", TWIN="1", PYTHON=f"{tmp}/bin/py")
    tw = md_rows(f"{tmp}/out/twin.md", 10).get(("d12", "32", "gproj", "1"), [""] * 10)
    check(r.returncode == 0 and tw[9] == "66.70" and tw[4] == "57.000" and
          "dev/gpt_twin.py --model d12 --batch 32 --seq 1024" in open(f"{tmp}/argv.txt").read(),
          "TWIN=1: the PyTorch twin runs at the same B and T, its ms/step in the table", r.stdout + r.stderr)
    # SMALL_GRAPHS: the small preset's graph values apart from the models' GRAPHS
    r = bench(tmp, f"{tmp}/out/sg.md", f"{tmp}/llmc", glob_, "d12:32", MODES="gproj", GRAPHS="0",
              SMALL_STEPS="30", SMALL_GRAPHS="0 1")
    sg_rows, sg_small = md_rows(f"{tmp}/out/sg.md", 10), md_rows(f"{tmp}/out/sg.md", 7)
    check(r.returncode == 0 and list(sg_rows) == [("d12", "32", "gproj", "0")] and
          sorted(sg_small) == [("small", "16", "gproj", "0"), ("small", "16", "gproj", "1")] and
          sg_small[("small", "16", "gproj", "1")][5] == "%.3f" % (OURS_BASE["small"] + MODE_ADD["gproj"] - 4),
          "SMALL_GRAPHS picks the small preset's graph values, GRAPHS the models'", r.stdout + r.stderr)
    r = bench(tmp, f"{tmp}/out/one.md", f"{tmp}/llmc", glob_, "d12:32", MODES="gproj", GRAPHS="1",
              SMALL_STEPS="0", STUB_FAIL="d12:gproj:1")
    check(r.returncode == 1, "exit status 1 when only a run of ours failed", r.returncode)
    for args, what in (([md, f"{tmp}/shards", glob_], "holds no train_gpt2cu"),
                       ([md, f"{tmp}/llmc", f"{tmp}/none_*.bin"], "matches no file"),
                       ([md, f"{tmp}/llmc", glob_, "d12"], "'d12' is not MODEL:B")):
        r = bench(tmp, *args)
        check(r.returncode == 2 and what in r.stderr, f"refused: {what}", r.stderr)

    # PROFILE=1: per MODEL:B a table of kernel kinds x MODES from the profiler's output; a run that fails, prints
    # no table or hangs shows n/a in its column, its last lines are printed and the exit status is 1
    open(f"{tmp}/argv_prof.txt", "w").close()
    r = bench(tmp, f"{tmp}/out/prof.md", f"{tmp}/llmc", glob_, "d12:32", "d24:16", MODES="bf16 gproj repair fp32",
              GRAPHS="1", SMALL_STEPS="0", PROFILE="1", PROFILE_TIMEOUT="3", STUB_ARGV=f"{tmp}/argv_prof.txt",
              STUB_PROF_FAIL="d24:gproj", STUB_PROF_GARBLE="d24:repair", STUB_PROF_HANG="d24:fp32")
    tabs = prof_tables(f"{tmp}/out/prof.md")
    modes = ["bf16", "gproj", "repair", "fp32"]

    def want_col(model, mode):
        ms = prof_ms(mode)
        return ["%.3f" % m for m in ms] + ["%.3f" % sum(ms), "%.2f" % (OURS_BASE[model] + MODE_ADD[mode] - 0.25)]
    labels = PHASES + ["GPU time between the first and last event", "wall ms/step (unprofiled steps)"]
    d12t, d24t = tabs.get(("d12", "32"), {}), tabs.get(("d24", "16"), {})
    got12 = {k: d12t.get("rows", {}).get(k) for k in labels}
    check(d12t.get("modes") == modes and list(d12t.get("rows", {})) == labels and
          all(got12[k] == [want_col("d12", m)[i] for m in modes] for i, k in enumerate(labels)),
          "PROFILE=1: a row per kernel kind, the profiled total and the wall ms/step; a column per mode, each "
          "number in its cell", d12t)
    got24 = [d24t.get("rows", {}).get(k) for k in labels]
    check(d24t.get("modes") == modes and
          all(row == [want_col("d24", "bf16")[i], "n/a", "n/a", "n/a"] for i, row in enumerate(got24)),
          "a failed, unparsable or timed-out profile shows n/a in its column; the other modes stay", d24t)
    check("FAILED profile d24 B16 gproj (rc 1" in r.stderr and "139.00 GiB free" in r.stderr and
          "FAILED profile d24 B16 repair (no breakdown found" in r.stderr and "attn=repair" in r.stderr and
          "FAILED profile d24 B16 fp32 (timed out" in r.stderr,
          "a failed profile is named with its exit status and its last lines", r.stderr)
    check(r.returncode == 1, "exit status 1 when a profile gave no breakdown", r.returncode)
    pargv = [l.split()[1:] for l in open(f"{tmp}/argv_prof.txt").read().splitlines() if l.startswith("profile ")]
    check(len(pargv) == 8 and all(a[a.index("--seq") + 1] == "1024" and a[a.index("--steps") + 1] == "10"
                                  for a in pargv) and
          ["--model", "d24", "--batch", "16", "--seq", "1024", "--attn", "gproj", "--steps", "10"] in pargv,
          "the profiler: every MODEL:B and mode, --seq 1024 --steps 10", pargv)
    tgz = f"{tmp}/out/prof_logs.tgz"
    names = subprocess.run(["tar", "-tzf", tgz], capture_output=True, text=True).stdout.split() \
        if os.path.exists(tgz) else []
    check("logs/profile_d12_b32_bf16.log" in names and "logs/profile_d24_b16_gproj.log" in names and
          "Profile: `" in open(f"{tmp}/out/prof.md").read(),
          "the profiler's console logs go with the raw logs; its command is under the table", names)
    r = bench(tmp, "out/prof1.md", "llmc", "shards/toy_train_*.bin", "d12:32", MODES="gproj", GRAPHS="1",
              SMALL_STEPS="0", PROFILE="1", OURS_BIN="bin/train_gpt", PROFILE_BIN="bin/profile_gpu_step",
              STUB_ARGV=f"{tmp}/argv_prof.txt", cwd=tmp)
    one = prof_tables(f"{tmp}/out/prof1.md").get(("d12", "32"), {})
    check(r.returncode == 0 and one.get("rows", {}).get("wall ms/step (unprofiled steps)") == ["60.75"],
          "PROFILE_BIN relative to the caller's folder; exit status 0 when every profile gave its table",
          r.stdout + r.stderr)
    r = bench(tmp, f"{tmp}/out/prof2.md", f"{tmp}/llmc", glob_, "d12:32", PROFILE="1",
              PROFILE_BIN=f"{tmp}/bin/none")
    check(r.returncode == 2 and "no profiler at" in r.stderr, "PROFILE=1 without the profiler: refused", r.stderr)

    # stopped by a signal in the middle: the table holds the rows measured so far, and says so
    import signal
    import time
    open(f"{tmp}/argv.txt", "w").close()
    hang_pid = f"{tmp}/argv.txt.hang_pid"
    if os.path.exists(hang_pid):
        os.remove(hang_pid)  # the timeout check above wrote one
    os.makedirs(f"{tmp}/rr_stop")
    e = dict(os.environ, OURS_BIN=f"{tmp}/bin/train_gpt", STUB_ARGV=f"{tmp}/argv.txt", PYTHON=sys.executable,
             MODES="bf16", GRAPHS="0", STUB_HANG="d24:bf16:0", RUN_ROOT=f"{tmp}/rr_stop")
    p = subprocess.Popen(["bash", os.path.join(ROOT, "scripts", "bench_vs_llmc.sh"), f"{tmp}/out/stop.md",
                          f"{tmp}/llmc", glob_], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e,
                         start_new_session=True)
    for _ in range(200):
        if os.path.exists(hang_pid) and open(hang_pid).read():
            break
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    try:
        os.kill(int(open(hang_pid).read()), 0)
        alive = True
    except (OSError, ValueError):
        alive = False
    check(not alive and os.listdir(f"{tmp}/rr_stop") == [],
          "the run in flight is stopped with the script (no trainer left running, no run folder left)",
          os.listdir(f"{tmp}/rr_stop"))
    stop = open(f"{tmp}/out/stop.md").read() if os.path.exists(f"{tmp}/out/stop.md") else ""
    check(p.returncode == 130 and "Stopped early" in stop and list(md_rows(f"{tmp}/out/stop.md", 10)) ==
          [("d12", "32", "bf16", "0")] and os.path.exists(f"{tmp}/out/stop_logs.tgz"),
          "SIGTERM in the middle: exit 130, the rows measured so far, 'Stopped early', the logs' tgz",
          f"rc {p.returncode}\n{stop}\n{err[-800:]}")

    # LLMC_DIR holding llm.c's tarballs: unpacked and built once in LLMC_BUILD (the stand-in Makefile checks that
    # the cuDNN headers were unpacked into llmc/cudnn-frontend and records its make variables)
    src = f"{tmp}/src"
    os.makedirs(f"{src}/llmc")
    os.makedirs(f"{src}/include")
    open(f"{src}/include/cudnn_frontend.h", "w").close()
    with open(f"{src}/llmc/Makefile", "w") as f:
        f.write("train_gpt2cu:\n\ttest -f cudnn-frontend/include/cudnn_frontend.h\n"
                "\techo '$(USE_CUDNN) $(GPU_COMPUTE_CAPABILITY)' > made_with\n"
                f"\tcp {tmp}/llmc/train_gpt2cu train_gpt2cu\n")
    os.makedirs(f"{tmp}/bench")
    subprocess.run(["tar", "-czf", f"{tmp}/bench/llmc-test.tgz", "-C", src, "llmc"], check=True)
    subprocess.run(["tar", "-czf", f"{tmp}/bench/cudnn-frontend-include.tgz", "-C", src, "include"], check=True)
    r = bench(tmp, "--build-only", "bench", LLMC_BUILD="b", cwd=tmp)
    made = open(f"{tmp}/b/llmc/made_with").read().split() if os.path.exists(f"{tmp}/b/llmc/made_with") else []
    check(r.returncode == 0 and f"llm.c is {tmp}/b/llmc/train_gpt2cu" in r.stdout and made == ["1", "90"],
          "--build-only: llm.c unpacked with the cuDNN headers, built with USE_CUDNN=1 for sm_90", r.stdout + r.stderr)
    r = bench(tmp, "--build-only", f"{tmp}/bench", LLMC_BUILD=f"{tmp}/b")
    check(r.returncode == 0 and "building" not in r.stderr, "a second call finds the build and does not rebuild",
          r.stderr)
    with open(f"{src}/llmc/Makefile", "w") as f:
        f.write("train_gpt2cu:\n\techo 'nvcc: fatal: stand-in failure'; false\n")
    subprocess.run(["tar", "-czf", f"{tmp}/bench/llmc-test.tgz", "-C", src, "llmc"], check=True)
    r = bench(tmp, "--build-only", f"{tmp}/bench", LLMC_BUILD=f"{tmp}/b2")
    check(r.returncode == 2 and "nvcc: fatal: stand-in failure" in r.stderr and "llm.c build failed" in r.stderr
          and f"{tmp}/b2/llmc/build.log" in r.stderr, "a failed llm.c build: its log's tail and where the log is",
          r.stderr)

    # scripts/step_ms.py: a step logged twice (a resumed run) counts once, with its last record
    import step_ms  # noqa: E402  (scripts/ is on sys.path above)
    rows_ = [{"step": s, "loss": 1.0, "ms": 10.0} for s in range(10, 13)] + [{"step": 12, "loss": 1.0, "ms": 40.0},
                                                                             {"step": 13, "loss": 1.0, "ms": 40.0}]
    check(step_ms.step_ms(rows_, 10) == 25.0 and step_ms.step_ms(rows_, 20) is None,
          "step_ms: median over distinct steps from --from on (the last record of a repeated step)",
          step_ms.step_ms(rows_, 10))

sys.exit(summary())
