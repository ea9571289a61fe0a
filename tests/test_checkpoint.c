/*
 * tests/test_checkpoint.c - model checkpoint files: round trips, refusals of
 * bad files, and the promise that a failed save loses nothing.
 *
 * Checks: fp32 round trip is bit-exact; bf16 round trip gives exactly the
 * round-to-nearest-even BF16 value of each float (checked against an
 * independent integer formula here, including ties and the exponent carry);
 * header fields are llm.c's; the bf16 file equals, byte for byte, the file
 * llm.c writes in BF16 mode (its version 5 layout, expected bytes built here
 * from llm.c's tensor sizes and order); refusals with a message naming the problem for a
 * missing file, wrong magic, unknown version, truncated header, truncated
 * body, trailing bytes, absurd and invalid configs; a save that fails (file
 * size limit via setrlimit(RLIMIT_FSIZE) with SIGXFSZ ignored, and an
 * unwritable folder) returns -1 and leaves the previous checkpoint intact and
 * no .tmp behind.
 * Files live in a fresh mkdtemp folder under /tmp, removed at the end.
 */
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/utils.h"
#include "model/checkpoint.h"
#include "model/gpt_config.h"
#include "tests/testing.h"

static char g_dir[64];

static GPTConfig small_config(void) {
    GPTConfig c = {.max_seq_len = 16, .vocab_size = 50, .padded_vocab_size = 64, .num_layers = 2,
                   .num_heads = 2, .channels = 16};
    gpt_config_set_gpt2_options(&c);
    return c;
}

static void path_in_dir(char* out, size_t len, const char* name) { snprintf(out, len, "%s/%s", g_dir, name); }

static long file_size(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static int file_exists(const char* path) { return access(path, F_OK) == 0; }

/* Independent BF16 RNE: keep the top 16 bits, add half an ulp plus the tie bit (finite inputs). */
static uint16_t reference_bf16_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint32_t lsb = (u >> 16) & 1u;
    return (uint16_t)((u + 0x7FFFu + lsb) >> 16);
}

static void write_raw(const char* path, const void* data, size_t bytes) {
    FILE* fp = fopenCheck(path, "wb");
    fwriteCheck(data, 1, bytes, fp, "test file");
    fcloseCheck(fp);
}

static void* read_raw(const char* path, size_t* bytes) {
    const long n = file_size(path);
    if (n < 0) die("test: cannot stat %s", path);
    void* data = mallocCheck((size_t)n);
    FILE* fp = fopenCheck(path, "rb");
    freadCheck(data, 1, (size_t)n, fp, "test file");
    fcloseCheck(fp);
    *bytes = (size_t)n;
    return data;
}

/* Writes a mutated copy of `good` and checks the reader refuses it with `expect` in the message. */
static void expect_refusal(const char* name, const void* data, size_t bytes, const char* expect) {
    char path[128], err[512];
    path_in_dir(path, sizeof(path), name);
    write_raw(path, data, bytes);
    GPTConfig cfg;
    float* params = (float*)0x1;
    err[0] = '\0';
    const int rc = checkpoint_read_model(path, &cfg, &params, err, sizeof(err));
    CHECK(rc == -1 && params == NULL && strstr(err, expect) != NULL && strstr(err, path) != NULL,
          "%s refused, message names the file and says '%s' (got rc %d: %s)", name, expect, rc, err);
    unlink(path);
}

/* --checkpoint-dtype bf16 must give the file llm.c's train_gpt2.cu writes with floatX = bf16
 * (gpt2_write_to_checkpoint): int32 header[256] with [0] 20240326, [1] 5, [2] maxT, [3] V, [4] L,
 * [5] NH, [6] C, [7] Vp, the rest 0; then its 16 tensors in fill_in_parameter_sizes order as bf16.
 * The expected bytes are built here from that description alone (sizes, order, little-endian
 * fields, RNE), not from our parameter table. */
static void test_llmc_v5_layout(void) {
    test_section("bf16 file = llm.c's version 5 layout, byte for byte");
    GPTConfig cfg = {.max_seq_len = 8, .vocab_size = 30, .padded_vocab_size = 32, .num_layers = 2,
                     .num_heads = 2, .channels = 8};
    gpt_config_set_gpt2_options(&cfg);
    const size_t Vp = 32, C = 8, maxT = 8, L = 2;
    const size_t sizes[16] = {Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
                              L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
    size_t total = 0;
    for (int t = 0; t < 16; t++) total += sizes[t];
    CHECK(gpt_num_parameters(&cfg) == total, "parameter count %zu = llm.c's sum of its 16 tensors %zu",
          gpt_num_parameters(&cfg), total);
    /* each tensor gets values of its own (its index in the exponent), ties and carries included */
    float* params = (float*)mallocCheck(total * sizeof(float));
    unsigned char* want = (unsigned char*)calloc(1, 1024 + 2 * total);
    const int32_t fields[8] = {20240326, 5, 8, 30, 2, 2, 8, 32};
    for (int k = 0; k < 8; k++)
        for (int b = 0; b < 4; b++) want[4 * k + b] = (unsigned char)((uint32_t)fields[k] >> (8 * b));
    size_t at = 0;
    for (int t = 0; t < 16; t++) {
        for (size_t j = 0; j < sizes[t]; j++, at++) {
            uint32_t bits = 0x3F800000u + ((uint32_t)t << 19) + (uint32_t)(j * 0x3FFFu) % 0x20000u;
            if (j % 7 == 3) bits = 0x3F808000u + ((uint32_t)t << 17); /* an exact tie */
            if (j % 11 == 5) bits |= 0x80000000u;
            memcpy(&params[at], &bits, 4);
            const uint16_t h = reference_bf16_bits(params[at]);
            want[1024 + 2 * at] = (unsigned char)(h & 0xff);
            want[1024 + 2 * at + 1] = (unsigned char)(h >> 8);
        }
    }
    char path[128], err[512];
    path_in_dir(path, sizeof(path), "llmc_v5.bin");
    CHECK(checkpoint_write_model(path, &cfg, params, 1, err, sizeof(err)) == 0, "bf16 save succeeds (%s)", err);
    size_t got_n = 0;
    unsigned char* got = (unsigned char*)read_raw(path, &got_n);
    size_t first_diff = got_n;
    for (size_t i = 0; i < got_n && i < 1024 + 2 * total; i++)
        if (got[i] != want[i]) { first_diff = i; break; }
    CHECK(got_n == 1024 + 2 * total && first_diff == got_n, "%zu bytes, want %zu; first differing byte %zu",
          got_n, 1024 + 2 * total, first_diff);
    free(got);
    free(want);
    free(params);
    unlink(path);
}

/* Version 6: a model with non-GPT-2 options. The header holds every option (written out here from
 * checkpoint.h's description), the weights follow in table order (empty tensors take no bytes), both
 * dtypes read back exactly, and a damaged header is refused naming the slot. */
static void test_options_version(void) {
    test_section("model options: version 6 header, round trip in fp32 and bf16, refusals");
    GPTConfig cfg = small_config(); /* C 16, NH 2: HS 8 */
    cfg.pos = GPT_POS_ROPE;
    cfg.rope_base = 500000.0f;
    cfg.norm = GPT_NORM_RMSNORM;
    cfg.mlp = GPT_MLP_SWIGLU;
    cfg.mlp_hidden = 48;
    cfg.qk_norm = 1;
    cfg.bias = 0;
    cfg.tie_embeddings = 0;
    const size_t n = gpt_num_parameters(&cfg);
    /* by hand: wte 64*16 + ln1w 32 + qkvw 2*48*16 + attprojw 2*16*16 + ln2w 32 + fcw 2*96*16 + fcprojw 2*16*48
       + lnfw 16 + qnormw 2*8 + knormw 2*8 + lmheadw 64*16 */
    const size_t by_hand = 1024 + 32 + 1536 + 512 + 32 + 3072 + 1536 + 16 + 16 + 16 + 1024;
    CHECK(n == by_hand, "%zu parameters, by hand %zu", n, by_hand);
    float* params = (float*)mallocCheck(n * sizeof(float));
    for (size_t i = 0; i < n; i++) params[i] = (float)((int)(i % 97) - 48) * 0.03125f + 1e-3f * (float)(i % 13);
    char path[128], err[512];
    path_in_dir(path, sizeof(path), "options.bin");
    CHECK(checkpoint_write_model(path, &cfg, params, 0, err, sizeof(err)) == 0, "fp32 save (%s)", err);
    size_t bytes = 0;
    int32_t* raw = (int32_t*)read_raw(path, &bytes);
    float base = 0;
    memcpy(&base, &raw[10], 4);
    CHECK(bytes == 1024 + 4 * n && raw[0] == 20240326 && raw[1] == 6 && raw[2] == 16 && raw[3] == 50 &&
              raw[4] == 2 && raw[5] == 2 && raw[6] == 16 && raw[7] == 64,
          "size and llm.c's first 8 ints, version 6");
    CHECK(raw[8] == 32 && raw[9] == GPT_POS_ROPE && base == 500000.0f && raw[11] == GPT_NORM_RMSNORM &&
              raw[12] == GPT_MLP_SWIGLU && raw[13] == 48 && raw[14] == 1 && raw[15] == 0 && raw[16] == 0 &&
              raw[17] == 0 && raw[255] == 0,
          "ints 8..16: bits 32, pos, rope_base bits, norm, mlp, hidden, qk_norm, bias, tie; the rest 0");
    CHECK(memcmp((char*)raw + 1024, params, 4 * n) == 0, "the weights follow, fp32, in table order");
    GPTConfig back;
    float* got = NULL;
    CHECK(checkpoint_read_model(path, &back, &got, err, sizeof(err)) == 0, "fp32 read (%s)", err);
    CHECK(got && memcmp(got, params, 4 * n) == 0 && memcmp(&back, &cfg, sizeof(cfg)) == 0,
          "fp32 round trip: the config (every option) and the weights exact");
    free(got);

    char pbf[128];
    path_in_dir(pbf, sizeof(pbf), "options_bf16.bin");
    CHECK(checkpoint_write_model(pbf, &cfg, params, 1, err, sizeof(err)) == 0, "bf16 save (%s)", err);
    CHECK(file_size(pbf) == (long)(1024 + 2 * n), "bf16 file has 2 bytes per weight");
    got = NULL;
    CHECK(checkpoint_read_model(pbf, &back, &got, err, sizeof(err)) == 0, "bf16 read (%s)", err);
    int exact = got != NULL && memcmp(&back, &cfg, sizeof(cfg)) == 0;
    for (size_t i = 0; exact && i < n; i++) {
        uint16_t h = reference_bf16_bits(params[i]);
        uint32_t u = (uint32_t)h << 16;
        float want;
        memcpy(&want, &u, 4);
        exact = got[i] == want;
    }
    CHECK(exact, "bf16 round trip: the config and the RNE-rounded weights");
    free(got);
    unlink(pbf);

    /* damaged version-6 headers */
    int32_t* bad = (int32_t*)mallocCheck(bytes);
    const struct { int slot; int32_t value; const char* expect; } cases[] = {
        {8, 8, "bits per weight"},
        {11, 9, "norm 9"},
        {12, 3, "mlp 3"},
        {13, 0, "MLP hidden size 0"},
        {15, 2, "bias (2)"},
        {9, 5, "position encoding 5"},
        {40, 1, "header int 40 (byte offset 160)"},
    };
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        memcpy(bad, raw, bytes);
        bad[cases[k].slot] = cases[k].value;
        char name[64];
        snprintf(name, sizeof(name), "options_bad_%d.bin", cases[k].slot);
        expect_refusal(name, bad, bytes, cases[k].expect);
    }
    memcpy(bad, raw, bytes);
    bad[6] = 18; /* C 18, NH 2: odd head size 9 with RoPE */
    bad[13] = 48;
    expect_refusal("options_odd_head.bin", bad, bytes, "even head size");
    memcpy(bad, raw, bytes);
    bad[16] = 1; /* tied: lm_head's 1024 weights are now trailing bytes */
    expect_refusal("options_tied_long.bin", bad, bytes, "too long");
    memcpy(bad, raw, bytes);
    expect_refusal("options_truncated.bin", bad, bytes - 4, "truncated");
    memcpy(bad, raw, bytes);
    bad[1] = 7;
    expect_refusal("options_v7.bin", bad, bytes, "version 7");
    free(bad);
    free(raw);
    unlink(path);

    /* GPT-2's options always give llm.c's layout (version 3), whatever else the test above did */
    GPTConfig g = small_config();
    float* gp = (float*)callocCheck(gpt_num_parameters(&g), sizeof(float));
    path_in_dir(path, sizeof(path), "gpt2.bin");
    CHECK(checkpoint_write_model(path, &g, gp, 0, err, sizeof(err)) == 0, "GPT-2 save");
    raw = (int32_t*)read_raw(path, &bytes);
    int zeros = 1;
    for (int i = 8; i < 256; i++) zeros &= raw[i] == 0;
    CHECK(raw[1] == 3 && zeros && bytes == 1024 + 4 * gpt_num_parameters(&g), "GPT-2 options: version 3, ints 8.. 0");
    free(raw);
    free(gp);
    unlink(path);
    free(params);
}

int main(void) {
    snprintf(g_dir, sizeof(g_dir), "/tmp/test_checkpoint_XXXXXX");
    if (!mkdtemp(g_dir)) die("cannot create a temporary folder under /tmp");

    const GPTConfig cfg = small_config();
    const size_t n = gpt_num_parameters(&cfg);
    float* params = (float*)mallocCheck(n * sizeof(float));
    uint64_t s = 88172645463325252ULL;
    for (size_t i = 0; i < n; i++) {  /* wide range of magnitudes and signs */
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        const double u = (double)(s >> 11) * 0x1.0p-53;
        params[i] = (float)((u - 0.5) * pow(10.0, (double)((s >> 3) % 9) - 4.0));
    }
    /* hand-picked BF16 rounding cases: exact tie to even (down and up), just above a tie, exponent carry */
    const uint32_t special_bits[] = {0x3F808000u, 0x3F818000u, 0x3F808001u, 0x3F7FFFFFu, 0xBF808000u, 0x00000000u};
    for (size_t k = 0; k < sizeof(special_bits) / sizeof(special_bits[0]); k++) memcpy(&params[k], &special_bits[k], 4);

    char path[128], err[512];
    path_in_dir(path, sizeof(path), "model.bin");

    test_section("fp32 round trip");
    CHECK(checkpoint_write_model(path, &cfg, params, 0, err, sizeof(err)) == 0, "fp32 save succeeds (%s)", err);
    CHECK(file_size(path) == (long)(1024 + 4 * n), "file is header + 4 bytes per parameter (%ld)", file_size(path));
    {
        char tmp[160];
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        CHECK(!file_exists(tmp), "no .tmp file left after a successful save");
    }
    {
        size_t bytes;
        int32_t* raw = (int32_t*)read_raw(path, &bytes);
        CHECK(raw[0] == 20240326 && raw[1] == 3 && raw[2] == 16 && raw[3] == 50 && raw[4] == 2 && raw[5] == 2 &&
                  raw[6] == 16 && raw[7] == 64 && raw[8] == 0 && raw[255] == 0,
              "header is llm.c's: magic, version 3, maxT V L NH C Vp, rest zero");
        free(raw);
    }
    GPTConfig back;
    float* loaded = NULL;
    CHECK(checkpoint_read_model(path, &back, &loaded, err, sizeof(err)) == 0, "fp32 read succeeds (%s)", err);
    if (loaded) {
        CHECK(memcmp(&back, &cfg, sizeof(cfg)) == 0, "config read back equals the config written");
        CHECK(memcmp(loaded, params, n * sizeof(float)) == 0, "all %zu parameters bit-exact", n);
        free(loaded);
        loaded = NULL;
    }

    test_section("bf16 round trip = round-to-nearest-even of fp32");
    char path_bf16[128];
    path_in_dir(path_bf16, sizeof(path_bf16), "model_bf16.bin");
    CHECK(checkpoint_write_model(path_bf16, &cfg, params, 1, err, sizeof(err)) == 0, "bf16 save succeeds (%s)", err);
    CHECK(file_size(path_bf16) == (long)(1024 + 2 * n), "file is header + 2 bytes per parameter");
    CHECK(checkpoint_read_model(path_bf16, &back, &loaded, err, sizeof(err)) == 0, "bf16 read succeeds (%s)", err);
    if (loaded) {
        size_t mismatches = 0;
        for (size_t i = 0; i < n; i++) {
            uint32_t got;
            memcpy(&got, &loaded[i], 4);
            if (got != ((uint32_t)reference_bf16_bits(params[i]) << 16)) mismatches++;
        }
        CHECK(mismatches == 0, "every value is the RNE BF16 of the original (%zu mismatches)", mismatches);
        uint32_t b0, b1, b2, b3;
        memcpy(&b0, &loaded[0], 4); memcpy(&b1, &loaded[1], 4); memcpy(&b2, &loaded[2], 4); memcpy(&b3, &loaded[3], 4);
        CHECK(b0 == 0x3F800000u && b1 == 0x3F820000u && b2 == 0x3F810000u && b3 == 0x3F800000u,
              "ties go to even (down and up), above-tie rounds up, mantissa carry bumps the exponent");
        free(loaded);
        loaded = NULL;
    }

    test_section("bad files are refused with a message");
    {
        char missing[128];
        path_in_dir(missing, sizeof(missing), "does_not_exist.bin");
        const int rc = checkpoint_read_model(missing, &back, &loaded, err, sizeof(err));
        CHECK(rc == -1 && strstr(err, missing) != NULL, "missing file refused (%s)", err);
    }
    size_t good_bytes;
    uint8_t* good = (uint8_t*)read_raw(path, &good_bytes);
    uint8_t* bad = (uint8_t*)mallocCheck(good_bytes + 64);
    int32_t* bad_header = (int32_t*)bad;

    memcpy(bad, good, good_bytes); bad_header[0] = 20240520;  /* a data shard's magic */
    expect_refusal("wrong_magic.bin", bad, good_bytes, "not a model checkpoint");
    memcpy(bad, good, good_bytes); bad_header[1] = 4;
    expect_refusal("wrong_version.bin", bad, good_bytes, "version 4");
    expect_refusal("short_header.bin", good, 100, "truncated");
    expect_refusal("truncated_body.bin", good, good_bytes - 4, "truncated");
    memcpy(bad, good, good_bytes); memset(bad + good_bytes, 0, 64);
    expect_refusal("trailing_bytes.bin", bad, good_bytes + 64, "too long");
    memcpy(bad, good, good_bytes); bad_header[4] = 1 << 30;  /* layers */
    expect_refusal("absurd_layers.bin", bad, good_bytes, "absurd config");
    memcpy(bad, good, good_bytes); bad_header[5] = 3;  /* C 16 not a multiple of 3 heads */
    expect_refusal("bad_heads.bin", bad, good_bytes, "multiple of heads");
    memcpy(bad, good, good_bytes); bad_header[7] = 40;  /* Vp < V */
    expect_refusal("bad_padded_vocab.bin", bad, good_bytes, "padded vocab");
    memcpy(bad, good, good_bytes); bad_header[6] = -16;
    expect_refusal("negative_channels.bin", bad, good_bytes, "positive");
    free(bad);

    test_section("a failed save leaves the previous checkpoint intact");
    {
        /* file-size limit below the checkpoint size: the write fails with EFBIG */
        GPTConfig other = cfg;
        for (size_t i = 0; i < n; i++) params[i] += 1.0f;  /* different content: must NOT reach the file */
        struct rlimit old_limit, limit;
        getrlimit(RLIMIT_FSIZE, &old_limit);
        signal(SIGXFSZ, SIG_IGN);
        limit = old_limit;
        limit.rlim_cur = 4096;
        setrlimit(RLIMIT_FSIZE, &limit);
        err[0] = '\0';
        const int rc = checkpoint_write_model(path, &other, params, 0, err, sizeof(err));
        setrlimit(RLIMIT_FSIZE, &old_limit);
        CHECK(rc == -1 && strstr(err, path) != NULL && strstr(err, "unchanged") != NULL,
              "save over the size limit returns -1 with a message (%s)", err);
        size_t now_bytes;
        uint8_t* now = (uint8_t*)read_raw(path, &now_bytes);
        CHECK(now_bytes == good_bytes && memcmp(now, good, good_bytes) == 0, "previous checkpoint byte-identical");
        free(now);
        char tmp[160];
        snprintf(tmp, sizeof(tmp), "%s.tmp", path);
        CHECK(!file_exists(tmp), "the partial .tmp file was removed");
    }
    if (geteuid() != 0) {  /* root ignores folder permissions */
        char ro_dir[128], ro_path[160];
        path_in_dir(ro_dir, sizeof(ro_dir), "readonly");
        mkdir(ro_dir, 0755);
        snprintf(ro_path, sizeof(ro_path), "%s/model.bin", ro_dir);
        CHECK(checkpoint_write_model(ro_path, &cfg, params, 0, err, sizeof(err)) == 0, "save into the folder");
        chmod(ro_dir, 0555);
        const int rc = checkpoint_write_model(ro_path, &cfg, params, 1, err, sizeof(err));
        chmod(ro_dir, 0755);
        CHECK(rc == -1 && strstr(err, "writable") != NULL, "save into a read-only folder refused (%s)", err);
        CHECK(file_size(ro_path) == (long)(1024 + 4 * n), "the earlier fp32 file there is intact");
        unlink(ro_path);
        rmdir(ro_dir);
    }
    free(good);

    test_section("invalid config is not saved");
    {
        GPTConfig broken = cfg;
        broken.num_heads = 5;
        char p2[128];
        path_in_dir(p2, sizeof(p2), "broken.bin");
        CHECK(checkpoint_write_model(p2, &broken, params, 0, err, sizeof(err)) == -1 && !file_exists(p2),
              "config with C %% NH != 0 refused before writing (%s)", err);
    }

    test_llmc_v5_layout();
    test_options_version();

    unlink(path);
    unlink(path_bf16);
    rmdir(g_dir);
    free(params);
    return test_summary();
}
