#!/usr/bin/env bash
# dev/gpu_trainer_checks.sh - the GPU trainer's evidence, in one go on a GPU machine:
#   1. every layer kernel vs its CPU reference      (build/tests/test_layers_gpu)
#   2. GPU model vs CPU model, per attention mode    (build/dev/parity_gpu)
#   3. a d12 training run on real text (40 steps): loss falls, validation, a sample
#   4. bit-exact resume: 20 steps straight vs 10 + resume 10; the final model files must be identical
#   5. the 450m preset at batch 16: tokens/s and MFU
# Usage: dev/gpu_trainer_checks.sh DATA_DIR VOCAB_DIR [BIN_DIR] [LOG_DIR]
#   DATA_DIR holds llm.c shards *train_*.bin and *val_*.bin; VOCAB_DIR encoder.json + vocab.bpe.
#   BIN_DIR (default build) holds train_gpt, tests/test_layers_gpu (or test_layers_gpu), dev/parity_gpu.
# Logs go to LOG_DIR (default dev/results/gpu_trainer_logs); ends with "N passed, N failed".
set -u
DATA=${1:?usage: dev/gpu_trainer_checks.sh DATA_DIR VOCAB_DIR [BIN_DIR] [LOG_DIR]}
VOCAB=${2:?usage: dev/gpu_trainer_checks.sh DATA_DIR VOCAB_DIR [BIN_DIR] [LOG_DIR]}
BIN=${3:-build}
LOGS=${4:-dev/results/gpu_trainer_logs}
mkdir -p "$LOGS"
pick() { for p in "$@"; do [ -x "$p" ] && { echo "$p"; return; }; done; echo "missing: $1" >&2; echo false; }
TRAIN=$(pick "$BIN/train_gpt")
LAYERS=$(pick "$BIN/tests/test_layers_gpu" "$BIN/test_layers_gpu")
PARITY=$(pick "$BIN/dev/parity_gpu" "$BIN/parity_gpu")
pass=0; fail=0
judge() { if [ "$1" -eq 0 ]; then pass=$((pass+1)); echo "ok: $2"; else fail=$((fail+1)); echo "FAILED: $2"; fi; }
nvidia-smi -L
COMMON=(--train-data "$DATA/*train_*.bin" --vocab "$VOCAB" --overwrite 1)

timeout 60 "$LAYERS" > "$LOGS/test_layers_gpu.log" 2>&1; judge $? "layer kernels (test_layers_gpu)"
tail -n 1 "$LOGS/test_layers_gpu.log"; grep FAIL "$LOGS/test_layers_gpu.log"
timeout 120 "$PARITY" > "$LOGS/parity_gpu.log" 2>&1; judge $? "GPU model vs CPU model (parity_gpu)"
tail -n 1 "$LOGS/parity_gpu.log"; grep FAIL "$LOGS/parity_gpu.log"

timeout 90 "$TRAIN" "${COMMON[@]}" --model d12 --batch-size 32 --seq-len 1024 --steps 40 --lr 6e-4 \
    --warmup-steps 10 --val-data "$DATA/*val_*.bin" --val-every 20 --val-batches 4 --sample-every 40 \
    --sample-tokens 32 --attn gproj --out-dir /tmp/gpu_checks/d12 > "$LOGS/train_d12.log" 2>&1
judge $? "d12 training run (40 steps, B32 T1024, gproj)"
python3 - "$LOGS/train_d12.log" <<'PY'
import re, sys
losses = [float(x) for x in re.findall(r"loss ([0-9.]+) \|", open(sys.argv[1]).read())]
print("d12 losses: first %s last %s" % (losses[:3], losses[-3:]))
sys.exit(0 if len(losses) >= 40 and sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 1.0 else 1)
PY
judge $? "d12 loss falls by more than 1 nat over 40 steps"

R=(--model small --batch-size 8 --seq-len 256 --steps 20 --checkpoint-every 10 --val-data "" --lr 1e-3 --attn bf16)
rm -rf /tmp/gpu_checks/ra /tmp/gpu_checks/rb
timeout 60 "$TRAIN" "${COMMON[@]}" "${R[@]}" --out-dir /tmp/gpu_checks/ra > "$LOGS/resume_a.log" 2>&1
cp -r /tmp/gpu_checks/ra /tmp/gpu_checks/rb && rm /tmp/gpu_checks/rb/model_00000020.bin /tmp/gpu_checks/rb/state_00000020.bin
timeout 60 "$TRAIN" "${COMMON[@]}" "${R[@]}" --out-dir /tmp/gpu_checks/rb --resume latest > "$LOGS/resume_b.log" 2>&1
cmp /tmp/gpu_checks/ra/model_00000020.bin /tmp/gpu_checks/rb/model_00000020.bin && \
    cmp /tmp/gpu_checks/ra/state_00000020.bin /tmp/gpu_checks/rb/state_00000020.bin
judge $? "bit-exact resume (model and state files after 20 steps identical to 10 + resume 10)"

timeout 60 "$TRAIN" "${COMMON[@]}" --model 450m --batch-size 16 --seq-len 1024 --steps 8 --val-data "" \
    --out-dir /tmp/gpu_checks/450m > "$LOGS/train_450m.log" 2>&1
judge $? "450m preset runs (8 steps, B16 T1024)"
grep -h "mean over" "$LOGS/train_d12.log" "$LOGS/train_450m.log"
echo "$pass passed, $fail failed"
