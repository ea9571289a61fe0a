#!/usr/bin/env bash
# tests/test_llmc_interop.sh - the CPU trainer's llm.c interop end to end:
# --checkpoint-dtype bf16 model files (llm.c's version 5) and their resume.
#
# Why: llm.c's default GPU trainer is BF16 and loads only version-5 model
# files; a run of ours must be able to hand its weights over. The byte layout
# itself is checked in tests/test_checkpoint.c; here: the trainer writes that
# layout when asked (header version 5, bf16 body, the fp32 default still
# version 3), and a --resume from a bf16 checkpoint continues (from the
# rounded weights) instead of failing on the weights' hash.
# Needs build/train_gpt_cpu, build/tokenize and the default data (make test).
set -u
source tests/train_test_lib.sh
train_test_setup

# header_field FILE INDEX: the INDEX-th int32 of the file's header.
header_field() { od -An -t d4 -j $((4 * $2)) -N 4 "$1" | tr -d ' '; }

section "--checkpoint-dtype bf16: llm.c version 5 model files"
common=(--train-data "$DATA/moby_train_*.bin" --val-data "" --vocab "" --model tiny --batch-size 2 --seq-len 32
        --log-every 100)
run_ok "train 2 steps, --checkpoint-dtype bf16" "${common[@]}" --steps 2 --checkpoint-dtype bf16 --out-dir "$TMP/bf16"
m=$TMP/bf16/model_00000002.bin
check "model_00000002.bin exists" test -f "$m"
if [ -f "$m" ]; then
    check "its header says magic 20240326, version 5" \
        test "$(header_field "$m" 0) $(header_field "$m" 1)" = "20240326 5"
    L=$(header_field "$m" 4); C=$(header_field "$m" 6); Vp=$(header_field "$m" 7); T=$(header_field "$m" 2)
    n=$(( Vp * C + T * C + L * (12 * C * C + 13 * C) + 2 * C ))
    check "its size is 1024 + 2 bytes x $n parameters" test "$(stat -c %s "$m")" -eq $((1024 + 2 * n))
fi
run_ok "resume from the bf16 checkpoint to step 3" "${common[@]}" --steps 3 --checkpoint-dtype bf16 \
    --out-dir "$TMP/bf16" --resume
check "the resumed run saved step 3" test -f "$TMP/bf16/model_00000003.bin"
run_ok "train 2 steps with the default dtype" "${common[@]}" --steps 2 --out-dir "$TMP/fp32"
check "the default is llm.c's fp32 version 3" test "$(header_field "$TMP/fp32/model_00000002.bin" 1)" = "3"
expect_refusal "--checkpoint-dtype fp16 is refused" "checkpoint-dtype" "${common[@]}" --checkpoint-dtype fp16

train_test_summary
