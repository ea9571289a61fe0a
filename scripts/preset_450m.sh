#!/usr/bin/env bash
# scripts/preset_450m.sh - the 450M-parameter recipe: the run in which BF16
# attention is expected to open a late-training loss gap, with the
# hyperparameters of a serious pretraining run (justified in
# docs/diagnostics.md, "The 450m recipe").
#
# Why: the failure this project studies (keys drift as a group, rho grows, the
# BF16 dQ error passes 100%) shows up late in long runs of mid-sized models,
# not in quick tests. This script is the reproducible way to run that
# experiment on real hardware: one mode, or all four matched
# (scripts/matched_runs.sh) with diagnostics and attention captures on.
#
# Usage:
#   scripts/preset_450m.sh [--mode MODE | --matched] [options] [-- extra trainer flags]
# Options:
#   --mode MODE        one run in attention mode MODE (default: gproj) into runs/450m/MODE
#   --matched          all four modes, same seed/data/weights (scripts/matched_runs.sh),
#                      into runs/450m/{fp32,bf16,repair,gproj} + runs/450m/compare
#   --gauge-arm MODE   with --matched: also MODE with --zero-key-bias-grad 1
#   --data "TRAIN:VAL" token shard globs (llm.c format). Default: llm.c's FineWeb
#                      shards, data/fineweb10B/fineweb_{train,val}_*.bin (written by
#                      llm.c's dev/data/fineweb.py); the Gutenberg shards work the same
#   --tokens N         training token budget (default 9175040000 = 17500 steps of
#                      524288 tokens, about 20 tokens per parameter)
#   --gpus N           processes / GPUs (default: all visible); N > 1 launches with
#                      mpirun -np N (needs the multi-GPU build of train_gpt)
#   --no-diag          leave the diagnostics flags out (for a trainer without them)
#   --resume           continue the run (or, with --matched, every run of the group)
#                      from its newest checkpoint; give the same options as the first time
#   --dry-run          print the command(s), run nothing
# Everything after "--" is appended to the trainer command (later flags win).
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "preset_450m: error: $*" >&2; exit 1; }

mode="gproj"
matched=0
mode_given=0
resume=0
gauge=""
data=""
tokens=9175040000
gpus=""
diag=1
dry_run=0
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --mode) [ $# -ge 2 ] || die "--mode needs a value"; mode="$2"; mode_given=1; shift ;;
        --resume) resume=1 ;;
        --matched) matched=1 ;;
        --gauge-arm) [ $# -ge 2 ] || die "--gauge-arm needs a mode"; gauge="$2"; shift ;;
        --data) [ $# -ge 2 ] || die "--data needs TRAIN_GLOB:VAL_GLOB"; data="$2"; shift ;;
        --tokens) [ $# -ge 2 ] || die "--tokens needs a number"; tokens="$2"; shift ;;
        --gpus) [ $# -ge 2 ] || die "--gpus needs a number"; gpus="$2"; shift ;;
        --no-diag) diag=0 ;;
        --dry-run) dry_run=1 ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) die "unknown option '$1' (see --help; trainer flags go after --)" ;;
    esac
    shift
done
case "$mode" in fp32|bf16|repair|gproj|cudnn) ;; *) die "--mode '$mode': choose fp32|bf16|repair|gproj|cudnn" ;; esac
[[ "$tokens" =~ ^[0-9]+$ ]] || die "--tokens '$tokens': not a whole number"
[ "$matched" = 0 ] || [ "$mode_given" = 0 ] || die "--mode and --matched: --matched runs every mode; give one"
[ "$matched" = 1 ] || [ -z "$gauge" ] || die "--gauge-arm is an arm of --matched: add --matched, or drop it"

# ---- the recipe ----
micro_batch=16                # sequences of 1024 per GPU per micro-step (about 22 GiB planned on one GPU)
seq_len=1024
total_batch_tokens=524288     # 2^19 tokens per optimizer step (GPT-3 / llm.c 0.5M batch)
[ "$tokens" -ge $(( 2 * total_batch_tokens )) ] ||
    die "--tokens $tokens: less than two optimizer steps of $total_batch_tokens tokens"
steps=$(( (tokens + total_batch_tokens - 1) / total_batch_tokens ))
recipe=(--model 450m --batch-size "$micro_batch" --seq-len "$seq_len" --total-batch-tokens "$total_batch_tokens"
        --steps "$steps" --lr 3e-4 --warmup-steps 700 --schedule cosine --min-lr-frac 0.1
        --weight-decay 0.1 --beta1 0.9 --beta2 0.95 --adam-eps 1e-8 --grad-clip 1.0 --seed 1337
        --val-every 250 --val-batches 20 --checkpoint-every 1000 --sample-every 0 --log-every 10)
if [ "$diag" = 1 ]; then
    # attention captures late and early, first / middle / last layer, for the probe (dev/)
    capture_steps=""
    for s in 1000 $((steps / 4)) $((steps / 2)) $((3 * steps / 4)) $((steps - 1)); do
        [ "$s" -ge 0 ] && capture_steps="${capture_steps:+$capture_steps,}$s"
    done
    recipe+=(--diag-every 100 --capture-steps "$capture_steps" --capture-layers 0,10,19)
fi

# ---- data ----
if [ -n "$data" ]; then
    [[ "$data" == *:* ]] || die "--data '$data': write TRAIN_GLOB:VAL_GLOB"
    train_glob="${data%%:*}"; val_glob="${data#*:}"
else
    train_glob="data/fineweb10B/fineweb_train_*.bin"; val_glob="data/fineweb10B/fineweb_val_*.bin"
fi
if [ "$dry_run" = 0 ]; then
    compgen -G "$train_glob" >/dev/null || die "no training shards match '$train_glob'
  hint: make llm.c FineWeb shards (llm.c dev/data/fineweb.py) and link them to data/fineweb10B/,
        or pass --data 'TRAIN_GLOB:VAL_GLOB' (e.g. Gutenberg shards made with build/tokenize)"
    compgen -G "$val_glob" >/dev/null || die "no validation shards match '$val_glob'"
fi
recipe+=(--train-data "$train_glob" --val-data "$val_glob")

# ---- launch ----
if [ -z "$gpus" ]; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); [ "$gpus" -ge 1 ] || gpus=1; fi
[[ "$gpus" =~ ^[1-9][0-9]*$ ]] || die "--gpus '$gpus': a positive number"
procs=$([ "$matched" = 1 ] && echo 1 || echo "$gpus")   # matched runs: one process (GPU) per mode
per_step=$(( micro_batch * seq_len * procs ))
[ $(( total_batch_tokens % per_step )) -eq 0 ] || die "$procs GPUs x $micro_batch x $seq_len does not divide $total_batch_tokens tokens per step; use 1, 2, 4, 8, 16 or 32 GPUs"
echo "preset_450m: $steps steps x $total_batch_tokens tokens = $(( steps * total_batch_tokens )) tokens," \
     "$procs GPU(s) per run, gradient accumulation $(( total_batch_tokens / per_step ))" \
     "${extra[*]:+(the recipe; the flags after -- override it: ${extra[*]})}"

if [ "$matched" = 1 ]; then
    [ "$gpus" -eq 1 ] || echo "preset_450m: note: matched runs put one mode on each visible GPU (one process each)"
    args=(--name 450m)
    [ -n "$gauge" ] && args+=(--gauge-arm "$gauge")
    [ "$resume" = 1 ] && args+=(--resume)
    [ "$dry_run" = 1 ] && args+=(--dry-run)
    exec scripts/matched_runs.sh "${args[@]}" -- "${recipe[@]}" "${extra[@]}"
fi

trainer="${TRAINER:-build/train_gpt}"
cmd=("$trainer" "${recipe[@]}" --attn "$mode" --out-dir "runs/450m/$mode" "${extra[@]}")
[ "$resume" = 1 ] && cmd+=(--resume)
[ "$gpus" -gt 1 ] && cmd=(mpirun -np "$gpus" --bind-to none "${cmd[@]}")
if [ "$dry_run" = 1 ]; then printf '%q ' "${cmd[@]}"; echo; exit 0; fi
[ -x "$trainer" ] || make --no-print-directory "$trainer" >/dev/null || die "could not build $trainer"
mkdir -p "runs/450m/$mode"
"${cmd[@]}" 2>&1 | tee -i -a "runs/450m/$mode/console.txt"  # -i: tee outlives a Ctrl-C; -a: a resume appends
