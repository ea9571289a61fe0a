# tests/train_test_lib.sh - shared helpers of the trainer's end-to-end tests
# (tests/test_train_cpu.sh, tests/test_train_cpu_run.sh); sourced, not run.
#
# Offers: train_test_setup (checks the programs, makes $TMP, tokenizes the
# default corpus into $DATA), section, check, run_ok, expect_refusal,
# flip_byte, same_records, train_test_summary (prints "N passed, N failed").

TRAINER=${TRAINER:-build/train_gpt_cpu}  # another binary: TRAINER=path tests/test_train_cpu.sh
pass=0
fail=0

section() { echo "== $*"; }

# check DESCRIPTION CMD [ARGS...]: one check, passes when CMD succeeds.
check() {
    local desc=$1; shift
    if "$@"; then pass=$((pass + 1)); echo "  ok   $desc"
    else fail=$((fail + 1)); echo "  FAIL $desc"; fi
}

train_test_setup() {
    local missing=""
    [ -x "$TRAINER" ] || missing="$missing $TRAINER"
    [ -x build/tokenize ] || missing="$missing build/tokenize"
    [ -f .cache/corpus/mobydick.txt ] || missing="$missing .cache/corpus/mobydick.txt"
    [ -f .cache/gpt2/encoder.json ] || missing="$missing .cache/gpt2/encoder.json"
    if [ -n "$missing" ]; then
        echo "missing:$missing (run 'make test', or 'make build/train_gpt_cpu setup')"
        echo "0 passed, 1 failed"
        exit 1
    fi
    TMP=$(mktemp -d /tmp/train_test.XXXXXX)
    trap 'rm -rf "$TMP"' EXIT
    DATA=$TMP/data
    if ! build/tokenize --vocab .cache/gpt2 --out "$DATA" --name moby --val-fraction 0.05 \
            .cache/corpus/mobydick.txt >"$TMP/tokenize.log" 2>&1; then
        cat "$TMP/tokenize.log"
        echo "0 passed, 1 failed"
        exit 1
    fi
}

# run_ok DESCRIPTION TRAINER_ARGS...: the trainer must exit 0.
run_ok() {
    local desc=$1; shift
    local t0=$SECONDS
    if "$TRAINER" "$@" >"$TMP/last.log" 2>&1; then
        pass=$((pass + 1)); echo "  ok   $desc ($((SECONDS - t0)) s)"
    else
        fail=$((fail + 1)); echo "  FAIL $desc: exit code $?; last lines:"; tail -n 15 "$TMP/last.log" | sed 's/^/    /'
    fi
}

# expect_refusal DESCRIPTION EXPECTED_TEXT TRAINER_ARGS...: the trainer must
# fail (non-zero exit) and print EXPECTED_TEXT (a fixed string).
expect_refusal() {
    local desc=$1 want=$2; shift 2
    "$TRAINER" "$@" >"$TMP/last.log" 2>&1
    local rc=$?
    if [ $rc -ne 0 ] && grep -qF -- "$want" "$TMP/last.log"; then
        pass=$((pass + 1)); echo "  ok   $desc -> $(grep -m1 -F -- "$want" "$TMP/last.log" | cut -c1-150)"
    else
        fail=$((fail + 1)); echo "  FAIL $desc: exit code $rc, expected a message containing: $want"
        tail -n 8 "$TMP/last.log" | sed 's/^/    /'
    fi
}

# flip_byte FILE OFFSET: inverts one byte in place.
flip_byte() {
    python3 -c 'import sys
p, o = sys.argv[1], int(sys.argv[2])
with open(p, "r+b") as f:
    f.seek(o); b = f.read(1); f.seek(o); f.write(bytes([b[0] ^ 0xFF]))' "$1" "$2"
}

# same_records LOG_A LOG_B STEPS: both logs hold the same training records for
# steps 0..STEPS-1 (loss, lr, grad_norm as exact numbers) and the same val
# losses and samples; for steps logged twice (a resume) the last one counts.
same_records() {
    python3 - "$1" "$2" "$3" <<'EOF'
import json, sys
def records(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "event" in r: continue
        if "loss" in r: key = ("step", r["step"]); r = {k: r[k] for k in ("loss", "lr", "grad_norm", "attn")}
        elif "val_loss" in r: key = ("val", r["step"])
        elif "sample" in r: key = ("sample", r["step"])
        else: continue
        out[key] = r
    return out
a, b, steps = records(sys.argv[1]), records(sys.argv[2]), int(sys.argv[3])
want = [("step", s) for s in range(steps)]
if any(k not in a or k not in b for k in want):
    print("    missing step records"); sys.exit(1)
if a != b:
    for k in sorted(set(a) | set(b)):
        if a.get(k) != b.get(k): print("    differs at", k, a.get(k), b.get(k))
    sys.exit(1)
EOF
}

train_test_summary() {
    echo "$pass passed, $fail failed"
    [ "$fail" -eq 0 ]
    exit $?
}
