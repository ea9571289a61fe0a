#!/usr/bin/env python3
"""scripts/step_ms.py - one run's step time: the median "ms" of its log.jsonl step records from step N on.

Why: the speed comparisons (scripts/bench_vs_llmc.sh, and any script that times our trainer from its log)
need one number per run, read the same way everywhere: the median of the per-step wall times, from step
--from on (default 10: the first steps hold warm-up, cuBLASLt heuristics and the CUDA-graph capture), so a
slow outlier step does not move it. The log is read with compare_runs.read_log (a damaged line is skipped
and named on stderr); a step logged twice (after a --resume) counts once, with its last record.

Usage: scripts/step_ms.py LOG_JSONL_OR_RUN_DIR [--from N]
Prints the median as "%.3f", or "n/a" (exit 1) when the log holds no step record from step N on.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_runs import fnum, median, read_log, step_records  # noqa: E402


def step_ms(rows, first):
    """Median ms/step over the step records with step >= first (None when there is none)."""
    by_step = {r["step"]: fnum(r.get("ms")) for r in step_records(rows) if r["step"] >= first}
    ms = [v for v in by_step.values() if v is not None]
    return median(ms) if ms else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("log", help="a run's log.jsonl, or its run folder")
    ap.add_argument("--from", dest="first", type=int, default=10, help="first step counted (default 10)")
    a = ap.parse_args()
    _, rows = read_log(a.log)
    ms = step_ms(rows, a.first)
    if ms is None:
        print("n/a")
        print(f"step_ms: {a.log}: no step record with an \"ms\" from step {a.first} on", file=sys.stderr)
        return 1
    print("%.3f" % ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
