#!/usr/bin/env bash
# scripts/bench_attention.sh - our attention kernels and PyTorch's fused SDPA
# (cuDNN and flash backends), timed side by side in one call on one GPU, and
# one results table with the ratios the project's targets are stated in.
#
# Why one script: the targets (docs/DESIGN.md) are ratios - our bf16 mode vs
# cuDNN SDPA, gproj over bf16, fp32 over bf16 - and ratios are only honest
# when both sides run on the same machine, in the same session, measured the
# same way (build/bench_attention and dev/bench_attention_torch.py share the
# recipe: rotated inputs beyond L2, CUDA events, median, FlashAttention's
# FLOP count).
#
# Usage: scripts/bench_attention.sh OUTDIR [options]
#   OUTDIR       where everything goes (created): build.log, ours.txt,
#                torch.txt, bench_attention.jsonl, bench_attention.md
#   options      passed to both programs: --shape B,H,T,D (repeatable),
#                --repeats N, --warmup N, --seed N; to ours only: --modes LIST;
#                to PyTorch only: --backends LIST, --layout contiguous|fused
# Also copies the table to dev/results/bench_attention.md in the checkout.
# Environment: PYTHON (a python3 that imports torch with CUDA; default: the
# first of python3, /usr/bin/python3 that does), MAKE (default make).
# The final table is printed last.
set -euo pipefail

usage() { sed -n '13,22p' "$0" | sed 's/^# \{0,1\}//'; }
if [ $# -ge 1 ] && { [ "$1" = "-h" ] || [ "$1" = "--help" ]; }; then usage; exit 0; fi
if [ $# -lt 1 ]; then usage >&2; exit 2; fi
out_dir=$1
shift
command_line="scripts/bench_attention.sh $out_dir $*"
repo_root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out_dir"
out_dir=$(cd "$out_dir" && pwd)
cd "$repo_root"

common_args=()    # to both programs
torch_args=()     # to PyTorch only
shapes=()
modes=()
while [ $# -gt 0 ]; do
    case "$1" in
        --modes) IFS=, read -r -a modes <<<"${2:?--modes needs a value}"; shift 2 ;;
        --shape) shapes+=("${2:?--shape needs a value}"); torch_args+=("$1" "$2"); shift 2 ;;
        --backends|--layout) torch_args+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
        --repeats|--warmup|--seed) common_args+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
        *) echo "error: unknown option '$1' (see: $0 --help)" >&2; exit 2 ;;
    esac
done
# the defaults of both programs (the shapes of the performance targets)
[ ${#shapes[@]} -gt 0 ] || shapes=(8,16,1024,64 4,16,2048,64 8,8,1024,128 2,16,4096,128)
[ ${#modes[@]} -gt 0 ] || modes=(fp32 bf16 repair gproj)

jsonl="$out_dir/bench_attention.jsonl"
rm -f "$jsonl" "$out_dir/ours.txt"

echo "== building build/bench_attention (log: $out_dir/build.log)"
if ! ${MAKE:-make} build/bench_attention >"$out_dir/build.log" 2>&1; then
    tail -n 30 "$out_dir/build.log"
    echo "error: build failed; see $out_dir/build.log" >&2
    exit 1
fi

# One process per (shape, mode): a mode or shape the kernels reject (they die
# with a message) costs only its own row, not the rest of the table.
ours_ok=1
for shape in "${shapes[@]}"; do
    for mode in "${modes[@]}"; do
        echo "== ours: build/bench_attention --shape $shape --modes $mode ${common_args[*]:-}"
        ./build/bench_attention --jsonl "$jsonl" --shape "$shape" --modes "$mode" \
            ${common_args[@]+"${common_args[@]}"} 2>&1 | tee -a "$out_dir/ours.txt" || ours_ok=0
    done
done

python_bin=${PYTHON:-}
if [ -z "$python_bin" ]; then
    for p in python3 /usr/bin/python3; do
        if "$p" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
            python_bin=$p; break
        fi
    done
fi
torch_ok=1
if [ -z "$python_bin" ]; then
    echo "warning: no python3 with a CUDA build of torch found (set PYTHON=...): PyTorch columns left empty" \
        | tee "$out_dir/torch.txt"
    torch_ok=0
else
    echo "== PyTorch: $python_bin dev/bench_attention_torch.py ${common_args[*]:-} ${torch_args[*]:-}"
    "$python_bin" dev/bench_attention_torch.py --jsonl "$jsonl" ${common_args[@]+"${common_args[@]}"} \
        ${torch_args[@]+"${torch_args[@]}"} 2>&1 \
        | tee "$out_dir/torch.txt" || torch_ok=0
fi
[ -f "$jsonl" ] || { echo "error: neither benchmark produced results; see $out_dir/*.txt" >&2; exit 1; }

merge_python=$python_bin
[ -n "$merge_python" ] || merge_python=python3
git_rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git_dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | head -n 1 || true)
"$merge_python" - "$jsonl" "$out_dir/bench_attention.md" "$command_line" "$git_rev${git_dirty:+ (with uncommitted changes)}" \
    "$ours_ok" "$torch_ok" <<'PY'
import datetime
import json
import sys

jsonl, md_path, command_line, rev, ours_ok, torch_ok = sys.argv[1:7]
rows = [json.loads(line) for line in open(jsonl) if line.strip()]
shapes = []
for r in rows:
    key = (r["B"], r["H"], r["T"], r["D"])
    if key not in shapes:
        shapes.append(key)
by = {((r["B"], r["H"], r["T"], r["D"]), r["impl"], r["variant"]): r for r in rows}
devices = sorted({r.get("device", "?") for r in rows})
torch_versions = sorted({r["torch"] for r in rows if "torch" in r})
order = [("torch", "cudnn"), ("torch", "flash"), ("ours", "fp32"), ("ours", "bf16"), ("ours", "repair"),
         ("ours", "gproj")]


def get(shape, impl, variant, field):
    r = by.get((shape, impl, variant))
    if r is None or field not in r:
        return None
    return r[field]


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


lines = []
lines.append("# Attention benchmark: ours vs PyTorch SDPA (causal, BF16)")
lines.append("")
lines.append(f"Command: `{command_line}`  ")
lines.append(f"Date: {datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}, "
             f"commit {rev}, device: {', '.join(devices)}"
             + (f", torch {', '.join(torch_versions)}" if torch_versions else ""))
if ours_ok != "1":
    lines.append("")
    lines.append("**build/bench_attention failed or was incomplete: see ours.txt.**")
if torch_ok != "1":
    lines.append("")
    lines.append("**The PyTorch baseline failed or was not run: see torch.txt.**")
lines.append("")
lines.append("Times are medians of CUDA-event-timed launches over input sets rotated beyond 3x L2. FLOPs as")
lines.append("FlashAttention counts them: causal fwd 4*B*H*T*T*D/2, fwd+bwd 3.5x that. Our modes read q, k, v")
layouts = sorted({r["layout"] for r in rows if "layout" in r})
lines.append("in place from the fused qkv [B,T,3,H,D]; PyTorch gets q, k, v as "
             + (", ".join(layouts) or "?") + " [B,H,T,D] tensors (contiguous: the usual SDPA benchmark;")
lines.append("fused: strided views of one [B,T,3,H,D] tensor).")
lines.append("")
lines.append("| shape | implementation | fwd ms | fwd TFLOP/s | bwd ms | fwd+bwd ms | fwd+bwd TFLOP/s | NaN/Inf |")
lines.append("|---|---|---:|---:|---:|---:|---:|---:|")
for shape in shapes:
    name = "B{} H{} T{} D{}".format(*shape)
    for impl, variant in order:
        r = by.get((shape, impl, variant))
        if r is None:
            continue
        label = f"PyTorch SDPA {variant}" if impl == "torch" else f"ours {variant}"
        if "error" in r:
            lines.append(f"| {name} | {label} | unavailable: {r['error'][:80]} | | | | | |")
            continue
        lines.append(f"| {name} | {label} | {fmt(r.get('fwd_ms'), '.4f')} | {fmt(r.get('fwd_tflops'), '.1f')} | "
                     f"{fmt(r.get('bwd_ms'), '.4f')} | {fmt(r.get('fwdbwd_ms'), '.4f')} | "
                     f"{fmt(r.get('fwdbwd_tflops'), '.1f')} | {r.get('nonfinite', '-')} |")
lines.append("")
lines.append("Ratios. \"speed vs cuDNN\" = cuDNN time / our time (above 1: we are faster). \"cost\" = time / bf16")
lines.append("mode's time (1.05 = 5% slower than bf16).")
lines.append("")
lines.append("| shape | bf16 vs cuDNN fwd+bwd | bf16 vs cuDNN fwd | bf16 vs flash fwd+bwd | repair vs cuDNN f+b | "
             "gproj vs cuDNN f+b | fp32 vs cuDNN f+b | gproj cost f+b | fp32 cost f+b | repair cost f+b |")
lines.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for shape in shapes:
    name = "B{} H{} T{} D{}".format(*shape)
    cud_fb = get(shape, "torch", "cudnn", "fwdbwd_ms")
    cud_f = get(shape, "torch", "cudnn", "fwd_ms")
    fla_fb = get(shape, "torch", "flash", "fwdbwd_ms")
    ours_fb = {m: get(shape, "ours", m, "fwdbwd_ms") for m in ("fp32", "bf16", "repair", "gproj")}
    ours_f = get(shape, "ours", "bf16", "fwd_ms")
    cells = [ratio(cud_fb, ours_fb["bf16"]), ratio(cud_f, ours_f), ratio(fla_fb, ours_fb["bf16"]),
             ratio(cud_fb, ours_fb["repair"]), ratio(cud_fb, ours_fb["gproj"]), ratio(cud_fb, ours_fb["fp32"]),
             ratio(ours_fb["gproj"], ours_fb["bf16"]), ratio(ours_fb["fp32"], ours_fb["bf16"]),
             ratio(ours_fb["repair"], ours_fb["bf16"])]
    lines.append(f"| {name} | " + " | ".join(fmt(c, ".3f") for c in cells) + " |")
lines.append("")
lines.append("Targets (docs/DESIGN.md): bf16 vs cuDNN fwd+bwd >= 1.0 at B8 H16 T1024 D64 and B2 H16 T4096 D128;")
lines.append("gproj and fp32 costs are judged per training step (attention is a fraction of it), not here.")
text = "\n".join(lines) + "\n"
with open(md_path, "w") as f:
    f.write(text)
PY
mkdir -p dev/results
cp "$out_dir/bench_attention.md" dev/results/bench_attention.md
echo
echo "== results: $out_dir/bench_attention.md (copied to dev/results/bench_attention.md)"
echo
cat "$out_dir/bench_attention.md"
if [ "$ours_ok" -ne 1 ] || [ "$torch_ok" -ne 1 ]; then exit 1; fi
