#!/usr/bin/env bash
# dev/dump_attention_code.sh OUTDIR [FILE.cu ...] - the generated code of the attention CUDA translation units,
# so that a restructuring can be shown to leave every kernel's code alone: `dev/compare_ptx.py --dirs OLD NEW`
# compares each kernel's PTX and its machine code (the cubin's .text section, relocations, registers, shared
# memory) by kernel name, wherever the kernel sits.
#
# Run it from the root of the checkout to dump (for the base of a change: a `git archive REV | tar -x` copy).
# Without FILEs it dumps every .cu under attention/cuda and dev/attention_lab; with FILEs only those (the
# units a step touched; copy the others' dumps from the base). Each unit gives OUTDIR/PATH_NAME.ptx and
# OUTDIR/PATH_NAME.cubin for sm_90a; attention/cuda/attention_cuda.cu (the portable kernels, which also run on
# sm_80) gives PATH_NAME.sm80.{ptx,cubin} too. Flags are the Makefile's defaults (-O3 --use_fast_math)
# without -lineinfo (line tables are not code). One nvcc at a time (the build machine is shared); a unit
# that does not compile stops the script with nvcc's message.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: dev/dump_attention_code.sh OUTDIR [FILE.cu ...]  (from the checkout's root)" >&2; exit 2; }
out=$(realpath -m "$1"); shift
nvcc=${NVCC:-nvcc}
mkdir -p "$out"
flags=(-O3 --use_fast_math -std=c++17 -I. -Xcompiler -fopenmp --expt-relaxed-constexpr)
one() {  # one SRC ARCH SUFFIX
    local src=$1 arch=$2 suf=$3 name tmp
    name=$(echo "${src%.cu}" | tr / _)$suf
    tmp=$(mktemp -d)
    "$nvcc" "${flags[@]}" -gencode "arch=compute_$arch,code=sm_$arch" -cubin -keep -keep-dir "$tmp" \
        "$src" -o "$out/$name.cubin"
    cp "$tmp"/*.ptx "$out/$name.ptx"
    rm -rf "$tmp"
    echo "[dump] $src (sm_$arch)"
}
if [ $# -eq 0 ]; then set -- $(find attention/cuda dev/attention_lab -name '*.cu' | sort); fi
for s in "$@"; do
    [ -f "$s" ] || { echo "dump_attention_code.sh: no file $s (run it from the checkout's root)" >&2; exit 2; }
    one "$s" 90a ""
    [ "$s" = attention/cuda/attention_cuda.cu ] && one "$s" 80 .sm80
done
exit 0
