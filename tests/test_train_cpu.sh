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
#   NaN      a diverging run stops with a message naming the last good
#            checkpoint, and writes none after it.
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
expect_refusal "--attn fp16" "--attn: 'fp16' is not allowed; allowed: one of fp32|bf16|repair|gproj" \
    "${COMMON[@]}" --attn fp16 --out-dir "$TMP/x"
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
expect_refusal "save into a blocked name stops the run" "saving the resume state at step 20 failed" \
    "${COMMON[@]}" --steps 20 --out-dir "$TMP/F" --resume
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

# ---------------------------------------------------------------- NaN
section "divergence: stop, keep the last good checkpoint"
expect_refusal "a diverging run stops" "last good checkpoint: $TMP/N/model_" \
    "${COMMON[@]}" --steps 20 --lr 1e6 --warmup-steps 0 --grad-clip 0 --checkpoint-every 2 --val-every 0 \
    --sample-every 0 --out-dir "$TMP/N"
check "it logged why it stopped" grep -q '"event": "stop", "step": [0-9]*, "reason": "non-finite' "$TMP/N/log.jsonl"
good=$(sed -n 's/.*last good checkpoint: \(.*\.bin\).*/\1/p' "$TMP/last.log")
stop_step=$(sed -n 's/.*"event": "stop", "step": \([0-9]*\).*/\1/p' "$TMP/N/log.jsonl")
newest=$(ls "$TMP/N"/model_*.bin 2>/dev/null | tail -n 1)
check "the named checkpoint is the newest one ($good), written before the bad step $stop_step" \
    test -n "$good" -a "$good" = "$newest" -a "$((10#$(basename "$good" .bin | cut -c7-)))" -le "${stop_step:-0}"

train_test_summary
