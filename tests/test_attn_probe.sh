#!/usr/bin/env bash
# tests/test_attn_probe.sh - end-to-end CPU test of the attention probe on a
# capture file written by dev/attn_capture.py.
#
# Why: the probe's numbers are only meaningful if the whole path is right -
# Python writer -> capture file -> C reader -> layout conversion -> fp64
# reference -> metrics. numpy computes exact causal attention itself and
# stores its O in the capture; the probe's "run's own O" row compares that O
# with the C fp64 reference, so any layout or reference mistake shows up as a
# large error instead of the BF16 rounding floor. The capture has a large key
# offset (rho 64) in [B, T, NH, HS] order (layout="bthd"), so the bf16 mode's
# dQ leak must appear and gproj must stay at the floor (the CPU emulation
# runs the modes: --cpu --no-gpu, no GPU needed). Also: --help, a capture
# written by a cudnn run (run mode 4) is read and replayed, cudnn (cuDNN's
# kernel, no CPU emulation) is left out of a CPU-only probe with a note and
# refused with the fix when named with --no-gpu, and a corrupt capture is
# refused with a message naming it.
# Needs nvcc (to build build/attn_probe) and a python3 with numpy; says
# "skipped" otherwise. Run from the repository root.
set -u
pass=0
fail=0
check() {  # check NAME CONDITION-EXIT-CODE
    if [ "$2" -eq 0 ]; then pass=$((pass + 1)); echo "  ok   $1"; else fail=$((fail + 1)); echo "  FAIL $1"; fi
}

py=""
for p in python3 /usr/bin/python3; do
    if "$p" -c 'import numpy' >/dev/null 2>&1; then py=$p; break; fi
done
if [ -z "$py" ]; then echo "skipped: no python3 with numpy"; echo "0 passed, 0 failed"; exit 0; fi
if ! command -v nvcc >/dev/null 2>&1 && [ ! -x /usr/local/cuda/bin/nvcc ]; then
    echo "skipped: nvcc not found, build/attn_probe cannot be built"; echo "0 passed, 0 failed"; exit 0
fi
if ! make --no-print-directory build/attn_probe >/tmp/test_attn_probe_build.log 2>&1; then
    tail -n 20 /tmp/test_attn_probe_build.log
    echo "  FAIL building build/attn_probe"; echo "0 passed, 1 failed"; exit 1
fi

dir=$(mktemp -d /tmp/test_attn_probe.XXXXXX)
trap 'rm -rf "$dir"' EXIT

echo "== --help works without a GPU"
./build/attn_probe --help >"$dir/help.txt" 2>&1
check "attn_probe --help exits 0" $?
grep -q -- "--capture FILE" "$dir/help.txt"
check "help lists --capture" $?

echo "== capture from numpy (rho 64, [B,T,NH,HS] order), probed with the CPU emulation"
"$py" - "$dir/offset.attncap" <<'PY'
import sys
import numpy as np
sys.path.insert(0, "dev")
import attn_capture

B, T, NH, HS, rho = 1, 96, 3, 64, 64.0
rng = np.random.default_rng(7)
def bf16(a):
    return attn_capture.bf16_bits_to_float(attn_capture.float_to_bf16_bits(a.astype(np.float32))).reshape(a.shape)
q = bf16(rng.standard_normal((B, T, NH, HS)))
u = rng.standard_normal((NH, HS)); u /= np.linalg.norm(u, axis=1, keepdims=True)
k = bf16(rng.standard_normal((B, T, NH, HS)) + rho * np.sqrt(HS) * u[None, None])
v = bf16(rng.standard_normal((B, T, NH, HS)))
do = bf16(rng.standard_normal((B, T, NH, HS)))
# exact causal attention in float64, [B, T, NH, HS]
s = np.einsum("bthd,bshd->bhts", q.astype(np.float64), k.astype(np.float64)) / np.sqrt(HS)
s = np.where(np.tril(np.ones((T, T), dtype=bool)), s, -np.inf)
p = np.exp(s - s.max(-1, keepdims=True)); p /= p.sum(-1, keepdims=True)
o = np.einsum("bhts,bshd->bthd", p, v.astype(np.float64))
attn_capture.write_capture(sys.argv[1], q, k, v, do, out=o, dtype="bf16", layer=5, step=777,
                           attn_mode="bf16", layout="bthd")
# the same tensors as a cudnn run's capture (run mode 4)
attn_capture.write_capture(sys.argv[1].replace("offset", "cudnn_run"), q, k, v, do, out=o, dtype="bf16", layer=2,
                           step=31, attn_mode="cudnn", layout="bthd")
PY
check "python writes the capture" $?
./build/attn_probe --cpu --no-gpu --modes bf16,gproj --capture "$dir/offset.attncap" --json "$dir/probe.json" \
    >"$dir/probe.txt" 2>&1
rc=$?
cat "$dir/probe.txt"
check "probe runs on the capture (exit $rc)" $rc
("$py" - "$dir/probe.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
inp = d["inputs"][0]
res = {r["mode"]: r for r in inp["results"]}
checks = [
    ("header carried through (layer 5, step 777, run mode bf16, 3 heads, T 96)",
     (inp["layer"], inp["step"], inp["run_mode"], inp["NH"] * inp["B"], inp["T"]) == (5, 777, "bf16", 3, 96)),
    ("measured key offset rho within 10%% of 64 (median %.3g)" % inp["rho"]["median"],
     abs(inp["rho"]["median"] - 64) < 6.4),
    ("numpy's O vs the C fp64 reference at the BF16 floor: max %.3g%% < 0.4%%" % (100 * res["captured O"]["O"]["max"]),
     res["captured O"]["O"]["max"] < 0.004),
    ("bf16 dQ leaks at rho 64: median %.3g%% > 5%%" % (100 * res["bf16"]["dQ"]["median"]),
     res["bf16"]["dQ"]["median"] > 0.05),
    ("gproj dQ at the floor: median %.3g%% <= 0.35%%" % (100 * res["gproj"]["dQ"]["median"]),
     res["gproj"]["dQ"]["median"] <= 0.0035),
    ("gproj dK at the floor: median %.3g%% <= 0.35%%" % (100 * res["gproj"]["dK"]["median"]),
     res["gproj"]["dK"]["median"] <= 0.0035),
    ("gproj restores zero dS row sums better than bf16 (%.3g < %.3g)"
     % (res["gproj"]["ds_row_residual"]["median"], res["bf16"]["ds_row_residual"]["median"]),
     res["gproj"]["ds_row_residual"]["median"] < 0.01 * res["bf16"]["ds_row_residual"]["median"]),
    ("no NaN/Inf", all(sum(r["nonfinite"].values()) == 0 for r in inp["results"])),
]
bad = 0
for name, ok in checks:
    print(("  ok   " if ok else "  FAIL ") + name)
    bad += not ok
print("json checks: %d %d" % (len(checks) - bad, bad))
PY
) 2>&1 | tee "$dir/json_checks.txt"
counts=$(grep -E '^json checks: [0-9]+ [0-9]+$' "$dir/json_checks.txt" | tail -n 1)
if [ -z "$counts" ]; then
    fail=$((fail + 1)); echo "  FAIL reading the probe's JSON (see above)"
else
    set -- $counts
    pass=$((pass + $3)); fail=$((fail + $4))
fi

echo "== a capture of a cudnn run; cudnn itself without a GPU"
./build/attn_probe --cpu --no-gpu --capture "$dir/cudnn_run.attncap" --json "$dir/cudnn_run.json" \
    >"$dir/cudnn_run.txt" 2>&1
rc=$?
check "probe reads a cudnn run's capture (exit $rc)" $rc
grep -q "L2 step 31 (cudnn run)" "$dir/cudnn_run.txt"
check "the text names the run mode cudnn" $?
"$py" -c '
import json, sys
inp = json.load(open(sys.argv[1]))["inputs"][0]
modes = sorted(set(r["mode"] for r in inp["results"] if r["impl"] == "cpu"))
sys.exit(0 if inp["run_mode"] == "cudnn" and (inp["layer"], inp["step"]) == (2, 31) and
         modes == ["bf16", "fp32", "gproj", "repair"] else 1)' "$dir/cudnn_run.json"
check "JSON: run_mode cudnn, layer 2, step 31, the four emulated modes on the CPU, no cudnn row" $?
grep -q "note: cudnn left out: it runs only on the GPU" "$dir/cudnn_run.txt" || \
    grep -q "note: cudnn left out: this build has no cuDNN" "$dir/cudnn_run.txt"
check "a CPU-only probe says why cudnn is left out" $?
./build/attn_probe --cpu --no-gpu --modes bf16,cudnn --case offset:4 --T 64 >"$dir/cudnn_nogpu.txt" 2>&1
rc=$?
cat "$dir/cudnn_nogpu.txt"
[ $rc -ne 0 ] && grep -q "runs only on the GPU" "$dir/cudnn_nogpu.txt" && \
    grep -q "drop --no-gpu, or leave cudnn out of --modes" "$dir/cudnn_nogpu.txt"
check "--modes cudnn with --no-gpu: refused with the fix (exit $rc)" $?

echo "== a corrupt capture is refused, naming the file"
cp "$dir/offset.attncap" "$dir/corrupt.attncap"
printf '\x01' | dd of="$dir/corrupt.attncap" bs=1 seek=1000 conv=notrunc status=none
./build/attn_probe --cpu --no-gpu --capture "$dir/corrupt.attncap" >"$dir/corrupt.txt" 2>&1
rc=$?
[ $rc -ne 0 ]; check "corrupt capture: non-zero exit ($rc)" $?
grep -q "corrupt.attncap" "$dir/corrupt.txt" && grep -q "checksum mismatch" "$dir/corrupt.txt"
check "corrupt capture: message names the file and the checksum ($(grep -m 1 'error:' "$dir/corrupt.txt"))" $?

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
