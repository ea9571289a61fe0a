/*
 * tests/test_attn_capture.c - CPU tests of the attention capture file
 * (attention/support/attn_capture.{h,c}, docs/attn_capture_format.md).
 *
 * Checks: the CRC-32 against its published check value; write -> read round
 * trips in bf16 and fp32 (values exact in fp32, rounded to nearest even in
 * bf16, every header field preserved); the module-layout conversions against
 * index formulas written out here; the trainer's direct BF16 writer; that
 * corrupt, truncated, over-long, wrong-magic, wrong-version, bad-dims and
 * missing files are each rejected with the right message; and, when a python3
 * with numpy exists, a round trip in both directions between
 * dev/attn_capture.py and the C reader/writer.
 * Run from the repository root (it calls dev/attn_capture.py by that path).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attention/support/attn_capture.h"
#include "common/utils.h"
#include "tests/testing.h"

static char g_dir[256];

static const char* tmp_path(const char* name) {
    static char buf[4][512];
    static int next = 0;
    char* p = buf[next++ % 4];
    snprintf(p, 512, "%s/%s", g_dir, name);
    return p;
}

/* Deterministic pseudo-random floats of varied magnitude (not BF16-exact). */
static float test_value(uint64_t i, int tensor) {
    uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull + (uint64_t)tensor * 0xBF58476D1CE4E5B9ull;
    x ^= x >> 31;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 29;
    double u = (double)(x >> 11) / 9007199254740992.0;      /* [0, 1) */
    return (float)((u - 0.5) * pow(10.0, (double)(x % 7) - 3.0));
}

static AttnCaptureInfo make_info(AttnCaptureDtype dtype, int B, int NH, int T, int HS, uint32_t flags) {
    AttnCaptureInfo info;
    memset(&info, 0, sizeof info);
    info.dtype = dtype;
    info.shape = (AttnShape){B, NH, T, HS};
    info.layer = 11;
    info.step = 5000000000ll;  /* needs 64 bits */
    info.attn_mode = ATTN_REPAIR;
    info.flags = flags;
    return info;
}

static void fill_capture(AttnCapture* cap) {
    size_t n = attn_capture_tensor_elems(cap->info.shape);
    float* tensors[5] = {cap->q, cap->k, cap->v, cap->dout, cap->out};
    for (int t = 0; t < 5; t++)
        if (tensors[t])
            for (size_t i = 0; i < n; i++) tensors[t][i] = test_value(i, t);
    if (cap->stats)
        for (size_t i = 0; i < attn_stats_count(cap->info.shape); i++) cap->stats[i] = test_value(i, 9);
}

/* ---- raw file editing for the corruption cases ---- */
static unsigned char* slurp(const char* path, size_t* n) {
    FILE* fp = fopenCheck(path, "rb");
    fseekCheck(fp, 0, SEEK_END);
    *n = (size_t)ftello(fp);
    fseekCheck(fp, 0, SEEK_SET);
    unsigned char* b = (unsigned char*)mallocCheck(*n + 16);
    freadCheck(b, 1, *n, fp, path);
    fcloseCheck(fp);
    return b;
}
static void spit(const char* path, const unsigned char* b, size_t n) {
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(b, 1, n, fp, path);
    fcloseCheck(fp);
}
static void put_le32(unsigned char* b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}
/* After editing a header field on purpose, re-seal it so that only the edit is wrong. */
static void reseal_header(unsigned char* b) { put_le32(b + 124, attn_crc32(0, b, 124)); }

static void expect_reject(const char* what, const char* path, const char* needle) {
    AttnCapture cap;
    char err[1024] = "";
    int rc = attn_capture_read(path, &cap, err, sizeof err);
    CHECK(rc == -1, "%s: rejected (rc %d)", what, rc);
    CHECK(strstr(err, needle) != NULL && strstr(err, path) != NULL,
          "%s: message names the file and says '%s' (got: %s)", what, needle, err);
    CHECK(cap.q == NULL && cap.stats == NULL, "%s: nothing left allocated", what);
}

/* Every run mode of attention.h, cudnn (4) included, survives the header round trip, through both readers. */
static void test_run_modes(void) {
    test_section("run mode of every attention mode (cudnn included) round-trips through the header");
    for (int m = 0; m < ATTN_NUM_MODES; m++) {
        AttnCaptureInfo info = make_info(ATTN_CAPTURE_BF16, 1, 2, 9, 16, 0);
        info.attn_mode = (uint32_t)m;
        AttnCapture w;
        attn_capture_alloc(&w, &info);
        fill_capture(&w);
        const char* path = tmp_path("mode.attncap");
        attn_capture_write(path, &w);
        attn_capture_free(&w);
        AttnCapture r;
        AttnCaptureInfo hi;
        char err[1024] = "", err2[1024] = "";
        const int rc = attn_capture_read(path, &r, err, sizeof err);
        const int rc2 = attn_capture_read_info(path, &hi, err2, sizeof err2);
        CHECK(rc == 0 && rc2 == 0 && r.info.attn_mode == (uint32_t)m && hi.attn_mode == (uint32_t)m,
              "run mode %d (%s) read back as %u / %u (%s%s)", m, attn_mode_name((AttnMode)m), rc == 0 ? r.info.attn_mode : 99u,
              rc2 == 0 ? hi.attn_mode : 99u, err, err2);
        if (rc == 0) attn_capture_free(&r);
    }
}

static void test_crc(void) {
    test_section("CRC-32 matches the standard check value (zlib.crc32)");
    CHECK(attn_crc32(0, "123456789", 9) == 0xCBF43926u, "crc32('123456789') = 0x%08x", attn_crc32(0, "123456789", 9));
    uint32_t split = attn_crc32(attn_crc32(0, "1234", 4), "56789", 5);
    CHECK(split == 0xCBF43926u, "crc32 continues across chunks (0x%08x)", split);
}

static void test_round_trip(AttnCaptureDtype dtype, uint32_t flags) {
    char name[128];
    snprintf(name, sizeof name, "round trip %s flags 0x%x (odd shape B2 NH3 T77 HS64)",
             attn_capture_dtype_name(dtype), flags);
    test_section(name);
    AttnCaptureInfo info = make_info(dtype, 2, 3, 77, 64, flags);
    AttnCapture w;
    attn_capture_alloc(&w, &info);
    fill_capture(&w);
    const char* path = tmp_path("rt.attncap");
    attn_capture_write(path, &w);
    CHECK(access(tmp_path("rt.attncap.tmp"), F_OK) != 0, "temporary file renamed away");
    size_t file_bytes;
    free(slurp(path, &file_bytes));
    CHECK(file_bytes == attn_capture_file_bytes(&info), "file is %zu bytes, header implies %llu", file_bytes,
          (unsigned long long)attn_capture_file_bytes(&info));

    AttnCapture r;
    char err[1024] = "";
    int rc = attn_capture_read(path, &r, err, sizeof err);
    CHECK(rc == 0, "read back (%s)", err);
    if (rc != 0) { attn_capture_free(&w); return; }
    CHECK(r.info.dtype == dtype && r.info.shape.B == 2 && r.info.shape.NH == 3 && r.info.shape.T == 77 &&
          r.info.shape.HS == 64, "dtype and shape preserved");
    CHECK(r.info.layer == 11 && r.info.step == 5000000000ll && r.info.attn_mode == ATTN_REPAIR &&
          r.info.flags == flags, "layer %d, step %lld (64-bit), mode %u, flags 0x%x preserved", r.info.layer,
          (long long)r.info.step, r.info.attn_mode, r.info.flags);
    CHECK((r.out != NULL) == ((flags & ATTN_CAPTURE_HAS_OUT) != 0), "O present iff flagged");
    CHECK((r.stats != NULL) == ((flags & ATTN_CAPTURE_HAS_STATS) != 0), "stats present iff flagged");
    size_t n = attn_capture_tensor_elems(info.shape);
    const float* wt[5] = {w.q, w.k, w.v, w.dout, w.out};
    const float* rt[5] = {r.q, r.k, r.v, r.dout, r.out};
    const char* names[5] = {"Q", "K", "V", "dO", "O"};
    for (int t = 0; t < 5; t++) {
        if (!rt[t]) continue;
        size_t exact = 0, within_half_ulp = 0;
        for (size_t i = 0; i < n; i++) {
            float want = dtype == ATTN_CAPTURE_BF16 ? bf16_round(wt[t][i]) : wt[t][i];
            exact += (rt[t][i] == want);
            /* independent of bf16_round: RNE to 8 significant bits errs by at most half an ulp, 2^-8 relative */
            within_half_ulp += fabsf(rt[t][i] - wt[t][i]) <= ldexpf(1.0f, -8) * fabsf(wt[t][i]);
        }
        CHECK(exact == n, "%s: %zu of %zu values equal the %s-rounded originals", names[t], exact, n,
              attn_capture_dtype_name(dtype));
        CHECK(within_half_ulp == n, "%s: %zu of %zu within half a BF16 ulp of the original", names[t],
              within_half_ulp, n);
    }
    if (r.stats) {
        size_t exact = 0, ns = attn_stats_count(info.shape);
        for (size_t i = 0; i < ns; i++) exact += (r.stats[i] == w.stats[i]);
        CHECK(exact == ns, "stats stay fp32 exactly in any dtype (%zu of %zu)", exact, ns);
    }
    attn_capture_free(&r);
    attn_capture_free(&w);
}

static void test_module_layout(void) {
    test_section("module layout <-> capture layout, and the trainer's direct BF16 writer");
    const int B = 2, NH = 3, T = 5, HS = 8;
    AttnCaptureInfo info = make_info(ATTN_CAPTURE_BF16, B, NH, T, HS, ATTN_CAPTURE_HAS_OUT | ATTN_CAPTURE_HAS_STATS);
    size_t n = (size_t)B * NH * T * HS;
    float* qkv = (float*)mallocCheck(3 * n * sizeof(float));
    float* out = (float*)mallocCheck(n * sizeof(float));
    float* dout = (float*)mallocCheck(n * sizeof(float));
    float* stats = (float*)mallocCheck(attn_stats_count(info.shape) * sizeof(float));
    /* each value encodes its own coordinates: which*1000 + b*100 + h*10 + t + d/16 */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int which = 0; which < 3; which++)
                for (int h = 0; h < NH; h++)
                    for (int d = 0; d < HS; d++)
                        qkv[((((size_t)b * T + t) * 3 + which) * NH + h) * HS + d] =
                            (float)(which * 1000 + b * 100 + h * 10 + t) + d / 16.0f;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++)
                for (int d = 0; d < HS; d++) {
                    size_t i = (((size_t)b * T + t) * NH + h) * HS + d;
                    out[i] = (float)(4000 + b * 100 + h * 10 + t) + d / 16.0f;
                    dout[i] = -(float)(b * 100 + h * 10 + t) - d / 16.0f;
                }
    for (size_t i = 0; i < attn_stats_count(info.shape); i++) stats[i] = (float)i * 0.5f;

    AttnCapture cap;
    attn_capture_alloc(&cap, &info);
    attn_capture_from_module(&cap, qkv, out, dout);
    int bad = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++)
                for (int d = 0; d < HS; d++) {
                    size_t c = (((size_t)b * NH + h) * T + t) * HS + d;
                    float base = (float)(b * 100 + h * 10 + t) + d / 16.0f;
                    bad += cap.q[c] != base;
                    bad += cap.k[c] != base + 1000.0f;
                    bad += cap.v[c] != base + 2000.0f;
                    bad += cap.out[c] != base + 4000.0f;
                    bad += cap.dout[c] != -base;
                }
    CHECK(bad == 0, "from_module puts (b,t,which,h,d) at [b,h,t,d] of Q/K/V, O and dO (%d wrong)", bad);

    float* qkv2 = (float*)callocCheck(3 * n, sizeof(float));
    float* out2 = (float*)callocCheck(n, sizeof(float));
    float* dout2 = (float*)callocCheck(n, sizeof(float));
    attn_capture_to_module(&cap, qkv2, out2, dout2);
    CHECK(memcmp(qkv2, qkv, 3 * n * sizeof(float)) == 0 && memcmp(out2, out, n * sizeof(float)) == 0 &&
          memcmp(dout2, dout, n * sizeof(float)) == 0, "to_module inverts from_module exactly");

    /* The trainer's writer: BF16 bits in module layout straight to the file. */
    uint16_t* qkv_bits = (uint16_t*)mallocCheck(3 * n * sizeof(uint16_t));
    uint16_t* out_bits = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
    uint16_t* dout_bits = (uint16_t*)mallocCheck(n * sizeof(uint16_t));
    for (size_t i = 0; i < 3 * n; i++) qkv_bits[i] = float_to_bf16_bits(qkv[i]);
    for (size_t i = 0; i < n; i++) {
        out_bits[i] = float_to_bf16_bits(out[i]);
        dout_bits[i] = float_to_bf16_bits(dout[i]);
    }
    const char* path = tmp_path("module.attncap");
    attn_capture_write_module_bf16(path, &info, qkv_bits, out_bits, stats, dout_bits);
    AttnCapture r;
    char err[1024] = "";
    int rc = attn_capture_read(path, &r, err, sizeof err);
    CHECK(rc == 0, "direct BF16 writer's file reads back (%s)", err);
    if (rc == 0) {
        int mism = 0;
        const float* ct[5] = {cap.q, cap.k, cap.v, cap.dout, cap.out};
        const float* rt[5] = {r.q, r.k, r.v, r.dout, r.out};
        for (int t = 0; t < 5; t++)
            for (size_t i = 0; i < n; i++) mism += rt[t][i] != bf16_round(ct[t][i]);
        CHECK(mism == 0, "direct writer == from_module + BF16 rounding (%d mismatches)", mism);
        CHECK(r.stats && memcmp(r.stats, stats, attn_stats_count(info.shape) * sizeof(float)) == 0,
              "direct writer's stats exact");
        attn_capture_free(&r);
    }
    attn_capture_free(&cap);
    free(qkv); free(out); free(dout); free(stats); free(qkv2); free(out2); free(dout2);
    free(qkv_bits); free(out_bits); free(dout_bits);
}

static void test_rejects(void) {
    test_section("bad files are rejected with a clear message");
    AttnCaptureInfo info = make_info(ATTN_CAPTURE_BF16, 1, 2, 9, 16, ATTN_CAPTURE_HAS_STATS);
    AttnCapture w;
    attn_capture_alloc(&w, &info);
    fill_capture(&w);
    const char* good = tmp_path("good.attncap");
    attn_capture_write(good, &w);
    attn_capture_free(&w);
    size_t n;
    unsigned char* orig = slurp(good, &n);
    unsigned char* b = (unsigned char*)mallocCheck(n + 16);
    const char* bad = tmp_path("bad.attncap");

    AttnCapture ok;
    CHECK(attn_capture_read(good, &ok, NULL, 0) == 0, "the unmodified file reads");
    attn_capture_free(&ok);

    expect_reject("missing file", tmp_path("does-not-exist.attncap"), "cannot open");

    memcpy(b, orig, n); memcpy(b, "GPT2CKPT", 8); spit(bad, b, n);
    expect_reject("wrong magic", bad, "bad magic");

    spit(bad, orig, 60);
    expect_reject("shorter than a header", bad, "shorter than the 128-byte header");

    spit(bad, orig, n - 1);
    expect_reject("truncated by one byte", bad, "truncated");

    memcpy(b, orig, n); memset(b + n, 0, 16); spit(bad, b, n + 4);
    expect_reject("trailing bytes", bad, "trailing bytes");

    memcpy(b, orig, n); b[n - 300] ^= 0x01; spit(bad, b, n);
    expect_reject("one payload bit flipped", bad, "payload checksum mismatch");
    {
        /* the header-only reader does not read the payload: it accepts this file and reports its header */
        AttnCaptureInfo hi;
        char err[512] = "";
        int rc = attn_capture_read_info(bad, &hi, err, sizeof err);
        CHECK(rc == 0 && hi.shape.B == 1 && hi.shape.NH == 2 && hi.shape.T == 9 && hi.shape.HS == 16 &&
              hi.flags == ATTN_CAPTURE_HAS_STATS && hi.dtype == ATTN_CAPTURE_BF16,
              "read_info: header of a payload-corrupt file still reads (rc %d, %s)", rc, err);
    }

    memcpy(b, orig, n); b[32] ^= 0x04; spit(bad, b, n);  /* T field, CRC left stale */
    expect_reject("header bit flipped", bad, "header checksum mismatch");
    {
        AttnCaptureInfo hi;
        char err[512] = "";
        CHECK(attn_capture_read_info(bad, &hi, err, sizeof err) == -1 && strstr(err, "header checksum mismatch"),
              "read_info rejects a corrupt header (%s)", err);
    }

    /* one header field changed and the header checksum resealed: each is refused for what it says */
    const struct { size_t offset; uint32_t value; const char* what; const char* expect; } fields[] = {
        {8, 2, "newer version", "format version 2"},
        {36, 0, "head size 0", "must all be >= 1"},
        {24, 0x7FFFFFFF, "absurd batch", "B * NH is larger"},
        {16, 3, "unknown dtype", "dtype must be"},
        {44, 9, "unknown mode", "attention mode"},
        {20, 0x4, "unknown flag", "unknown flag bits"},
        {20, ATTN_CAPTURE_HAS_OUT | ATTN_CAPTURE_HAS_STATS, "flag says O but no O in file", "payload bytes"},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        memcpy(b, orig, n);
        put_le32(b + fields[i].offset, fields[i].value);
        reseal_header(b);
        spit(bad, b, n);
        expect_reject(fields[i].what, bad, fields[i].expect);
    }

    memcpy(b, orig, n); b[100] = 1; reseal_header(b); spit(bad, b, n);
    expect_reject("reserved byte set", bad, "reserved header byte 100");
    free(orig);
    free(b);
}

/* The pattern dev/attn_capture.py's selftest writes and checks (see selftest_tensor there):
   BF16-exact, except tensor 4 (O), divided by 3 so that both sides' BF16 rounding is compared. */
static float selftest_value(size_t i, int tensor) {
    float v = (float)(int)(((long long)i * 37 + tensor * 11) % 201 - 100) / 16.0f;
    v = v * ldexpf(1.0f, tensor);
    return tensor == 4 ? v / 3.0f : v;
}

static const char* find_numpy_python(void) {
    static const char* candidates[] = {"python3", "/usr/bin/python3"};
    char cmd[256];
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s -c 'import numpy' >/dev/null 2>&1", candidates[i]);
        if (system(cmd) == 0) return candidates[i];
    }
    return NULL;
}

static void test_python(void) {
    test_section("dev/attn_capture.py <-> C, both directions");
    const char* py = find_numpy_python();
    if (py == NULL) {
        printf("  skipped: no python3 with numpy found (tried python3, /usr/bin/python3)\n");
        return;
    }
    const AttnShape s = {2, 3, 5, 4};
    const char* dtypes[2] = {"bf16", "fp32"};
    for (int k = 0; k < 2; k++) {
        char cmd[1024];
        const char* from_py = tmp_path(k == 0 ? "py_bf16.attncap" : "py_fp32.attncap");
        snprintf(cmd, sizeof cmd, "%s dev/attn_capture.py selftest-write %s %s", py, from_py, dtypes[k]);
        int rc = system(cmd);
        CHECK(rc == 0, "python writes a %s file (%s)", dtypes[k], cmd);
        AttnCapture r;
        char err[1024] = "";
        rc = attn_capture_read(from_py, &r, err, sizeof err);
        CHECK(rc == 0, "C reads python's %s file (%s)", dtypes[k], err);
        if (rc == 0) {
            CHECK(r.info.shape.B == s.B && r.info.shape.NH == s.NH && r.info.shape.T == s.T && r.info.shape.HS == s.HS &&
                  r.info.layer == 7 && r.info.step == 123456789012ll && r.info.attn_mode == ATTN_GPROJ &&
                  r.info.dtype == (k == 0 ? ATTN_CAPTURE_BF16 : ATTN_CAPTURE_FP32),
                  "header fields from python as written");
            size_t n = attn_capture_tensor_elems(s);
            const float* rt[5] = {r.q, r.k, r.v, r.dout, r.out};
            int mism = 0;
            for (int t = 0; t < 5; t++)
                for (size_t i = 0; i < n; i++) {
                    float want = k == 0 ? bf16_round(selftest_value(i, t)) : selftest_value(i, t);
                    mism += !rt[t] || rt[t][i] != want;
                }
            for (size_t i = 0; i < attn_stats_count(s); i++) mism += !r.stats || r.stats[i] != (float)i * 0.25f - 3.0f;
            CHECK(mism == 0, "all tensors and stats from python exact, O rounded as C rounds (%d mismatches)", mism);
            attn_capture_free(&r);
        }
        /* and back: C writes the same pattern, python checks it */
        AttnCaptureInfo info = make_info(k == 0 ? ATTN_CAPTURE_BF16 : ATTN_CAPTURE_FP32, s.B, s.NH, s.T, s.HS,
                                         ATTN_CAPTURE_HAS_OUT | ATTN_CAPTURE_HAS_STATS);
        info.layer = 7;
        info.step = 123456789012ll;
        info.attn_mode = ATTN_GPROJ;
        AttnCapture w;
        attn_capture_alloc(&w, &info);
        size_t n = attn_capture_tensor_elems(s);
        float* wt[5] = {w.q, w.k, w.v, w.dout, w.out};
        for (int t = 0; t < 5; t++)
            for (size_t i = 0; i < n; i++) wt[t][i] = selftest_value(i, t);
        for (size_t i = 0; i < attn_stats_count(s); i++) w.stats[i] = (float)i * 0.25f - 3.0f;
        const char* from_c = tmp_path("c_for_py.attncap");
        attn_capture_write(from_c, &w);
        attn_capture_free(&w);
        snprintf(cmd, sizeof cmd, "%s dev/attn_capture.py selftest-check %s %s", py, from_c, dtypes[k]);
        rc = system(cmd);
        CHECK(rc == 0, "python reads the C %s file and finds every value (%s)", dtypes[k], cmd);
    }
    /* python's own reader must reject a corrupt file too */
    {
        const char* p = tmp_path("py_bf16.attncap");
        size_t n;
        unsigned char* b = slurp(p, &n);
        b[n - 1] ^= 0x80;
        const char* q = tmp_path("py_corrupt.attncap");
        spit(q, b, n);
        free(b);
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "%s dev/attn_capture.py selftest-check %s bf16 >/dev/null 2>&1", py, q);
        CHECK(system(cmd) != 0, "python's reader rejects a flipped payload bit");
    }
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/test_attn_capture.XXXXXX");
    if (mkdtemp(g_dir) == NULL) die("mkdtemp failed: %s", strerror(errno));
    test_crc();
    test_round_trip(ATTN_CAPTURE_BF16, ATTN_CAPTURE_HAS_OUT | ATTN_CAPTURE_HAS_STATS);
    test_round_trip(ATTN_CAPTURE_FP32, ATTN_CAPTURE_HAS_OUT | ATTN_CAPTURE_HAS_STATS);
    test_round_trip(ATTN_CAPTURE_BF16, 0);
    test_round_trip(ATTN_CAPTURE_FP32, ATTN_CAPTURE_HAS_STATS);
    test_run_modes();
    test_module_layout();
    test_rejects();
    test_python();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) printf("  note: could not remove %s\n", g_dir);
    return test_summary();
}
