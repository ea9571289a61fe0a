#!/usr/bin/env bash
# scripts/matched_runs.sh - the same training run under each attention mode,
# then one comparison table and plots (scripts/compare_runs.py).
#
# Why: "does the attention mode change training?" is only answered by runs
# that differ in --attn and in nothing else. Every run here gets the same
# trainer flags, the same --seed (the initial weights are a pure function of
# the seed, model/gpt_cpu.h), the same data glob and shuffle seed (so the same
# data order), and the same --init-from checkpoint when one is given. Runs go
# to runs/NAME/MODE/; the comparison to runs/NAME/compare/.
#
# Usage:
#   scripts/matched_runs.sh [options] [-- extra trainer flags]
# Options:
#   --cpu                 use the CPU trainer (build/train_gpt_cpu) with a tiny
#                         config, so the recipe can be tried without a GPU
#   --name NAME           run group name (default: matched_gpu / matched_cpu)
#   --modes "M1 M2 ..."   attention modes (default: "fp32 bf16 repair gproj")
#   --gauge-arm "M ..."   add one more run per mode M, with --zero-key-bias-grad 1,
#                         named M_zkbg (needs a trainer with that flag)
#   --diag-every N        pass --diag-every N to every run (needs a trainer
#                         with the diagnostics wired in; default: not passed)
#   --parallel            GPU only: one mode per GPU at once (the default when
#                         more than one GPU is visible); --sequential forces
#                         one after the other on GPU 0
#   --per-gpu N           GPU only: N runs at once on each GPU (implies
#                         --parallel; small models leave most of an H200 idle,
#                         so 4-8 runs share one well; default 1)
#   --dry-run             print the commands, run nothing
# Everything after "--" is appended to every trainer command line (a later flag
# overrides an earlier one), e.g. -- --model d12 --steps 5000.
# Environment: TRAINER overrides the trainer binary; PYTHON the Python used for
# compare_runs.py (default python3).
#
# Defaults (a quick matched run; scripts/preset_450m.sh is the serious one):
#   GPU: --model small --batch-size 16 --steps 2000 --lr 2e-3 --warmup-steps 100
#        --weight-decay 0 --val-every 100 --seed 1337 (the docs/attention_numerics.md
#        first-measurement setting: L4 C256 T256, AdamW 2e-3, no weight decay)
#   CPU: --model tiny --batch-size 4 --steps 300 --lr 2e-3 --weight-decay 0
#        --val-every 50 --seed 1337
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "matched_runs: error: $*" >&2; exit 1; }

use_cpu=0
name=""
modes="fp32 bf16 repair gproj"
gauge_mode=""
diag_every=""
parallel=""
per_gpu=1
dry_run=0
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) use_cpu=1 ;;
        --name) [ $# -ge 2 ] || die "--name needs a value"; name="$2"; shift ;;
        --modes) [ $# -ge 2 ] || die "--modes needs a value"; modes="$2"; shift ;;
        --gauge-arm) [ $# -ge 2 ] || die "--gauge-arm needs a mode"; gauge_mode="$2"; shift ;;
        --diag-every) [ $# -ge 2 ] || die "--diag-every needs a value"; diag_every="$2"; shift ;;
        --parallel) parallel=1 ;;
        --sequential) parallel=0 ;;
        --per-gpu) [ $# -ge 2 ] || die "--per-gpu needs a value"; per_gpu="$2"; parallel=1; shift ;;
        --dry-run) dry_run=1 ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) sed -n '2,40p' "$0"; exit 0 ;;
        *) die "unknown option '$1' (see --help; trainer flags go after --)" ;;
    esac
    shift
done

for m in $modes $gauge_mode; do
    case "$m" in fp32|bf16|repair|gproj) ;; *) die "unknown attention mode '$m' (fp32|bf16|repair|gproj)" ;; esac
done
case "$name" in */*|.|..) die "--name '$name': a plain folder name, please" ;; esac
[[ "$per_gpu" =~ ^[1-9][0-9]*$ ]] || die "--per-gpu '$per_gpu': a positive number of runs per GPU"
if [ -n "$diag_every" ] && ! [[ "$diag_every" =~ ^[0-9]+$ ]]; then die "--diag-every '$diag_every': not a number"; fi

if [ "$use_cpu" = 1 ]; then
    trainer="${TRAINER:-build/train_gpt_cpu}"
    name="${name:-matched_cpu}"
    base=(--model tiny --batch-size 4 --steps 300 --lr 2e-3 --weight-decay 0 --val-every 50 --seed 1337)
    ngpu=0
else
    trainer="${TRAINER:-build/train_gpt}"
    name="${name:-matched_gpu}"
    base=(--model small --batch-size 16 --steps 2000 --lr 2e-3 --warmup-steps 100 --weight-decay 0
          --val-every 100 --seed 1337)
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    [ "$dry_run" = 1 ] || [ "$ngpu" -ge 1 ] || die "no NVIDIA GPU visible (nvidia-smi -L); use --cpu for the CPU trainer"
fi
[ -n "$diag_every" ] && base+=(--diag-every "$diag_every")
if [ -z "$parallel" ]; then parallel=$([ "$ngpu" -gt 1 ] && echo 1 || echo 0); fi
[ "$use_cpu" = 0 ] || parallel=0

if [ ! -x "$trainer" ] && [ "$dry_run" = 0 ]; then
    echo "matched_runs: building $trainer"
    make --no-print-directory "$trainer" >/dev/null || die "could not build $trainer (run make to see why)"
fi

group="runs/$name"
# runs: label, mode, extra flag
labels=()
for m in $modes; do labels+=("$m"); done
for m in $gauge_mode; do labels+=("${m}_zkbg"); done

command_for() {  # label -> the trainer command line (as an array in cmd)
    local label="$1" mode="${1%_zkbg}"
    cmd=("$trainer" "${base[@]}" --attn "$mode" --out-dir "$group/$label")
    [ "$label" != "$mode" ] && cmd+=(--zero-key-bias-grad 1)
    cmd+=("${extra[@]}")
}

# refuse to mix a new matched set with an old one (unless --overwrite is passed on)
overwrite=0
for a in "${extra[@]}"; do case "$a" in --overwrite|--overwrite=1) overwrite=1 ;; esac; done
for label in "${labels[@]}"; do
    if [ -e "$group/$label/log.jsonl" ] && [ "$overwrite" = 0 ] && [ "$dry_run" = 0 ]; then
        die "$group/$label already holds a run; pick another --name or pass -- --overwrite 1"
    fi
done

slots=$(( ngpu > 0 ? ngpu * per_gpu : 1 ))
echo "matched_runs: ${#labels[@]} runs (${labels[*]}) into $group/, $([ "$parallel" = 1 ] && echo "$per_gpu at a time per GPU ($ngpu GPUs)" || echo "one after the other")"
mkdir -p "$group"
pids=()
failed=0
i=0
for label in "${labels[@]}"; do
    command_for "$label"
    gpu=$(( ngpu > 0 ? i % ngpu : 0 ))
    if [ "$dry_run" = 1 ]; then
        [ "$parallel" = 1 ] && printf 'CUDA_VISIBLE_DEVICES=%s ' "$gpu"
        printf '%q ' "${cmd[@]}"; echo
    elif [ "$parallel" = 1 ]; then
        mkdir -p "$group/$label"
        echo "  $label on GPU $gpu (console: $group/$label/console.txt)"
        CUDA_VISIBLE_DEVICES=$gpu "${cmd[@]}" >"$group/$label/console.txt" 2>&1 &
        pids+=($!)
        # more runs than slots: wait for this batch before reusing the GPUs
        if [ $(( (i + 1) % slots )) -eq 0 ]; then
            for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
            pids=()
        fi
    else
        mkdir -p "$group/$label"
        echo "---- $label: ${cmd[*]}"
        if [ "$use_cpu" = 1 ]; then
            "${cmd[@]}" 2>&1 | tee "$group/$label/console.txt" || failed=$((failed + 1))
        else
            CUDA_VISIBLE_DEVICES=$gpu "${cmd[@]}" 2>&1 | tee "$group/$label/console.txt" || failed=$((failed + 1))
        fi
    fi
    i=$((i + 1))
done
for p in "${pids[@]}"; do wait "$p" || failed=$((failed + 1)); done
[ "$dry_run" = 1 ] && exit 0
[ "$failed" -eq 0 ] || die "$failed run(s) failed; see $group/*/console.txt"

dirs=()
for label in "${labels[@]}"; do dirs+=("$group/$label"); done
echo "---- comparison"
"${PYTHON:-python3}" scripts/compare_runs.py "${dirs[@]}" --out "$group/compare" | tee "$group/compare.txt"
