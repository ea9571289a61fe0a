#!/usr/bin/env bash
# dev/hf_parity.sh OUTDIR - the Hugging Face export and import checked against transformers itself.
#
# Why: CI has no transformers (tests/test_hf_export.py checks the format and the
# semantics against a stand-in); this runs on a machine that has transformers,
# safetensors and torch, offline, and does everything itself in a few minutes:
# builds build/train_gpt_cpu, build/model_logits and build/tokenize, finds token
# data, trains a small model for a few steps with fp32 attention and a greedy
# sample at the end, then runs dev/hf_parity.py (which says what it checks and
# with which tolerance). Writes OUTDIR/hf_parity.md (the table) and
# OUTDIR/hf_parity.log (everything printed); exits non-zero on any mismatch.
#
# Inputs (no network):
#   VOCAB_DIR   GPT-2's encoder.json and vocab.bpe (default .carry/gpt2, else .cache/gpt2)
#   data        /tmp/data/gutenberg_{train,val}_*.bin if present, else the smallest
#               .carry/data/gutenberg_*.bin.xz decompressed to a temporary folder,
#               else data/default/*.bin (scripts/setup_data.sh's shards)
#   PYTHON      a python3 that imports transformers and torch (default: the first of
#               python3, /usr/bin/python3 that does)
set -euo pipefail
export PYTHONUNBUFFERED=1
[ $# -eq 1 ] || { echo "usage: $0 OUTDIR" >&2; exit 2; }
OUT=$1
cd "$(dirname "$0")/.."
mkdir -p "$OUT"
exec > >(tee "$OUT/hf_parity.log") 2>&1
t0=$SECONDS
stamp() { echo "[$((SECONDS - t0)) s] $*"; }

if [ -z "${PYTHON:-}" ]; then
    for p in python3 /usr/bin/python3; do
        if "$p" -c 'import transformers, torch, numpy' >/dev/null 2>&1; then PYTHON=$(command -v "$p"); break; fi
    done
fi
[ -n "${PYTHON:-}" ] || { echo "error: no python3 here imports transformers, torch and numpy (set PYTHON=...)"; exit 1; }
stamp "python: $PYTHON"

VOCAB_DIR=${VOCAB_DIR:-.carry/gpt2}
[ -f "$VOCAB_DIR/encoder.json" ] || VOCAB_DIR=.cache/gpt2
for f in encoder.json vocab.bpe; do
    [ -f "$VOCAB_DIR/$f" ] || { echo "error: no $VOCAB_DIR/$f (set VOCAB_DIR to a folder with GPT-2's encoder.json and vocab.bpe)"; exit 1; }
done
stamp "vocab: $VOCAB_DIR"

stamp "building"
make -j"$(nproc)" build/train_gpt_cpu build/model_logits build/tokenize >"$OUT/build.log" 2>&1 ||
    { tail -n 30 "$OUT/build.log"; echo "error: the build failed (full log: $OUT/build.log)"; exit 1; }

WORK=$(mktemp -d /tmp/hf_parity.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
shard=""
shopt -s nullglob
for f in /tmp/data/gutenberg_train_*.bin; do shard=$f; break; done
if [ -z "$shard" ]; then
    xzs=(.carry/data/gutenberg_*.bin.xz)
    if [ ${#xzs[@]} -gt 0 ]; then
        smallest=$(ls -S "${xzs[@]}" | tail -n 1)
        shard=$WORK/$(basename "${smallest%.xz}")
        xz -dc "$smallest" >"$shard"
    fi
fi
if [ -z "$shard" ]; then
    for f in data/default/default_train_*.bin; do shard=$f; break; done
fi
[ -n "$shard" ] || { echo "error: no token shards: none in /tmp/data/gutenberg_train_*.bin, .carry/data/*.bin.xz or data/default/"; exit 1; }
stamp "data: $shard"

# Our checkpoint: preset small (L4 C256 NH4, context 256), fp32 attention, a greedy sample of the final weights.
RUN=$WORK/run
stamp "training our model (build/train_gpt_cpu)"
build/train_gpt_cpu --model small --attn fp32 --train-data "$shard" --val-data "" --vocab "" \
    --batch-size 4 --seq-len 256 --steps 8 --lr 3e-3 --warmup-steps 0 --log-every 4 \
    --sample-every 8 --sample-tokens 64 --sample-temperature 0 --out-dir "$RUN" >"$OUT/train.log" 2>&1 ||
    { tail -n 20 "$OUT/train.log"; echo "error: training failed (log: $OUT/train.log)"; exit 1; }
grep -E '^step' "$OUT/train.log" | tail -n 2

stamp "comparing with transformers"
rc=0
"$PYTHON" dev/hf_parity.py "$OUT" "$RUN" "$shard" "$VOCAB_DIR" || rc=$?
rm -rf "$OUT/work"
stamp "done (exit $rc); table: $OUT/hf_parity.md"
exit $rc
