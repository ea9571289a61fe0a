#!/usr/bin/env bash
# tests/test_build.sh - the top Makefile's own rules: user flags and what
# `make run` builds.
#
# Why: `make CFLAGS=-O1` (or any user CFLAGS/NVCCFLAGS/LDLIBS) must change
# optimisation and instrumentation only, never drop the include path,
# language level or the attention emulation's pinned flags; `make run` on a
# machine without a GPU must not spend its time compiling CUDA programs it
# cannot run; and an ASan build is where the tokenize tool's error path is
# checked for leaks.
# Checked here, all in a temporary build folder (BUILD=...), so the main
# build/ is never touched:
#   - `make CFLAGS="-O1 -g -fsanitize=address"` builds build/tokenize for real
#     (4 small sources), with -O1 and without the default -O3;
#   - that ASan build, given a vocabulary folder that does not exist, exits 1
#     with the message and LeakSanitizer reports no leak;
#   - `make -n` with user CFLAGS keeps attention_cpu.o's pinned flags, with
#     user NVCCFLAGS keeps nvcc's -I. and -std=c++17, with user LDLIBS keeps -lm;
#   - `make -n run` without a GPU builds the CPU trainer and tokenize and runs
#     no nvcc at all; with a GPU (and nvcc, cuBLAS) the GPU trainer instead.
# Run from the repository root; prints "N passed, N failed".
set -u
pass=0
fail=0
check() {  # check NAME COMMAND...: passes when COMMAND succeeds
    local name=$1; shift
    if "$@"; then pass=$((pass + 1)); echo "  ok   $name"; else fail=$((fail + 1)); echo "  FAIL $name"; fi
}
TMP=$(mktemp -d /tmp/test_build.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
B=$TMP/build

echo "== user CFLAGS keep the build's own flags"
make --no-print-directory BUILD="$B" CFLAGS="-O1 -g -fsanitize=address" "$B/tokenize" >"$TMP/make.log" 2>&1
rc=$?
check "make CFLAGS='-O1 -g -fsanitize=address' builds tokenize (exit $rc)" [ $rc -eq 0 ]
[ $rc -eq 0 ] || tail -n 5 "$TMP/make.log"
check "its compile commands have the user's -O1 and the build's -I. and -std=gnu11" \
    grep -q -- "-O1 -g -fsanitize=address -std=gnu11 .*-I\. .*-c dataloader/tokenizer.c" "$TMP/make.log"
check "and not the default -O3" bash -c "! grep -q -- '-O3' '$TMP/make.log'"
check "the main build folder is not touched" bash -c "! grep -q ' build/' '$TMP/make.log'"

echo "== tokenize's error path frees what it allocated (LeakSanitizer)"
if [ -x "$B/tokenize" ]; then
    ASAN_OPTIONS=detect_leaks=1 "$B/tokenize" --vocab "$TMP/no-such-folder" --ids </dev/null >"$TMP/run.log" 2>&1
    rc=$?
    check "a missing vocabulary folder: exit 1 (got $rc)" [ $rc -eq 1 ]
    check "the message names encoder.json" grep -q "no-such-folder/encoder.json" "$TMP/run.log"
    check "no leak reported" bash -c "! grep -q 'LeakSanitizer' '$TMP/run.log'"
    grep -A3 "LeakSanitizer" "$TMP/run.log" | head -n 8
else
    check "ASan build of tokenize exists" false
fi

echo "== pinned and required flags survive user values (make -n)"
make -n --no-print-directory BUILD="$B" CFLAGS=-O1 "$B/attention/cpu/attention_cpu.o" >"$TMP/n1.log" 2>&1
check "attention_cpu.o keeps -ffp-contract=off -fmath-errno -march=x86-64-v2 under CFLAGS=-O1" \
    grep -q -- "-O1 .*-I\. .*-ffp-contract=off -fmath-errno -march=x86-64-v2" "$TMP/n1.log"
make -n --no-print-directory BUILD="$B" NVCCFLAGS=-O1 "$B/train/comm_single.cu.o" >"$TMP/n2.log" 2>&1
check "nvcc objects keep -std=c++17 and -I. under NVCCFLAGS=-O1" grep -q -- "-O1 -std=c++17 .*-I\. " "$TMP/n2.log"
make -n -B --no-print-directory BUILD="$B" LDLIBS=-lpthread "$B/tokenize" >"$TMP/n3.log" 2>&1
check "links keep -lm -fopenmp under LDLIBS=-lpthread" grep -q -- "-o $B/tokenize -lpthread -lm -fopenmp" "$TMP/n3.log"

echo "== make run builds only what it runs (make -n into an empty build folder)"
E=$TMP/empty
make -n --no-print-directory BUILD="$E" HAVE_GPU= run >"$TMP/run_cpu.log" 2>&1
check "no GPU: make -n run exits 0" [ $? -eq 0 ]
check "no GPU: no nvcc command" bash -c "! grep -v '^\[build\]' '$TMP/run_cpu.log' | grep -q nvcc"
check "no GPU: it links the CPU trainer and tokenize" \
    bash -c "grep -q -- '-o $E/train_gpt_cpu ' '$TMP/run_cpu.log' && grep -q -- '-o $E/tokenize ' '$TMP/run_cpu.log'"
check "no GPU: no test program, benchmark or lab is built" bash -c "! grep -q -- '-o $E/\(tests\|dev\|bench\)' '$TMP/run_cpu.log'"
check "no GPU: then runs scripts/run_default.sh" grep -q "bash scripts/run_default.sh" "$TMP/run_cpu.log"
make -n --no-print-directory BUILD="$E" HAVE_GPU=1 HAVE_CUBLAS=1 NVCC=nvcc run >"$TMP/run_gpu.log" 2>&1
check "GPU, nvcc and cuBLAS: it links the GPU trainer, not the CPU one" \
    bash -c "grep -q -- '-o $E/train_gpt ' '$TMP/run_gpu.log' && ! grep -q -- '-o $E/train_gpt_cpu ' '$TMP/run_gpu.log'"

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
