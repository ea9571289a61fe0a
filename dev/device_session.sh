#!/usr/bin/env bash
# dev/device_session.sh - everything one lent GPU session checks, in one call.
#
# Why: device time is scarce (minutes per session) and each call pays for a
# machine start, so the GPU evidence of every module is gathered by one script
# that builds once (sm_90a only, all cores), runs each phase under its own time
# limit, keeps going when a phase fails, and writes every log under OUTDIR.
# The results files in dev/results/ name this script and the phases they came from.
# Keep OUTDIR small (logs, tables, plots): the device tool returns at most 8 files of 16 MiB, and
# a tar of run folders with checkpoints (450m: gigabytes) can outlast the call. Run folders stay
# under runs/ and /tmp, outside OUTDIR.
#
# Usage: dev/device_session.sh OUTDIR PHASE [PHASE ...]
#   phases: build gputest layercheck hopper labs multigpu tokenizer trainer matched ncu kerneltimes pdlab sweep seeds seeds_start seeds_wait seeds_probe seeds_finish seeds_group llmcbuild reliability attnbench trainbench
#           diagcost run450m resume450m finalruns modecost makerun graph modern tilesweep vsllmc matmulbench
#           stepkernels oldtree attnab bitsab switchab profiles resumecheck smallstep power launches sass ncusource
#           issuetable
#   data:   GUTENBERG_XZ (default .carry/data) holds gutenberg_{train,val}_*.bin.xz,
#           decompressed to /tmp/data; .cache/gpt2 holds the vocab (scripts/setup_data.sh).
#   labs:   LABS="hopper_fwd hopper_rows ..." picks labs (default: every Hopper lab), LAB_TIMEOUT (s, each),
#           LABS_ONLY=1 skips the attention test after them.
#   attnbench: ATTN_MODES (bench_attention --modes); kerneltimes: KT_MODES (space-separated, default "bf16 gproj";
#   cudnn: cuDNN's own kernels), KT_SHAPES (space-separated B,H,T,D). ncu: NCU_MODES, NCU_SHAPE (cudnn as kerneltimes).
#   The commands behind the numbers in README.md and docs/: dev/results/README.md.
set -u
OUT=${1:?usage: dev/device_session.sh OUTDIR PHASE [PHASE ...]}
shift
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
say() { echo "$*" | tee -a "$SUMMARY"; }
phase_start=0
begin() { phase_start=$(date +%s); say "== $1 ($(date -u +%H:%M:%S))"; }
end() { say "   -> rc $1 in $(( $(date +%s) - phase_start )) s"; }
ARCH='-gencode arch=compute_90a,code=sm_90a'
DATA=/tmp/data
MATCHED_STEPS=${MATCHED_STEPS:-12000}
OLD_TREE=${OLD_DIR:-/tmp/old} # where oldtree builds the comparison tree, the other tree of bitsab, attnab, profiles

prepare_data() {
    [ -d "$DATA" ] && return
    mkdir -p "$DATA"
    for f in "${GUTENBERG_XZ:-.carry/data}"/gutenberg_*.bin.xz; do
        [ -f "$f" ] && xz -dc "$f" > "$DATA/$(basename "${f%.xz}")" &
    done
    wait
    ls -la "$DATA" >> "$OUT/data.txt"
}

# MPS lets the kernels of several small runs sharing one GPU overlap
mps_start() { mps=0; command -v nvidia-cuda-mps-control >/dev/null && nvidia-cuda-mps-control -d 2>/dev/null && mps=1
              say "   MPS: $([ $mps = 1 ] && echo on || echo off)"; }
# a time-limited matched_runs.sh leaves its trainers running: stop them (their logs end there), then MPS.
# The pattern is anchored: an unanchored one also matched (and killed) the device call's own shell, whose
# command line named build/train_gpt as a make target.
# On SIGTERM a trainer finishes its step and saves a checkpoint before it exits: wait for that (60 s at most).
stop_runs() { pkill -TERM -f '^build/train_gpt( |$)'
              for _ in $(seq 60); do pgrep -f '^build/train_gpt( |$)' > /dev/null || break; sleep 1; done
              [ "$mps" = 1 ] && echo quit | nvidia-cuda-mps-control; }

# the matched-run group of the seeds phases into runs/$g: SEED_MODES (default the four modes) x SEEDS at constant
# lr SEED_LR, SEED_PER_GPU runs at once (default 12), SEED_EXTRA appended to every trainer's flags (an arm's model
# options, e.g. "--bias 0"); vocab $1. g = SEED_NAME (default seeds_lr$SEED_LR) names the group, its tree and its results.
seeds_group() {
    bash scripts/matched_runs.sh --name "$g" --seeds "$SEEDS" --modes "${SEED_MODES:-fp32 bf16 repair gproj}" \
        --per-gpu "${SEED_PER_GPU:-12}" --diag-every 500 -- \
        --train-data "$DATA/gutenberg_train_*.bin" --val-data "$DATA/gutenberg_val_*.bin" --vocab "$1" \
        --steps "$SEED_STEPS" --schedule constant --lr "$SEED_LR" --val-every 2500 --val-batches 20 \
        --log-every 2500 --sample-every 0 --probe-every 500 --capture-attn "$SEED_CAPTURE" --checkpoint-minutes 0 \
        ${SEED_EXTRA:-}
}
# seeds_compare RUNS: compare_runs over RUNS/$g's runs into /tmp/$g (tables, JSON, figures, thinned logs)
seeds_compare() {
    mkdir -p /tmp/$g
    python3 scripts/compare_runs.py $(ls -d $1/$g/*/ | grep -v /compare/) --out /tmp/$g --smooth 50 \
        --last-k 200 --json /tmp/$g/compare.json --thin-to /tmp/$g/logs --thin-every 200 > /tmp/$g/compare.txt 2>&1
    grep -v '^wrote' /tmp/$g/compare.txt | tee -a "$SUMMARY"
}
# seeds_probe_step RUNS STEP LIMIT: attn_probe (LIMIT seconds each) on the captures of STEP not probed yet of every
# run of the leaking modes (SEED_PROBE_MODES, default "bf16 repair cudnn"), in parallel, into
# /tmp/$g/probe_RUN_STEP.{json,txt}
seeds_probe_step() {
    local cap r; cap=$(printf %08d "$2"); mkdir -p /tmp/$g
    for r in $(for m in ${SEED_PROBE_MODES:-bf16 repair cudnn}; do ls -d $1/$g/${m}_s* 2>/dev/null; done); do
        ls $r/attn_step${cap}_layer*.bin > /dev/null 2>&1 || continue
        [ -s /tmp/$g/probe_$(basename $r)_$2.json ] && continue
        timeout "$3" build/attn_probe $(printf -- '--capture %s ' $r/attn_step${cap}_layer*.bin) --heads 16 \
            --json /tmp/$g/probe_$(basename $r)_$2.json > /tmp/$g/probe_$(basename $r)_$2.txt 2>&1 &
    done
    wait
    say "   probes at step $2: $(ls /tmp/$g/probe_*_$2.json 2>/dev/null | wc -l) json"
}
# the step of a log.jsonl's last record (json.dumps writes "step": N)
last_step() { tail -n 1 "$1" | sed -nE 's/.*"step": *([0-9]+).*/\1/p'; }

# run_test NAME LIMIT CMD...: CMD under LIMIT seconds into $OUT/NAME.log; its "N passed, N failed" line and
# its first FAIL lines go to the summary
run_test() {
    local name=$1 limit=$2 rc
    shift 2
    timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
    rc=$?; say "   $name: rc $rc, $(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/$name.log" | tail -1)"
    grep -m 12 FAIL "$OUT/$name.log" | tee -a "$SUMMARY"
    return $rc
}
# run_labs LAB...: builds and runs each Hopper lab of dev/attention_lab under LAB_TIMEOUT (default 90 s: a hang
# means a wrong mbarrier count or phase), its checks and timings into the summary, and a lab that fails once
# more under compute-sanitizer
run_labs() {
    local l passed
    make -j"$(nproc)" NVCC_ARCH="$ARCH" $(for l in "$@"; do echo build/dev/attention_lab/$l; done) \
        build/tests/test_attention_gpu build/bench_attention > "$OUT/build_labs.log" 2>&1 || tail -30 "$OUT/build_labs.log" | tee -a "$SUMMARY"
    for l in "$@"; do
        if run_test "$l" "${LAB_TIMEOUT:-90}" build/dev/attention_lab/$l; then passed=1; else passed=0; fi
        grep -E "wrong|time|ms" "$OUT/$l.log" | head -n 30 | tee -a "$SUMMARY"
        if [ $passed = 0 ] && command -v compute-sanitizer >/dev/null; then
            timeout 120 compute-sanitizer --print-limit 20 build/dev/attention_lab/$l > "$OUT/${l}_sanitizer.log" 2>&1
            say "   $l under compute-sanitizer: rc $?"
            grep -m 20 -E "Invalid|Error|error|at 0x|by thread" "$OUT/${l}_sanitizer.log" | tee -a "$SUMMARY"
        fi
    done
}

# the 450m preset (gproj) on the Gutenberg shards with a schedule of RUN_STEPS steps of 65,536 tokens, into
# RUN_DIR (default /tmp/runs/450m_gutenberg: outside the tree, which each device call replaces, so a run
# stopped by RUN_STOP_AT in one call can be continued by `resume450m` in the next while the machine is
# warm). Extra trainer flags (--resume) are the arguments.
RUN_DIR=${RUN_DIR:-/tmp/runs/450m_gutenberg}
start_450m_run() {
    timeout "$RUN_SECONDS" bash scripts/preset_450m.sh --mode gproj --no-diag \
        --data "$DATA/gutenberg_train_*.bin:$DATA/gutenberg_val_*.bin" -- --out-dir "$RUN_DIR" \
        --total-batch-tokens 65536 --steps "$RUN_STEPS" --lr 6e-4 --warmup-steps 60 --val-every 100 \
        --val-batches 20 --checkpoint-every 0 --sample-every "$RUN_STEPS" --sample-tokens 64 --diag-every 100 \
        ${RUN_STOP_AT:+--stop-at "$RUN_STOP_AT"} "$@" > "$OUT/run450m.log" 2>&1 &
}
summarize_450m_run() {  # DEST: console, log and plots of the run into DEST/run450m
    mkdir -p "$1/run450m"
    grep -E "^(step|val|---- sample|mean over|saved|stopped|resum|note|error|diagnostics)" "$OUT/run450m.log" | tail -n 40 | tee -a "$SUMMARY"
    cp "$RUN_DIR/log.jsonl" "$1/run450m/" 2>/dev/null
    cp "$OUT/run450m.log" "$1/run450m/console.txt"
    python3 scripts/compare_runs.py "$RUN_DIR" --out "$1/run450m" --smooth 5 >> "$SUMMARY" 2>&1
}

# summarize_group GROUP DEST: compare table and plots, logs thinned for the repo (every 100th step
# record plus every diagnostics/validation record), attn_probe on the bf16 run's latest captures
summarize_group() {
    local g=$1 dest=$2/$1 r cap_step
    mkdir -p "$dest"
    say "-- $g"
    python3 scripts/compare_runs.py $(ls -d runs/$g/*/ | grep -v /compare/) --out "$dest" --smooth 20 2>&1 \
        | grep -v '^wrote' | tee "$dest/compare.txt" | tee -a "$SUMMARY"
    for r in runs/$g/*/; do
        [ -f "$r/log.jsonl" ] || continue
        python3 -c '
import json, sys
for line in open(sys.argv[1]):
    try: rec = json.loads(line)
    except ValueError: break
    if rec.get("event") is not None or "val_loss" in rec or rec.get("step", 0) % 100 == 0: sys.stdout.write(line)
' "$r/log.jsonl" > "$dest/log_$(basename "$r").jsonl"
    done
    cap_step=$(ls runs/$g/bf16/attn_step*_layer*.bin 2>/dev/null | sed 's/.*attn_step0*\([0-9]*\)_layer.*/\1/' | sort -n | tail -1)
    if [ -n "$cap_step" ] && [ "$cap_step" -gt 10 ]; then
        timeout 90 build/attn_probe $(printf -- '--capture %s ' runs/$g/bf16/attn_step$(printf %08d "$cap_step")_layer*.bin) \
            --heads 16 --json "$dest/probe_bf16_step$cap_step.json" > "$dest/probe_bf16_step$cap_step.txt" 2>&1
        say "   attn_probe on $g bf16 captures at step $cap_step: rc $?"
        tail -n 30 "$dest/probe_bf16_step$cap_step.txt" >> "$SUMMARY"
    fi
}

for phase in "$@"; do
    case "$phase" in
    build)
        begin build
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$SUMMARY"
        make -j"$(nproc)" NVCC_ARCH="$ARCH" build/train_gpt build/tokenize build/attn_probe build/bench_attention \
            build/tests/test_attention_gpu build/tests/test_layers_gpu build/tests/test_modern_layers_gpu \
            build/tests/test_diagnostics_gpu build/bench_modern_layers \
            build/dev/parity_gpu build/dev/profile_gpu_step build/dev/bench_matmul build/dev/attention_lab/hopper_fwd \
            > "$OUT/build.log" 2>&1
        rc=$?; [ $rc -ne 0 ] && tail -30 "$OUT/build.log"; end $rc ;;
    gputest)
        begin "GPU tests"
        for t in test_attention_gpu test_layers_gpu test_modern_layers_gpu test_diagnostics_gpu; do
            run_test "$t" 150 build/tests/$t; done
        timeout 60 build/tests/test_diagnostics_gpu --bench > "$OUT/diag_bench.log" 2>&1
        tail -5 "$OUT/diag_bench.log" | tee -a "$SUMMARY"
        timeout 60 build/bench_modern_layers > "$OUT/modern_layers_bench.log" 2>&1
        tee -a "$SUMMARY" < "$OUT/modern_layers_bench.log"
        end 0 ;;
    layercheck)
        # the layer and diagnostics tests and the GPU-vs-CPU model parity: what a host-side refactor of the
        # trainer (activation pointer tables, capture headers) can break without touching a kernel
        begin "layer tests and model parity"
        for t in tests/test_layers_gpu tests/test_modern_layers_gpu tests/test_diagnostics_gpu; do
            run_test "$(basename $t)" 150 build/$t; done
        # five option sets x four modes, each with a CPU-model reference: minutes, not seconds
        run_test parity_gpu 480 build/dev/parity_gpu
        end 0 ;;
    hopper)
        # issue 4: the wgmma + TMA forward lab alone (`labs` runs every lab)
        begin "hopper_fwd lab"
        run_labs hopper_fwd
        end 0 ;;
    labs)
        # issue 4: the Hopper kernel labs that exist in this tree, then the attention GPU test
        begin "Hopper labs and the attention GPU test"
        labs=""
        # LABS (names, space-separated) picks some of them
        for l in ${LABS:-hopper_fwd hopper_rows hopper_rows128 hopper_bwd64_wide hopper_bwd128 hopper_bwd_gproj \
                          hopper_bwd128_gproj hopper_bwd64_fp32 hopper_bwd128_fp32}; do
            [ -f dev/attention_lab/$l.cu ] && labs="$labs $l"; done
        run_labs $labs
        # LABS_ONLY=1: a quick look at a lab variant, without the attention test
        [ "${LABS_ONLY:-0}" = 1 ] || run_test test_attention_gpu 300 build/tests/test_attention_gpu
        end 0 ;;
    multigpu)
        begin "multi-GPU checks (scripts/check_multi_gpu.sh)"
        SKIP_BUILD=1 timeout "${MULTI_TIMEOUT:-300}" bash scripts/check_multi_gpu.sh "$OUT/multi" data/default > "$OUT/multi.log" 2>&1
        rc=$?; grep -E "^(PASS|FAIL|info)|passed, " "$OUT/multi.log" | tee -a "$SUMMARY"; end $rc ;;
    tokenizer)
        begin "tokenizer vs tiktoken (dev/bench_tokenizer.sh)"
        for i in $(seq 20); do cat .cache/corpus/mobydick.txt; done > /tmp/moby20.txt
        timeout 120 bash dev/bench_tokenizer.sh /tmp/moby20.txt 3 > "$OUT/bench_tokenizer.log" 2>&1
        rc=$?; tail -8 "$OUT/bench_tokenizer.log" | tee -a "$SUMMARY"; end $rc ;;
    trainer)
        begin "GPU trainer checks (dev/gpu_trainer_checks.sh)"
        prepare_data
        timeout 400 bash dev/gpu_trainer_checks.sh "$DATA" .cache/gpt2 build "$OUT/trainer" > "$OUT/trainer.log" 2>&1
        rc=$?; grep -E "^(ok|FAILED)|passed, |mean over|losses" "$OUT/trainer.log" | tee -a "$SUMMARY"; end $rc ;;
    matched)
        # issue 8: the small-scale reproduction. Four modes plus the two gauge arms, matched
        # (same seed, weights, data order), diagnostics and the in-run probe every 200 steps,
        # captures of every layer of each run late in training.
        begin "matched runs ($MATCHED_STEPS steps per run)"
        prepare_data
        late=$(( MATCHED_STEPS - 1000 ))
        flags=(--train-data "$DATA/gutenberg_train_*.bin" --val-data "$DATA/gutenberg_val_*.bin" --vocab .cache/gpt2
               --steps "$MATCHED_STEPS" --val-every 1000 --val-batches 20 --log-every 1000 --probe-every 200
               --capture-attn "10,$late" --overwrite 1)
        rm -rf runs/repro
        timeout 480 bash scripts/matched_runs.sh --name repro --sequential --diag-every 200 --gauge-arm bf16 \
            -- "${flags[@]}" > "$OUT/matched.log" 2>&1
        rc=$?
        timeout 200 bash scripts/matched_runs.sh --name repro --sequential --diag-every 200 --modes "" \
            --gauge-arm gproj -- "${flags[@]}" >> "$OUT/matched.log" 2>&1
        rc=$(( rc || $? ))
        python3 scripts/compare_runs.py runs/repro/{fp32,bf16,repair,gproj,bf16_zkbg,gproj_zkbg} \
            --out "$OUT/plots" --smooth 5 > "$OUT/compare.txt" 2>&1
        cat "$OUT/compare.txt" | tee -a "$SUMMARY"
        cp runs/repro/*/log.jsonl "$OUT/plots/" 2>/dev/null
        for m in fp32 bf16 repair gproj bf16_zkbg gproj_zkbg; do cp "runs/repro/$m/log.jsonl" "$OUT/plots/log_$m.jsonl"; done
        # the bf16 run's captures (step 10 and late), every mode against fp64
        for st in 10 "$late"; do
            caps=(runs/repro/bf16/attn_step$(printf %08d "$st")_layer*.bin)
            timeout 150 build/attn_probe $(printf -- '--capture %s ' "${caps[@]}") --heads 16 \
                --json "$OUT/plots/probe_bf16_step$st.json" > "$OUT/plots/probe_bf16_step$st.txt" 2>&1
            tail -n 45 "$OUT/plots/probe_bf16_step$st.txt" >> "$SUMMARY"
        done
        end $rc ;;
    ncu)
        # where the attention's time goes: Nsight Compute on one call per mode (NCU_MODES, default "bf16 gproj")
        # at NCU_SHAPE (B,H,T,D; default d12's 32,12,1024,64), every Hopper kernel of the call
        # (hopper_fwd*, keys64*/keys128*, rows_kernel) and the prep kernel, the first 6 launches; mode cudnn: cuDNN's
        # own kernels beside ours at the same shape, the first 12 launches named cudnn (four forward calls of two
        # kernels each, then the backward's D kernel, its main kernel and its dQ conversion)
        shape=${NCU_SHAPE:-32,12,1024,64}
        begin "ncu: attention kernels at $shape"
        for m in ${NCU_MODES:-bf16 gproj}; do
            kernels='hopper_fwd|keys64|keys128|rows_kernel|attn_bwd'; count=6
            [ "$m" = cudnn ] && { kernels='cudnn'; count=12; }
            timeout 240 ncu --kernel-name regex:"$kernels" --launch-count $count \
                --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
                --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats \
                --section Occupancy --section InstructionStats \
                --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active \
                build/bench_attention --shape "$shape" --modes "$m" --warmup 1 --repeats 1 \
                > "$OUT/ncu_$m.txt" 2>&1
            say "   ncu $m: rc $? ($(grep -cE '^  [A-Za-z_].*\(' "$OUT/ncu_$m.txt") kernel lines)"
        done
        end 0 ;;
    sweep)
        # issue 8: when does bf16 attention change training? Matched arms at two constant learning
        # rates, long enough for the keys to drift, several runs sharing the GPU (MPS when present).
        begin "gap sweep (${SWEEP_STEPS:=30000} steps per run, ${SWEEP_TIMEOUT:=330} s at most)"
        prepare_data
        mps_start
        flags=(--train-data "$DATA/gutenberg_train_*.bin" --val-data "$DATA/gutenberg_val_*.bin" --vocab .cache/gpt2
               --steps "$SWEEP_STEPS" --schedule constant --val-every 2500 --val-batches 20 --log-every 2500
               --sample-every 0 --probe-every 500 --capture-attn "10,$((SWEEP_STEPS / 2)),$((SWEEP_STEPS - 1000))"
               --overwrite 1)
        rm -rf runs/sweep_lr2e-3 runs/sweep_lr6e-3
        timeout "$SWEEP_TIMEOUT" bash scripts/matched_runs.sh --name sweep_lr2e-3 --per-gpu 3 --modes "fp32 bf16 gproj" \
            --diag-every 500 -- "${flags[@]}" --lr 2e-3 > "$OUT/sweep_lr2e-3.log" 2>&1 &
        timeout "$SWEEP_TIMEOUT" bash scripts/matched_runs.sh --name sweep_lr6e-3 --per-gpu 4 --modes "fp32 bf16 gproj" \
            --gauge-arm bf16 --diag-every 500 -- "${flags[@]}" --lr 6e-3 > "$OUT/sweep_lr6e-3.log" 2>&1 &
        wait
        stop_runs
        for g in sweep_lr2e-3 sweep_lr6e-3; do summarize_group "$g" /tmp/sweep; done
        tar czf "$OUT/sweep.tgz" -C /tmp sweep
        end 0 ;;
    seeds)
        # matched runs over seeds (scripts/matched_runs.sh --seeds): four modes x SEEDS at constant lr SEED_LR,
        # all sharing the GPU under MPS for SEED_LIMIT seconds, every layer captured at step SEED_CAPTURE; then
        # compare_runs (tables, bands, breaks, warnings), the logs thinned for the repo, and attn_probe on the
        # bf16 and repair captures (every mode against fp64 on the keys the run had learned)
        : "${SEED_LR:=3e-3}" "${SEED_STEPS:=60000}" "${SEED_LIMIT:=360}" "${SEED_CAPTURE:=16000}" "${SEEDS:=7 8 9}"
        g=${SEED_NAME:-seeds_lr$SEED_LR}
        begin "matched runs over seeds $SEEDS at lr $SEED_LR (${SEED_LIMIT} s)"
        prepare_data
        mps_start
        rm -rf runs/$g
        export SEED_LR SEED_STEPS SEED_CAPTURE SEEDS SEED_NAME SEED_MODES SEED_PER_GPU SEED_EXTRA SEED_PROBE_MODES
        timeout "$SEED_LIMIT" bash dev/device_session.sh "$OUT/group" seeds_group > "$OUT/$g.log" 2>&1
        stop_runs
        seeds_compare runs
        for c in ${SEED_CAPTURE//,/ }; do seeds_probe_step runs "$c" 150; done
        tar czf "$OUT/$g.tgz" -C /tmp $g
        end 0 ;;
    seeds_start|seeds_wait|seeds_probe|seeds_finish)
        # the same matched runs as `seeds`, carried over several device calls on one warm machine: seeds_start
        # copies the built tree to /tmp/seedtree_$g (each call replaces the checkout) and starts the group there in
        # its own process session, so it outlives the call; seeds_wait reports progress for SEED_WAIT seconds;
        # seeds_finish stops the runs (SIGTERM: each saves a checkpoint), then compares, thins and probes
        # every capture step of SEED_CAPTURE (a comma list) like `seeds`
        : "${SEED_LR:=3e-3}" "${SEED_STEPS:=80000}" "${SEED_CAPTURE:=20000,35000,50000}" "${SEEDS:=7 8 9}"
        g=${SEED_NAME:-seeds_lr$SEED_LR}; tree=/tmp/seedtree_$g
        case $phase in
        seeds_start)
            begin "matched runs over seeds $SEEDS at lr $SEED_LR, detached in $tree"
            prepare_data
            mps_start
            rm -rf "$tree"; mkdir -p "$tree/.carry"
            tar cf - --exclude=./.git --exclude=./.carry --exclude=./runs . | tar xf - -C "$tree"
            cp -a "${VOCAB_DIR:-.cache/gpt2}" "$tree/.carry/gpt2"
            export SEED_LR SEED_STEPS SEED_CAPTURE SEEDS SEED_NAME SEED_MODES SEED_PER_GPU SEED_EXTRA SEED_PROBE_MODES
            (cd "$tree" && VOCAB_DIR=.carry/gpt2 setsid nohup bash dev/device_session.sh /tmp/seeds_group_out_$g seeds_group \
                > "$tree/$g.log" 2>&1 < /dev/null &)
            sleep 20; say "   started: $(pgrep -fc '^build/train_gpt( |$)') trainers on the GPU"
            end 0 ;;
        seeds_wait)
            begin "matched runs: progress for ${SEED_WAIT:-540} s"
            t_end=$(( $(date +%s) + ${SEED_WAIT:-540} ))
            while [ "$(date +%s)" -lt "$t_end" ]; do
                sleep $(( t_end - $(date +%s) < 120 ? t_end - $(date +%s) : 120 ))
                say "   $(date -u +%H:%M:%S) $(pgrep -fc '^build/train_gpt( |$)') trainers; last steps: $(for f in $tree/runs/$g/*/log.jsonl; do
                    printf '%s=%s ' "$(basename "$(dirname "$f")")" "$(last_step "$f")"; done)"
            done
            end 0 ;;
        seeds_probe)
            # the captures of SEED_PROBE_STEPS, each once every bf16 and repair run is 100 steps past it (waiting
            # up to SEED_WAIT seconds), probed while the group runs on
            begin "matched runs: probe the captures at ${SEED_PROBE_STEPS:?}"
            t_end=$(( $(date +%s) + ${SEED_WAIT:-300} ))
            for c in $SEED_PROBE_STEPS; do
                until [ "$(date +%s)" -ge "$t_end" ]; do
                    behind=0
                    for f in $(for m in ${SEED_PROBE_MODES:-bf16 repair cudnn}; do ls $tree/runs/$g/${m}_s*/log.jsonl 2>/dev/null; done); do
                        st=$(last_step "$f")
                        [ "${st:-0}" -ge $(( c + 100 )) ] || behind=1
                    done
                    [ $behind = 0 ] && break; sleep 10
                done
                seeds_probe_step $tree/runs "$c" 200
            done
            end 0 ;;
        seeds_finish)
            begin "matched runs: stop, compare, probe"
            mps=1; stop_runs
            seeds_compare $tree/runs
            for c in ${SEED_PROBE_STEPS:-${SEED_CAPTURE//,/ }}; do seeds_probe_step $tree/runs "$c" 200; done
            cp $tree/$g.log /tmp/$g/matched_runs.log
            tar czf "$OUT/$g.tgz" -C /tmp $g
            end 0 ;;
        esac ;;
    seeds_group)
        # the matched-run group itself, in the foreground (what `seeds` times out and seeds_start detaches)
        : "${SEED_LR:=3e-3}" "${SEED_STEPS:=80000}" "${SEED_CAPTURE:=20000,35000,50000}" "${SEEDS:=7 8 9}"
        g=${SEED_NAME:-seeds_lr$SEED_LR}
        seeds_group "${VOCAB_DIR:-.cache/gpt2}" ;;
    llmcbuild)
        # llm.c (the copied ../shared/bench kit in LLMC_KIT, default .carry/bench) built in /tmp/llmc, in the
        # background at low priority so it can overlap other work; vsllmc waits for it
        begin "llm.c build (background)"
        mkdir -p /tmp/llmc
        (cd /tmp/llmc && tar -xzf "$OLDPWD/${LLMC_KIT:-.carry/bench}/llmc-f1e2ace-cuda13.tgz" && mkdir -p llmc/cudnn-frontend \
            && tar -xzf "$OLDPWD/${LLMC_KIT:-.carry/bench}/cudnn-frontend-include.tgz" -C llmc/cudnn-frontend \
            && cd llmc && setsid nohup nice make train_gpt2cu USE_CUDNN=1 GPU_COMPUTE_CAPABILITY=90 > build.log 2>&1 < /dev/null &)
        end 0 ;;
    reliability)
        # the GPU trainer's reliability checks (dev/gpu_reliability_checks.sh: SIGTERM + resume, --overwrite,
        # --deterministic per mode and its cost per d12 step) and the deterministic backward's cost per
        # attention call, flag off and on side by side (bench_attention --deterministic both)
        begin "reliability checks and the cost of --deterministic"
        prepare_data
        timeout 330 bash dev/gpu_reliability_checks.sh "$DATA" "${VOCAB_DIR:-.cache/gpt2}" "$OUT/reliability" \
            > "$OUT/reliability.log" 2>&1
        rc=$?; grep -E "^(ok|FAILED)|passed, |SIGTERM exit|after --overwrite" "$OUT/reliability.log" | tee -a "$SUMMARY"
        cat "$OUT/reliability/deterministic_cost.md" >> "$SUMMARY" 2>/dev/null
        timeout 120 build/bench_attention --deterministic both --shape 8,16,1024,64 --shape 4,16,2048,64 \
            --shape 8,8,1024,128 --shape 2,16,4096,128 > "$OUT/bench_deterministic.txt" 2>&1
        say "   bench_attention --deterministic both: rc $?"
        grep -E "^B[0-9]|^ *(mode|bf16|repair|fp32|gproj)" "$OUT/bench_deterministic.txt" | head -n 60 >> "$SUMMARY"
        end $rc ;;
    tilesweep)
        # the L2 sections of the causal tile order (attention/cuda/tile_order.cuh): bench_attention per
        # ATTN_TILE_SECTION_HEADS (0: one section over all heads, the plain longest-first order; "default": the
        # per-pass sizes of attn_tile_section_heads), our modes next to cuDNN's kernel in each run
        begin "tile sections: bench_attention per ATTN_TILE_SECTION_HEADS"
        for sec in ${TILE_SECTIONS:-0 default 24 48 96}; do
            if [ "$sec" = default ]; then unset ATTN_TILE_SECTION_HEADS; else export ATTN_TILE_SECTION_HEADS=$sec; fi
            timeout 150 build/bench_attention ${TILE_SHAPES:---shape 32,12,1024,64 --shape 16,16,1024,64 \
                --shape 8,16,1024,64 --shape 4,16,2048,64 --shape 8,8,1024,128 --shape 2,16,4096,128 \
                --shape 2,16,4096,64 --shape 1,16,8192,128} --modes "${TILE_MODES:-bf16,gproj,cudnn}" --repeats 20 \
                > "$OUT/tiles_$sec.txt" 2>&1
            say "   ATTN_TILE_SECTION_HEADS=$sec: rc $?"
            grep -E '^B[0-9]' "$OUT/tiles_$sec.txt" | tee -a "$SUMMARY"
        done
        unset ATTN_TILE_SECTION_HEADS
        end 0 ;;
    vsllmc)
        # the whole step against llm.c (scripts/bench_vs_llmc.sh, PROFILE=1: the per-kernel table), once per
        # VS_SECTIONS value of ATTN_TILE_SECTION_HEADS ("default": unset), in one call; llm.c from llmcbuild
        begin "step vs llm.c per tile order"
        prepare_data
        for _ in $(seq 120); do [ -x /tmp/llmc/llmc/train_gpt2cu ] && break; sleep 2; done
        [ -x /tmp/llmc/llmc/train_gpt2cu ] || { tail -5 /tmp/llmc/llmc/build.log | tee -a "$SUMMARY"; }
        rc=0
        for sec in ${VS_SECTIONS:-0 default}; do
            if [ "$sec" = default ]; then unset ATTN_TILE_SECTION_HEADS; else export ATTN_TILE_SECTION_HEADS=$sec; fi
            MODES="${VS_MODES:-bf16 gproj}" GRAPHS=0 SMALL_GRAPHS="0 1" SMALL_STEPS=${VS_SMALL_STEPS:-0} PROFILE=${VS_PROFILE:-1} \
                timeout "${VS_TIMEOUT:-400}" bash scripts/bench_vs_llmc.sh "$OUT/vsllmc_$sec.md" /tmp/llmc/llmc \
                "$DATA/gutenberg_train_*.bin" ${VS_MODELS:-d12:32 d24:16} > "$OUT/vsllmc_$sec.log" 2>&1 || rc=1
            say "   ATTN_TILE_SECTION_HEADS=$sec: rc $rc"
            grep -E '^\|' "$OUT/vsllmc_$sec.md" | tee -a "$SUMMARY"
        done
        unset ATTN_TILE_SECTION_HEADS
        end $rc ;;
    matmulbench)
        # the step's GEMMs under the heuristic's first cuBLASLt algorithm against the fastest of its first 16
        # (dev/bench_matmul.cu), per MM_MODELS entry MODEL:B (T 1024)
        begin "cuBLASLt: the heuristic's first algorithm against the fastest of its first 16"
        for cfg in ${MM_MODELS:-d12:32 d24:16 450m:16}; do
            timeout 150 build/dev/bench_matmul --model "${cfg%%:*}" --batch "${cfg##*:}" --seq 1024 \
                > "$OUT/matmul_${cfg%%:*}.txt" 2>&1
            say "   $cfg: rc $?"
            tail -n 17 "$OUT/matmul_${cfg%%:*}.txt" | tee -a "$SUMMARY"
        done
        end 0 ;;
    stepkernels)
        # every kernel of profile_gpu_step --steps 1 (three warm-up steps, a timed one, a profiled one) under
        # ncu with its duration only, clocks as found, per SK_RUNS entry MODEL:B:MODE[:T] (T default 1024); PROFILE_BIN (default
        # build/dev/profile_gpu_step) picks the build
        begin "per-kernel times of whole training steps (ncu)"
        for run in ${SK_RUNS:-d12:32:gproj d12:32:bf16}; do
            IFS=: read -r m b a t <<< "$run"
            timeout 300 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
                "${PROFILE_BIN:-build/dev/profile_gpu_step}" --model "$m" --batch "$b" --seq "${t:-1024}" --attn "$a" \
                --steps 1 > "$OUT/stepkernels_${m}_${a}${SK_TAG:-}.csv" 2> "$OUT/stepkernels_${m}_${a}${SK_TAG:-}.err"
            say "   $run: rc $?, $(grep -c gpu__time_duration "$OUT/stepkernels_${m}_${a}${SK_TAG:-}.csv") kernels"
        done
        end 0 ;;
    smallstep)
        # where the launch-bound small preset's step goes (B16 T256): profile_gpu_step per mode in SMALL_MODES
        # (eager step, synchronized, no data loader; per-kind table), then train_gpt on real shards
        # with --cuda-graph 0 and 1: the step records' median ms and the wall time per step. TRAIN_BIN /
        # PROFILE_BIN (default build/...) pick the build, SMALL_TAG suffixes the file names, SMALL_PROFILE=0
        # skips the profile
        begin "small preset: GPU step, per kind, and the trainer's wall step (${TRAIN_BIN:-build/train_gpt})"
        prepare_data
        for a in ${SMALL_MODES:-gproj bf16}; do
            tag=${a}${SMALL_TAG:-}
            if [ "${SMALL_PROFILE:-1}" = 1 ]; then
                timeout 60 "${PROFILE_BIN:-build/dev/profile_gpu_step}" --model small --batch 16 --seq 256 \
                    --attn "$a" --steps 50 > "$OUT/small_prof_$tag.txt" 2>&1
                say "   profile $a: rc $? $(grep -m1 '^ours:' "$OUT/small_prof_$tag.txt" | sed 's/.*: \([0-9.]* ms\/step\).*/\1/')"
            fi
            # wall ms per step between a 200-step and a SMALL_LONG-step run (default 1200; start-up cancels, its
            # spread of a few tenths of a second does not): every host cost counts
            long=${SMALL_LONG:-1200}
            for g in 0 1; do
                for n in 200 "$long"; do
                    t_start=$(date +%s%N)
                    timeout 120 "${TRAIN_BIN:-build/train_gpt}" --model small --batch-size 16 --seq-len 256 --steps $n \
                        --lr 3e-3 --schedule constant --log-every 100 --train-data "$DATA/gutenberg_train_*.bin" \
                        --val-data "" --vocab "" --sample-every 0 --checkpoint-minutes 0 --overwrite 1 --attn "$a" \
                        --cuda-graph $g --out-dir "/tmp/small_${tag}_g$g" > "$OUT/small_train_${tag}_g${g}_$n.log" 2>&1
                    rc=$?
                    [ "$n" = 200 ] && wall_short=$(( $(date +%s%N) - t_start )) || wall_long=$(( $(date +%s%N) - t_start ))
                done
                say "   train $a --cuda-graph $g: rc $rc | step record $(python3 scripts/step_ms.py "/tmp/small_${tag}_g$g/log.jsonl" 2>/dev/null) ms (median from step 10) | wall $(awk -v a="$wall_short" -v b="$wall_long" -v n=$((long - 200)) 'BEGIN{printf "%.3f", (b - a) / n / 1e6}') ms per step ($long-step run minus 200-step run)"
            done
        done
        end 0 ;;
    power)
        # the SM clock and the board power while d12 B32 T1024 trains (POWER_MODES, default "gproj bf16"; 60 steps
        # each): nvidia-smi every 100 ms into OUT/power_MODE.csv; the summary gives, over the samples drawing more
        # than half the power limit (the training steps), the median SM clock against its maximum, the median power
        # against the limit, and how often each clock-event reason was active (0x4: software power cap).
        # POWER_EXTRA: more trainer flags (e.g. "--matmul-tune 16"), POWER_TAG suffixes the file names,
        # POWER_STEPS (default 60) the run's length
        begin "SM clock and power during d12 training ${POWER_EXTRA:-}"
        prepare_data
        for a in ${POWER_MODES:-gproj bf16}; do
            f=$a${POWER_TAG:-}
            nvidia-smi --query-gpu=clocks.sm,clocks.max.sm,power.draw,power.limit,clocks_event_reasons.active \
                --format=csv,noheader,nounits -lms 100 > "$OUT/power_$f.csv" 2>&1 &
            smi=$!
            timeout 150 build/train_gpt --model d12 --batch-size 32 --seq-len 1024 --steps "${POWER_STEPS:-60}" \
                --lr 6e-4 --warmup-steps 5 --train-data "$DATA/gutenberg_train_*.bin" --val-data "" --vocab "" \
                --sample-every 0 --checkpoint-minutes 0 --overwrite 1 --attn "$a" ${POWER_EXTRA:-} \
                --out-dir "/tmp/power_$f" > "$OUT/power_$f.log" 2>&1
            rc=$?
            kill $smi; wait $smi 2>/dev/null
            say "   d12 $a ${POWER_EXTRA:-}: rc $rc | $(python3 scripts/step_ms.py "/tmp/power_$f/log.jsonl" 2>/dev/null) ms/step (median from step 10) | $(python3 -c '
import collections, statistics, sys
rows = [[c.strip() for c in l.split(",")] for l in open(sys.argv[1]) if l.count(",") == 4]
rows = [r for r in rows if r[2].replace(".", "").isdigit() and float(r[2]) > 0.5 * float(r[3])]
if not rows: sys.exit("no samples under load")
reasons = collections.Counter(r[4] for r in rows)
print("%d samples: SM clock median %.0f MHz of max %s, power median %.0f W of limit %s W, reasons %s" % (
    len(rows), statistics.median(float(r[0]) for r in rows), rows[0][1],
    statistics.median(float(r[2]) for r in rows), rows[0][3],
    ", ".join("%s x%d" % kv for kv in reasons.most_common())))' "$OUT/power_$f.csv" 2>&1)"
        done
        end 0 ;;
    resumecheck)
        # timed GEMM algorithms and bit-exact resume: d12 at B8 T1024 (gproj, --matmul-tune 16),
        # RC_STEPS straight with a checkpoint halfway, then that checkpoint copied to a new folder and resumed
        # (it must restore the straight run's algorithms); the final model and state files compared with cmp
        begin "timed GEMM algorithms: a straight run vs its halfway checkpoint resumed"
        prepare_data
        n=${RC_STEPS:-16}
        rc_flags=(--model d12 --batch-size 8 --seq-len 1024 --train-data "$DATA/gutenberg_train_*.bin" --val-data ""
                  --vocab "" --sample-every 0 --steps "$n" --checkpoint-minutes 0 --checkpoint-every $((n / 2))
                  --matmul-tune 16)
        timeout 120 build/train_gpt "${rc_flags[@]}" --overwrite 1 --out-dir /tmp/rc_straight \
            > "$OUT/rc_straight.log" 2>&1
        r1=$?
        rm -rf /tmp/rc_split && mkdir -p /tmp/rc_split
        h=$(printf '%08d' $((n / 2)))
        cp /tmp/rc_straight/log.jsonl /tmp/rc_straight/model_$h.bin /tmp/rc_straight/state_$h.bin /tmp/rc_split/
        timeout 120 build/train_gpt "${rc_flags[@]}" --out-dir /tmp/rc_split --resume > "$OUT/rc_resumed.log" 2>&1
        r2=$?
        m=$(printf 'model_%08d.bin' "$n"); st=$(printf 'state_%08d.bin' "$n")
        cmp /tmp/rc_straight/$m /tmp/rc_split/$m && cmp /tmp/rc_straight/$st /tmp/rc_split/$st
        r3=$?
        grep -h "gemm algorithms" "$OUT"/rc_*.log | tee -a "$SUMMARY"
        say "   runs rc $r1 $r2; straight vs halfway + resume, model and state files: $([ $r3 = 0 ] && echo identical || echo DIFFER)"
        grep -q "restored from the resume state" "$OUT/rc_resumed.log"; r4=$?
        say "   the resumed run restored its GEMM algorithms: $([ $r4 = 0 ] && echo yes || echo NO)"
        end $(( r1 || r2 || r3 || r4 )) ;;
    oldtree)
        # the tree in OLD_SRC (default .carry/old: git archive of the commit to compare against) built in OLD_DIR
        # (default /tmp/old): train_gpt, profile_gpu_step and bench_attention, whose paths the phases after it
        # take from OURS_BIN / PROFILE_BIN (attnab: AB_OLD, bitsab: BITS_OLD)
        begin "build the comparison tree (${OLD_SRC:-.carry/old} in $OLD_TREE)"
        rm -rf "$OLD_TREE" && cp -r "${OLD_SRC:-.carry/old}" "$OLD_TREE" && (cd "$OLD_TREE" && make -j"$(nproc)" \
            NVCC_ARCH="$ARCH" build/train_gpt build/dev/profile_gpu_step build/bench_attention \
            > "$OUT/build_$(basename "$OLD_TREE").log" 2>&1)
        rc=$?; [ $rc -ne 0 ] && tail -30 "$OUT/build_$(basename "$OLD_TREE").log"; end $rc ;;
    bitsab)
        # a kernel change that must move no bit: the trainers of this tree and of BITS_OLD (default OLD_DIR,
        # built by oldtree) run the same steps with --deterministic 1 in BITS_MODES (default "gproj fp32"), small
        # B16 T256 (60 steps) and d12 B4 T1024 (20 steps); the final model and state files compared with cmp.
        # BITS_NEW_ENV: VAR=VALUE words for this tree's runs only (a run-time switch against the same build: BITS_OLD=.)
        begin "bits: this tree's trainer${BITS_NEW_ENV:+ under $BITS_NEW_ENV} against ${BITS_OLD:-$OLD_TREE}"
        prepare_data
        rc=0
        for a in ${BITS_MODES:-gproj fp32}; do
            for cfg in small:16:256:60 d12:4:1024:20; do
                IFS=: read -r m b tl n <<< "$cfg"
                for t in new old; do
                    bin=build/train_gpt; envs=${BITS_NEW_ENV:-}
                    [ $t = old ] && { bin=${BITS_OLD:-$OLD_TREE}/build/train_gpt; envs=""; }
                    env $envs timeout 150 $bin --model "$m" --batch-size "$b" --seq-len "$tl" --steps "$n" --lr 3e-4 \
                        --train-data "$DATA/gutenberg_train_*.bin" --val-data "" --vocab "" --sample-every 0 \
                        --checkpoint-minutes 0 --checkpoint-every "$n" --deterministic 1 --overwrite 1 --attn "$a" \
                        --out-dir "/tmp/bits_${t}_${m}_$a" > "$OUT/bits_${t}_${m}_$a.log" 2>&1 || say "   $t $m $a: rc $?"
                done
                f=$(printf '%08d' "$n")
                if cmp -s "/tmp/bits_new_${m}_$a/model_$f.bin" "/tmp/bits_old_${m}_$a/model_$f.bin" &&
                   cmp -s "/tmp/bits_new_${m}_$a/state_$f.bin" "/tmp/bits_old_${m}_$a/state_$f.bin"; then
                    say "   $m $a, $n steps: model and state files identical"
                else
                    rc=1
                    say "   $m $a, $n steps: DIFFER $(cmp "/tmp/bits_new_${m}_$a/model_$f.bin" "/tmp/bits_old_${m}_$a/model_$f.bin" 2>&1 | head -1)"
                fi
            done
        done
        end $rc ;;
    launches)
        # the two launches of the passes over work items (the forward and the HS-64 bf16/repair key-major pass):
        # one CTA per SM over the work-item queue, the default, and with ATTN_FWD_PERSISTENT=0 ATTN_BWD_PERSISTENT=0
        # one CTA per item: a hang and NaN check on shapes on and off the tiles in every mode, then the attention
        # test under each (after build; the bits and times against main: oldtree, bitsab, attnab)
        begin "the launches over work items"
        for e in 1 0; do
            env ATTN_FWD_PERSISTENT=$e ATTN_BWD_PERSISTENT=$e timeout 30 build/bench_attention --shape 2,4,1000,64 \
                --shape 2,4,1000,128 --shape 4,16,1024,64 --shape 1,2,77,64 --shape 3,1,1,128 \
                --modes fp32,bf16,repair,gproj --deterministic both --warmup 1 --repeats 2 \
                >> "$OUT/launches_smoke.txt" 2>&1
            say "   ATTN_FWD_PERSISTENT=ATTN_BWD_PERSISTENT=$e smoke: rc $? (1: NaN/Inf outputs, 124: a hang)"
            run_test "test_attention_gpu_items$e" 240 env ATTN_FWD_PERSISTENT=$e ATTN_BWD_PERSISTENT=$e \
                build/tests/test_attention_gpu
        done
        end 0 ;;
    attnab)
        # one kernel change against AB_OLD (default OLD_DIR, built by oldtree): bench_attention of both builds
        # alternating, AB_REPS rounds (default 3), at AB_SHAPES (default d12's and d24's) in AB_MODES (default
        # gproj,bf16); AB_NEW_ENV: VAR=VALUE words for this tree's runs only (a run-time switch: AB_OLD=.)
        begin "attention A/B: this tree${AB_NEW_ENV:+ under $AB_NEW_ENV} and ${AB_OLD:-$OLD_TREE}, alternating"
        shapes=""; for sh in ${AB_SHAPES:-32,12,1024,64 16,16,1024,64}; do shapes="$shapes --shape $sh"; done
        for rep in $(seq "${AB_REPS:-3}"); do
            for t in new old; do
                bin=build/bench_attention; envs=${AB_NEW_ENV:-}
                [ $t = old ] && { bin=${AB_OLD:-$OLD_TREE}/build/bench_attention; envs=""; }
                env $envs timeout 120 $bin $shapes --modes "${AB_MODES:-gproj,bf16}" > "$OUT/attnab_${rep}_$t.txt" 2>&1
                say "   round $rep $t: rc $?"
                grep -E '^B[0-9]' "$OUT/attnab_${rep}_$t.txt" | tee -a "$SUMMARY"
            done
        done
        end 0 ;;
    issuetable)
        # issue 17's tables in one phase (run after llmcbuild build): bench_attention against cuDNN at the issue's six
        # shapes and the trainers' grids (bf16, gproj, fp32, cudnn; median of 20), the 450m B16 step per mode
        # (profile_gpu_step, 8 steps, bf16 twice), then the step against llm.c and the PyTorch twin (vsllmc with
        # VS_MODES "bf16 gproj", TWIN=1) in what time is left of IT_TIMEOUT (default 540 s from the phase's start)
        begin "issue 17's tables: attention against cuDNN, 450m per mode, the step against llm.c and the twin"
        timeout 120 build/bench_attention --shape 8,16,1024,64 --shape 4,16,2048,64 --shape 8,8,1024,128 \
            --shape 2,16,4096,128 --shape 2,16,4096,64 --shape 1,16,8192,128 --shape 32,12,1024,64 \
            --shape 16,16,1024,64 --modes bf16,gproj,fp32,cudnn --repeats 20 > "$OUT/issuetable_attention.txt" 2>&1
        say "   bench_attention: rc $?"
        grep -E '^B[0-9]' "$OUT/issuetable_attention.txt" | tee -a "$SUMMARY"
        i=0
        for a in bf16 gproj fp32 bf16; do
            i=$((i + 1)) # bf16 runs twice: each run its own file
            timeout 120 build/dev/profile_gpu_step --model 450m --batch 16 --seq 1024 --attn $a --steps 8 \
                > "$OUT/issuetable_450m_${i}_$a.txt" 2>&1
            say "   450m $a: $(grep -m1 'ms/step' "$OUT/issuetable_450m_${i}_$a.txt")"
        done
        left=$(( ${IT_TIMEOUT:-540} - ($(date +%s) - phase_start) - 15 ))
        if [ "$left" -gt 120 ]; then
            VS_SECTIONS=default VS_MODES="bf16 gproj" VS_PROFILE=0 VS_SMALL_STEPS=0 VS_TIMEOUT=$left TWIN=1 \
                bash "$0" "$OUT/vsllmc" vsllmc > /dev/null 2>&1
            grep -E '^\|' "$OUT/vsllmc/vsllmc_default.md" | tee -a "$SUMMARY"
        else
            say "   vsllmc skipped: $left s left of IT_TIMEOUT"
        fi
        end 0 ;;
    switchab)
        # a kernel schedule behind a run-time switch, measured in one call against the same build: SWITCH (VAR=1,
        # required) in SW_MODES (bench_attention modes, default fp32): the attention test under it, the attnab
        # rounds (AB_REPS, default 5; AB_SHAPES) summarised by dev/bench_ab.py, then SW_MODEL (default 450m) B16
        # whole steps (profile_gpu_step, 8 steps) of the first mode without and with it, twice, alternating
        sw=${SWITCH:?switchab needs SWITCH=VAR=1}; modes=${SW_MODES:-fp32}
        begin "switch A/B: $sw in $modes"
        run_test "test_attention_gpu_switch" 240 env "$sw" build/tests/test_attention_gpu
        AB_OLD=. AB_NEW_ENV="$sw" AB_MODES="$modes" AB_REPS=${AB_REPS:-5} \
            AB_SHAPES=${AB_SHAPES:-32,12,1024,64 16,16,1024,64 8,16,1024,64 4,16,2048,64} bash "$0" "$OUT/ab" attnab \
            > /dev/null 2>&1
        python3 dev/bench_ab.py off="$OUT/ab/attnab_*_old.txt" on="$OUT/ab/attnab_*_new.txt" \
            > "$OUT/switchab_attention.md" 2>&1
        tee -a "$SUMMARY" < "$OUT/switchab_attention.md"
        for rep in 1 2; do
            for e in off on; do
                envs=""; [ $e = on ] && envs=$sw
                env $envs timeout 120 build/dev/profile_gpu_step --model "${SW_MODEL:-450m}" --batch 16 --seq 1024 \
                    --attn "${modes%%,*}" --steps 8 > "$OUT/switchab_step_${rep}_$e.txt" 2>&1
                say "   step $rep $e: $(grep -h 'ms/step' "$OUT/switchab_step_${rep}_$e.txt" | head -1)"
            done
        done
        end 0 ;;
    profiles)
        # profile_gpu_step (10 steps; per kernel kind) for the new build and OLD_DIR's side by side, per
        # PF_RUNS entry MODEL:B:MODE
        begin "per-kind step profiles: this tree and $OLD_TREE, alternating"
        for run in ${PF_RUNS:-d12:32:gproj d12:32:bf16 d24:16:gproj d24:16:bf16}; do
            IFS=: read -r m b a <<< "$run"
            for t in new old; do
                bin=build/dev/profile_gpu_step; [ $t = old ] && bin=$OLD_TREE/build/dev/profile_gpu_step
                timeout 120 $bin --model "$m" --batch "$b" --seq 1024 --attn "$a" --steps 10 \
                    > "$OUT/prof_${m}_${a}_$t.txt" 2>&1
                say "   $run $t: rc $? $(grep -m1 '^ours:' "$OUT/prof_${m}_${a}_$t.txt" | sed 's/.*: \([0-9.]* ms\/step\).*/\1/')"
            done
        done
        end 0 ;;
    sass)
        # the machine code (cuobjdump -sass) of the attention objects of this tree and, when oldtree built it, of
        # OLD_DIR's, for reading away from the GPU machine (the build machines have no disassembler):
        # $OUT/sass.tar.xz, one .sass per object under new/ and old/
        begin "sass: machine code of the attention objects"
        rc=0
        if ! command -v cuobjdump > /dev/null; then
            say "   cuobjdump not found (it ships with the CUDA toolkit, beside nvcc)"; rc=1
        else
            rm -rf /tmp/sass && mkdir -p /tmp/sass
            for t in new old; do
                root=.; [ $t = old ] && root=$OLD_TREE
                [ -d "$root/build/attention" ] || continue
                mkdir -p /tmp/sass/$t
                for o in $(find "$root/build/attention" "$root/build/dev/attention_lab" -name '*.cu.o' 2>/dev/null); do
                    f=/tmp/sass/$t/$(echo "${o#"$root"/build/}" | tr / _).sass
                    cuobjdump -sass "$o" > "$f" 2>&1 || { say "   cuobjdump $o: rc $?"; rc=1; }
                done
                say "   $t: $(ls /tmp/sass/$t 2>/dev/null | wc -l) objects"
            done
            tar -C /tmp/sass -cJf "$OUT/sass.tar.xz" . || rc=1
        fi
        end $rc ;;
    ncusource)
        # where inside a kernel the time goes: ncu's per-instruction warp-state samples (its source page, SASS) for
        # the kernels matching NCU_SOURCE_KERNELS (default the forward, hopper_fwd) at NCU_SHAPE (default d12's) in
        # each mode of NCU_MODES (default "bf16 gproj"), for this tree and, when oldtree built it, OLD_DIR's; of the
        # matching launches NCU_SKIP (default 1: bench_attention's warm-up) are skipped and NCU_COUNT (default 1)
        # profiled, so a regex of two kernels of a call takes NCU_SKIP=2 NCU_COUNT=2: $OUT/ncusource.tar.xz (CSV per
        # tree and mode)
        shape=${NCU_SHAPE:-32,12,1024,64}
        begin "ncusource: per-instruction samples of ${NCU_SOURCE_KERNELS:-hopper_fwd} at $shape"
        rc=0
        rm -rf /tmp/ncusource && mkdir -p /tmp/ncusource
        for t in new old; do
            bin=build/bench_attention; [ $t = old ] && bin=$OLD_TREE/build/bench_attention
            [ -x "$bin" ] || continue
            for m in ${NCU_MODES:-bf16 gproj}; do
                rep=/tmp/ncusource/${t}_$m
                timeout 240 ncu --set full --import-source no --kernel-name regex:"${NCU_SOURCE_KERNELS:-hopper_fwd}" \
                    --launch-skip "${NCU_SKIP:-1}" --launch-count "${NCU_COUNT:-1}" -f -o "$rep" \
                    $bin --shape "$shape" --modes "$m" --warmup 1 --repeats 1 > "$rep.log" 2>&1 &&
                    ncu -i "$rep.ncu-rep" --page source --print-source sass --csv > "$rep.csv" 2>> "$rep.log" &&
                    ncu -i "$rep.ncu-rep" --page details > "$rep.details.txt" 2>> "$rep.log"
                r=$?; [ $r -ne 0 ] && rc=1
                say "   $t $m: rc $r, $(wc -l < "$rep.csv" 2>/dev/null || echo 0) source rows"
                rm -f "$rep.ncu-rep"
            done
        done
        tar -C /tmp/ncusource -cJf "$OUT/ncusource.tar.xz" . || rc=1
        end $rc ;;
    attnbench)
        # issue 4: our kernels vs PyTorch SDPA (cuDNN, flash), side by side (scripts/bench_attention.sh)
        begin "attention benchmark vs PyTorch SDPA"
        timeout 240 bash scripts/bench_attention.sh "$OUT/attn" --shape 8,16,1024,64 --shape 4,16,2048,64 \
            --shape 8,8,1024,128 --shape 2,16,4096,128 ${ATTN_MODES:+--modes "$ATTN_MODES"} > "$OUT/attnbench.log" 2>&1
        rc=$?; tail -n 12 "$OUT/attnbench.log" | tee -a "$SUMMARY"; end $rc ;;
    kerneltimes)
        # issue 4: how long each launch of one attention call takes (fwd; bwd = prep, key-major/row pass, dQ
        # post-pass), warm L2 and unlocked clocks, so the parts add up to what bench_attention times
        begin "kernel times: one attention call per mode at ${KT_SHAPES:-8,16,1024,64 2,16,4096,128}"
        for shape in ${KT_SHAPES:-8,16,1024,64 2,16,4096,128}; do
            for m in ${KT_MODES:-bf16 gproj}; do
                timeout 60 ncu --clock-control none --cache-control none --metrics gpu__time_duration.sum \
                    build/bench_attention --shape "$shape" --modes "$m" --warmup 1 --repeats 1 \
                    > "$OUT/kerneltimes_${m}_${shape//,/x}.txt" 2>&1
                say "   $m $shape: rc $?"
                awk '/^  [a-z_A-Z].*\(/ {name=$1} /gpu__time_duration.sum/ {print "     " name, $(NF)" "$(NF-1)}' \
                    "$OUT/kerneltimes_${m}_${shape//,/x}.txt" | head -n 20 | tee -a "$SUMMARY"
            done
        done
        end 0 ;;
    pdlab)
        # issue 4: what programmatic dependent launch buys (attention/cuda/launch_overlap.cuh), ATTN_PDL=1 vs 0
        # alternating, twice each, bench_attention alone (our modes; fwd, bwd and fwd+bwd medians)
        begin "PDL on/off: bench_attention at B8 H16 T1024 D64 and B2 H16 T4096 D128"
        for rep in 1 2; do
            for pdl in 1 0; do
                ATTN_PDL=$pdl timeout 120 build/bench_attention --shape 8,16,1024,64 --shape 2,16,4096,128 \
                    --modes "${PDL_MODES:-bf16,repair,fp32}" > "$OUT/pdlab_${rep}_pdl$pdl.txt" 2>&1
                say "   run $rep, ATTN_PDL=$pdl: rc $?"
                grep -E '^B[0-9]' "$OUT/pdlab_${rep}_pdl$pdl.txt" | tee -a "$SUMMARY"
            done
        done
        end 0 ;;
    trainbench)
        # issue 5: our training step (every mode, per-kernel breakdown) vs the PyTorch twin, side by side
        begin "training step vs the PyTorch twin (scripts/bench_train.sh)"
        STEPS=8 TWIN_STEPS=12 TWIN_TIMEOUT=150 timeout 400 bash scripts/bench_train.sh "$OUT/bench_train.md" \
            d12:32 450m:16 > "$OUT/trainbench.log" 2>&1
        rc=$?; grep -A4 '^| model' "$OUT/bench_train.md" | tee -a "$SUMMARY"; end $rc ;;
    diagcost)
        # issue 8: what the diagnostics cost at 450m (B16 T1024), measured by the trainer itself
        begin "diagnostics cost at 450m"
        timeout 90 build/train_gpt --model 450m --batch-size 16 --seq-len 1024 --steps 10 --val-data "" \
            --train-data "data/default/default_train_*.bin" --vocab "" --attn bf16 --diag-every 3 --overwrite 1 \
            --out-dir /tmp/diagcost > "$OUT/diagcost.log" 2>&1
        rc=$?; grep -h -E "^diagnostics:|mean over" "$OUT/diagcost.log" | tee -a "$SUMMARY"; end $rc ;;
    finalruns)
        # issue 5: the 450m preset on the Gutenberg shards for about 9 minutes (the device call limit is 10),
        # and, sharing the GPU under MPS, issue 8's longer matched runs (lr 2e-3 continued, lr 4e-3).
        begin "450m run (${RUN_SECONDS:=520} s, ${RUN_STEPS:=480} steps) + longer matched runs"
        prepare_data
        mps_start
        rm -rf runs/long_lr2e-3 runs/long_lr4e-3
        rm -rf "$RUN_DIR"
        start_450m_run
        flags=(--train-data "$DATA/gutenberg_train_*.bin" --val-data "$DATA/gutenberg_val_*.bin" --vocab .cache/gpt2
               --steps 60000 --schedule constant --val-every 2500 --val-batches 20 --log-every 5000
               --sample-every 0 --probe-every 500 --capture-attn "10,35000" --overwrite 1)
        timeout "$((RUN_SECONDS - 10))" bash scripts/matched_runs.sh --name long_lr2e-3 --per-gpu 3 \
            --modes "fp32 bf16 gproj" --diag-every 500 -- "${flags[@]}" --lr 2e-3 > "$OUT/long_lr2e-3.log" 2>&1 &
        timeout "$((RUN_SECONDS - 10))" bash scripts/matched_runs.sh --name long_lr4e-3 --per-gpu 3 \
            --modes "fp32 bf16 gproj" --diag-every 500 -- "${flags[@]}" --lr 4e-3 > "$OUT/long_lr4e-3.log" 2>&1 &
        wait
        stop_runs
        summarize_450m_run /tmp/final
        for g in long_lr2e-3 long_lr4e-3; do summarize_group "$g" /tmp/final; done
        tar czf "$OUT/final.tgz" -C /tmp final
        end 0 ;;
    run450m)
        # issue 5: the 450m preset alone on the Gutenberg shards. A device call lasts at most 10 minutes
        # (build and data included), so a run longer than about 8.5 minutes of training is split: this
        # phase with RUN_STOP_AT (it stops there and saves model + resume state), then `resume450m` in the
        # next call, continuing bit-exactly to RUN_STEPS.
        begin "450m run alone (${RUN_SECONDS:=570} s at most, ${RUN_STEPS:=1150} steps, stop at ${RUN_STOP_AT:-the end})"
        prepare_data
        mps=0
        rm -rf "$RUN_DIR"
        start_450m_run
        wait
        summarize_450m_run /tmp/final
        tar czf "$OUT/run450m.tgz" -C /tmp/final run450m
        end 0 ;;
    resume450m)
        # the second part of a run450m stopped at RUN_STOP_AT (same RUN_STEPS), on the same warm machine
        begin "450m run continued (--resume; ${RUN_SECONDS:=570} s at most, to step ${RUN_STEPS:=1150})"
        prepare_data
        mps=0
        [ -f "$RUN_DIR/log.jsonl" ] || say "   no run in $RUN_DIR to resume (the machine was not the same one)"
        RUN_STOP_AT="" start_450m_run --resume
        wait
        summarize_450m_run /tmp/final
        tar czf "$OUT/run450m.tgz" -C /tmp/final run450m
        end 0 ;;
    modecost)
        # issue 5: each attention mode's cost in a whole 450m training step (B16 T1024)
        begin "450m step time per attention mode"
        for m in bf16 repair gproj fp32; do
            timeout 90 build/train_gpt --model 450m --batch-size 16 --seq-len 1024 --steps 12 --val-data "" \
                --train-data "data/default/default_train_*.bin" --vocab "" --attn "$m" --overwrite 1 \
                --out-dir "/tmp/modecost_$m" > "$OUT/modecost_$m.log" 2>&1
            say "   $m: $(grep -h 'mean over' "$OUT/modecost_$m.log")"
        done
        end 0 ;;
    makerun)
        # the README's first command on a GPU machine (set-up is cached: the machine has no network)
        begin "make run"
        make -j"$(nproc)" NVCC_ARCH="$ARCH" all > "$OUT/make_all.log" 2>&1 || tail -20 "$OUT/make_all.log"
        timeout 120 make run NVCC_ARCH="$ARCH" > "$OUT/make_run.log" 2>&1
        rc=$?; { grep -m1 run_default "$OUT/make_run.log"; tail -n 25 "$OUT/make_run.log"; } | tee -a "$SUMMARY"
        end $rc ;;
    modern)
        # issue 19: the modern-stack options in the GPU trainer, 300 steps per option set on the data and the
        # shape of the graph phase's small runs (B16 T256, lr 3e-3 constant): small (GPT-2, the baseline),
        # llama-small, llama-small --qk-norm 1, small --bias 0, each in MODERN_MODES (default bf16). The loss
        # must fall (mean of steps 0-9 against 290-299), and the median ms/step (scripts/step_ms.py, from step
        # 10) is each option set's cost per step. Table: $OUT/modern.md.
        begin "modern stacks: 300 steps per option set, loss and ms/step (small shapes, B16 T256)"
        prepare_data
        make -j"$(nproc)" NVCC_ARCH="$ARCH" build/train_gpt > "$OUT/build_modern.log" 2>&1 || tail -20 "$OUT/build_modern.log" | tee -a "$SUMMARY"
        common=(--train-data "$DATA/gutenberg_train_*.bin" --vocab "${VOCAB_DIR:-.cache/gpt2}" --val-data ""
                --sample-every 0 --overwrite 1 --batch-size 16 --seq-len 256 --steps 300 --lr 3e-3
                --schedule constant --log-every 100)
        { echo "| option set | attn | flags | loss 0-9 | loss 290-299 | ms/step | rc |"
          echo "|---|---|---|---|---|---|---|"; } > "$OUT/modern.md"
        rc=0
        for arm in "small|--model small" "llama-small|--model llama-small" \
                   "llama-small-qknorm|--model llama-small --qk-norm 1" "small-bias0|--model small --bias 0"; do
            name=${arm%%|*} flags=${arm#*|}
            for m in ${MODERN_MODES:-bf16}; do
                dir="/tmp/modern_${name}_$m" log="$OUT/modern_${name}_$m.log"
                timeout 150 build/train_gpt $flags "${common[@]}" --attn "$m" --out-dir "$dir" > "$log" 2>&1
                r=$?
                # the mean train loss of the first and the last 10 steps, and whether it fell by 0.5 nats or more
                read -r first last falls < <(python3 -c '
import sys; sys.path.insert(0, "scripts")
from compare_runs import fnum, read_log, step_records
rows = {r["step"]: fnum(r.get("loss")) for r in step_records(read_log(sys.argv[1])[1])}
a = [rows[s] for s in range(0, 10) if rows.get(s) is not None]
b = [rows[s] for s in range(290, 300) if rows.get(s) is not None]
if len(a) == 10 and len(b) == 10:
    fa, fb = sum(a) / 10, sum(b) / 10
    print("%.4f %.4f %d" % (fa, fb, fb < fa - 0.5))
else:
    print("n/a n/a 0")' "$dir" 2>/dev/null)
                ms=$(python3 scripts/step_ms.py "$dir" 2>/dev/null)
                [ "$r" = 0 ] && [ "${falls:-0}" = 1 ] || rc=1
                echo "| $name | $m | \`$flags\` | ${first:-n/a} | ${last:-n/a} | ${ms:-n/a} | $r |" >> "$OUT/modern.md"
                say "   $name $m: rc $r, loss ${first:-n/a} -> ${last:-n/a} ($([ "${falls:-0}" = 1 ] && echo falls || echo 'DOES NOT FALL')), ${ms:-n/a} ms/step"
                [ "$r" != 0 ] && tail -n 8 "$log" | tee -a "$SUMMARY"
            done
        done
        end $rc ;;
    graph)
        # --cuda-graph 1 against 0: the same bits (cmp of the last checkpoint) and the median ms/step of each
        # (log.jsonl step records from step 10 on). --deterministic 1 everywhere: without it the bf16 backward
        # adds its dQ partials in arrival order and two eager runs already differ in the last bits.
        begin "CUDA graph on/off: bits and ms/step (small B16 T256, d12 B32 T1024)"
        prepare_data
        make -j"$(nproc)" NVCC_ARCH="$ARCH" build/train_gpt > "$OUT/build_graph.log" 2>&1 || tail -20 "$OUT/build_graph.log" | tee -a "$SUMMARY"
        common=(--train-data "$DATA/gutenberg_train_*.bin" --vocab "${VOCAB_DIR:-.cache/gpt2}" --val-data ""
                --sample-every 0 --deterministic 1 --overwrite 1)
        small=(--model small --batch-size 16 --seq-len 256 --steps 300 --lr 3e-3 --schedule constant --log-every 100)
        d12=(--model d12 --batch-size 32 --seq-len 1024 --steps 30 --lr 6e-4 --warmup-steps 5 --log-every 10)
        median_ms() { local v; v=$(python3 scripts/step_ms.py "$1" 2>/dev/null); echo "${v:-n/a}"; }
        { echo "| model | attn | eager ms/step | graph ms/step | speedup | final checkpoint |"
          echo "|---|---|---|---|---|---|"; } > "$OUT/graph.md"
        # small_diag: diagnostics and the probe every 50 steps, so the probe steps run eagerly between replays
        for cfg in small small_diag d12; do
            case $cfg in
                small) args=("${small[@]}"); last=00000300; limit=150; modes="gproj bf16" ;;
                small_diag) args=("${small[@]}" --diag-every 50); last=00000300; limit=150; modes="gproj" ;;
                d12) args=("${d12[@]}"); last=00000030; limit=240; modes="gproj bf16" ;;
            esac
            for m in $modes; do
                for g in 0 1; do
                    log="$OUT/graph_${cfg}_${m}_g$g.log"
                    timeout "$limit" build/train_gpt "${args[@]}" "${common[@]}" --attn "$m" --cuda-graph $g \
                        --out-dir "/tmp/graph_${cfg}_${m}_g$g" > "$log" 2>&1
                    rc=$?
                    say "   $cfg $m --cuda-graph $g: rc $rc | $(grep -h -E '^cuda graph: (on|off|captured)' "$log" | tr '\n' ' ')"
                    say "      $(grep -h 'mean over' "$log")"
                    [ $rc -ne 0 ] && tail -n 8 "$log" | tee -a "$SUMMARY"
                done
                a="/tmp/graph_${cfg}_${m}_g0/model_$last.bin" b="/tmp/graph_${cfg}_${m}_g1/model_$last.bin"
                if [ -f "$a" ] && [ -f "$b" ]; then
                    if cmp -s "$a" "$b"; then same="identical (model_$last.bin)"; else same="DIFFER: $(cmp "$a" "$b" | head -1)"; fi
                else same="missing model_$last.bin"; fi
                e=$(median_ms "/tmp/graph_${cfg}_${m}_g0/log.jsonl") c=$(median_ms "/tmp/graph_${cfg}_${m}_g1/log.jsonl")
                sp=$(python3 -c "import sys; print('%.2fx' % (float(sys.argv[1]) / float(sys.argv[2])))" "$e" "$c" 2>/dev/null || echo n/a)
                echo "| $cfg | $m | $e | $c | $sp | $same |" >> "$OUT/graph.md"
            done
        done
        cat "$OUT/graph.md" | tee -a "$SUMMARY"
        end 0 ;;
    *) say "unknown phase '$phase'"; exit 2 ;;
    esac
done
say "== done $(date -u +%H:%M:%S)"
