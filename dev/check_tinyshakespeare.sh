#!/usr/bin/env bash
# dev/check_tinyshakespeare.sh - tinyshakespeare must encode to exactly 338,025
# GPT-2 tokens (the count tiktoken, js-tiktoken and OpenAI's encoder.py give).
#
# Why: tests may not read data outside the repository, and tinyshakespeare is
# not fetched by scripts/setup_data.sh, so this check is a script that is run
# by hand wherever the file exists (karpathy/char-rnn data/tinyshakespeare/input.txt,
# 1,115,394 bytes).
# Usage: dev/check_tinyshakespeare.sh PATH/TO/tinyshakespeare.txt
# Prints the count and "N passed, N failed"; exit status 0 only if it matches.
set -euo pipefail
cd "$(dirname "$0")/.."
EXPECTED_TOKENS=338025
EXPECTED_BYTES=1115394
[ $# -eq 1 ] || { echo "usage: dev/check_tinyshakespeare.sh PATH/TO/tinyshakespeare.txt" >&2; exit 2; }
[ -f "$1" ] || { echo "check_tinyshakespeare: no such file: $1" >&2; exit 2; }
[ -x build/tokenize ] || make --no-print-directory build/tokenize >/dev/null
bytes=$(wc -c < "$1")
tokens=$(build/tokenize --ids < "$1" | wc -w)
pass=0; fail=0
if [ "$bytes" -eq $EXPECTED_BYTES ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $1 has $bytes bytes, tinyshakespeare has $EXPECTED_BYTES (another version of the file?)"; fi
if [ "$tokens" -eq $EXPECTED_TOKENS ]; then pass=$((pass + 1)); else fail=$((fail + 1)); echo "FAIL: $tokens tokens, expected $EXPECTED_TOKENS"; fi
echo "tinyshakespeare: $bytes bytes -> $tokens tokens (expected $EXPECTED_TOKENS)"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
