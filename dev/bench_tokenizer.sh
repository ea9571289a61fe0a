#!/usr/bin/env bash
# dev/bench_tokenizer.sh - our C tokenizer against tiktoken on the same file:
# single-thread MB/s of both, their ratio, and whether the ids are identical.
#
# Why: the tokenizer's goal is tiktoken's ids at least at tiktoken's speed.
# Both numbers come from one run on one machine, so the ratio is fair.
#
# Usage: dev/bench_tokenizer.sh FILE [REPEAT]     (run from anywhere; default REPEAT 5)
#   FILE must be UTF-8 (tiktoken's Python API takes str). Pick a large one, e.g.
#   for i in $(seq 20); do cat tinyshakespeare.txt; done > /tmp/big.txt
# Needs build/tokenize (built if missing), .cache/gpt2/{encoder.json,vocab.bpe}
# (scripts/setup_data.sh), and python3 with tiktoken (pip install tiktoken).
#
# tiktoken offline: it looks for its GPT-2 files in TIKTOKEN_CACHE_DIR under the
# sha1 hex digest of the address it would download each from. We place our
# (sha256-identical) copies under those names in a temporary folder, so it never
# goes to the network. The digests are below; the addresses are not written here.
#
# Measured 2026-11-29 on the lent H200 host (Intel Xeon, one core used), tiktoken 0.14.0:
#   FILE = 20 copies of .cache/corpus/mobydick.txt (24.1 MB), REPEAT 3:
#     ours 86.6 MB/s, tiktoken 12.2 MB/s, ratio 7.1x; ids identical (6,355,120 tokens).
#   FILE = dev/gen_unicode_stress.py --no-disputed --seed 1..4 (0.8 MB, ~666K tokens each), REPEAT 1:
#     ours 11-16 MB/s, tiktoken 4-7 MB/s (1.8-3.8x); ids identical for all four seeds.
#   With U+0085 or U+FEFF in the text the ids differ by design (see gen_unicode_stress.py).
set -euo pipefail
cd "$(dirname "$0")/.."

TIKTOKEN_NAME_VOCAB_BPE=6d1cbeee0f20b3d9449abfede4726ed8212e3aee
TIKTOKEN_NAME_ENCODER_JSON=6c7ea1a7e38e3a7f062df639a5b80947f075ffe6
VOCAB_DIR=.cache/gpt2
PYTHON=${PYTHON:-python3}

fail() { echo "bench_tokenizer: error: $*" >&2; exit 1; }
[ $# -ge 1 ] && [ $# -le 2 ] || fail "usage: dev/bench_tokenizer.sh FILE [REPEAT]"
file=$1
repeat=${2:-5}
[ -f "$file" ] || fail "no such file: $file"
[[ "$repeat" =~ ^[1-9][0-9]*$ ]] || fail "REPEAT must be a positive integer, got '$repeat'"
for f in encoder.json vocab.bpe; do
    [ -f "$VOCAB_DIR/$f" ] || fail "$VOCAB_DIR/$f is missing; run scripts/setup_data.sh first"
done
[ -x build/tokenize ] || make --no-print-directory build/tokenize >/dev/null || fail "cannot build build/tokenize"

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

echo "== ours: build/tokenize --bench (1 thread, $repeat passes)"
build/tokenize --vocab "$VOCAB_DIR" --bench "$file" --repeat "$repeat" | tee "$tmp/ours.txt"
ours_mbs=$(sed -n 's/^bench: all passes \([0-9.]*\) MB\/s$/\1/p' "$tmp/ours.txt")
[ -n "$ours_mbs" ] || fail "could not read our MB/s from build/tokenize --bench"
build/tokenize --vocab "$VOCAB_DIR" --ids < "$file" > "$tmp/ours_ids.txt"

if ! "$PYTHON" -c 'import tiktoken' 2>/dev/null; then
    echo
    echo "bench_tokenizer: tiktoken is NOT installed for $PYTHON: no comparison was made."
    echo "  Only our speed is shown above ($ours_mbs MB/s). Install tiktoken (pip install tiktoken)"
    echo "  or set PYTHON=/path/to/python-with-tiktoken, then run this script again."
    exit 3
fi

mkdir -p "$tmp/tiktoken_cache"
cp "$VOCAB_DIR/vocab.bpe" "$tmp/tiktoken_cache/$TIKTOKEN_NAME_VOCAB_BPE"
cp "$VOCAB_DIR/encoder.json" "$tmp/tiktoken_cache/$TIKTOKEN_NAME_ENCODER_JSON"

echo
echo "== tiktoken: encode_ordinary (1 thread, $repeat passes)"
TIKTOKEN_CACHE_DIR="$tmp/tiktoken_cache" RAYON_NUM_THREADS=1 "$PYTHON" - "$file" "$repeat" "$tmp/ours_ids.txt" "$ours_mbs" <<'EOF'
import sys, time
import tiktoken

path, repeat, ours_ids_path, ours_mbs = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
raw = open(path, "rb").read()
try:
    text = raw.decode("utf-8")
except UnicodeDecodeError as e:
    sys.exit(f"bench_tokenizer: {path} is not valid UTF-8 ({e}); tiktoken's str API cannot take it")
enc = tiktoken.get_encoding("gpt2")
enc.encode_ordinary("warm up")
times = []
for _ in range(repeat):
    t0 = time.perf_counter()
    ids = enc.encode_ordinary(text)
    times.append(time.perf_counter() - t0)
mb = len(raw) / 1e6
tk_mbs = mb * repeat / sum(times)
print(f"tiktoken {tiktoken.__version__}: {len(raw)} bytes, {len(ids)} tokens")
print(f"tiktoken: first pass {mb / times[0]:.2f} MB/s, all passes {tk_mbs:.2f} MB/s")

ours = [int(x) for x in open(ours_ids_path).read().split()]
print()
print(f"== result")
print(f"ours {ours_mbs:.2f} MB/s, tiktoken {tk_mbs:.2f} MB/s, ratio ours/tiktoken {ours_mbs / tk_mbs:.2f}x")
if ours == ids:
    print(f"ids: identical ({len(ids)} tokens)")
else:
    first = next((i for i, (a, b) in enumerate(zip(ours, ids)) if a != b), min(len(ours), len(ids)))
    ctx = enc.decode(ids[max(0, first - 5):first + 5])
    print(f"ids: DIFFERENT: ours {len(ours)} tokens, tiktoken {len(ids)}; first difference at token {first}: "
          f"ours {ours[first:first + 5]}, tiktoken {ids[first:first + 5]}, text around it {ctx!r}")
    sys.exit(1)
EOF
