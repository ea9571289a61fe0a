#!/usr/bin/env bash
# dev/cudnn_check.sh OUTDIR - the one GPU-machine run that checks cudnn mode (attention/cudnn/): builds
# build/dev/cudnn_check, runs it (every graph variant's build log, the engines, errors vs fp64, the hard
# cases next to our bf16 mode; see dev/cudnn_check.cu), then, where PyTorch with CUDA is importable,
# dev/cudnn_check_torch.py on the inputs it wrote (ours vs torch's cuDNN SDPA backend, bit for bit).
# Everything goes to OUTDIR: build.log, cudnn_check.log, cudnn_api.log (cuDNN's own warnings and errors),
# torch.log, summary.txt. Exit status: nonzero if the build, any check or the torch step failed.
set -uo pipefail
OUT=${1:?usage: dev/cudnn_check.sh OUTDIR}
mkdir -p "$OUT" || { echo "error: cannot create $OUT" >&2; exit 2; }
cd "$(dirname "$0")/.."
status=0
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    nvidia-smi -L 2>&1 || true
    nvcc --version 2>&1 | tail -1
} | tee "$OUT/summary.txt"

echo "== build" | tee -a "$OUT/summary.txt"
if ! make -j"$(nproc)" build/dev/cudnn_check > "$OUT/build.log" 2>&1; then
    tail -30 "$OUT/build.log"
    echo "build: FAILED (see $OUT/build.log)" | tee -a "$OUT/summary.txt"
    exit 1
fi
grep '^\[build\] cuDNN' "$OUT/build.log" | tee -a "$OUT/summary.txt"

echo "== build/dev/cudnn_check --out $OUT" | tee -a "$OUT/summary.txt"
CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGERR_DBG=1 CUDNN_LOGWARN_DBG=1 CUDNN_LOGDEST_DBG="$OUT/cudnn_api.log" \
    build/dev/cudnn_check --out "$OUT" > "$OUT/cudnn_check.log" 2>&1
rc=$?
grep -E '^(PASS|FAIL) |^  HS(64|128) |^cudnn_check:|describe:' "$OUT/cudnn_check.log" | grep -v '^PASS' | tee -a "$OUT/summary.txt"
grep -c '^PASS ' "$OUT/cudnn_check.log" | sed 's/^/PASS lines: /' | tee -a "$OUT/summary.txt"
[ $rc -ne 0 ] && { echo "cudnn_check: exit $rc" | tee -a "$OUT/summary.txt"; status=1; }

echo "== torch's cuDNN backend on the same inputs" | tee -a "$OUT/summary.txt"
PY=""
for p in python3 /usr/bin/python3; do
    if "$p" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' > /dev/null 2>&1; then PY=$p; break; fi
done
if [ -z "$PY" ]; then
    echo "torch: no python with a CUDA torch here; step skipped" | tee -a "$OUT/summary.txt"
elif ls "$OUT"/torch_inputs_*.bin > /dev/null 2>&1; then
    "$PY" dev/cudnn_check_torch.py "$OUT" > "$OUT/torch.log" 2>&1 || status=1
    cat "$OUT/torch.log" | tee -a "$OUT/summary.txt"
else
    echo "torch: cudnn_check wrote no inputs (its production path failed); step skipped" | tee -a "$OUT/summary.txt"
    status=1
fi
echo "cudnn_check.sh: $([ $status -eq 0 ] && echo ok || echo FAILED) (logs in $OUT)" | tee -a "$OUT/summary.txt"
exit $status
