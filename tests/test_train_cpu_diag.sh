#!/usr/bin/env bash
# tests/test_train_cpu_diag.sh - end-to-end tests of the CPU trainer's run
# diagnostics (--diag-every, --probe-every, --capture-attn, --zero-key-bias-grad;
# model/diagnostics.h, docs/diagnostics.md).
#
# Why: the diagnostics library is unit-tested in tests/test_diagnostics.c;
# this checks what only the wired-up trainer shows, on the default corpus:
#   records   "diag" records at exactly the diag and probe steps, with the GPU
#             trainer's field names, per-layer arrays of L numbers, the probe
#             (fp64 reference) on the round-robin layer, measured values in
#             range (rho >= 0, entropy <= ln T, norms > 0);
#   probe     fp32 mode reads ~1e-7 against fp64, bf16 mode reads > 1e-3;
#   gauge     --zero-key-bias-grad 1: key-bias gradient norm exactly 0 in
#             every layer; without it (bf16) > 0;
#   read-only diagnostics on or off: the same losses and byte-identical model
#             and resume-state files (they touch no weights, RNG or data);
#   resume    with diagnostics on: 8 steps == 4 + --resume + 4, bit for bit,
#             the diag records included;
#   gauge arm across a resume: --zero-key-bias-grad is stored in the state;
#             resuming with the other value is refused (both ways), with the
#             same value or without the flag it continues bit for bit; a
#             version-1 state (arm not recorded) is refused;
#   captures  the files asked for exist, and their header/size fit the shape
#             (attention/support/attn_capture.h), none at other steps or layers;
#   warning   a low --warn-rho / --warn-dq-err fires: console line with the
#             gproj hint, attn_warning events once per (kind, layer) after
#             their diag record; thresholds 0 fire nothing; the first warning
#             gets a kept checkpoint (--checkpoint-on-warning) that outlives the
#             rolling ones and that a run continues from under gproj;
#   modern    with --pos rope --qk-norm 1: diagnostics and the capture read q
#             and k after qk-norm and RoPE (what attention sees); no key bias
#             means null key-bias norms; --zero-key-bias-grad is refused where
#             the key-bias gradient is not exactly 0;
#   refusals  --capture-attn with --capture-steps, a layer past the model,
#             --capture-layers alone;
#   recipe    scripts/matched_runs.sh --cpu --gauge-arm bf16 runs end to end
#             (compare_runs.py needs matplotlib: PYTHON picks the interpreter).
#
# Usage: tests/test_train_cpu_diag.sh   (from anywhere; needs build/train_gpt_cpu,
# build/tokenize and .cache/ from scripts/setup_data.sh - `make test` does all)
set -u
cd "$(dirname "$0")/.."
source tests/train_test_lib.sh

train_test_setup
COMMON=(--train-data "$DATA/moby_train_*.bin" --val-data "$DATA/moby_val_*.bin" --batch-size 2
        --seq-len 32 --lr 3e-3 --warmup-steps 2 --val-every 4 --val-batches 2
        --sample-every 4 --sample-tokens 4 --checkpoint-every 4 --log-every 4 --attn bf16)
DIAG=(--diag-every 2 --probe-every 3 --capture-attn 4:1)

# check_log DESCRIPTION LOG PYTHON_CONDITION_BODY: runs the body with `recs`
# (every record), `diag` (the diag records, last per step) and `L` in scope;
# it must print nothing and exit 0 to pass (it prints what was wrong).
check_log() {
    local desc=$1 log=$2 body=$3
    local msg
    msg=$(python3 - "$log" "$body" <<'EOF' 2>&1
import json, math, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
cfg = [r for r in recs if r.get("event") == "config"][0]
L = cfg["model_config"]["num_layers"]
T = cfg["T"]
diag = {}
for r in recs:
    if r.get("event") == "diag":
        diag[r["step"]] = r
problems = []
def need(cond, what):
    if not cond: problems.append(what)
exec(sys.argv[2])
print("; ".join(problems))
sys.exit(1 if problems else 0)
EOF
)
    if [ $? -eq 0 ]; then pass=$((pass + 1)); echo "  ok   $desc"
    else fail=$((fail + 1)); echo "  FAIL $desc: $msg"; fi
}

# ---------------------------------------------------------------- records
section "records: --diag-every 2 --probe-every 3 --capture-attn 4:1 --zero-key-bias-grad 1 (bf16, 6 steps)"
run_ok "train 6 steps with diagnostics and the gauge arm" "${COMMON[@]}" "${DIAG[@]}" --zero-key-bias-grad 1 \
    --steps 6 --out-dir "$TMP/arm"
check_log "diag records at steps 0, 2, 3, 4 (diag: 0, 2, 4; probe: 0, 3), each after its step record" \
    "$TMP/arm/log.jsonl" '
need(sorted(diag) == [0, 2, 3, 4], "diag steps %s" % sorted(diag))
for i, r in enumerate(recs):
    if r.get("event") == "diag":
        prev = recs[i - 1]
        need("loss" in prev and prev.get("step") == r["step"], "diag record of step %d does not follow its step record" % r["step"])'
check_log "field names and per-layer arrays as the GPU trainer writes them" "$TMP/arm/log.jsonl" '
keys = ["rho_max", "rho_median", "q_absmax", "k_absmax", "logit_max", "entropy_mean", "key_bias_norm",
        "key_bias_grad_norm"]
arrays = ["layer_rho_max", "layer_rho_median", "layer_q_absmax", "layer_k_absmax", "layer_logit_max",
          "layer_entropy", "layer_grad_norm", "layer_key_bias_norm", "layer_key_bias_grad_norm"]
for s in (0, 2, 4):
    r = diag[s]
    for k in keys: need(isinstance(r.get(k), (int, float)), "step %d: %s = %r" % (s, k, r.get(k)))
    for k in arrays:
        need(isinstance(r.get(k), list) and len(r[k]) == L and all(isinstance(x, (int, float)) for x in r[k]),
             "step %d: %s = %r" % (s, k, r.get(k)))
    need(isinstance(r.get("diag_ms"), (int, float)), "step %d: diag_ms" % s)
for k in keys + arrays:
    need(diag[3].get(k) is None or (isinstance(diag[3][k], list) and all(x is None for x in diag[3][k])),
         "probe-only step 3 has a measured %s" % k)'
check_log "measured values in range (rho >= 0, rho_median <= rho_max, 0 < entropy <= ln T, norms > 0, run-level = max over layers)" \
    "$TMP/arm/log.jsonl" '
for s in (0, 2, 4):
    r = diag[s]
    for l in range(L):
        need(0 <= r["layer_rho_median"][l] <= r["layer_rho_max"][l], "step %d layer %d rho" % (s, l))
        need(0 < r["layer_entropy"][l] <= math.log(T) + 1e-5, "step %d layer %d entropy %r" % (s, l, r["layer_entropy"][l]))
        need(r["layer_grad_norm"][l] > 0 and r["layer_q_absmax"][l] > 0, "step %d layer %d norms" % (s, l))
    need(r["rho_max"] == max(r["layer_rho_max"]), "step %d run-level rho_max" % s)
    need(r["q_absmax"] == max(r["layer_q_absmax"]), "step %d run-level q_absmax" % s)'
check_log "probe on steps 0 and 3 only: layer (step / 3) mod L, mode bf16, fp64 reference, 1e-3 < dQ error < 1, median <= max" \
    "$TMP/arm/log.jsonl" '
for s in (0, 3):
    r = diag[s]
    need(r.get("probe_layer") == (s // 3) % L, "step %d probe_layer %r" % (s, r.get("probe_layer")))
    need(r.get("probe_mode") == "bf16" and r.get("probe_ref") == "fp64", "step %d probe mode/ref" % s)
    need(1e-3 < r.get("probe_dq_err", 0) < 1 and 1e-3 < r.get("probe_dk_err", 0) < 1,
         "step %d bf16 probe errors %r %r" % (s, r.get("probe_dq_err"), r.get("probe_dk_err")))
    need(r["probe_dq_err"] <= r["probe_dq_err_max"] and r["probe_dk_err"] <= r["probe_dk_err_max"], "median > max")
for s in (2, 4):
    need("probe_layer" not in diag[s], "step %d has a probe" % s)'
check_log "gauge arm: the key-bias gradient norm is exactly 0 in every layer" "$TMP/arm/log.jsonl" '
for s in (0, 2, 4):
    need(diag[s]["key_bias_grad_norm"] == 0 and all(x == 0 for x in diag[s]["layer_key_bias_grad_norm"]),
         "step %d key-bias grad %r" % (s, diag[s]["layer_key_bias_grad_norm"]))
need(diag[4]["key_bias_norm"] == 0, "the key bias moved under the arm: %r" % diag[4]["key_bias_norm"])'

# ---------------------------------------------------------------- captures
section "captures: --capture-attn 4:1 -> attn_step00000004_layer01.bin only"
caps=$(cd "$TMP/arm" && ls attn_*.bin 2>/dev/null | tr '\n' ' ')
check "exactly one capture file, the one asked for (found: ${caps:-none})" test "$caps" = "attn_step00000004_layer01.bin "
check "capture = magic + 128-byte header + Q, K, V, dO, O in fp32 + stats, for B2 T32 C64 NH4" python3 - \
    "$TMP/arm/attn_step00000004_layer01.bin" <<'EOF'
import os, sys
B, T, C, NH = 2, 32, 64, 4
want = 128 + 4 * (5 * B * T * C + B * NH * T * 2)
size = os.path.getsize(sys.argv[1])
magic = open(sys.argv[1], "rb").read(8)
print("    %s: %d bytes (expected %d)" % (magic, size, want))
sys.exit(0 if size == want and magic == b"ATTNCAPT" else 1)
EOF

# ---------------------------------------------------------------- probe floor in fp32
section "probe: fp32 mode against the fp64 reference"
run_ok "fp32, probe every step, 2 steps" "${COMMON[@]}" --attn fp32 --probe-every 1 --steps 2 --out-dir "$TMP/fp32"
check_log "fp32 probe dQ/dK errors < 1e-5 (fp32 rounding only), on layers 0 and 1" "$TMP/fp32/log.jsonl" '
need(sorted(diag) == [0, 1], "probe steps %s" % sorted(diag))
for s in diag:
    r = diag[s]
    need(r["probe_layer"] == s % L and r["probe_mode"] == "fp32", "step %d probe layer/mode" % s)
    need(0 < r["probe_dq_err_max"] < 1e-5 and 0 < r["probe_dk_err_max"] < 1e-5,
         "step %d fp32 errors %r %r" % (s, r["probe_dq_err_max"], r["probe_dk_err_max"]))
    need(r.get("rho_max") is None, "a probe-only record measured rho")'

# ---------------------------------------------------------------- read-only
section "read-only: the same run with and without diagnostics (bf16, no gauge arm)"
run_ok "plain: 8 steps, no diagnostics" "${COMMON[@]}" --steps 8 --out-dir "$TMP/plain"
run_ok "diag: 8 steps, diagnostics + probe + capture" "${COMMON[@]}" "${DIAG[@]}" --steps 8 --out-dir "$TMP/diag"
check "same losses, val losses and samples (exact numbers)" same_records "$TMP/plain/log.jsonl" "$TMP/diag/log.jsonl" 8
check "model_00000008.bin identical byte for byte" cmp -s "$TMP/plain/model_00000008.bin" "$TMP/diag/model_00000008.bin"
check "state_00000008.bin identical (moments, data position, RNG)" \
    cmp -s "$TMP/plain/state_00000008.bin" "$TMP/diag/state_00000008.bin"
check_log "without the arm the bf16 key-bias gradient is not zero (rounding noise) and the key bias moves" \
    "$TMP/diag/log.jsonl" '
for s in (0, 2, 4, 6):
    need(diag[s]["key_bias_grad_norm"] > 0, "step %d key-bias grad norm %r" % (s, diag[s]["key_bias_grad_norm"]))
need(diag[6]["key_bias_norm"] > 0, "key bias still zero at step 6")'

# ---------------------------------------------------------------- resume
section "resume with diagnostics on: 8 steps == 4 + --resume + 4, bit for bit"
run_ok "first 4 steps (--stop-at 4)" "${COMMON[@]}" "${DIAG[@]}" --steps 8 --stop-at 4 --out-dir "$TMP/res"
run_ok "--resume to 8 steps" "${COMMON[@]}" "${DIAG[@]}" --steps 8 --out-dir "$TMP/res" --resume
check "same losses, val losses and samples" same_records "$TMP/diag/log.jsonl" "$TMP/res/log.jsonl" 8
check "model_00000008.bin identical" cmp -s "$TMP/diag/model_00000008.bin" "$TMP/res/model_00000008.bin"
check "state_00000008.bin identical" cmp -s "$TMP/diag/state_00000008.bin" "$TMP/res/state_00000008.bin"
check "the same diag records (every number, diag_ms aside)" python3 - "$TMP/diag/log.jsonl" "$TMP/res/log.jsonl" <<'EOF'
import json, sys
def diags(p):
    d = {}
    for l in open(p):
        r = json.loads(l)
        if r.get("event") == "diag":
            r.pop("diag_ms", None)
            d[r["step"]] = r
    return d
a, b = diags(sys.argv[1]), diags(sys.argv[2])
print("    diag steps %s vs %s" % (sorted(a), sorted(b)))
sys.exit(0 if a == b and sorted(a) == [0, 2, 3, 4, 6] else 1)
EOF
check "the capture of step 4 identical" cmp -s "$TMP/diag/attn_step00000004_layer01.bin" \
    "$TMP/res/attn_step00000004_layer01.bin"

# ---------------------------------------------------------------- the gauge arm across a resume
section "the gauge arm survives resume (--zero-key-bias-grad is in the resume state)"
run_ok "arm on: first 4 of 6 steps (--stop-at 4)" "${COMMON[@]}" "${DIAG[@]}" --zero-key-bias-grad 1 --steps 6 \
    --stop-at 4 --out-dir "$TMP/armres"
cp -r "$TMP/armres" "$TMP/armres2"
expect_refusal "resume with --zero-key-bias-grad 0 refused, naming both values and the fix" \
    "saved with --zero-key-bias-grad 1 (gauge arm on) and this resume asks for --zero-key-bias-grad 0" \
    "${COMMON[@]}" "${DIAG[@]}" --zero-key-bias-grad 0 --steps 6 --out-dir "$TMP/armres" --resume
check "  ... with the hint" grep -qF "hint: resume with --zero-key-bias-grad 1" "$TMP/last.log"
check "the refused resume trained nothing" test ! -e "$TMP/armres/model_00000006.bin"
run_ok "resume with --zero-key-bias-grad 1" "${COMMON[@]}" "${DIAG[@]}" --zero-key-bias-grad 1 --steps 6 \
    --out-dir "$TMP/armres" --resume
check "same losses, val losses and samples as the uninterrupted arm run" \
    same_records "$TMP/arm/log.jsonl" "$TMP/armres/log.jsonl" 6
check "model_00000006.bin identical to the uninterrupted arm run" \
    cmp -s "$TMP/arm/model_00000006.bin" "$TMP/armres/model_00000006.bin"
check "state_00000006.bin identical too" cmp -s "$TMP/arm/state_00000006.bin" "$TMP/armres/state_00000006.bin"
run_ok "resume without the flag" "${COMMON[@]}" "${DIAG[@]}" --steps 6 --out-dir "$TMP/armres2" --resume
check "keeps the saved arm: model_00000006.bin identical to the arm run" \
    cmp -s "$TMP/arm/model_00000006.bin" "$TMP/armres2/model_00000006.bin"
expect_refusal "an arm-off run resumed with --zero-key-bias-grad 1 refused" \
    "saved with --zero-key-bias-grad 0 (gauge arm off) and this resume asks for --zero-key-bias-grad 1" \
    "${COMMON[@]}" "${DIAG[@]}" --zero-key-bias-grad 1 --steps 12 --out-dir "$TMP/res" --resume
mkdir -p "$TMP/v1"
cp "$TMP/armres2/state_00000004.bin" "$TMP/armres2/model_00000004.bin" "$TMP/v1/"
python3 -c "
import struct, sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(8); f.write(struct.pack('<q', 1))   # header slot 1: the version
" "$TMP/v1/state_00000004.bin"
expect_refusal "a version-1 state (no arm recorded) refused with the way out" \
    "version 1 does not record --zero-key-bias-grad" \
    "${COMMON[@]}" "${DIAG[@]}" --steps 6 --out-dir "$TMP/v1" --resume

# ---------------------------------------------------------------- early warning
section "early warning: --warn-rho / --warn-dq-err -> console line + attn_warning event, once per (kind, layer)"
run_ok "bf16, --diag-every 2 --probe-every 1 --warn-rho 1e-6 --warn-dq-err 1e-9, 6 steps" "${COMMON[@]}" \
    --diag-every 2 --probe-every 1 --warn-rho 1e-6 --warn-dq-err 1e-9 --steps 6 --out-dir "$TMP/warn"
cp "$TMP/last.log" "$TMP/warn.console"
check_log "rho warnings for every layer at step 0 only; dQ warnings at steps 0 and 1 (layers 0, 1: round robin), then quiet" \
    "$TMP/warn/log.jsonl" '
w = [r for r in recs if r.get("event") == "attn_warning"]
rho = sorted((r["step"], r["layer"]) for r in w if r["kind"] == "rho")
dq = sorted((r["step"], r["layer"]) for r in w if r["kind"] == "dq_err")
need(rho == [(0, l) for l in range(L)], "rho warnings %s" % rho)
need(dq == [(s, s % L) for s in range(L)], "dq warnings %s" % dq)
for r in w:
    need(r["value"] > r["threshold"] and r["mode"] == "bf16", "record %r" % r)
    need(r["value"] == (diag[r["step"]]["layer_rho_max"][r["layer"]] if r["kind"] == "rho" else diag[r["step"]]["probe_dq_err"]),
         "value %r is not the logged one" % r)
for i, r in enumerate(recs):
    if r.get("event") == "attn_warning":
        need(recs[i - 1].get("event") in ("diag", "attn_warning") and recs[i - 1]["step"] == r["step"],
             "warning of step %d does not follow its diag record" % r["step"])'
check "console: the warning names step, layer, value and the way to continue under gproj" \
    bash -c "grep -q 'warning: step 0: layer 0 key offset rho .* crossed --warn-rho 1e-06' '$TMP/warn.console' &&
             grep -q 'hint: bf16 attention.s backward leaks here; to continue this run under gproj, run the same command with --resume --attn gproj' '$TMP/warn.console'"
run_ok "the same with --warn-rho 0 --warn-dq-err 0" "${COMMON[@]}" --diag-every 2 --probe-every 1 --warn-rho 0 \
    --warn-dq-err 0 --steps 4 --out-dir "$TMP/nowarn"
check "thresholds 0: no attn_warning event" bash -c "! grep -q attn_warning '$TMP/nowarn/log.jsonl'"

# --checkpoint-on-warning (default 1): the first warning (step 0) gets a kept checkpoint at the next boundary
check "the warning's checkpoint: step 1 written, logged, the console naming its state file and the gproj command" \
    bash -c "[ -f '$TMP/warn/model_00000001.bin' ] && [ -f '$TMP/warn/state_00000001.bin' ] &&
             grep -q '\"event\": \"checkpoint\", \"step\": 1,' '$TMP/warn/log.jsonl' &&
             grep -q 'checkpoint: the attention warning of step 0 gets a checkpoint that is kept' '$TMP/warn.console' &&
             grep -qF 'checkpoint: kept for the attention warning; to branch from it under gproj: the same command with --resume $TMP/warn/state_00000001.bin --attn gproj --out-dir $TMP/warn_gproj' '$TMP/warn.console' &&
             [ \$(grep -c 'kept for the attention warning' '$TMP/warn.console') = 1 ]"
check "no warning, no warning checkpoint (thresholds 0: no step-1 checkpoint)" \
    bash -c "[ ! -e '$TMP/nowarn/model_00000001.bin' ] && ! grep -q 'attention warning' '$TMP/last.log'"
run_ok "warnings with --checkpoint-on-warning 0" "${COMMON[@]}" --diag-every 2 --probe-every 1 --warn-rho 1e-6 \
    --warn-dq-err 1e-9 --checkpoint-on-warning 0 --steps 4 --out-dir "$TMP/warn_off"
check "--checkpoint-on-warning 0: warnings, but no step-1 checkpoint" \
    bash -c "grep -q attn_warning '$TMP/warn_off/log.jsonl' && [ ! -e '$TMP/warn_off/model_00000001.bin' ]"
run_ok "warnings with a --checkpoint-minutes checkpoint at every boundary (--checkpoint-every 0)" "${COMMON[@]}" \
    --diag-every 2 --probe-every 1 --warn-rho 1e-6 --warn-dq-err 1e-9 --checkpoint-every 0 --checkpoint-minutes 1e-9 \
    --steps 5 --out-dir "$TMP/warn_rolling"
check "the warning's checkpoint outlives the rolling ones (step 1 kept, steps 2 and 3 deleted)" \
    bash -c "[ -f '$TMP/warn_rolling/state_00000001.bin' ] && [ ! -e '$TMP/warn_rolling/state_00000002.bin' ] &&
             [ ! -e '$TMP/warn_rolling/state_00000003.bin' ]"
run_ok "continue from the warning's checkpoint under gproj (a new folder, --resume STATE --attn gproj)" \
    "${COMMON[@]}" --diag-every 2 --probe-every 1 --steps 6 --resume "$TMP/warn/state_00000001.bin" --attn gproj \
    --out-dir "$TMP/warn_gproj"
check "the continued run resumes at step 1 and trains steps 1-5 under gproj" python3 -c '
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
steps = [r for r in recs if "loss" in r and "event" not in r]
sys.exit(not (recs[0].get("event") == "resume" and recs[0].get("start_step") == 1 and
              [r["step"] for r in steps] == [1, 2, 3, 4, 5] and all(r["attn"] == "gproj" for r in steps)))' \
    "$TMP/warn_gproj/log.jsonl"
run_ok "the same continuation with --warn-rho 1e-6: the offset it warns about can date from the bf16 steps" \
    "${COMMON[@]}" --diag-every 2 --probe-every 1 --warn-rho 1e-6 --steps 4 --resume "$TMP/warn/state_00000001.bin" \
    --attn gproj --out-dir "$TMP/warn_gproj2"
check "  ... and the note says the run was trained under bf16 until step 1, not that training itself grew it" \
    bash -c "grep -qF 'note: this run uses gproj attention now, but it was trained under bf16 until step 1' '$TMP/last.log' &&
             ! grep -q 'comes from training itself' '$TMP/last.log'"

# ---------------------------------------------------------------- refusals
section "refusals"
# ---------------------------------------------------------------- the keys attention sees
section "modern stack: diagnostics and captures read q and k after qk-norm and RoPE"
# With qk-norm every head's q and k has RMS |gain| (~1 after 2 steps) and RoPE keeps norms, so the
# captured heads have RMS ~1 and max |q|, |k| lie in (1, sqrt(HS) * 1.1]; the qkv matmul output
# (what diagnostics read without the transform) has RMS ~0.1-0.3 at this stage.
run_ok "--pos rope --qk-norm 1 --bias 0, diag every step, capture step 1 layer 0" "${COMMON[@]}" --pos rope \
    --qk-norm 1 --bias 0 --diag-every 1 --probe-every 1 --capture-attn 1:0 --steps 2 --out-dir "$TMP/qkn"
check_log "max |q|, |k| of every layer in (1, 4.4] (post-norm keys), key-bias norms null (no bias)" \
    "$TMP/qkn/log.jsonl" '
for s in diag:
    r = diag[s]
    for name in ("layer_q_absmax", "layer_k_absmax"):
        need(all(1.0 < v <= 4.4 for v in r[name]), "step %d %s %r" % (s, name, r[name]))
    need(r["key_bias_norm"] is None and all(v is None for v in r["layer_key_bias_norm"]),
         "step %d key bias %r" % (s, r["layer_key_bias_norm"]))
    need(r["probe_dq_err_max"] is not None and r["probe_dq_err_max"] > 0, "step %d probe ran" % s)
'
check "the capture holds the normed, rotated q and k: every head's RMS within 10% of 1" python3 - \
    "$TMP/qkn/attn_step00000001_layer00.bin" <<'EOF'
import struct, sys
B, T, C, NH = 2, 32, 64, 4
HS = C // NH
data = open(sys.argv[1], "rb").read()
vals = struct.unpack("<%df" % (2 * B * T * C), data[128:128 + 8 * B * T * C])  # Q then K
rms = [(sum(v * v for v in vals[i:i + HS]) / HS) ** 0.5 for i in range(0, len(vals), HS)]
print("    head RMS of Q and K: min %.4f max %.4f" % (min(rms), max(rms)))
sys.exit(0 if all(0.9 < r < 1.1 for r in rms) else 1)
EOF
expect_refusal "--zero-key-bias-grad with --bias 0" "--zero-key-bias-grad 1 needs a key bias whose exact gradient is 0" \
    "${COMMON[@]}" --bias 0 --zero-key-bias-grad 1 --out-dir "$TMP/x"
expect_refusal "--zero-key-bias-grad with --pos rope" "--pos rope (RoPE turns a common key offset" \
    "${COMMON[@]}" --pos rope --zero-key-bias-grad 1 --out-dir "$TMP/x"
expect_refusal "--zero-key-bias-grad with --qk-norm 1" "--qk-norm 1 (the norm is not shift invariant)" \
    "${COMMON[@]}" --qk-norm 1 --zero-key-bias-grad 1 --out-dir "$TMP/x"

expect_refusal "--capture-attn with --capture-steps" "say the same thing twice" \
    "${COMMON[@]}" --capture-attn 4:0 --capture-steps 4 --out-dir "$TMP/x"
expect_refusal "--capture-attn layer past the model" "--capture" "${COMMON[@]}" --capture-attn 4:2 --out-dir "$TMP/x"
expect_refusal "--capture-layers alone" "captures nothing" "${COMMON[@]}" --capture-layers 1 --out-dir "$TMP/x"
expect_refusal "--probe-every negative" "--probe-every" "${COMMON[@]}" --probe-every -1 --out-dir "$TMP/x"
check "refused command lines created no run folder" test ! -e "$TMP/x"

# ---------------------------------------------------------------- the matched-runs recipe
section "scripts/matched_runs.sh --cpu --gauge-arm bf16 --diag-every 5 -- --steps 20"
# compare_runs.py plots with matplotlib; use the first python3 that has it
PY=""
for cand in "${PYTHON:-}" python3 /usr/bin/python3; do
    [ -n "$cand" ] && "$cand" -c "import matplotlib" 2>/dev/null && { PY=$cand; break; }
done
NAME="test_cpu_diag_$$"
trap 'rm -rf "$TMP" "runs/$NAME"' EXIT
if [ -z "$PY" ]; then
    fail=$((fail + 1)); echo "  FAIL no python3 with matplotlib for compare_runs.py: install it (Debian: apt-get install python3-matplotlib) or set PYTHON=/path/to/python3 that has it"
else
    t0=$SECONDS
    if PYTHON=$PY scripts/matched_runs.sh --cpu --name "$NAME" --gauge-arm bf16 --diag-every 5 -- --steps 20 \
            --batch-size 2 --seq-len 32 --val-every 10 --val-batches 2 --sample-every 0 \
            --train-data "$DATA/moby_train_*.bin" --val-data "$DATA/moby_val_*.bin" >"$TMP/matched.log" 2>&1; then
        pass=$((pass + 1)); echo "  ok   matched_runs.sh finished ($((SECONDS - t0)) s)"
    else
        fail=$((fail + 1)); echo "  FAIL matched_runs.sh:"; tail -n 15 "$TMP/matched.log" | sed 's/^/    /'
    fi
    for label in fp32 bf16 repair gproj bf16_zkbg; do
        check_log "$label: 20 steps, diag records at 0, 5, 10, 15 with probes" "runs/$NAME/$label/log.jsonl" '
need(sorted(diag) == [0, 5, 10, 15], "diag steps %s" % sorted(diag))
need(all("probe_dq_err" in diag[s] for s in diag), "a diag step without probe")
need(len([r for r in recs if "loss" in r and r.get("event") is None]) == 20, "step records")'
    done
    check_log "bf16_zkbg: key-bias gradient norm 0 at every diag step" "runs/$NAME/bf16_zkbg/log.jsonl" '
need(all(diag[s]["key_bias_grad_norm"] == 0 for s in diag), "nonzero key-bias grad")'
    check "compare_runs.py plotted rho_max, probe_dq_err and key_bias_norm into runs/$NAME/compare/" \
        test -s "runs/$NAME/compare/rho_max.png" -a -s "runs/$NAME/compare/probe_dq_err.png" \
             -a -s "runs/$NAME/compare/key_bias_norm.png"
    check "compare_runs.py printed its table with all 5 runs" \
        bash -c "for r in fp32 bf16 repair gproj bf16_zkbg; do grep -q \"^\$r \" '$TMP/matched.log' || exit 1; done"
    grep -A7 "^run " "$TMP/matched.log" | sed 's/^/    /'
fi

train_test_summary
