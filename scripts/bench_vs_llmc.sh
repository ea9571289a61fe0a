#!/usr/bin/env bash
# scripts/bench_vs_llmc.sh - whole-step speed of our GPU trainer against karpathy/llm.c (and the PyTorch twin),
# on the same GPU, the same token shards and the same B and T, in one call and one table.
#
# Why: "how fast is it" is only meaningful next to the trainer people would otherwise use. This runs, for
# each MODEL:B (T 1024, 50 steps), our build/train_gpt in every --attn mode with --cuda-graph 0 and 1, and
# llm.c's train_gpt2cu (cuDNN attention) with its fastest flags (-r 0 -ge 1: no recompute, GELU fused in the
# matmul) and its defaults (-r 1 -ge 0); with TWIN=1 also dev/gpt_twin.py (torch.compile, bf16 autocast,
# SDPA; random tokens). Then our small preset (B16 T256) in every mode, graph 0 and 1, as steps/s. With
# PROFILE=1, then per MODEL:B a table of where our step's time goes, per kernel kind and mode
# (build/dev/profile_gpu_step, 10 steps, random tokens): the breakdown to read before and after a speed change.
#   ours:  the median "ms" of the step records from step 10 on in the run's log.jsonl (scripts/step_ms.py)
#   llm.c: the "total average iteration time" it prints (the mean over its steps, the first excluded)
#   twin:  the ms/step it prints (the mean over --steps after 5 warm-up steps)
#   profile: its "kernel kind / ms/step / share" table, and the ms/step of its "ours:" line (unprofiled steps)
# The project fetches nothing at run time: LLMC_DIR is llm.c's build folder, or the folder holding its
# sources as tarballs (../shared/bench: llmc-*.tgz, cudnn-frontend-include.tgz, llmc_step.sh), which is
# built first (1-2 minutes; ahead of time with --build-only).
#
# Usage: scripts/bench_vs_llmc.sh OUT_MD LLMC_DIR TRAIN_GLOB [MODEL:B ...]   (default d12:32 d24:16)
#        scripts/bench_vs_llmc.sh --build-only LLMC_DIR
#   OUT_MD      the markdown table (GPU, date, commands); raw logs go to OUT_MD without .md + _logs.tgz
#   LLMC_DIR    holds train_gpt2cu (or llmc/train_gpt2cu, a llmc_step.sh work folder), or the tarballs: then
#               llm.c is unpacked and built in $LLMC_BUILD/llmc (default build/llmc), once
#   TRAIN_GLOB  llm.c-format token shards, quoted (both trainers read the same ones)
#   (relative paths here and in the environment below are taken from the caller's folder)
# Env: OURS_BIN (default build/train_gpt), MODES (default "fp32 bf16 repair gproj"), GRAPHS (default "0 1"),
#      STEPS (default 50), SMALL_STEPS (default 200; SMALL_STEPS=0 skips the small preset), SMALL_GRAPHS (the
#      small preset's --cuda-graph values, default GRAPHS), VAL_GLOB (llm.c
#      always opens validation shards; default TRAIN_GLOB: its evaluations are outside the timed steps),
#      OURS_TIMEOUT / LLMC_TIMEOUT / TWIN_TIMEOUT seconds per run (default 120 / 180 / 300), TWIN=1,
#      TWIN_STEPS (default 15), PYTHON (default python3), RUN_ROOT (the runs' folders: default /dev/shm when it
#      has 16 GB free, else /tmp), PROFILE=1 (the per-kernel tables), PROFILE_BIN (default
#      build/dev/profile_gpu_step), PROFILE_TIMEOUT seconds per mode (default 120).
# Every run is under `timeout` (SIGTERM, then SIGKILL 30 s later: ours saves a checkpoint on SIGTERM); a run
# that fails or prints no time shows n/a, and its last lines are printed. On INT/TERM the run in flight is
# stopped and the rows measured so far are written (exit 130).
# Exit status: 0 when every run gave a time (and every profile its table), 1 when some did not (the tables are
# written either way), 2 on bad arguments, a failed build or PROFILE=1 without the profiler.
set -u
# paths given by the caller are taken from the caller's folder; the defaults are inside the repo
caller=$PWD
abs() { case $1 in /*) echo "$1" ;; *) echo "$caller/$1" ;; esac; }
[ -n "${OURS_BIN:-}" ] && OURS_BIN=$(abs "$OURS_BIN")
[ -n "${PROFILE_BIN:-}" ] && PROFILE_BIN=$(abs "$PROFILE_BIN")
[ -n "${LLMC_BUILD:-}" ] && LLMC_BUILD=$(abs "$LLMC_BUILD")
[ -n "${RUN_ROOT:-}" ] && RUN_ROOT=$(abs "$RUN_ROOT")
[ -n "${VAL_GLOB:-}" ] && VAL_GLOB=$(abs "$VAL_GLOB")
cd "$(dirname "$0")/.." || exit 2
PY=${PYTHON:-python3}
usage() { sed -n '/^# Usage:/,/^#        /p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
die() { echo "bench_vs_llmc: error: $*" >&2; exit 2; }

# llmc_bin DIR: prints the path of llm.c's train_gpt2cu for DIR, building it from DIR's tarballs if needed
llmc_bin() {
    local dir=$1 build=${LLMC_BUILD:-build/llmc} src cudnn
    [ -d "$dir" ] || die "LLMC_DIR '$dir' is not a folder"
    for b in "$dir/train_gpt2cu" "$dir/llmc/train_gpt2cu"; do [ -x "$b" ] && { echo "$b"; return 0; }; done
    src=$(ls "$dir"/llmc-*.tgz 2>/dev/null); cudnn="$dir/cudnn-frontend-include.tgz"
    if [ -z "$src" ] || [ "$(echo "$src" | wc -l)" -ne 1 ] || [ ! -f "$cudnn" ]; then
        die "LLMC_DIR '$dir' holds no train_gpt2cu and not llm.c's tarballs (one llmc-*.tgz and" \
            "cudnn-frontend-include.tgz): name llm.c's build folder, or a copy of ../shared/bench"
    fi
    [ -x "$build/llmc/train_gpt2cu" ] && { echo "$build/llmc/train_gpt2cu"; return 0; }
    echo "bench_vs_llmc: building llm.c from $src in $build/llmc (log: $build/llmc/build.log)" >&2
    mkdir -p "$build" && rm -rf "$build/llmc" && tar -xzf "$src" -C "$build" && [ -d "$build/llmc" ] \
        || die "could not unpack $src into $build (it must hold a folder llmc/)"
    mkdir -p "$build/llmc/cudnn-frontend" && tar -xzf "$cudnn" -C "$build/llmc/cudnn-frontend" \
        || die "could not unpack $cudnn into $build/llmc/cudnn-frontend"
    if ! (cd "$build/llmc" && make train_gpt2cu USE_CUDNN=1 GPU_COMPUTE_CAPABILITY=90 > build.log 2>&1) \
        || [ ! -x "$build/llmc/train_gpt2cu" ]; then
        tail -n 20 "$build/llmc/build.log" >&2
        die "llm.c build failed (log: $build/llmc/build.log)"
    fi
    echo "$build/llmc/train_gpt2cu"
}

case "${1:-}" in -h|--help) sed -n '/^# Usage:/,/^#        /p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
if [ "${1:-}" = --build-only ]; then
    [ $# -eq 2 ] || usage
    bin=$(llmc_bin "$(abs "$2")") || exit 2
    echo "bench_vs_llmc: llm.c is $bin"
    exit 0
fi
[ $# -ge 3 ] || usage
OUT_MD=$(abs "$1") LLMC_DIR=$(abs "$2") TRAIN_GLOB=$(abs "$3")
shift 3
CONFIGS=("$@")
[ ${#CONFIGS[@]} -eq 0 ] && CONFIGS=(d12:32 d24:16)
for cfg in "${CONFIGS[@]}"; do
    [[ $cfg =~ ^[a-z0-9]+:[0-9]+$ ]] || die "'$cfg' is not MODEL:B (e.g. d12:32)"
done
OURS_BIN=${OURS_BIN:-build/train_gpt}
MODES=${MODES:-fp32 bf16 repair gproj}
GRAPHS=${GRAPHS:-0 1}
SMALL_GRAPHS=${SMALL_GRAPHS:-$GRAPHS}
STEPS=${STEPS:-50} SMALL_STEPS=${SMALL_STEPS:-200}
VAL_GLOB=${VAL_GLOB:-$TRAIN_GLOB}
OURS_TIMEOUT=${OURS_TIMEOUT:-120} LLMC_TIMEOUT=${LLMC_TIMEOUT:-180} TWIN_TIMEOUT=${TWIN_TIMEOUT:-300}
TWIN_STEPS=${TWIN_STEPS:-15}
PROFILE=${PROFILE:-0} PROFILE_BIN=${PROFILE_BIN:-build/dev/profile_gpu_step} PROFILE_TIMEOUT=${PROFILE_TIMEOUT:-120}
[ -x "$OURS_BIN" ] || die "no trainer at $OURS_BIN: build it first (make build/train_gpt) or set OURS_BIN"
[ "$PROFILE" = 1 ] && [ ! -x "$PROFILE_BIN" ] &&
    die "PROFILE=1 but no profiler at $PROFILE_BIN: build it first (make build/dev/profile_gpu_step) or set PROFILE_BIN"
compgen -G "$TRAIN_GLOB" > /dev/null || die "TRAIN_GLOB '$TRAIN_GLOB' matches no file"
LLMC=$(llmc_bin "$LLMC_DIR") || exit 2
mkdir -p "$(dirname "$OUT_MD")"
LOGS_TGZ="${OUT_MD%.md}_logs.tgz"
# Run folders (ours writes a checkpoint at the end and fsyncs it: d24 about 5.6 GB) go to memory when /dev/shm
# has room, so the disk's speed does not lengthen the call; each is deleted after its run.
if [ -z "${RUN_ROOT:-}" ]; then
    RUN_ROOT=/tmp
    shm=$(df -P -k /dev/shm 2>/dev/null | awk 'NR == 2 {print $4}')
    [ -n "$shm" ] && [ "$shm" -ge $((16 * 1024 * 1024)) ] && RUN_ROOT=/dev/shm
fi
work=$(mktemp -d "$RUN_ROOT/bench_vs_llmc.XXXXXX") || die "cannot make a work folder in RUN_ROOT '$RUN_ROOT'"
logs="$work/logs"
mkdir -p "$logs"
failed=0 complete=0

# finish: OUT_MD from the rows measured so far, the logs' tgz, the work folder removed; also when stopped early
# shellcheck disable=SC2317  # called by the EXIT trap
finish() {
    [ -f "$work/table" ] || { rm -rf "$work"; return; }
    {
        cat "$work/table"
        [ "$complete" = 1 ] || printf '\nStopped early (signal or error): the rows above are the runs that finished.\n'
        echo
        echo "Commands: \`$OURS_BIN --model M --batch-size B --seq-len 1024 --steps $STEPS --train-data GLOB --val-data \"\""
        echo "--vocab \"\" --sample-every 0 --log-every 10 --checkpoint-minutes 0 --attn MODE --cuda-graph G --out-dir DIR\`;"
        echo "\`$LLMC -i GLOB -j VAL_GLOB -o DIR -b B -t 1024 -d B*1024 -x $STEPS -e M -v 1000 -s 0 -n 0 FLAGS\`."
        [ "$PROFILE" = 1 ] && echo "Profile: \`$PROFILE_BIN --model M --batch B --seq 1024 --attn MODE --steps 10\`."
        [ "${TWIN:-0}" = 1 ] && echo "Twin: \`$PY dev/gpt_twin.py --model M --batch B --seq 1024 --steps $TWIN_STEPS --warmup 5 --compile --autocast bf16 --attn sdpa --fused-adamw\`."
        echo "Raw logs: $(basename "$LOGS_TGZ")."
    } > "$OUT_MD"
    tar -czf "$LOGS_TGZ" -C "$work" logs
    rm -rf "$work"
    cat "$OUT_MD"
}
# timed LIMIT LOG CMD...: CMD under timeout, output into LOG. timeout puts CMD in a process group of its own (out of
# reach of a Ctrl-C or a kill of ours), so its pid is kept where stop_run finds it.
timed() {
    local limit=$1 log=$2 pid rc
    shift 2
    timeout -k 30 "$limit" "$@" > "$log" 2>&1 &
    pid=$!
    echo "$pid" > "$work/running.pid"
    wait "$pid"
    rc=$?
    rm -f "$work/running.pid"
    return $rc
}
# stop_run: on INT/TERM, the run in flight gets SIGTERM (ours finishes its step and checkpoints; timeout kills it
# 30 s later); waits until it is gone, so no trainer outlives this script or writes after the clean-up
# shellcheck disable=SC2317  # called by the INT/TERM trap
stop_run() {
    local pid
    pid=$(cat "$work/running.pid" 2>/dev/null) || return 0
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
}
trap finish EXIT
trap 'stop_run; exit 130' INT TERM

# fail WHAT LOG RC [MISSING]: says that a run gave no time (or no MISSING), with its last lines (the run functions
# print their time from a subshell: the caller sees n/a and counts the failure)
fail() {
    local why="rc $3"
    [ "$3" = 124 ] && why="timed out"
    [ "$3" = 0 ] && why="no ${4:-time} found in its output"
    echo "bench_vs_llmc: FAILED $1 ($why; log $(basename "$2")):"
    tail -n 8 "$2" | sed 's/^/    /'
}

# ours MODEL B T MODE GRAPH STEPS: prints our median ms/step, or n/a
ours() {
    local name="ours_$1_b$2_t$3_$4_g$5" rc ms
    local run="$work/$name"
    echo "---- ours: $1 B$2 T$3 --attn $4 --cuda-graph $5" >&2
    timed "$OURS_TIMEOUT" "$logs/$name.log" "$OURS_BIN" --model "$1" --batch-size "$2" --seq-len "$3" \
        --steps "$6" --train-data "$TRAIN_GLOB" --val-data "" --vocab "" --sample-every 0 --log-every 10 \
        --checkpoint-minutes 0 --attn "$4" --cuda-graph "$5" --out-dir "$run" --overwrite 1
    rc=$?
    [ -f "$run/log.jsonl" ] && cp "$run/log.jsonl" "$logs/$name.jsonl"
    rm -rf "$run" # its checkpoints (d24: gigabytes)
    ms=$([ $rc -eq 0 ] && "$PY" scripts/step_ms.py "$logs/$name.jsonl" 2>> "$logs/$name.log")
    if [[ ! $ms =~ ^[0-9.]+$ ]]; then fail "ours $1 B$2 T$3 $4 graph $5" "$logs/$name.log" $rc >&2; ms=n/a; fi
    echo "$ms"
}

# llmc MODEL B FLAGS: prints llm.c's average ms/step, or n/a
llmc() {
    local name="llmc_$1_b$2_${3// /}" rc ms
    echo "---- llm.c: $1 B$2 T1024 $3" >&2
    # shellcheck disable=SC2086
    timed "$LLMC_TIMEOUT" "$logs/$name.log" "$LLMC" -i "$TRAIN_GLOB" -j "$VAL_GLOB" -o "$work/$name" -b "$2" \
        -t 1024 -d $(($2 * 1024)) -x "$STEPS" -e "$1" -v 1000 -s 0 -n 0 $3
    rc=$?
    rm -rf "${work:?}/$name"
    ms=$([ $rc -eq 0 ] && sed -nE 's/.*total average iteration time: ([0-9.]+) ms.*/\1/p' "$logs/$name.log" | tail -n 1)
    if [[ $ms =~ ^[0-9.]+$ ]]; then ms=$(printf '%.3f' "$ms"); else fail "llm.c $1 B$2 $3" "$logs/$name.log" $rc >&2; ms=n/a; fi
    echo "$ms"
}

# twin MODEL B: prints the PyTorch twin's ms/step, or n/a
twin() {
    local name="twin_$1_b$2" rc ms
    echo "---- PyTorch twin: $1 B$2 T1024" >&2
    timed "$TWIN_TIMEOUT" "$logs/$name.log" "$PY" dev/gpt_twin.py --model "$1" --batch "$2" --seq 1024 \
        --steps "$TWIN_STEPS" --warmup 5 --compile --autocast bf16 --attn sdpa --fused-adamw
    rc=$?
    ms=$([ $rc -eq 0 ] && sed -nE 's/^twin: .* ([0-9.]+) ms\/step.*/\1/p' "$logs/$name.log" | tail -n 1)
    if [[ ! $ms =~ ^[0-9.]+$ ]]; then fail "twin $1 B$2" "$logs/$name.log" $rc >&2; ms=n/a; fi
    echo "$ms"
}

# profile MODEL B MODE: dev/profile_gpu_step's breakdown of one mode, as $work/profile_MODEL_bB_MODE.tsv (lines
# "KIND<tab>MS", then "total<tab>MS" and "wall<tab>MS"); status 1 and no file when the run fails or its output
# lacks the "ours:" ms/step, the table or its total line. Only the first table counts (one mode per run).
profile() {
    local name="profile_$1_b$2_$3" rc=0
    echo "---- profile: $1 B$2 T1024 --attn $3" >&2
    timed "$PROFILE_TIMEOUT" "$logs/$name.log" "$PROFILE_BIN" --model "$1" --batch "$2" --seq 1024 --attn "$3" \
        --steps 10 || rc=$?
    # a table row is "  KIND  MS  SHARE%" (KIND may hold spaces); the table ends at "  total  MS (GPU time ...)"
    if [ $rc -eq 0 ] && awk '
        BEGIN { OFS = "\t" }
        /^ours: / && wall == "" {
            s = $0; sub(/ ms\/step.*/, "", s); sub(/.* /, "", s)
            if (s ~ /^[0-9]+(\.[0-9]+)?$/) wall = s
        }
        intable && $1 == "total" { if ($2 ~ /^[0-9.]+$/) total = $2; intable = 0; next }
        intable {
            kind = $0; sub(/^ +/, "", kind); sub(/ +[^ ]+ +[^ ]+$/, "", kind)
            if (NF < 3 || $(NF - 1) !~ /^[0-9.]+$/ || $NF !~ /^[0-9.]+%$/) bad = 1
            else rows[++n] = kind OFS $(NF - 1)
            next
        }
        /^  kernel kind / && total == "" && !bad { intable = 1 }
        END {
            if (wall == "" || total == "" || n == 0 || bad) exit 1
            for (i = 1; i <= n; i++) print rows[i]
            print "total", total
            print "wall", wall
        }' "$logs/$name.log" > "$work/$name.tsv"; then
        return 0
    fi
    rm -f "$work/$name.tsv"
    fail "profile $1 B$2 $3" "$logs/$name.log" $rc "breakdown" >&2
    return 1
}

# profile_table MODEL B: the markdown table of the MODES' breakdowns of MODEL:B (rows: kernel kinds in the order
# printed, then the profiled total and the wall ms/step; n/a where a mode's run failed)
profile_table() {
    local mode f kind ms row
    local -A cell=()
    local kinds=()
    for mode in $MODES; do
        f="$work/profile_$1_b$2_$mode.tsv"
        [ -f "$f" ] || continue
        while IFS=$'\t' read -r kind ms; do
            case $kind in total | wall) ;; *) [ -n "${cell["$kind"]+x}" ] || { cell["$kind"]=1; kinds+=("$kind"); } ;; esac
            cell["$mode|$kind"]=$ms
        done < "$f"
    done
    echo
    echo "Where our step's time goes, $1 B$2 T1024 (\`$(basename "$PROFILE_BIN")\`, 10 steps, random tokens; ms per step)."
    echo "CUDA events between the kernel groups serialize them: the profiled total exceeds the wall time."
    echo
    row="| kernel kind (ms/step) |"; for mode in $MODES; do row+=" $mode |"; done; echo "$row"
    row="|---|"; for mode in $MODES; do row+="---:|"; done; echo "$row"
    for kind in "${kinds[@]}" total wall; do
        case $kind in
            total) row="| GPU time between the first and last event |" ;;
            wall) row="| wall ms/step (unprofiled steps) |" ;;
            *) row="| $kind |" ;;
        esac
        for mode in $MODES; do row+=" ${cell["$mode|$kind"]:-n/a} |"; done
        echo "$row"
    done
}

# ratio A B: A / B to 2 decimals, n/a when either is n/a
ratio() { [[ $1 =~ ^[0-9.]+$ && $2 =~ ^[0-9.]+$ ]] && awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}' || echo n/a; }

gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
{
    echo "## bench_vs_llmc $(date -u +%Y-%m-%dT%H:%MZ) on ${gpu:-an unknown GPU (nvidia-smi gave no name)}"
    echo
    echo "Whole training step, T 1024, $STEPS steps, the same shards (\`$TRAIN_GLOB\`). Ours: median ms of the"
    echo "step records from step 10 on; llm.c: its \"total average iteration time\" (mean, step 1 excluded)."
    echo "Ratios are llm.c ms / ours ms: above 1 = ours is faster."
    echo
    echo "| model | B | mode | graph | ours ms/step | llm.c -r 0 -ge 1 ms/step | llm.c -r 1 -ge 0 ms/step | llm.c fastest / ours | llm.c default / ours | PyTorch twin ms/step |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
} > "$work/table"
for cfg in "${CONFIGS[@]}"; do
    model=${cfg%%:*} B=${cfg##*:}
    fast=$(llmc "$model" "$B" "-r 0 -ge 1")
    dflt=$(llmc "$model" "$B" "-r 1 -ge 0")
    tw=-
    [ "${TWIN:-0}" = 1 ] && tw=$(twin "$model" "$B")
    for t in "$fast" "$dflt" "$tw"; do [ "$t" = n/a ] && failed=1; done
    for mode in $MODES; do
        for g in $GRAPHS; do
            o=$(ours "$model" "$B" 1024 "$mode" "$g" "$STEPS")
            [ "$o" = n/a ] && failed=1
            echo "| $model | $B | $mode | $g | $o | $fast | $dflt | $(ratio "$fast" "$o") | $(ratio "$dflt" "$o") | $tw |" \
                >> "$work/table"
        done
    done
done
if [ "$SMALL_STEPS" -gt 0 ]; then
    {
        echo
        echo "Small preset (\`--model small --batch-size 16 --seq-len 256\`, $SMALL_STEPS steps), ours only:"
        echo
        echo "| model | B | T | mode | graph | ours ms/step | steps/s |"
        echo "|---|---|---|---|---|---|---|"
    } >> "$work/table"
    for mode in $MODES; do
        for g in $SMALL_GRAPHS; do
            o=$(ours small 16 256 "$mode" "$g" "$SMALL_STEPS")
            [ "$o" = n/a ] && failed=1
            sps=n/a
            [[ $o =~ ^[0-9.]+$ ]] && sps=$(awk -v ms="$o" 'BEGIN{printf "%.1f", 1000 / ms}')
            echo "| small | 16 | 256 | $mode | $g | $o | $sps |" >> "$work/table"
        done
    done
fi
if [ "$PROFILE" = 1 ]; then
    for cfg in "${CONFIGS[@]}"; do
        model=${cfg%%:*} B=${cfg##*:}
        for mode in $MODES; do profile "$model" "$B" "$mode" || failed=1; done
        profile_table "$model" "$B" >> "$work/table"
    done
fi
complete=1
exit $failed
