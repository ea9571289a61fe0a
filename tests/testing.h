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
 *         test_summary() - prints "N passed, N failed", returns exit code;
 *         test_run_captured(fn, ctx, msg, cap) - runs fn in a child process
 *           with its stderr captured (for checks that a call dies with a
 *           message).
 */
#ifndef TESTS_TESTING_H
#define TESTS_TESTING_H

#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

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

/* Runs fn(ctx) in a child process with its stderr captured into msg (cap
   bytes, NUL-terminated); returns the child's status as waitpid gives it. A
   child whose fn returns exits 0 (not refused: the caller reports it). */
static inline int test_run_captured(void (*fn)(void*), void* ctx, char* msg, size_t cap) {
    int fds[2];
    if (pipe(fds) != 0) {
        fprintf(stderr, "error: test_run_captured: pipe failed\n");
        exit(1);
    }
    fflush(stdout);
    fflush(stderr);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        fn(ctx);
        _exit(0);
    }
    close(fds[1]);
    size_t got = 0;
    ssize_t n;
    while (got < cap - 1 && (n = read(fds[0], msg + got, cap - 1 - got)) > 0) got += (size_t)n;
    msg[got] = '\0';
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return status;
}

#endif /* TESTS_TESTING_H */
