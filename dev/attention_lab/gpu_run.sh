#!/usr/bin/env bash
# dev/attention_lab/gpu_run.sh - one GPU session for the attention kernels:
# the GPU test, a memcheck of the kernels on a small shape, the kernel lab
# (naive vs fast, timed) and the cuDNN comparison (scripts/bench_attention.sh).
#
# Why a script: GPU time is scarce, so everything that needs the GPU runs in
# one go, and the numbers in docs/attention_kernels.md and dev/results/ name
# this exact command. Logs go to OUTDIR; a short summary goes to stdout.
# Usage: dev/attention_lab/gpu_run.sh OUTDIR [--no-bench]
set -uo pipefail
out=${1:?usage: dev/attention_lab/gpu_run.sh OUTDIR [--no-bench]}
bench=1
[ "${2:-}" = "--no-bench" ] && bench=0
mkdir -p "$out"
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$out/gpu.txt"
git log -1 --format='commit %h %s' 2>/dev/null | tee -a "$out/gpu.txt"

targets="build/tests/test_attention_gpu build/dev/attention_lab/attention_lab build/bench_attention"
# binaries built on another machine may miss a library here: rebuild then
for b in $targets; do
    if [ ! -x "$b" ] || ldd "$b" 2>/dev/null | grep -q "not found"; then
        echo "== rebuilding $targets here"; make -j"$(nproc)" $targets > "$out/build.log" 2>&1 || { tail -20 "$out/build.log"; exit 1; }
        break
    fi
done

echo "== build/tests/test_attention_gpu"
start=$(date +%s)
./build/tests/test_attention_gpu > "$out/test_attention_gpu.log" 2>&1
rc=$?
grep -E "seed|FAIL|passed, " "$out/test_attention_gpu.log" | head -60
echo "test rc=$rc ($(( $(date +%s) - start )) s)"

echo "== memcheck on B1 NH3 T130 HS64 and B1 NH2 T77 HS128 (lab)"
if command -v compute-sanitizer >/dev/null; then
    { compute-sanitizer --tool memcheck ./build/dev/attention_lab/attention_lab 1 3 130 64;
      compute-sanitizer --tool memcheck ./build/dev/attention_lab/attention_lab 1 2 77 128; } > "$out/memcheck.log" 2>&1
    grep -E "ERROR SUMMARY|passed, |Invalid|error" "$out/memcheck.log" | head -20
else
    echo "compute-sanitizer not found" | tee "$out/memcheck.log"
fi

echo "== build/dev/attention_lab/attention_lab (default shapes, then T 8192 and 8191)"
{ ./build/dev/attention_lab/attention_lab; ./build/dev/attention_lab/attention_lab 1 2 8192 128;
  ./build/dev/attention_lab/attention_lab 1 3 8191 64; } 2>&1 | tee "$out/lab.log"

if [ $bench = 1 ]; then
    echo "== scripts/bench_attention.sh"
    scripts/bench_attention.sh /tmp/bench_attention > /tmp/bench_attention.log 2>&1
    tail -25 /tmp/bench_attention.log
    tar -C /tmp -czf "$out/bench_attention.tgz" bench_attention bench_attention.log
fi
