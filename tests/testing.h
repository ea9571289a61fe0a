/*
 * tests/testing.h - the minimal test harness every C/CUDA test program uses.
 *
 * Why: `make test` must end with one plain line "N passed, N failed" over all
 * suites. Each test program counts its own checks with these macros and ends
 * with test_summary(), which prints that line for the program and returns the
 * exit status; tests/run_tests.sh adds the counts of all programs together.
 *
 * Offers: CHECK(cond, fmt, ...) - one named check, prints FAIL with details;
 *         CHECK_CLOSE(name, got, want, rtol, atol) - numeric closeness;
 *         test_section(name) - a heading in the output;
 *         test_summary() - prints "N passed, N failed", returns exit code.
 */
#ifndef TESTS_TESTING_H
#define TESTS_TESTING_H

#include <stdio.h>
#include <math.h>

static int g_tests_passed = 0;
static int g_tests_failed = 0;
static int g_tests_verbose = 0;  /* set to 1 to print every passing check */

static inline void test_section(const char* name) { printf("== %s\n", name); fflush(stdout); }

#define CHECK(cond, ...) do {                                            \
        if (cond) {                                                      \
            g_tests_passed++;                                            \
            if (g_tests_verbose) { printf("  ok   "); printf(__VA_ARGS__); printf("\n"); } \
        } else {                                                         \
            g_tests_failed++;                                            \
            printf("  FAIL "); printf(__VA_ARGS__);                      \
            printf("   [%s:%d]\n", __FILE__, __LINE__);                  \
        }                                                                \
        fflush(stdout);                                                  \
    } while (0)

/* |got - want| <= atol + rtol * |want|, and neither is NaN. */
#define CHECK_CLOSE(name, got, want, rtol, atol) do {                     \
        double g_ = (double)(got), w_ = (double)(want);                  \
        int ok_ = !isnan(g_) && !isnan(w_) &&                            \
                  fabs(g_ - w_) <= (atol) + (rtol) * fabs(w_);           \
        CHECK(ok_, "%s: got %.9g want %.9g (rtol %g atol %g)", name, g_, w_, \
              (double)(rtol), (double)(atol));                           \
    } while (0)

static inline int test_summary(void) {
    printf("%d passed, %d failed\n", g_tests_passed, g_tests_failed);
    fflush(stdout);
    return g_tests_failed == 0 ? 0 : 1;
}

#endif /* TESTS_TESTING_H */
