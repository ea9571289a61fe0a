"""tests/testing.py - the Python twin of tests/testing.h for the test scripts.

Why: every test program of `make test` ends with the plain line
"N passed, N failed" that tests/run_tests.sh adds up; the Python tests count
their checks with this one module instead of each keeping its own counters.

Offers: check(ok, msg) - one named check (prints ok/FAIL); fail(msg) - a
failed check that is not a comparison (a missing dependency, say);
summary() - prints the closing line and returns the exit status.
"""
import sys

passed = 0
failed = 0


def check(ok, msg):
    global passed, failed
    if ok:
        passed += 1
        print(f"  ok   {msg}")
    else:
        failed += 1
        print(f"  FAIL {msg}")
    sys.stdout.flush()
    return ok


def fail(msg):
    check(False, msg)


def summary():
    print(f"{passed} passed, {failed} failed")
    sys.stdout.flush()
    return 0 if failed == 0 else 1
