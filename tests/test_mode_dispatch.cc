/*
 * tests/test_mode_dispatch.cc - attention/cuda/mode_dispatch.cuh's with_mode_hs, on the host (the helper is plain
 * C++ host code; every CUDA attention entry point turns its run-time mode and head size into template arguments
 * through it, so a wrong case here would launch another mode's kernel).
 *
 * Checks: each of the four modes our kernels compute, at head sizes 64 and 128, reaches the callback exactly once,
 * with template arguments equal to the run-time values; a head size without kernels (32, 96, 256) and a mode
 * without our kernels (cudnn, -1, ATTN_NUM_MODES) stop the process with exit status 1 and one message that names
 * the entry point and what to use instead, and never reach the callback.
 */
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <initializer_list>

#include "attention/cuda/mode_dispatch.cuh"
#include "tests/testing.h"

namespace {

struct Seen {
    int calls = 0, mode = -1, hs = -1;
};

Seen dispatch(AttnMode mode, int hs) {
    Seen seen;
    with_mode_hs("test_entry", mode, hs, [&](auto mode_c, auto hs_c) {
        constexpr int MODE = decltype(mode_c)::value, HS = decltype(hs_c)::value; /* usable as template args */
        static_assert(HS == 64 || HS == 128, "only the kernels' head sizes reach the callback");
        static_assert(MODE >= ATTN_FP32 && MODE <= ATTN_GPROJ, "only the emulated modes reach the callback");
        seen.calls++;
        seen.mode = MODE;
        seen.hs = HS;
    });
    return seen;
}

struct Refused {
    AttnMode mode;
    int hs;
};

void run_refused(void* ctx) {
    const Refused* r = static_cast<const Refused*>(ctx);
    const Seen seen = dispatch(r->mode, r->hs);
    fprintf(stderr, "callback reached %d time(s)\n", seen.calls); /* only if with_mode_hs did not stop */
}

void check_refused(AttnMode mode, int hs, const char* want_words) {
    Refused r = {mode, hs};
    char msg[1024];
    const int status = test_run_captured(run_refused, &r, msg, sizeof msg);
    const bool exited_1 = WIFEXITED(status) && WEXITSTATUS(status) == 1;
    CHECK(exited_1, "mode %d HS %d: exit status 1 (got raw status %d)", (int)mode, hs, status);
    CHECK(strstr(msg, "test_entry") != NULL && strstr(msg, want_words) != NULL && strstr(msg, "callback") == NULL,
          "mode %d HS %d: one message naming the entry and \"%s\", no callback (got: %s)", (int)mode, hs,
          want_words, msg);
}

}  // namespace

int main() {
    test_section("every mode of our kernels at head sizes 64 and 128 reaches the callback once, as itself");
    const AttnMode modes[] = {ATTN_FP32, ATTN_BF16, ATTN_REPAIR, ATTN_GPROJ};
    for (AttnMode mode : modes)
        for (int hs : {64, 128}) {
            const Seen seen = dispatch(mode, hs);
            CHECK(seen.calls == 1 && seen.mode == (int)mode && seen.hs == hs,
                  "mode %d HS %d: 1 call with <%d, %d> (got %d calls, <%d, %d>)", (int)mode, hs, (int)mode, hs,
                  seen.calls, seen.mode, seen.hs);
        }

    test_section("head sizes without kernels stop with the fix");
    for (int hs : {32, 96, 256}) check_refused(ATTN_BF16, hs, "use head size 64 or 128");

    test_section("modes without our kernels stop with the choices");
    check_refused(ATTN_CUDNN, 64, "use one of fp32|bf16|repair|gproj");
    check_refused((AttnMode)-1, 128, "mode -1 has no CUDA kernel");
    check_refused(ATTN_NUM_MODES, 64, "mode 5 has no CUDA kernel");
    return test_summary();
}
