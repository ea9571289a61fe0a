"""tests/testing.py - the Python twin of tests/testing.h for the test scripts.

Why: every test program of `make test` ends with the plain line
"N passed, N failed" that tests/run_tests.sh adds up; the Python tests count
their checks with this one module instead of each keeping its own counters.

Offers: check(ok, msg) - one named check (prints ok/FAIL); fail(msg) - a
failed check that is not a comparison (a missing dependency, say);
summary() - prints the closing line and returns the exit status;
require(modules, packages) - imports the modules a test needs, or re-runs the test under Debian's
/usr/bin/python3 (where .ci/run installs them), or fails with the packages to install.
"""
import importlib
import os
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


def require(modules, packages):
    """Imports each of `modules` and returns them; when one is missing, re-executes the calling script under
    /usr/bin/python3 (CI installs Debian's packages there) or, already there, fails naming `packages`."""
    try:
        return [importlib.import_module(m) for m in modules]
    except ImportError:
        script = os.path.abspath(sys.argv[0])
        if sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3"):
            os.execv("/usr/bin/python3", ["/usr/bin/python3", script] + sys.argv[1:])
        print(f"  FAIL {', '.join(modules)} needed (Debian: apt-get install {packages})\n0 passed, 1 failed")
        sys.exit(1)
