#!/usr/bin/env bash
# scripts/matched_runs.sh - the same training run under each attention mode,
# for one seed or several, then one comparison (scripts/compare_runs.py).
#
# Why: "does the attention mode change training?" is only answered by runs
# that differ in --attn and in nothing else, and, since one seed is an
# anecdote, by several such sets that differ only in the seed. Every run here
# gets the same trainer flags, the same data glob and the same --init-from
# checkpoint when one is given. The trainer's --seed sets the initial weights
# (model/gpt_cpu.h), the data shuffle (dataloader_open) and sampling together,
# so one seed per run fixes both its weights and its data order; there is no
# separate shuffle seed. Runs go to runs/NAME/LABEL/ with LABEL = MODE (one
# seed) or MODE_sSEED (--seeds), gauge arms MODE_zkbg[_sSEED]; the comparison
# goes to runs/NAME/compare/ and runs/NAME/compare.txt.
#
# Usage:
#   scripts/matched_runs.sh [options] [-- extra trainer flags]
# Options:
#   --cpu                 use the CPU trainer (build/train_gpt_cpu) with a tiny
#                         config, so the recipe can be tried without a GPU
#   --name NAME           run group name (default: matched_gpu / matched_cpu)
#   --modes "M1 M2 ..."   attention modes (default: "fp32 bf16 repair gproj")
#   --seeds "S1 S2 ..."   one run per mode and seed, named MODE_sSEED, each with
#                         --seed S (default: one run per mode, named MODE, with
#                         the default --seed 1337 or the one given after --)
#   --gauge-arm "M ..."   add one more run per mode M (and seed), with
#                         --zero-key-bias-grad 1, named M_zkbg[_sSEED]
#   --diag-every N        pass --diag-every N to every run (default: not passed)
#   --stop-at N           pass --stop-at N to every run: each stops at step N
#                         with a checkpoint, the schedule still spanning --steps
#   --resume              continue every run of the existing group runs/NAME
#                         from its newest state_*.bin (--resume in the trainer),
#                         so a group can be carried over several jobs. Each run
#                         keeps the schedule and optimizer settings it was saved
#                         with (the defaults below are not passed again); flags
#                         given after -- are passed, and each one that changes a
#                         saved setting is noted by the trainer and repeated
#                         here after the runs. Give the same data and model
#                         flags as the first time. A run that logged
#                         its "done" stop, or whose state is already at --stop-at,
#                         is left alone; a run whose folder does not exist yet
#                         (a seed or mode added to the group) starts fresh; a run
#                         folder with a log but no state is refused (nothing to
#                         continue from; move it away to start it again)
#   --parallel            GPU only: several runs at once (the default when more
#                         than one GPU is visible); --sequential forces one
#                         after the other on GPU 0
#   --per-gpu N           GPU only: N runs at once on each GPU (implies
#                         --parallel; small models leave most of an H200 idle,
#                         so 4-8 runs share one well; default 1). Every mode x
#                         seed run is scheduled in batches of N x GPUs, seed by
#                         seed, each batch finishing before the next starts
#   --dry-run             print the commands (and "wait" where a batch ends),
#                         run nothing
# Everything after "--" is appended to every trainer command line (a later flag
# overrides an earlier one), e.g. -- --model d12 --steps 5000. Relative paths
# of --train-data, --val-data, --init-from and --vocab there are taken from the
# folder the script was started in (it runs the trainers from the repository root).
# Ctrl-C, SIGTERM or SIGHUP: the running trainers save a checkpoint and stop,
# no further run starts, and the group continues with --resume.
# Environment: TRAINER overrides the trainer binary; PYTHON the Python used for
# compare_runs.py (default python3).
#
# Defaults (a quick matched run; scripts/preset_450m.sh is the serious one):
#   GPU: --model small --batch-size 16 --steps 2000 --lr 2e-3 --warmup-steps 100
#        --weight-decay 0 --val-every 100 --seed 1337 (the docs/attention_numerics.md
#        first-measurement setting: L4 C256 T256, AdamW 2e-3, no weight decay)
#   CPU: --model tiny --batch-size 4 --steps 300 --lr 2e-3 --weight-decay 0
#        --val-every 50 --seed 1337
#   both: --diverge-margin 0 (a run whose loss rises is the result being looked for: the trainer's
#        divergence stop would end it; non-finite values still stop it)
# Example, three seeds carried over two jobs:
#   scripts/matched_runs.sh --name s3 --seeds "7 8 9" --per-gpu 6 --stop-at 10000 -- --steps 20000
#   scripts/matched_runs.sh --name s3 --seeds "7 8 9" --per-gpu 6 --resume -- --steps 20000
set -euo pipefail
caller_dir=$PWD
cd "$(dirname "$0")/.."

die() { echo "matched_runs: error: $*" >&2; exit 1; }

use_cpu=0
name=""
modes="fp32 bf16 repair gproj"
seeds=""
gauge_mode=""
diag_every=""
stop_at=""
resume=0
parallel=""
per_gpu=1
dry_run=0
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --cpu) use_cpu=1 ;;
        --name) [ $# -ge 2 ] || die "--name needs a value"; name="$2"; shift ;;
        --modes) [ $# -ge 2 ] || die "--modes needs a value"; modes="$2"; shift ;;
        --seeds) [ $# -ge 2 ] || die "--seeds needs a value, e.g. --seeds \"7 8 9\""; seeds="$2"; shift ;;
        --gauge-arm) [ $# -ge 2 ] || die "--gauge-arm needs a mode"; gauge_mode="$2"; shift ;;
        --diag-every) [ $# -ge 2 ] || die "--diag-every needs a value"; diag_every="$2"; shift ;;
        --stop-at) [ $# -ge 2 ] || die "--stop-at needs a step"; stop_at="$2"; shift ;;
        --resume) resume=1 ;;
        --parallel) parallel=1 ;;
        --sequential) parallel=0 ;;
        --per-gpu) [ $# -ge 2 ] || die "--per-gpu needs a value"; per_gpu="$2"; parallel=1; shift ;;
        --dry-run) dry_run=1 ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        *) die "unknown option '$1' (see --help; trainer flags go after --)" ;;
    esac
    shift
done

for m in $modes $gauge_mode; do
    case "$m" in
        fp32|bf16|repair|gproj) ;;
        cudnn) [ "$use_cpu" = 1 ] && die "mode cudnn runs only on the GPU (cuDNN's fused attention); the CPU trainer has fp32|bf16|repair|gproj" ;;
        *) die "unknown attention mode '$m' (fp32|bf16|repair|gproj|cudnn)" ;;
    esac
done
[ -n "$(printf '%s' "$modes" | tr -d ' ')" ] || die "--modes \"$modes\" names no mode (fp32|bf16|repair|gproj|cudnn)"
# once FLAG WORDS WHAT: dies when a word of the space-separated WORDS comes twice
once() { [ -z "$(printf '%s\n' $2 | sort | uniq -d)" ] || die "$1 \"$2\" names $3 twice"; }
once --modes "$modes" "a mode"
once --gauge-arm "$gauge_mode" "a mode"
case "$name" in */*|.|..) die "--name '$name': a plain folder name, please" ;; esac
[[ "$per_gpu" =~ ^[1-9][0-9]*$ ]] || die "--per-gpu '$per_gpu': a positive number of runs per GPU"
if [ -n "$diag_every" ] && ! [[ "$diag_every" =~ ^[0-9]+$ ]]; then die "--diag-every '$diag_every': not a number"; fi
if [ -n "$stop_at" ] && ! [[ "$stop_at" =~ ^[1-9][0-9]*$ ]]; then die "--stop-at '$stop_at': a positive step number"; fi
for s in $seeds; do [[ "$s" =~ ^[0-9]+$ ]] || die "--seeds: '$s' is not a seed (non-negative integers, e.g. --seeds \"7 8 9\")"; done
once --seeds "$seeds" "a seed"
# The script runs from the repository root: a relative path given to a file flag after -- means the caller's
# folder, so it is made absolute here (globs stay globs).
abs_path() { case "$1" in ""|/*) printf '%s' "$1" ;; *) printf '%s/%s' "$caller_dir" "$1" ;; esac; }
fixed=()
path_next=0
for a in "${extra[@]}"; do
    if [ "$path_next" = 1 ]; then fixed+=("$(abs_path "$a")"); path_next=0; continue; fi
    case "$a" in
        --train-data|--val-data|--init-from|--vocab) path_next=1; fixed+=("$a") ;;
        --train-data=*|--val-data=*|--init-from=*|--vocab=*) fixed+=("${a%%=*}=$(abs_path "${a#*=}")") ;;
        *) fixed+=("$a") ;;
    esac
done
extra=("${fixed[@]}")
for a in "${extra[@]}"; do
    case "$a" in
        --seed|--seed=*) [ -z "$seeds" ] || die "--seeds and a trainer --seed after -- say the same thing twice: give one" ;;
        --stop-at|--stop-at=*) [ -z "$stop_at" ] || die "--stop-at and a trainer --stop-at after -- say the same thing twice: give one" ;;
        --resume|--resume=*) die "pass --resume to matched_runs.sh (before --), which resumes each run from its own folder" ;;
        --out-dir|--out-dir=*) die "--out-dir after --: matched_runs.sh names each run's folder (runs/NAME/LABEL); use --name" ;;
        --overwrite|--overwrite=1) [ "$resume" = 0 ] || die "--resume continues the group and --overwrite starts it over: give one" ;;
    esac
done

if [ "$use_cpu" = 1 ]; then
    trainer="${TRAINER:-build/train_gpt_cpu}"
    name="${name:-matched_cpu}"
    base=(--model tiny --batch-size 4 --val-every 50 --diverge-margin 0)
    sched=(--steps 300 --lr 2e-3 --weight-decay 0)
    ngpu=0
else
    trainer="${TRAINER:-build/train_gpt}"
    name="${name:-matched_gpu}"
    base=(--model small --batch-size 16 --val-every 100 --diverge-margin 0)
    sched=(--steps 2000 --lr 2e-3 --warmup-steps 100 --weight-decay 0)
    ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
    if [ "$ngpu" -lt 1 ]; then
        [ "$dry_run" = 1 ] || die "no NVIDIA GPU visible (nvidia-smi -L); use --cpu for the CPU trainer"
        ngpu=1  # a dry run on a machine without a GPU prints the schedule of one GPU
    fi
fi
[ -n "$diag_every" ] && base+=(--diag-every "$diag_every")
if [ -z "$parallel" ]; then parallel=$([ "$ngpu" -gt 1 ] && echo 1 || echo 0); fi
[ "$use_cpu" = 0 ] || parallel=0

if [ ! -x "$trainer" ] && [ "$dry_run" = 0 ]; then
    echo "matched_runs: building $trainer"
    make --no-print-directory "$trainer" >/dev/null || die "could not build $trainer (run make to see why)"
fi

group="runs/$name"
# The runs, seed by seed (so that a batch of runs holds every mode of one seed before the next seed):
# label, attention mode, gauge arm (0|1), seed ("" = the trainer flags' seed).
labels=(); run_mode=(); run_arm=(); run_seed=()
add_run() { labels+=("$1"); run_mode+=("$2"); run_arm+=("$3"); run_seed+=("$4"); }
for s in ${seeds:-""}; do
    sfx=${s:+_s$s}
    for m in $modes; do add_run "$m$sfx" "$m" 0 "$s"; done
    for m in $gauge_mode; do add_run "${m}_zkbg$sfx" "$m" 1 "$s"; done
done

# --init-from gives a new run its weights; a resumed run takes them from its folder (the trainer refuses both)
extra_resume=()
skip_next=0
for a in "${extra[@]}"; do
    if [ "$skip_next" = 1 ]; then skip_next=0; continue; fi
    case "$a" in --init-from) skip_next=1 ;; --init-from=*) ;; *) extra_resume+=("$a") ;; esac
done

command_for() {  # run index -> the trainer command line (as an array in cmd); resumes when run_resume[i] = 1
    local i="$1" label="${labels[$1]}"
    cmd=("$trainer" "${base[@]}")
    # a resumed run keeps the schedule and optimizer settings of its saved state: the defaults would replace them
    [ "${run_resume[$i]}" = 1 ] || cmd+=("${sched[@]}")
    cmd+=(--attn "${run_mode[$i]}" --out-dir "$group/$label")
    [ "${run_arm[$i]}" = 1 ] && cmd+=(--zero-key-bias-grad 1)
    cmd+=(--seed "${run_seed[$i]:-1337}")  # a --seed after -- overrides it when --seeds is not given
    [ -n "$stop_at" ] && cmd+=(--stop-at "$stop_at")
    if [ "${run_resume[$i]}" = 1 ]; then
        cmd+=(--resume)
        cmd+=("${extra_resume[@]}")
    else
        cmd+=("${extra[@]}")
    fi
}

# newest_state DIR: the step of the newest state_NNNNNNNN.bin in DIR ("" when none)
newest_state() {
    local f step="" n
    for f in "$1"/state_*.bin; do
        [ -e "$f" ] || continue
        n=${f##*/state_}; n=${n%.bin}
        [[ "$n" =~ ^[0-9]+$ ]] || continue
        n=$((10#$n))
        if [ -z "$step" ] || [ "$n" -gt "$step" ]; then step=$n; fi
    done
    echo "$step"
}

# What each run does: start (0), resume (1) or nothing (skip, with the reason printed).
overwrite=0
for a in "${extra[@]}"; do case "$a" in --overwrite|--overwrite=1) overwrite=1 ;; esac; done
run_resume=(); run_skip=()
if [ "$resume" = 1 ] && [ ! -d "$group" ]; then
    die "--resume: no run group $group to continue (check --name; drop --resume to start it)"
fi
for i in "${!labels[@]}"; do
    d="$group/${labels[$i]}"
    run_resume+=(0); run_skip+=(0)
    if [ "$resume" = 1 ]; then
        if [ ! -e "$d" ]; then
            echo "matched_runs: $d does not exist yet: starting it"
            continue
        fi
        if [ -f "$d/log.jsonl" ] && grep -a '"event": "stop"' "$d/log.jsonl" | grep -q '"reason": "done"'; then
            echo "matched_runs: $d finished (its log has the \"done\" stop): left alone"
            run_skip[$i]=1; continue
        fi
        st=$(newest_state "$d")
        [ -n "$st" ] || die "--resume: $d holds no state_NNNNNNNN.bin to continue from (the run stopped before its first checkpoint); move the folder away to start that run again, then --resume the group"
        if [ -n "$stop_at" ] && [ "$st" -ge "$stop_at" ]; then
            echo "matched_runs: $d is at step $st, not before --stop-at $stop_at: left alone"
            run_skip[$i]=1; continue
        fi
        run_resume[$i]=1
    elif [ -e "$d/log.jsonl" ] && [ "$overwrite" = 0 ] && [ "$dry_run" = 0 ]; then
        die "$d already holds a run; continue the group with --resume, pick another --name, or pass -- --overwrite 1 (deletes it)"
    fi
done

todo=()
for i in "${!labels[@]}"; do [ "${run_skip[$i]}" = 1 ] || todo+=("$i"); done
slots=$(( ngpu > 0 ? ngpu * per_gpu : 1 ))
echo "matched_runs: ${#labels[@]} runs (${labels[*]}) in $group/, ${#todo[@]} to run," \
     "$([ "$parallel" = 1 ] && echo "$per_gpu at a time per GPU ($ngpu GPUs)" || echo "one after the other")"
[ "$dry_run" = 1 ] || mkdir -p "$group"
pids=()
failed=0
k=0
# Ctrl-C, SIGTERM, SIGHUP: pass SIGTERM on to the running trainers (each saves a checkpoint and stops), start no
# further run. The trainers run in the background and are waited for, so that the trap runs at once; their
# console goes through `tee -i`, which a Ctrl-C does not kill.
stopping=""
on_signal() { stopping="$1"; for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; }
[ "$dry_run" = 1 ] || trap 'on_signal SIGINT' INT
[ "$dry_run" = 1 ] || trap 'on_signal SIGTERM' TERM
[ "$dry_run" = 1 ] || trap 'on_signal SIGHUP' HUP
# wait_run PID: its exit status, waiting on through the signals that interrupt `wait`
wait_run() {
    local rc=0
    while :; do
        rc=0
        wait "$1" || rc=$?
        kill -0 "$1" 2>/dev/null || return "$rc"
    done
}
for i in "${todo[@]}"; do
    [ -z "$stopping" ] || break
    label="${labels[$i]}"
    command_for "$i"
    gpu=$(( ngpu > 0 ? k % ngpu : 0 ))
    batch_end=$(( (k + 1) % slots == 0 && k + 1 < ${#todo[@]} ))
    if [ "$dry_run" = 1 ]; then
        [ "$parallel" = 1 ] && printf 'CUDA_VISIBLE_DEVICES=%s ' "$gpu"
        printf '%q ' "${cmd[@]}"; echo
        [ "$parallel" = 1 ] && [ "$batch_end" = 1 ] && echo "wait"
    elif [ "$parallel" = 1 ]; then
        mkdir -p "$group/$label"
        echo "  $label on GPU $gpu (console: $group/$label/console.txt)"
        # a resumed run appends to its console file: what the earlier jobs printed stays
        CUDA_VISIBLE_DEVICES=$gpu "${cmd[@]}" >>"$group/$label/console.txt" 2>&1 &
        pids+=($!)
        # more runs than slots: wait for this batch before reusing the GPUs
        if [ "$batch_end" = 1 ]; then
            for p in "${pids[@]}"; do wait_run "$p" || failed=$((failed + 1)); done
            pids=()
        fi
    else
        mkdir -p "$group/$label"
        echo "---- $label: ${cmd[*]}"
        CUDA_VISIBLE_DEVICES=$gpu "${cmd[@]}" > >(tee -i -a "$group/$label/console.txt") 2>&1 &
        pids=($!)
        wait_run "${pids[0]}" || failed=$((failed + 1))
        pids=()
    fi
    k=$((k + 1))
done
for p in "${pids[@]}"; do wait_run "$p" || failed=$((failed + 1)); done
[ "$dry_run" = 1 ] && exit 0
# the trainers' notes on changed settings of resumed runs (a parallel run's console is its file only)
for i in "${todo[@]}"; do
    [ "${run_resume[$i]}" = 1 ] || continue
    grep -h '^note: resuming with' "$group/${labels[$i]}/console.txt" 2>/dev/null | tail -n 1 |
        sed "s|^|matched_runs: ${labels[$i]}: |" || true
done
[ -z "$stopping" ] || die "stopped by $stopping: the running trainers saved a checkpoint, no further run" \
    "started; continue the group with --resume"
[ "$failed" -eq 0 ] || die "$failed run(s) failed; see $group/*/console.txt (runs that stopped early can be continued with --resume)"

dirs=()
for label in "${labels[@]}"; do dirs+=("$group/$label"); done
echo "---- comparison"
plots=()
if ! "${PYTHON:-python3}" -c 'import matplotlib, numpy' 2>/dev/null; then
    echo "note: ${PYTHON:-python3} has no matplotlib/numpy: tables only, no plots (Debian:" \
         "apt-get install python3-matplotlib; or PYTHON=/usr/bin/python3)"
    plots=(--no-plots)
fi
"${PYTHON:-python3}" scripts/compare_runs.py "${dirs[@]}" "${plots[@]}" --out "$group/compare" |
    tee "$group/compare.txt"
