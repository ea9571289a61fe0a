#!/usr/bin/env bash
# tests/run_tests.sh - runs every test program given on the command line and
# adds their "N passed, N failed" lines into one total.
#
# A program that crashes or exits non-zero without printing its summary line
# counts as one failure, so a test can never pass by dying quietly.
# Usage: tests/run_tests.sh CMD [CMD ...]   (each CMD is one quoted command)
set -u
total_pass=0
total_fail=0
failed_suites=()
for cmd in "$@"; do
    echo "---- $cmd"
    log=$(mktemp)
    bash -c "$cmd" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    line=$(grep -E '^([-A-Za-z0-9_]+: )?[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    rm -f "$log"
    if [ -z "$line" ]; then
        echo "!!!! $cmd printed no summary (exit code $rc): counted as 1 failure"
        total_fail=$((total_fail + 1)); failed_suites+=("$cmd"); continue
    fi
    p=$(echo "$line" | sed -E 's/^([-A-Za-z0-9_]+: )?([0-9]+) passed, ([0-9]+) failed.*/\2/')
    f=$(echo "$line" | sed -E 's/^([-A-Za-z0-9_]+: )?([0-9]+) passed, ([0-9]+) failed.*/\3/')
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "!!!! $cmd exited with code $rc after reporting no failure: counted as 1 failure"
        f=1
    fi
    total_pass=$((total_pass + p)); total_fail=$((total_fail + f))
    [ "$f" -ne 0 ] && failed_suites+=("$cmd")
done
echo
if [ ${#failed_suites[@]} -ne 0 ]; then
    echo "suites with failures:"; printf '  %s\n' "${failed_suites[@]}"
fi
echo "$total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
