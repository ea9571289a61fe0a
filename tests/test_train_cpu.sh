#!/usr/bin/env bash
# tests/test_train_cpu.sh - end-to-end tests of the CPU trainer build/train_gpt_cpu.
#
# Why: the pieces are unit-tested in tests/test_train_cpu.c; this checks what
# only the whole program shows, on real text (the default corpus, Moby Dick,
# tokenized here by build/tokenize into a temp folder):
#   flags    --help lists every flag; bad values, GPU-only flags, a batch that
#            does not divide, a too-long sequence and an occupied run folder
#            are refused with a message naming the flag or file;
#   resume   20 steps in one go == 10 steps + --resume + 10 steps: the same
#            losses, val losses and samples (compared as exact numbers) and
#            byte-identical model and resume-state files;
#   damage   truncated or corrupt state, truncated model, a model from another
#            run, a state given as a model, a changed batch size: refused,
#            each with its reason; a failed save (the temp name is blocked)
#            stops the run and leaves the previous checkpoint intact and
#            resumable (and the result still bit-exact);
#   init     --init-from loads the weights exactly (same val loss);
#   folder   --overwrite deletes only the run's own files (log.jsonl,
#            model_/state_NNNNNNNN.bin), never anything else in the folder;
#   diverge  a loss jump (--diverge-margin) or a non-finite loss stops the run
#            before the update; the checkpoint of the diverged weights is
#            deleted and the message names the last sane one and the command;
#   skip     --skip-update-z skips outlier updates, logged;
#   signals  SIGTERM mid-run: the step finishes, model + state are saved, exit
#            143, and the printed command resumes to the uninterrupted result;
#   retention --checkpoint-minutes checkpoints are deleted once superseded;
#   log      a file-size limit (ulimit -f) makes the log write fail: a clear
#            error naming only checkpoints that exist;
#   input    NaN weights in --init-from, an accumulation count that does not
#            fit an int, --resume FOLDER, the saved --attn on resume, and
#            --overwrite deleting every old checkpoint;
#   owner    one trainer per run folder (a second one, or a resume while the
#            run goes, is refused with the holder's pid); two runs started at
#            once without --out-dir get two folders; a resume from an older
#            checkpoint is refused where newer ones would be overwritten, and
#            branches into a new folder; SIGHUP saves and stops like SIGTERM;
#   resume   the schedule and optimizer flags come from the state when left
#            out, and a changed one is noted; the command printed at --stop-at
#            runs as printed;
#   scripts  scripts/matched_runs.sh stopped by SIGTERM: its running trainer
#            saves a checkpoint, no further run starts.
# The short real run (loss vs unigram entropy) is tests/test_train_cpu_run.sh.
#
# Usage: tests/test_train_cpu.sh   (from anywhere; needs build/train_gpt_cpu,
# build/tokenize and .cache/ from scripts/setup_data.sh - `make test` does all)
set -u
cd "$(dirname "$0")/.."
source tests/train_test_lib.sh

train_test_setup
COMMON=(--train-data "$DATA/moby_train_*.bin" --val-data "$DATA/moby_val_*.bin" --batch-size 2
        --seq-len 32 --total-batch-tokens 128 --lr 3e-3 --warmup-steps 3 --val-every 5 --val-batches 2
        --sample-every 5 --sample-tokens 6 --checkpoint-every 10 --log-every 5)

# ---------------------------------------------------------------- flags
section "flags: --help and refusals"
out=$($TRAINER --help 2>&1); rc=$?
check "--help exits 0" test $rc -eq 0
missing=""
for name in $(sed -n 's/^ *{FLAG_[A-Z0-9_]*, "\([a-z0-9-]*\)".*/\1/p' train/flags.c); do
    grep -q -- "--$name" <<<"$out" || missing="$missing --$name"
done
check "--help names every flag of train/flags.c (missing:${missing:- none})" test -z "$missing"
check "--help shows the CPU defaults" grep -q "(default: tiny)" <<<"$out"
expect_refusal "--attn fp16" "--attn: 'fp16' is not allowed; allowed: one of fp32|bf16|repair|gproj|cudnn" \
    "${COMMON[@]}" --attn fp16 --out-dir "$TMP/x"
expect_refusal "--attn cudnn (GPU only)" "--attn cudnn is implemented by the GPU trainer only" \
    "${COMMON[@]}" --attn cudnn --out-dir "$TMP/x"
expect_refusal "--steps 0" "--steps: 0 is out of range" "${COMMON[@]}" --steps 0 --out-dir "$TMP/x"
expect_refusal "misspelt flag" "did you mean --batch-size" "${COMMON[@]}" --batchsize 4 --out-dir "$TMP/x"
expect_refusal "GPU-only flag" "--zero-stage is implemented by the GPU trainer only" \
    "${COMMON[@]}" --zero-stage 1 --out-dir "$TMP/x"
expect_refusal "total batch not divisible" "--total-batch-tokens" \
    "${COMMON[@]}" --total-batch-tokens 100 --out-dir "$TMP/x"
expect_refusal "sequence longer than the model" "--seq-len 65 is longer than the model's context (64)" \
    "${COMMON[@]}" --seq-len 65 --out-dir "$TMP/x"
expect_refusal "unknown model" "unknown model 'huge'" "${COMMON[@]}" --model huge --out-dir "$TMP/x"
expect_refusal "missing data" "--train-data" "${COMMON[@]}" --train-data "$TMP/none_*.bin" --out-dir "$TMP/x"
expect_refusal "tile-max shift outside repair" "--attn-tile-max-shift 1 is an arm of --attn repair only" \
    "${COMMON[@]}" --attn-tile-max-shift 1 --out-dir "$TMP/x"
expect_refusal "--resume with a missing folder" "nothing to continue" "${COMMON[@]}" --resume --out-dir "$TMP/empty"
mkdir -p "$TMP/empty2"
expect_refusal "--resume in an empty folder" "nothing to continue" "${COMMON[@]}" --resume --out-dir "$TMP/empty2"
check "refused command lines created no run folder" test ! -e "$TMP/x" -a ! -e "$TMP/empty"

# ---------------------------------------------------------------- bit-exact resume
section "resume: 20 steps == 10 + resume + 10, bit for bit"
run_ok "A: 20 steps in one run" "${COMMON[@]}" --steps 20 --out-dir "$TMP/A"
run_ok "B: first 10 steps (--stop-at 10)" "${COMMON[@]}" --steps 20 --stop-at 10 --out-dir "$TMP/B"
check "B stopped at 10" test -e "$TMP/B/state_00000010.bin" -a ! -e "$TMP/B/model_00000020.bin"
expect_refusal "B again without --resume/--overwrite" "already holds a run" "${COMMON[@]}" --steps 20 --out-dir "$TMP/B"
cp "$TMP/B/model_00000010.bin" "$TMP/B/state_00000010.bin" "$TMP/"
run_ok "B: --resume to 20 steps" "${COMMON[@]}" --steps 20 --out-dir "$TMP/B" --resume
check "B resumed at step 10 (log has a resume record)" grep -q '"event": "resume", "start_step": 10' "$TMP/B/log.jsonl"
check "same step losses, val losses and samples (exact numbers)" same_records "$TMP/A/log.jsonl" "$TMP/B/log.jsonl" 20
check "model_00000010.bin identical" cmp -s "$TMP/A/model_00000010.bin" "$TMP/B/model_00000010.bin"
check "model_00000020.bin identical byte for byte" cmp -s "$TMP/A/model_00000020.bin" "$TMP/B/model_00000020.bin"
check "state_00000020.bin identical (moments, data position, RNG)" \
    cmp -s "$TMP/A/state_00000020.bin" "$TMP/B/state_00000020.bin"
grep '"step": 1[0-9], "loss"' "$TMP/A/log.jsonl" | head -n 2 | sed 's/^/    A: /'
grep '"step": 1[0-9], "loss"' "$TMP/B/log.jsonl" | tail -n 10 | head -n 2 | sed 's/^/    B: /'

section "--init-from: a new run from trained weights"
run_ok "I: 2 steps from A's final model" "${COMMON[@]}" --steps 2 --init-from "$TMP/A/model_00000020.bin" \
    --out-dir "$TMP/I"
val_of() { python3 -c 'import json,sys
print([r for r in map(json.loads, open(sys.argv[1])) if r.get("step") == int(sys.argv[2]) and "val_loss" in r][-1]["val_loss"])' "$1" "$2"; }
check "its first validation loss equals A's last one exactly ($(val_of "$TMP/A/log.jsonl" 20))" \
    test "$(val_of "$TMP/I/log.jsonl" 0)" = "$(val_of "$TMP/A/log.jsonl" 20)"
# The architecture options come from the checkpoint: a given flag that differs is refused, each one named.
expect_refusal "--init-from with other options: --norm named" "--norm rmsnorm, but the checkpoint has --norm layernorm" \
    "${COMMON[@]}" --steps 2 --init-from "$TMP/A/model_00000020.bin" --norm rmsnorm --bias 0 --out-dir "$TMP/I2"
check "... and --bias named on its own line" grep -qF -- "--bias 0, but the checkpoint has --bias 1" "$TMP/last.log"
expect_refusal "--resume with another option" "--qk-norm 1, but the checkpoint has --qk-norm 0" \
    "${COMMON[@]}" --steps 20 --resume --out-dir "$TMP/A" --qk-norm 1
run_ok "I3: --init-from with the checkpoint's own options given" "${COMMON[@]}" --steps 2 \
    --init-from "$TMP/A/model_00000020.bin" --norm layernorm --bias 1 --out-dir "$TMP/I3"

# ---------------------------------------------------------------- modern-stack options end to end
section "architecture options: every one on, checkpoint version 6, bit-exact resume, --init-from"
MOD=(--pos rope --rope-base 500 --norm rmsnorm --mlp swiglu --qk-norm 1 --bias 0 --tie-embeddings 0)
run_ok "M: 8 steps with every option" "${COMMON[@]}" "${MOD[@]}" --steps 8 --checkpoint-every 4 --out-dir "$TMP/OPT"
check "its model file is version 6 (options in the header)" python3 -c 'import struct,sys
h = struct.unpack("<17i", open(sys.argv[1], "rb").read(68))
sys.exit(0 if h[1] == 6 and h[9:] == (1, struct.unpack("<i", struct.pack("<f", 500.0))[0], 1, 1, 192, 1, 0, 0) else 1)' \
    "$TMP/OPT/model_00000008.bin"
check "the config record's flags hold the resolved options (mlp-hidden 0 -> 192)" python3 -c 'import json,sys
f = [json.loads(l) for l in open(sys.argv[1])][0]["flags"]
want = {"pos": "rope", "rope-base": 500, "norm": "rmsnorm", "mlp": "swiglu", "mlp-hidden": 192, "qk-norm": 1,
        "bias": 0, "tie-embeddings": 0}
sys.exit(0 if all(f[k] == v for k, v in want.items()) else 1)' "$TMP/OPT/log.jsonl"
run_ok "M2: first 4 steps (--stop-at 4)" "${COMMON[@]}" "${MOD[@]}" --steps 8 --stop-at 4 --checkpoint-every 4 \
    --out-dir "$TMP/OPT2"
run_ok "M2: --resume to 8 (no option flags: they come from the checkpoint)" "${COMMON[@]}" --steps 8 \
    --checkpoint-every 4 --out-dir "$TMP/OPT2" --resume
check "model_00000008.bin identical byte for byte" cmp -s "$TMP/OPT/model_00000008.bin" "$TMP/OPT2/model_00000008.bin"
check "state_00000008.bin identical" cmp -s "$TMP/OPT/state_00000008.bin" "$TMP/OPT2/state_00000008.bin"
run_ok "M3: --init-from the version-6 file, options from its header" "${COMMON[@]}" --steps 2 \
    --init-from "$TMP/OPT/model_00000008.bin" --out-dir "$TMP/OPT3"
check "... and its first validation loss equals M's last one exactly" \
    test "$(val_of "$TMP/OPT3/log.jsonl" 0)" = "$(val_of "$TMP/OPT/log.jsonl" 8)"
expect_refusal "--init-from the version-6 file with --pos learned --mlp gelu" \
    "--pos learned, but the checkpoint has --pos rope" "${COMMON[@]}" --steps 2 \
    --init-from "$TMP/OPT/model_00000008.bin" --pos learned --mlp gelu --out-dir "$TMP/OPT4"
check "... --mlp named too (and the hidden size that follows from it)" grep -qF -- "--mlp gelu, but the checkpoint has --mlp swiglu" "$TMP/last.log"

# ---------------------------------------------------------------- damaged inputs
section "damage: refused with a reason"
fresh_copy() {  # dir -> a run folder holding only the step-10 checkpoint of B
    rm -rf "$1"; mkdir -p "$1"; cp "$TMP/model_00000010.bin" "$TMP/state_00000010.bin" "$1/"
}
fresh_copy "$TMP/C"; truncate -s -100 "$TMP/C/state_00000010.bin"
expect_refusal "truncated state" "truncated" "${COMMON[@]}" --steps 20 --resume "$TMP/C/state_00000010.bin"
fresh_copy "$TMP/C"; flip_byte "$TMP/C/state_00000010.bin" 5000
expect_refusal "state with one flipped byte" "corrupt (checksum" "${COMMON[@]}" --steps 20 --resume "$TMP/C/state_00000010.bin"
fresh_copy "$TMP/C"; truncate -s -4 "$TMP/C/model_00000010.bin"
expect_refusal "truncated model" "cannot be read" "${COMMON[@]}" --steps 20 --resume "$TMP/C/state_00000010.bin"
fresh_copy "$TMP/C"; flip_byte "$TMP/C/model_00000010.bin" 200000
expect_refusal "model weights not the ones saved with the state" "is not the model saved with" \
    "${COMMON[@]}" --steps 20 --resume "$TMP/C/state_00000010.bin"
fresh_copy "$TMP/C"
expect_refusal "state file given as --init-from" "--init-from" \
    "${COMMON[@]}" --steps 20 --init-from "$TMP/C/state_00000010.bin" --out-dir "$TMP/C2"
expect_refusal "model file given as --resume" "not a resume state file" \
    "${COMMON[@]}" --steps 20 --resume "$TMP/C/model_00000010.bin"
expect_refusal "resume with another batch size" "batch size 2, this run has 4" \
    "${COMMON[@]}" --batch-size 4 --total-batch-tokens 128 --steps 20 --resume "$TMP/C/state_00000010.bin"
expect_refusal "resume past --steps" "raise --steps" "${COMMON[@]}" --steps 10 --resume "$TMP/C/state_00000010.bin"
expect_refusal "--stop-at behind the resume point" "--stop-at 5 must lie between" \
    "${COMMON[@]}" --steps 20 --stop-at 5 --resume "$TMP/C/state_00000010.bin"

section "failed save: the previous checkpoint survives"
fresh_copy "$TMP/F"
mkdir "$TMP/F/state_00000020.bin.tmp"   # blocks the temp file the state is written to
expect_refusal "save into a blocked name stops the run" "saving the checkpoint of step 20 failed" \
    "${COMMON[@]}" --steps 20 --out-dir "$TMP/F" --resume
check "the failure names the checkpoint that exists on disk" \
    grep -qF "checkpoint to continue from: $TMP/F/state_00000010.bin (newest of 1 on disk)" "$TMP/last.log"
check "state_00000010.bin untouched" cmp -s "$TMP/F/state_00000010.bin" "$TMP/state_00000010.bin"
check "model_00000010.bin untouched" cmp -s "$TMP/F/model_00000010.bin" "$TMP/model_00000010.bin"
check "no state_00000020.bin appeared" test ! -e "$TMP/F/state_00000020.bin"
rmdir "$TMP/F/state_00000020.bin.tmp"
run_ok "resume again after the failure" "${COMMON[@]}" --steps 20 --out-dir "$TMP/F" --resume
check "and the result is still bit-exact" cmp -s "$TMP/A/model_00000020.bin" "$TMP/F/model_00000020.bin"

section "--overwrite: starts over, deleting only the run's own files"
run_ok "O: a first run" "${COMMON[@]}" --steps 2 --out-dir "$TMP/O"
echo "mine" >"$TMP/O/notes.txt"; cp "$TMP/O/model_00000002.bin" "$TMP/O/model_best.bin"
run_ok "O: again with --overwrite" "${COMMON[@]}" --steps 1 --out-dir "$TMP/O" --overwrite
check "the user's files (notes.txt, model_best.bin) are kept" test -f "$TMP/O/notes.txt" -a -f "$TMP/O/model_best.bin"
check "the old run's checkpoint is gone, the new one there" \
    test ! -e "$TMP/O/model_00000002.bin" -a -e "$TMP/O/model_00000001.bin"
check "the log holds only the new run" test "$(grep -c '"event": "config"' "$TMP/O/log.jsonl")" -eq 1

# ---------------------------------------------------------------- divergence
section "divergence: stop before the update, keep no diverged checkpoint"
expect_refusal "--lr 1e6 from scratch stops at the first loss jump" "more than --diverge-margin 5 above the lowest loss" \
    "${COMMON[@]}" --steps 20 --lr 1e6 --warmup-steps 0 --grad-clip 0 --checkpoint-every 1 --val-every 0 \
    --sample-every 0 --out-dir "$TMP/N0"
check "it logged why it stopped" grep -q '"event": "stop", "step": 1, "reason": "diverged: ' "$TMP/N0/log.jsonl"
check "no step with a loss above 100 was trained on (logged)" python3 -c 'import json,sys
sys.exit(0 if all(r["loss"] < 100 for r in map(json.loads, open(sys.argv[1])) if "loss" in r) else 1)' "$TMP/N0/log.jsonl"
check "the diverged weights were not left as a checkpoint" test ! -e "$TMP/N0/model_00000001.bin" -a ! -e "$TMP/N0/state_00000001.bin"
check "the message says no sane checkpoint exists" grep -qF "last good checkpoint: none" "$TMP/last.log"
fresh_copy "$TMP/N"
expect_refusal "resumed at 10 with --lr 1e6: stops at 11" "last good checkpoint: $TMP/N/model_00000010.bin" \
    "${COMMON[@]}" --steps 20 --lr 1e6 --warmup-steps 0 --grad-clip 0 --checkpoint-every 1 --val-every 0 \
    --sample-every 0 --out-dir "$TMP/N" --resume
check "the checkpoint written at step 11 (diverged weights) was deleted" test ! -e "$TMP/N/model_00000011.bin"
check "the hint's command resumes the sane state" grep -qF -- "--resume $TMP/N/state_00000010.bin --out-dir $TMP/N" "$TMP/last.log"
check "the sane checkpoint is untouched" cmp -s "$TMP/N/state_00000010.bin" "$TMP/state_00000010.bin"
expect_refusal "a non-finite loss stops too (--diverge-margin 0)" "training stopped before updating the weights" \
    "${COMMON[@]}" --steps 20 --lr 1e6 --warmup-steps 0 --grad-clip 0 --diverge-margin 0 --val-every 0 \
    --sample-every 0 --out-dir "$TMP/N2"
check "it logged a non-finite stop" grep -q '"reason": "diverged: the \(loss\|gradient norm\) is' "$TMP/N2/log.jsonl"

section "--skip-update-z: outlier steps skip their update"
run_ok "30 steps with --skip-update-z 0.01" "${COMMON[@]}" --steps 30 --skip-update-z 0.01 --checkpoint-every 0 \
    --val-every 0 --sample-every 0 --out-dir "$TMP/Z"
nskip=$(grep -c '"event": "skip_update"' "$TMP/Z/log.jsonl")
check "skip_update records logged ($nskip), each with z above 0.01, none before 16 steps of history" python3 -c 'import json,sys
r = [x for x in map(json.loads, open(sys.argv[1])) if x.get("event") == "skip_update"]
sys.exit(0 if r and all(max(x["loss_z"], x["grad_norm_z"]) > 0.01 and x["step"] >= 16 for x in r) else 1)' "$TMP/Z/log.jsonl"
check "the console says so" grep -q "update skipped (--skip-update-z 0.01)" "$TMP/last.log"
check "AdamW made 30 - $nskip updates (the state's step counter t)" python3 -c 'import struct,sys
h = struct.unpack("<64q", open(sys.argv[1], "rb").read(512)); sys.exit(0 if h[3] == 30 and h[4] == 30 - int(sys.argv[2]) else 1)' \
    "$TMP/Z/state_00000030.bin" "$nskip"

# ---------------------------------------------------------------- interrupted runs
section "SIGTERM: finish the step, save, exit 143, resume to the same result"
"$TRAINER" "${COMMON[@]}" --steps 20 --out-dir "$TMP/S" >"$TMP/S.log" 2>&1 &
pid=$!
for _ in $(seq 1 1000); do grep -q '"step": 2, "loss"' "$TMP/S/log.jsonl" 2>/dev/null && break; sleep 0.01; done
kill -TERM "$pid"
wait "$pid"; rc=$?
check "exit status 143 = 128 + SIGTERM (got $rc)" test "$rc" -eq 143
sstep=$(sed -n 's/.*"event": "stop", "step": \([0-9]*\), "reason": "signal SIGTERM".*/\1/p' "$TMP/S/log.jsonl")
check "stopped early (step ${sstep:-none} of 20) and logged the signal" test -n "$sstep" -a "${sstep:-99}" -lt 20
check "model + state of that step exist" test -e "$TMP/S/state_$(printf %08d "${sstep:-0}").bin" \
    -a -e "$TMP/S/model_$(printf %08d "${sstep:-0}").bin"
cmd=$(sed -n '/^continue with:$/{n;s/^  //p;}' "$TMP/S.log")
check "it printed the resume command ($cmd)" test -n "$cmd"
bash -c "$cmd" >"$TMP/S2.log" 2>&1
check "the printed command continues to the end" test $? -eq 0
check "final model equals the uninterrupted run's byte for byte" cmp -s "$TMP/A/model_00000020.bin" "$TMP/S/model_00000020.bin"
check "and so does the final state" cmp -s "$TMP/A/state_00000020.bin" "$TMP/S/state_00000020.bin"
check "and every logged loss, val loss and sample" same_records "$TMP/A/log.jsonl" "$TMP/S/log.jsonl" 20

section "SIGINT then SIGTERM: the first decides (exit 130), the second is reported and ignored"
"$TRAINER" "${COMMON[@]}" --steps 20 --out-dir "$TMP/S3" >"$TMP/S3.log" 2>&1 &
pid=$!
for _ in $(seq 1 1000); do grep -q '"step": 2, "loss"' "$TMP/S3/log.jsonl" 2>/dev/null && break; sleep 0.01; done
kill -INT "$pid"; sleep 0.05; kill -TERM "$pid"
wait "$pid"; rc=$?
check "exit status 130 = 128 + SIGINT (got $rc)" test "$rc" -eq 130
check "the second signal was reported, not obeyed" grep -q "already stopping" "$TMP/S3.log"
run_ok "the saved state resumes" "${COMMON[@]}" --steps 20 --out-dir "$TMP/S3" --resume
check "to the uninterrupted result" cmp -s "$TMP/A/model_00000020.bin" "$TMP/S3/model_00000020.bin"

section "--checkpoint-minutes: wall-time checkpoints, the superseded ones deleted"
run_ok "6 steps, a wall-time checkpoint at every boundary" "${COMMON[@]}" --steps 6 --checkpoint-every 0 \
    --checkpoint-minutes 0.000001 --val-every 0 --sample-every 0 --out-dir "$TMP/W"
check "a checkpoint record for each of steps 1..6" test "$(grep -c '"event": "checkpoint"' "$TMP/W/log.jsonl")" -eq 6
check "only the final one is kept on disk" test "$(ls "$TMP/W" | grep -c '^\(model\|state\)_')" -eq 2 \
    -a -e "$TMP/W/state_00000006.bin"

# ---------------------------------------------------------------- log write failures
section "log write failures stop the run with a clear error"
# (the output goes through a pipe: the limit would cut a file it wrote to as well)
# (SIGXFSZ is left at its default here: the trainer ignores it itself, so the write fails instead of the signal
# killing the run)
( ulimit -f 2; "$TRAINER" "${COMMON[@]}" --steps 30 --out-dir "$TMP/L" 2>&1 ) | cat >"$TMP/L.log"
rc=${PIPESTATUS[0]}
check "a 2 KiB file-size limit stops the run (exit $rc, not 153 = killed by SIGXFSZ)" test "$rc" -eq 1
check "naming the log and the reason" grep -qF "writing the run log '$TMP/L/log.jsonl' failed: File too large" "$TMP/L.log"
check "and that no checkpoint exists" grep -qF "checkpoint to continue from: none" "$TMP/L.log"
check "it stopped at the failing write: the log is cut at the 2 KiB limit, fewer than 30 steps ran, step 30 never reached" \
    test "$(stat -c %s "$TMP/L/log.jsonl")" -eq 2048 -a "$(grep -c '"loss"' "$TMP/L/log.jsonl")" -lt 30 \
    -a "$(grep -c '^done:\|step 30/30' "$TMP/L.log")" -eq 0
fresh_copy "$TMP/L2"; cp "$TMP/B/log.jsonl" "$TMP/L2/"
( ulimit -f 1; trap '' XFSZ; "$TRAINER" "${COMMON[@]}" --steps 20 --out-dir "$TMP/L2" --resume 2>&1 ) | cat >"$TMP/L.log"
rc=${PIPESTATUS[0]}
check "appending to a log past the limit fails at once (exit $rc), naming the checkpoint on disk" \
    grep -qF "checkpoint to continue from: $TMP/L2/state_00000010.bin (newest of 1 on disk)" "$TMP/L.log"

# ---------------------------------------------------------------- more bad input
section "bad input: weights, batch arithmetic, --resume FOLDER"
python3 -c 'import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
struct.pack_into("<f", b, 1024 + 4 * 1000, float("nan"))
open(sys.argv[2], "wb").write(b)' "$TMP/A/model_00000020.bin" "$TMP/nan_model.bin"
expect_refusal "--init-from with a NaN weight" "tensor 'wte' element 1000" \
    "${COMMON[@]}" --steps 2 --init-from "$TMP/nan_model.bin" --out-dir "$TMP/X1"
expect_refusal "2^40 tokens per step (accumulation 2^34)" "more than the 2147483647 one optimizer step can run" \
    "${COMMON[@]}" --total-batch-tokens 1099511627776 --out-dir "$TMP/X2"
expect_refusal "2^40 + 64 tokens per step (accumulation 2^34 + 1)" "accumulation steps of B*T*GPUs = 64 tokens" \
    "${COMMON[@]}" --total-batch-tokens 1099511627840 --out-dir "$TMP/X2"
check "refused runs left no folder" test ! -e "$TMP/X1" -a ! -e "$TMP/X2"
fresh_copy "$TMP/R"
run_ok "--resume FOLDER continues from its newest state" "${COMMON[@]}" --steps 20 --resume "$TMP/R/"
check "to the same result as the uninterrupted run" cmp -s "$TMP/A/model_00000020.bin" "$TMP/R/model_00000020.bin"

section "resume: the saved --attn unless --attn is given"
run_ok "fp32 run, stopped at 2" "${COMMON[@]}" --steps 4 --stop-at 2 --attn fp32 --val-every 0 --sample-every 0 \
    --out-dir "$TMP/M"
cp -r "$TMP/M" "$TMP/M2"
run_ok "resumed without --attn" "${COMMON[@]}" --steps 4 --val-every 0 --sample-every 0 --out-dir "$TMP/M" --resume
check "continues in fp32 (every step record says fp32)" test "$(grep -c '"attn": "fp32"}$' "$TMP/M/log.jsonl")" -eq 4
run_ok "resumed with --attn bf16" "${COMMON[@]}" --steps 4 --val-every 0 --sample-every 0 --out-dir "$TMP/M2" \
    --resume --attn bf16
check "switches, and says so" grep -q "attention mode switched from fp32 (saved) to bf16 at step 2" "$TMP/last.log"
check "steps 2 and 3 ran in bf16" test "$(grep -c '"attn": "bf16"}$' "$TMP/M2/log.jsonl")" -eq 2

section "--overwrite removes every checkpoint of the old run"
run_ok "P: 30 steps, checkpoints at 10, 20, 30" "${COMMON[@]}" --steps 30 --val-every 0 --sample-every 0 --out-dir "$TMP/P"
run_ok "P: --overwrite 1 --steps 10" "${COMMON[@]}" --steps 10 --val-every 0 --sample-every 0 --out-dir "$TMP/P" --overwrite 1
check "only the new run's step-10 checkpoint is left" test "$(ls "$TMP/P" | grep -c '^\(model\|state\)_')" -eq 2 \
    -a -e "$TMP/P/state_00000010.bin"
run_ok "P: a bare --resume continues the new run" "${COMMON[@]}" --steps 12 --val-every 0 --sample-every 0 \
    --out-dir "$TMP/P" --resume
check "from step 10" grep -q '"event": "resume", "start_step": 10' "$TMP/P/log.jsonl"

# ---------------------------------------------------------------- run-folder ownership
section "one trainer per run folder; automatic folders; older checkpoints; SIGHUP"
# SIGHUP back to its default for this run: the trainer keeps a SIGHUP that its parent ignored (a `nohup make test`
# would pass that on), and the check below needs the signal to arrive (exec: the same pid)
python3 -c 'import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])' \
    "$TRAINER" "${COMMON[@]}" --steps 2000 --checkpoint-every 5 --val-every 0 --sample-every 0 --out-dir "$TMP/own" \
    >"$TMP/own.log" 2>&1 &
pid=$!
for _ in $(seq 1 1000); do [ -e "$TMP/own/state_00000005.bin" ] && break; sleep 0.01; done
expect_refusal "a second trainer on the same folder (--resume while the run goes)" \
    "is in use by another training process (pid $pid)" "${COMMON[@]}" --steps 2000 --out-dir "$TMP/own" --resume
kill -HUP "$pid"
wait "$pid"; rc=$?
check "SIGHUP: exit 129 = 128 + SIGHUP (got $rc), logged, checkpoint saved" bash -c "test $rc -eq 129 &&
    grep -q '\"reason\": \"signal SIGHUP\"' '$TMP/own/log.jsonl' && grep -q '^stopped by SIGHUP at step' '$TMP/own.log'"
run_ok "the folder is free again once the trainer is gone" "${COMMON[@]}" --steps 2000 --stop-at 40 \
    --checkpoint-every 5 --val-every 0 --sample-every 0 --out-dir "$TMP/own" --resume
cp "$TMP/own/state_00000040.bin" "$TMP/own.state40"
expect_refusal "--resume from an older checkpoint where newer ones would be overwritten" \
    "holds checkpoints newer than step 5 (up to step 40)" "${COMMON[@]}" --steps 2000 --checkpoint-every 5 \
    --resume "$TMP/own/state_00000005.bin"
run_ok "... branches into a new folder" "${COMMON[@]}" --steps 10 --val-every 0 --sample-every 0 \
    --resume "$TMP/own/state_00000005.bin" --out-dir "$TMP/own_branch"
check "the branch trained steps 5-9 into its own folder, the original untouched" bash -c "
    test -e '$TMP/own_branch/state_00000010.bin' -a -e '$TMP/own/state_00000040.bin' &&
    cmp -s '$TMP/own/state_00000040.bin' '$TMP/own.state40'"
mkdir -p "$TMP/auto"
abs_trainer=$(cd "$(dirname "$TRAINER")" && pwd)/$(basename "$TRAINER")
(cd "$TMP/auto" && for s in 1 2; do "$abs_trainer" "${COMMON[@]}" --steps 3 --seed $s --val-every 0 --sample-every 0 \
    >"$TMP/auto/$s.log" 2>&1 & done; wait)
check "two runs started at once without --out-dir: two folders, each with its own complete run" bash -c "
    test \$(ls '$TMP/auto/runs' | wc -l) -eq 2 && for d in '$TMP'/auto/runs/*; do test -e \$d/state_00000003.bin &&
    test \$(grep -c '\"loss\"' \$d/log.jsonl) -eq 3 || exit 1; done"
expect_refusal "--init-from a folder" "is a folder, not a file" "${COMMON[@]}" --steps 2 --init-from "$TMP/own" \
    --out-dir "$TMP/X3"
expect_refusal "--shuffle 2" "--shuffle: '2' is not 0|1|true|false" "${COMMON[@]}" --shuffle 2 --out-dir "$TMP/X3"
run_ok "--val-data the same as --train-data" "${COMMON[@]}" --val-data "$DATA/moby_train_*.bin" --steps 2 \
    --out-dir "$TMP/X4"
check "... is noted" grep -q "^note: --val-data is --train-data" "$TMP/last.log"

section "scripts/matched_runs.sh: SIGTERM stops the running trainer with a checkpoint and starts no further run"
mr_name="test_train_cpu_$$"
TRAINER="$TRAINER" scripts/matched_runs.sh --cpu --name "$mr_name" --modes "fp32 bf16" -- --train-data \
    "$DATA/moby_train_*.bin" --val-data "" --batch-size 2 --seq-len 32 --total-batch-tokens 128 --steps 3000 \
    --sample-every 0 >"$TMP/mr.log" 2>&1 &
mr_pid=$!
for _ in $(seq 1 2000); do
    grep -q '"step": 20, "loss"' "runs/$mr_name/fp32/log.jsonl" 2>/dev/null && break; sleep 0.01
done
kill -TERM "$mr_pid"
wait "$mr_pid"; rc=$?
check "the script exits 1, saying how to continue (got $rc)" bash -c "test $rc -eq 1 &&
    grep -q 'stopped by SIGTERM: the running trainers saved a checkpoint, no further run started' '$TMP/mr.log'"
check "the running trainer (fp32) saved a checkpoint and logged the signal; bf16 never started" bash -c "
    ls runs/$mr_name/fp32/state_*.bin >/dev/null &&
    grep -q '\"reason\": \"signal SIGTERM\"' runs/$mr_name/fp32/log.jsonl &&
    test ! -e runs/$mr_name/bf16"
rm -rf "runs/$mr_name"

# ---------------------------------------------------------------- the saved schedule on resume
section "resume: the schedule and optimizer flags come from the state unless given"
run_ok "Q: constant lr 5e-3, 20 steps, stopped at 10" "${COMMON[@]}" --lr 5e-3 --schedule constant --grad-clip 0.5 \
    --steps 20 --stop-at 10 --val-every 0 --sample-every 0 --out-dir "$TMP/Q"
cmd=$(sed -n '/^continue with:$/{n;s/^  //p;}' "$TMP/last.log")
check "the command printed at --stop-at leaves --stop-at out ($cmd)" bash -c "[ -n \"\$1\" ] &&
    ! grep -q -- '--stop-at' <<<\"\$1\"" _ "$cmd"
cp -r "$TMP/Q" "$TMP/Q2"
bash -c "$cmd" >"$TMP/Q.log" 2>&1
check "the printed command runs as printed, to step 20" test $? -eq 0 -a -e "$TMP/Q/state_00000020.bin"
no_sched=(--train-data "$DATA/moby_train_*.bin" --val-data "" --batch-size 2 --seq-len 32 --total-batch-tokens 128)
run_ok "Q2: resumed with no schedule or optimizer flag" "${no_sched[@]}" --sample-every 0 --out-dir "$TMP/Q2" --resume
check "... trains to the saved --steps 20, with no note" bash -c "
    test -e '$TMP/Q2/state_00000020.bin' && ! grep -q '^note: resuming with' '$TMP/last.log'"
check "... at the saved constant lr 5e-3 (every step record of steps 10-19)" python3 -c 'import json,sys
r = [x for x in map(json.loads, open(sys.argv[1])) if "lr" in x and "event" not in x]
sys.exit(0 if [x["step"] for x in r][-10:] == list(range(10, 20)) and
         all(abs(x["lr"] - 0.005) < 1e-9 for x in r if x["step"] >= 10) else 1)' \
    "$TMP/Q2/log.jsonl"
check "... and equals the uninterrupted continuation byte for byte" cmp -s "$TMP/Q/model_00000020.bin" \
    "$TMP/Q2/model_00000020.bin"
cp -r "$TMP/Q2" "$TMP/Q3"; rm "$TMP/Q3/model_00000020.bin" "$TMP/Q3/state_00000020.bin"
run_ok "Q3: resumed with --lr 1e-3 --steps 12" "${no_sched[@]}" --lr 1e-3 --steps 12 --sample-every 0 \
    --out-dir "$TMP/Q3" --resume
check "the changed flags are noted, with the saved values" grep -qF \
    "note: resuming with --steps 12 --lr 0.001 where the run was saved with --steps 20 --lr 0.005" "$TMP/last.log"

train_test_summary
