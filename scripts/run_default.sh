#!/usr/bin/env bash
# scripts/run_default.sh - what `make run` executes: train a small GPT-2 on the
# bundled default corpus (Moby Dick, tokenized by scripts/setup_data.sh).
#
# Picks the GPU trainer (build/train_gpt) when `nvidia-smi -L` sees a GPU and
# that program was built; otherwise the CPU trainer (build/train_gpt_cpu),
# saying why. Each call writes a new run folder runs/default_<trainer>_<time>
# (log.jsonl, checkpoints), so nothing earlier is overwritten.
#
# Usage: scripts/run_default.sh [extra trainer flags...]
#   extra flags go after the defaults below and so override them, e.g.
#   scripts/run_default.sh --steps 50 --attn bf16
set -euo pipefail
cd "$(dirname "$0")/.."

train_glob="data/default/default_train_*.bin"
val_glob="data/default/default_val_*.bin"
if ! ls $train_glob >/dev/null 2>&1; then
    echo "run_default: no shards at $train_glob" >&2
    echo "  hint: run 'make setup' (or 'make run', which does it first)" >&2
    exit 1
fi
stamp=$(date +%Y%m%d_%H%M%S)
common=(--train-data "$train_glob" --val-data "$val_glob" --vocab .cache/gpt2)

if nvidia-smi -L >/dev/null 2>&1 && [ -x build/train_gpt ]; then
    echo "run_default: GPU found ($(nvidia-smi -L | head -n 1)); running build/train_gpt"
    # small = L4 C256 NH4 T256: 4096 tokens per step, about 4 epochs of Moby Dick in 300 steps.
    exec build/train_gpt "${common[@]}" --model small --batch-size 16 --seq-len 256 --steps 300 \
        --lr 3e-3 --warmup-steps 20 --val-every 50 --val-batches 8 --sample-every 100 --sample-tokens 64 \
        --log-every 10 --out-dir "runs/default_gpu_$stamp" "$@"
fi
if ! nvidia-smi -L >/dev/null 2>&1; then
    why="no NVIDIA GPU visible (nvidia-smi -L failed)"
else
    why="build/train_gpt was not built (it needs nvcc and cuBLASLt; see the [build] lines of make)"
fi
echo "run_default: $why; running the CPU trainer build/train_gpt_cpu instead (a tiny model, a few minutes)"
[ -x build/train_gpt_cpu ] || { echo "run_default: build/train_gpt_cpu is missing; run 'make'" >&2; exit 1; }
exec build/train_gpt_cpu "${common[@]}" --model tiny --batch-size 4 --seq-len 64 --steps 300 \
    --lr 2e-2 --warmup-steps 20 --val-every 50 --val-batches 16 --sample-every 100 --sample-tokens 32 \
    --log-every 10 --out-dir "runs/default_cpu_$stamp" "$@"
