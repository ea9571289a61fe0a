#!/usr/bin/env bash
# scripts/bench_train.sh - training-step speed of our GPU trainer vs the PyTorch twin, side by side in one run.
#
# Why: the project's speed claims are ratios measured on the same GPU in the same session. For each
# configuration this runs our step (build/dev/profile_gpu_step: the trainer's forward, backward, norm and
# AdamW on random tokens, every attention mode, with a per-kernel-kind breakdown) and the PyTorch twin
# (dev/gpt_twin.py: bf16 autocast, SDPA attention, fused AdamW, torch.compile; random tokens too), then
# prints one table of tokens/s and ratios.
#
# Usage: scripts/bench_train.sh [OUT_FILE] [CONFIGS...]
#   OUT_FILE  markdown table + raw logs appended (default dev/results/bench_train_latest.md)
#   CONFIGS   "model:batch" items, default "d12:32 450m:16" (T = 1024)
# Env: PROFILE_BIN (default build/dev/profile_gpu_step), STEPS (ours, default 10), TWIN_STEPS (default 15),
#      TWIN_TIMEOUT seconds per twin run (default 240; torch.compile takes a while).
set -u
cd "$(dirname "$0")/.."
case "${1:-}" in
    -h|--help) sed -n '10,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bench_train: error: unknown option '$1' (usage: scripts/bench_train.sh [OUT_FILE] [CONFIGS...])" >&2
        exit 2 ;;
esac
OUT_FILE=${1:-dev/results/bench_train_latest.md}
shift || true
CONFIGS=("$@")
[ ${#CONFIGS[@]} -eq 0 ] && CONFIGS=("d12:32" "450m:16")
PROFILE_BIN=${PROFILE_BIN:-build/dev/profile_gpu_step}
STEPS=${STEPS:-10}
TWIN_STEPS=${TWIN_STEPS:-15}
TWIN_TIMEOUT=${TWIN_TIMEOUT:-240}
PY=${PYTHON:-python3}
[ -x "$PROFILE_BIN" ] || make --no-print-directory "$PROFILE_BIN" >/dev/null || { echo "cannot build $PROFILE_BIN"; exit 1; }
mkdir -p "$(dirname "$OUT_FILE")"
tmp=$(mktemp -d)
{
    echo "## bench_train $(date -u +%Y-%m-%dT%H:%MZ) on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)"
    echo
    echo "| model | B | T | ours bf16 tok/s | ours gproj tok/s | ours fp32 tok/s | PyTorch twin tok/s | bf16 / twin | gproj / twin | gproj cost vs bf16 |"
    echo "|---|---|---|---|---|---|---|---|---|---|"
} > "$tmp/table"
for cfg in "${CONFIGS[@]}"; do
    model=${cfg%%:*}; B=${cfg##*:}
    echo "---- ours: $model B$B T1024"
    "$PROFILE_BIN" --model "$model" --batch "$B" --seq 1024 --attn all --steps "$STEPS" 2>&1 | tee "$tmp/ours_$model.log"
    echo "---- PyTorch twin: $model B$B T1024"
    timeout "$TWIN_TIMEOUT" "$PY" dev/gpt_twin.py --model "$model" --batch "$B" --seq 1024 --steps "$TWIN_STEPS" \
        --warmup 5 --compile --autocast bf16 --attn sdpa --fused-adamw 2>&1 | tail -n 5 | tee "$tmp/twin_$model.log"
    tok() { grep -E "^ours: .* attn=$1 " "$tmp/ours_$model.log" | sed -E 's/.* ([0-9]+) tokens\/s.*/\1/'; }
    bf=$(tok bf16); gp=$(tok gproj); f32=$(tok fp32)
    tw=$(grep -E "^twin: .* tokens/s" "$tmp/twin_$model.log" | sed -E 's/.* ([0-9]+) tokens\/s.*/\1/')
    ratio() { [ -n "$1" ] && [ -n "$2" ] && awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", a/b}' || echo "n/a"; }
    cost=$( [ -n "$bf" ] && [ -n "$gp" ] && awk -v a="$bf" -v b="$gp" 'BEGIN{printf "%+.1f%%", 100*(a/b-1)}' || echo "n/a")
    echo "| $model | $B | 1024 | ${bf:-n/a} | ${gp:-n/a} | ${f32:-n/a} | ${tw:-n/a} | $(ratio "$bf" "$tw") | $(ratio "$gp" "$tw") | $cost |" >> "$tmp/table"
done
{
    cat "$tmp/table"
    echo
    echo "Commands: \`$PROFILE_BIN --model M --batch B --seq 1024 --attn all --steps $STEPS\` and"
    echo "\`python3 dev/gpt_twin.py --model M --batch B --seq 1024 --steps $TWIN_STEPS --warmup 5 --compile --autocast bf16 --attn sdpa --fused-adamw\`."
    echo
    for f in "$tmp"/ours_*.log "$tmp"/twin_*.log; do echo "### $(basename "$f")"; echo '```'; cat "$f"; echo '```'; done
} >> "$OUT_FILE"
cat "$tmp/table"
rm -rf "$tmp"
