#!/usr/bin/env bash
# tests/test_train_gpt_launch.sh - the GPU trainer's launch checks that need no GPU (CPU test).
#
# Why: a multi-GPU launch that is set up wrong must stop at once with one message that says what to fix,
# before any rank waits on another. train_gpt checks launcher variables, the process count against the
# batch, the id file of the env-var launch, the run folder, the run driver's flag conflicts and the
# diagnostics flags before it touches a GPU or starts NCCL; this test runs those refusals (and --help) on the CPU machine,
# and checks that every flag refusal exits with status 2 and points at --help, as the CPU trainer's do. The GPU side of
# multi-GPU training is checked by scripts/check_multi_gpu.sh on a GPU machine.
# Ends with "N passed, N failed".
set -u
TRAIN=build/train_gpt
pass=0
fail=0
if [ ! -x "$TRAIN" ]; then echo "missing $TRAIN (make $TRAIN)"; echo "0 passed, 1 failed"; exit 1; fi
TMP=$(mktemp -d /tmp/train_gpt_launch.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# refuses DESCRIPTION EXPECTED_TEXT ENV... -- ARGS...: the run must fail (non-zero, within 20 s, no GPU
# work) and its stderr must contain EXPECTED_TEXT.
refuses() {
    local desc=$1 expect=$2; shift 2
    local envs=()
    while [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u RANK -u WORLD_SIZE -u LOCAL_RANK "${envs[@]}" \
        timeout 20 "$TRAIN" "$@" > "$TMP/out" 2> "$TMP/err"
    local rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF -- "$expect" "$TMP/err"; then
        pass=$((pass + 1)); echo "  ok   $desc"
    else
        fail=$((fail + 1)); echo "  FAIL $desc (exit $rc; wanted '$expect' in:)"; sed 's/^/       /' "$TMP/err"
    fi
}

echo "== launcher variables"
refuses "RANK without WORLD_SIZE" "are incomplete or not numbers" RANK=0 -- --model small
refuses "RANK not below WORLD_SIZE" "RANK=2 must be smaller than WORLD_SIZE=2" RANK=2 WORLD_SIZE=2 -- --model small
refuses "OMPI rank not a number" "are incomplete or not numbers" OMPI_COMM_WORLD_RANK=x OMPI_COMM_WORLD_SIZE=2 -- --model small
refuses "env launch of 2 without --nccl-id-file" "needs --nccl-id-file PATH" RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 -- \
    --model small --out-dir "$TMP/run"
refuses "a failing rank names itself" "rank 1 of 2 stopped with the error above" RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 -- \
    --model small --out-dir "$TMP/run"
refuses "2 processes without --out-dir" "give --out-dir" RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 -- \
    --model small --nccl-id-file "$TMP/id"

echo "== batch arithmetic counts the processes"
refuses "total batch not a multiple of B*T*processes" "is not a multiple of B*T*GPUs = 4*64*2 = 512" \
    RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 -- --model small --batch-size 4 --seq-len 64 --total-batch-tokens 768 \
    --nccl-id-file "$TMP/id" --out-dir "$TMP/run"

echo "== diagnostics flags"
refuses "--capture-attn together with --capture-steps" "say the same thing twice" -- \
    --model small --capture-attn 10:0 --capture-steps 5
refuses "--capture-attn layer past the model" "layer 9 does not exist" -- --model small --capture-attn 10:9
refuses "--capture-attn malformed" "--capture" -- --model small --capture-attn 10x:0
refuses "--capture-layers alone" "captures nothing" -- --model small --capture-layers 1
refuses "--probe-every negative" "--probe-every" -- --model small --probe-every -1
refuses "--zero-key-bias-grad=2" "--zero-key-bias-grad" -- --model small --zero-key-bias-grad=2

echo "== attention kernel choice"
refuses "--attn-kernels takes auto|portable only" "'hopper' is not allowed; allowed: one of auto|portable" -- \
    --model small --attn-kernels hopper

echo "== CUDA graph switch"
refuses "--cuda-graph takes 0|1 only" "--cuda-graph: 2 is out of range; allowed: an integer from 0 to 1" -- \
    --model small --cuda-graph 2

echo "== GEMM algorithm timing"
refuses "--matmul-tune past 64" "--matmul-tune: 65 is out of range" -- --model small --matmul-tune 65
refuses "--matmul-tune with --deterministic 1" "drop --matmul-tune (or give 0) with it" -- \
    --model small --deterministic 1 --matmul-tune 8
# --deterministic 1 with the default --matmul-tune 0, and --matmul-tune alone, reach the GPU check
refuses "--deterministic 1 reaches the GPU check" "no CUDA GPU found" -- --model small --deterministic 1
refuses "--matmul-tune 16 reaches the GPU check" "no CUDA GPU found" -- --model small --matmul-tune 16

echo "== the run driver's checks (train/run_driver.c, shared with the CPU trainer) come before any GPU work"
refuses "--resume with --overwrite" "--resume continues a run and --overwrite starts one over" -- \
    --model small --out-dir "$TMP/run" --resume --overwrite
refuses "--init-from with --model" "--init-from sets the model shape from the checkpoint: drop --model" -- \
    --model small --init-from "$TMP/none.bin"
refuses "--attn-tile-max-shift outside repair" "--attn-tile-max-shift 1 is an arm of --attn repair only" -- \
    --model small --attn gproj --attn-tile-max-shift 1
refuses "an accumulation count that does not fit an int" "more than the 2147483647 one optimizer step can run" -- \
    --model small --batch-size 4 --seq-len 64 --total-batch-tokens 1099511627776
mkdir -p "$TMP/occupied" && touch "$TMP/occupied/log.jsonl" "$TMP/occupied/model_00000030.bin"
refuses "a folder holding a run, without --overwrite" "already holds a run (2 log/checkpoint files)" -- \
    --model small --out-dir "$TMP/occupied"
mkdir -p "$TMP/empty"
refuses "--resume in a folder without a state" "nothing to continue" -- --model small --out-dir "$TMP/empty" --resume
refuses "--resume FOLDER without a state" "no state_NNNNNNNN.bin in '$TMP/empty'" -- --model small --resume "$TMP/empty"

# refuses_flag DESCRIPTION EXPECTED_TEXT ARGS...: a flag refusal exits with status 2 (docs/training.md) and
# points at --help, the same way in both trainers (train/run_driver.c's run_flag_error).
refuses_flag() {
    local desc=$1 expect=$2; shift 2
    env -u OMPI_COMM_WORLD_RANK -u OMPI_COMM_WORLD_SIZE -u RANK -u WORLD_SIZE -u LOCAL_RANK \
        timeout 20 "$TRAIN" "$@" > "$TMP/out" 2> "$TMP/err"
    local rc=$?
    if [ $rc -eq 2 ] && grep -qF -- "$expect" "$TMP/err" && grep -qF -- "(run 'train_gpt --help' for every flag)" "$TMP/err"; then
        pass=$((pass + 1)); echo "  ok   $desc"
    else
        fail=$((fail + 1)); echo "  FAIL $desc (exit $rc, wanted 2; wanted '$expect' and the --help pointer in:)"
        sed 's/^/       /' "$TMP/err"
    fi
}

echo "== every flag refusal: exit status 2 and a pointer to --help"
refuses_flag "a value out of range" "--cuda-graph: 2 is out of range" --model small --cuda-graph 2
refuses_flag "an unknown flag" "--bogus" --model small --bogus 1
refuses_flag "--seq-len longer than the model" "--seq-len 100000 is longer than the model's context" \
    --model small --seq-len 100000
refuses_flag "--capture-attn together with --capture-steps" "say the same thing twice" \
    --model small --capture-attn 10:0 --capture-steps 5
refuses_flag "--capture-attn layer past the model" "layer 9 does not exist" --model small --capture-attn 10:9
refuses_flag "--resume with --overwrite" "--resume continues a run and --overwrite starts one over" \
    --model small --out-dir "$TMP/run" --resume --overwrite

echo "== model options: the GPU model runs them, and refuses (as a flag error) the shapes its kernels cannot take"
refuses_flag "--mlp-hidden not a multiple of 8" "--mlp-hidden 700 must be a multiple of 8" \
    --model llama-small --mlp-hidden 700
for opts in "--model llama-small" "--model llama-small --qk-norm 1" "--model small --bias 0" \
            "--model small --tie-embeddings 0"; do
    # past every option check: the first thing to stop these runs here is the missing GPU
    refuses "$opts reaches the GPU check" "no CUDA GPU found" -- $opts
done

echo "== --help lists the multi-GPU, diagnostics and CUDA graph flags"
if "$TRAIN" --help > "$TMP/help" 2>&1 && grep -q -- "--nccl-id-file" "$TMP/help" && grep -q -- "--zero-stage" "$TMP/help" \
    && grep -q -- "--probe-every" "$TMP/help" && grep -q -- "--capture-attn" "$TMP/help" \
    && grep -q -- "--zero-key-bias-grad" "$TMP/help" && grep -q -- "--attn-kernels auto|portable" "$TMP/help" \
    && grep -q -- "--checkpoint-minutes" "$TMP/help" && grep -q -- "--skip-update-z" "$TMP/help" \
    && grep -q -- "--cuda-graph 0|1" "$TMP/help" && grep -q -- "--matmul-tune N" "$TMP/help"; then
    pass=$((pass + 1)); echo "  ok   --help"
else
    fail=$((fail + 1)); echo "  FAIL --help"
fi
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
