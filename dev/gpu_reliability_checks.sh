#!/usr/bin/env bash
# dev/gpu_reliability_checks.sh - the GPU trainer's reliability evidence, in one go on a GPU machine:
#   1. SIGTERM mid-run, then --resume: the final model equals an uninterrupted run's byte for byte
#   2. --overwrite 1 removes the old run's checkpoints (only the new run's remain)
#   3. --deterministic 1: the same command twice gives byte-identical models in every attention mode
#      (and, for contrast, whether it does without the flag); under bf16, --stop-at then --resume too
#   4. the cost of --deterministic 1 per mode: ms/step of a d12 step (B32 T1024), flag off vs on
# Usage: dev/gpu_reliability_checks.sh DATA_DIR VOCAB_DIR [OUT_DIR]
#   DATA_DIR holds llm.c shards *train_*.bin; VOCAB_DIR encoder.json + vocab.bpe; build/train_gpt built.
# Ends with "N passed, N failed"; the cost table goes to OUT_DIR/deterministic_cost.md.
set -u
DATA=${1:?usage: dev/gpu_reliability_checks.sh DATA_DIR VOCAB_DIR [OUT_DIR]}
VOCAB=${2:?usage: dev/gpu_reliability_checks.sh DATA_DIR VOCAB_DIR [OUT_DIR]}
OUTD=${3:-/tmp/gpu_reliability}
mkdir -p "$OUTD"
TRAIN=build/train_gpt
W=/tmp/gpu_reliability_runs
rm -rf "$W"; mkdir -p "$W"
pass=0; fail=0
judge() { if [ "$1" -eq 0 ]; then pass=$((pass+1)); echo "ok: $2"; else fail=$((fail+1)); echo "FAILED: $2"; fi; }
SMALL=(--model small --batch-size 16 --seq-len 256 --train-data "$DATA/*train_*.bin" --val-data "" --vocab "$VOCAB"
       --sample-every 0 --lr 3e-3 --schedule constant --log-every 50)

# 1. SIGTERM, then resume
timeout 120 "$TRAIN" "${SMALL[@]}" --steps 600 --out-dir "$W/straight" > "$OUTD/sigterm_straight.log" 2>&1
judge $? "uninterrupted run, 600 steps"
"$TRAIN" "${SMALL[@]}" --steps 600 --out-dir "$W/killed" > "$OUTD/sigterm_killed.log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do grep -q '"step": 200,' "$W/killed/log.jsonl" 2>/dev/null && break; sleep 0.1; done
kill -TERM $pid; wait $pid; rc=$?
echo "SIGTERM exit code: $rc"; tail -n 4 "$OUTD/sigterm_killed.log"
test $rc -eq 143 && ls "$W"/killed/state_*.bin > /dev/null 2>&1
judge $? "SIGTERM: exit 143 (128 + 15) and a resume state saved ($(ls "$W"/killed/state_*.bin 2>/dev/null | xargs -n1 basename | tr '\n' ' '))"
timeout 120 "$TRAIN" "${SMALL[@]}" --steps 600 --out-dir "$W/killed" --resume > "$OUTD/sigterm_resumed.log" 2>&1
judge $? "resume after SIGTERM to step 600"
cmp "$W/straight/model_00000600.bin" "$W/killed/model_00000600.bin"
judge $? "SIGTERM + resume: final model byte-identical to the uninterrupted run (gproj)"

# 2. --overwrite 1
timeout 60 "$TRAIN" "${SMALL[@]}" --steps 30 --checkpoint-every 10 --out-dir "$W/ow" > "$OUTD/overwrite_first.log" 2>&1
timeout 60 "$TRAIN" "${SMALL[@]}" --steps 10 --checkpoint-every 10 --overwrite 1 --out-dir "$W/ow" > "$OUTD/overwrite_second.log" 2>&1
left=$(cd "$W/ow" && ls model_*.bin state_*.bin 2>/dev/null | tr '\n' ' ')
echo "after --overwrite 1: $left"
test "$left" = "model_00000010.bin state_00000010.bin "
judge $? "--overwrite 1 leaves only the new run's checkpoints"

# 3. determinism per mode, 4. its cost
D12=(--model d12 --batch-size 32 --seq-len 1024 --train-data "$DATA/*train_*.bin" --val-data "" --vocab "$VOCAB"
     --sample-every 0 --steps 30 --lr 6e-4 --warmup-steps 5 --log-every 10)
echo "| mode | ms/step, --deterministic 0 | ms/step, --deterministic 1 | cost | repeats bit for bit (0 / 1) |" > "$OUTD/deterministic_cost.md"
echo "|---|---:|---:|---:|---|" >> "$OUTD/deterministic_cost.md"
msmed() { python3 -c '
import json, sys
ms = sorted(r["ms"] for r in map(json.loads, open(sys.argv[1])) if "ms" in r and r.get("step", 0) >= 10)
print("%.2f" % ms[len(ms) // 2])' "$1"; }
for m in bf16 repair fp32 gproj; do
    for d in 0 1; do
        for rep in a b; do
            timeout 120 "$TRAIN" "${D12[@]}" --attn $m --deterministic $d --out-dir "$W/det_${m}_${d}_$rep" \
                > "$OUTD/det_${m}_${d}_$rep.log" 2>&1 || echo "run $m det $d $rep failed: $(tail -n 2 "$OUTD/det_${m}_${d}_$rep.log")"
        done
        if cmp -s "$W/det_${m}_${d}_a/model_00000030.bin" "$W/det_${m}_${d}_b/model_00000030.bin"; then same[$d]=yes; else same[$d]=no; fi
    done
    test "${same[1]}" = yes; judge $? "$m: --deterministic 1 twice gives byte-identical models (without the flag: ${same[0]})"
    if [ $m = bf16 ]; then
        timeout 120 "$TRAIN" "${D12[@]}" --attn $m --deterministic 1 --stop-at 15 --out-dir "$W/det_resume" \
            > "$OUTD/det_resume_first.log" 2>&1
        timeout 120 "$TRAIN" "${D12[@]}" --attn $m --deterministic 1 --resume --out-dir "$W/det_resume" \
            > "$OUTD/det_resume_second.log" 2>&1
        cmp -s "$W/det_${m}_1_a/model_00000030.bin" "$W/det_resume/model_00000030.bin"
        judge $? "bf16 --deterministic 1: 15 steps + --resume 15 gives the 30-step run's model byte for byte"
    fi
    t0=$(msmed "$W/det_${m}_0_a/log.jsonl"); t1=$(msmed "$W/det_${m}_1_a/log.jsonl")
    echo "| $m | $t0 | $t1 | $(python3 -c "print('%+.1f%%' % (100 * ($t1 / $t0 - 1)))") | ${same[0]} / ${same[1]} |" >> "$OUTD/deterministic_cost.md"
done
cat "$OUTD/deterministic_cost.md"
echo "$pass passed, $fail failed"
