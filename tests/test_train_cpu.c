/*
 * tests/test_train_cpu.c - CPU tests of the training infrastructure shared by
 * both trainers: the flag table (train/flags.c), the learning-rate schedule
 * (train/schedule.c), the run log (train/runlog.c), the resume-state file
 * (train/resume_state.c), the sampler (train/sampler.c) and the run
 * driver's helpers (train/run_driver.c: run-file names, the resume command,
 * the finite-weights check, the checkpoint listing).
 *
 * References are independent: schedule values are recomputed from their
 * closed form here; sampler frequencies are tested against softmax by a
 * chi-square bound; resume files are damaged byte by byte and must be
 * refused with the right reason. The trainer end to end (bit-exact resume,
 * corrupt files, a short real run) is tests/test_train_cpu.sh.
 */
#include "attention/attention.h"
#include "model/gpt_config.h"
#include "tests/testing.h"
#include "train/flags.h"
#include "train/resume_state.h"
#include "train/run_driver.h"
#include "train/runlog.h"
#include "train/sampler.h"
#include "train/schedule.h"

#include <math.h>
#include <setjmp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char g_tmpdir[256];

/* Parses a NULL-terminated list of words as a command line. */
static int parse_words(TrainFlags* f, const char** words, char* err, size_t errlen) {
    char* argv[64];
    int argc = 0;
    argv[argc++] = (char*)"prog";
    for (int i = 0; words[i] != NULL; i++) argv[argc++] = (char*)words[i];
    flags_init(f);
    err[0] = '\0';
    return flags_parse(f, argc, argv, err, errlen);
}

static char* read_text(const char* path) {
    FILE* fp = fopen(path, "rb");
    if (fp == NULL) return NULL;
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char* s = (char*)malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, fp);
    s[got] = '\0';
    fclose(fp);
    return s;
}

static void test_flags(void) {
    test_section("flags: one table drives parser, help and settings");
    char err[512];
    TrainFlags f;

    /* Every row is complete, and its name is unique. */
    for (int i = 0; i < NUM_FLAGS; i++) {
        FlagInfo a = flags_info((FlagId)i);
        CHECK(a.name && *a.name && a.help && *a.help, "flag %d has a name and help", i);
        for (int j = 0; j < i; j++) CHECK(strcmp(a.name, flags_info((FlagId)j).name) != 0, "--%s unique", a.name);
    }
    /* The table's lists match the modules they describe (no drift). */
    CHECK(strcmp(flags_info(FLAG_ATTN).choices, attn_mode_choices()) == 0, "--attn choices == attn_mode_choices()");
    CHECK(strstr(flags_info(FLAG_MODEL).help, gpt_config_choices()) != NULL, "--model help lists every preset");

    /* --help lists every flag (with and without the GPU-only block). */
    char path[300];
    snprintf(path, sizeof(path), "%s/help.txt", g_tmpdir);
    FILE* fp = fopen(path, "w");
    flags_print_help(fp, "prog", "summary line", 1);
    fclose(fp);
    char* help = read_text(path);
    int all_listed = 1;
    for (int i = 0; i < NUM_FLAGS; i++) {
        char want[80];
        snprintf(want, sizeof(want), "--%s ", flags_info((FlagId)i).name);
        if (strstr(help, want) == NULL) { all_listed = 0; printf("  missing from help: %s\n", want); }
    }
    CHECK(all_listed, "--help lists all %d flags", NUM_FLAGS);
    CHECK(strstr(help, "(default: gproj)") != NULL, "--help shows defaults");
    free(help);

    /* Defaults. */
    const char* none[] = {NULL};
    CHECK(parse_words(&f, none, err, sizeof(err)) == 0, "no arguments parse");
    CHECK(strcmp(f.attn, "gproj") == 0 && f.shuffle == 1 && f.seed == 1337 && fabsf(f.lr - 6e-4f) == 0.0f &&
              strcmp(f.resume, "") == 0 && f.overwrite == 0 && !flags_was_set(&f, FLAG_LR),
          "defaults: attn gproj, shuffle 1, seed 1337, lr 6e-4");

    /* Both syntaxes, optional values, every type. */
    const char* ok1[] = {"--batch-size", "8", "--lr=0.001", "--attn", "bf16", "--shuffle", "0", "--overwrite",
                         "--total-batch-tokens=4096", "--seed", "42", "--schedule=linear", "--resume", NULL};
    CHECK(parse_words(&f, ok1, err, sizeof(err)) == 0, "mixed command line parses (%s)", err);
    CHECK(f.batch_size == 8 && f.lr == 0.001f && strcmp(f.attn, "bf16") == 0 && f.shuffle == 0 &&
              f.overwrite == 1 && f.total_batch_tokens == 4096 && f.seed == 42 &&
              strcmp(f.schedule, "linear") == 0 && strcmp(f.resume, "latest") == 0,
          "values land in their fields (bare --overwrite = 1, bare --resume = latest)");
    CHECK(flags_was_set(&f, FLAG_LR) && !flags_was_set(&f, FLAG_STEPS), "was_set marks given flags only");
    const char* ok2[] = {"--resume", "runs/x/state_00000010.bin", "--steps", "5", "--overwrite", "0", NULL};
    CHECK(parse_words(&f, ok2, err, sizeof(err)) == 0 && strcmp(f.resume, "runs/x/state_00000010.bin") == 0 &&
              f.steps == 5 && f.overwrite == 0,
          "--resume PATH and --overwrite 0 take their values");
    const char* help_words[] = {"--steps", "3", "--help", NULL};
    CHECK(parse_words(&f, help_words, err, sizeof(err)) == 1, "--help returns 1");

    /* Bad input: one message naming the flag and what is allowed. */
    struct { const char* words[4]; const char* want; } bad[] = {
        {{"--bach-size", "4", NULL}, "did you mean --batch-size"},
        {{"--batch-size", "0", NULL}, "--batch-size: 0 is out of range; allowed: an integer from 1 to"},
        {{"--batch-size", "4x", NULL}, "--batch-size: '4x' is not an integer"},
        {{"--lr", "nan", NULL}, "--lr: 'nan' is not a finite number"},
        {{"--lr=-1", NULL}, "--lr: -1 is out of range"},
        {{"--attn", "fp16", NULL}, "--attn: 'fp16' is not allowed; allowed: one of fp32|bf16|repair|gproj|cudnn"},
        {{"--schedule", NULL}, "--schedule needs a value"},
        {{"--shuffle=2", NULL}, "--shuffle: '2' is not allowed; allowed: 0 or 1"},
        {{"stray", NULL}, "unexpected argument 'stray'"},
        {{"--beta2", "1.5", NULL}, "--beta2: 1.5 is out of range"},
        {{"--zzzzzzzzzzzz", NULL}, "unknown flag '--zzzzzzzzzzzz' (see --help"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = parse_words(&f, bad[i].words, err, sizeof(err));
        CHECK(rc == -1 && strstr(err, bad[i].want) != NULL, "'%s %s' refused with \"%s\" (got: %s)", bad[i].words[0],
              bad[i].words[1] ? bad[i].words[1] : "", bad[i].want, err);
    }

    /* GPU-only flags: accepted at their default, refused otherwise by the CPU trainer. */
    const char* gpu_def[] = {"--zero-stage", "0", NULL};
    parse_words(&f, gpu_def, err, sizeof(err));
    CHECK(flags_reject_gpu_only(&f, "train_gpt_cpu", err, sizeof(err)) == 0, "--zero-stage 0 (default) accepted");
    const char* gpu_bad[] = {"--zero-stage", "1", NULL};
    parse_words(&f, gpu_bad, err, sizeof(err));
    CHECK(flags_reject_gpu_only(&f, "train_gpt_cpu", err, sizeof(err)) == -1 &&
              strstr(err, "--zero-stage is implemented by the GPU trainer only") != NULL,
          "--zero-stage 1 refused on the CPU trainer (%s)", err);
    /* --attn is shared, but its value cudnn is GPU only (no CPU emulation); the other modes pass */
    TrainFlags fa;
    flags_init(&fa);
    const char* attn_bf16[] = {"--attn", "bf16", NULL};
    parse_words(&fa, attn_bf16, err, sizeof(err));
    CHECK(flags_reject_gpu_only(&fa, "train_gpt_cpu", err, sizeof(err)) == 0, "--attn bf16 accepted on the CPU trainer");
    const char* attn_cudnn[] = {"--attn", "cudnn", NULL};
    parse_words(&fa, attn_cudnn, err, sizeof(err));
    CHECK(flags_reject_gpu_only(&fa, "train_gpt_cpu", err, sizeof(err)) == -1 &&
              strstr(err, "--attn cudnn is implemented by the GPU trainer only") != NULL &&
              strstr(err, "fp32|bf16|repair|gproj") != NULL,
          "--attn cudnn refused on the CPU trainer, naming the CPU's modes (%s)", err);

    /* Per-program defaults go through the same parser and show in --help. */
    CHECK(flags_set_default(FLAG_BATCH_SIZE, "-1", err, sizeof(err)) == -1, "a bad default is refused");
    CHECK(flags_set_default(FLAG_MODEL, "tiny", err, sizeof(err)) == 0, "a good default is taken");
    flags_init(&f);
    CHECK(strcmp(f.model, "tiny") == 0 && strcmp(flags_info(FLAG_MODEL).def, "tiny") == 0,
          "the new default is used and reported");
    flags_set_default(FLAG_MODEL, "d12", err, sizeof(err));

    /* JSON and settings carry every flag. */
    snprintf(path, sizeof(path), "%s/flags.json", g_tmpdir);
    fp = fopen(path, "w");
    const char* js[] = {"--out-dir", "a\"b\\c", "--batch-size", "8", NULL};
    parse_words(&f, js, err, sizeof(err));
    flags_write_json(fp, &f);
    fclose(fp);
    char* json = read_text(path);
    CHECK(strstr(json, "\"batch-size\": 8") && strstr(json, "\"out-dir\": \"a\\\"b\\\\c\"") &&
              strstr(json, "\"attn\": \"gproj\"") && strstr(json, "\"weight-decay\": 0.1,") &&
              strstr(json, "\"adam-eps\": 1e-08,"),
          "flags_write_json: numbers bare and shortest (0.1, not 0.100000001), strings escaped");
    free(json);
}

static void test_schedule(void) {
    test_section("schedule: warmup then cosine / linear / constant");
    ScheduleKind k;
    CHECK(schedule_parse("cosine", &k) == 0 && k == SCHEDULE_COSINE && schedule_parse("linear", &k) == 0 &&
              k == SCHEDULE_LINEAR && schedule_parse("constant", &k) == 0 && k == SCHEDULE_CONSTANT &&
              schedule_parse("step", &k) == -1,
          "names parse, others refused");
    LRSchedule s = {SCHEDULE_COSINE, 1e-3, 0.1, 10, 110};
    CHECK_CLOSE("warmup step 0 = lr/10", schedule_lr(&s, 0), 1e-4, 1e-12, 0);
    CHECK_CLOSE("warmup step 4 = lr*5/10", schedule_lr(&s, 4), 5e-4, 1e-12, 0);
    CHECK_CLOSE("warmup ends at peak", schedule_lr(&s, 9), 1e-3, 1e-12, 0);
    CHECK_CLOSE("cosine starts at peak", schedule_lr(&s, 10), 1e-3, 1e-12, 0);
    CHECK_CLOSE("cosine ends at the floor", schedule_lr(&s, 109), 1e-4, 1e-12, 0);
    /* independent closed form at an arbitrary step */
    double r = (57.0 - 10.0) / 99.0, want = 1e-4 + 0.9e-3 * 0.5 * (1 + cos(3.14159265358979323846 * r));
    CHECK_CLOSE("cosine mid-way", schedule_lr(&s, 57), want, 1e-12, 0);
    int mono = 1;
    for (int i = 11; i < 110; i++) mono &= schedule_lr(&s, i) <= schedule_lr(&s, i - 1);
    CHECK(mono, "cosine decays monotonically after warmup");
    CHECK_CLOSE("past the end stays at the floor", schedule_lr(&s, 500), 1e-4, 1e-12, 0);
    s.kind = SCHEDULE_LINEAR;
    CHECK_CLOSE("linear mid-way", schedule_lr(&s, 10 + 33), 1e-3 - 0.9e-3 * (33.0 / 99.0), 1e-12, 0);
    CHECK_CLOSE("linear ends at the floor", schedule_lr(&s, 109), 1e-4, 1e-12, 0);
    s.kind = SCHEDULE_CONSTANT;
    CHECK_CLOSE("constant after warmup", schedule_lr(&s, 100), 1e-3, 1e-12, 0);
    LRSchedule nowarm = {SCHEDULE_COSINE, 2.0, 0.0, 0, 1};
    CHECK_CLOSE("single step, no warmup: peak", schedule_lr(&nowarm, 0), 2.0, 1e-12, 0);
}

static void test_sampler(void) {
    test_section("sampler: seeded RNG and softmax draws");
    SamplerRng a, b, c;
    sampler_seed(&a, 7);
    sampler_seed(&b, 7);
    sampler_seed(&c, 8);
    int same = 1, differ = 0;
    for (int i = 0; i < 100; i++) {
        uint64_t x = sampler_next_u64(&a), y = sampler_next_u64(&b), z = sampler_next_u64(&c);
        same &= x == y;
        differ |= x != z;
    }
    CHECK(same && differ, "same seed, same stream; another seed, another stream");
    SamplerRng zero;
    sampler_seed(&zero, 0);
    CHECK(zero.state != 0, "seed 0 gives a usable state");
    double mean = 0;
    float lo = 1, hi = 0;
    const int n_unif = 100000;
    for (int i = 0; i < n_unif; i++) {
        float u = sampler_uniform(&a);
        mean += u;
        lo = u < lo ? u : lo;
        hi = u > hi ? u : hi;
    }
    mean /= n_unif;
    CHECK(lo >= 0.0f && hi < 1.0f && fabs(mean - 0.5) < 0.005, "uniform in [0,1), mean %.4f", mean);

    /* Draw frequencies vs softmax(logits / T): chi-square over 6 bins. */
    enum { V = 6, VP = 8 };
    float logits[VP] = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f, 2.0f, 100.0f, 100.0f}; /* padded tail is huge */
    const float temps[2] = {1.0f, 0.7f};
    for (int ti = 0; ti < 2; ti++) {
        double p[V], z = 0;
        for (int i = 0; i < V; i++) z += p[i] = exp(logits[i] / temps[ti]);
        int counts[V] = {0}, outside = 0;
        const int draws = 60000;
        SamplerRng rng;
        sampler_seed(&rng, 1234 + ti);
        for (int d = 0; d < draws; d++) {
            int id = sampler_draw(logits, V, temps[ti], &rng);
            if (id < 0 || id >= V) outside++;
            else counts[id]++;
        }
        double chi2 = 0;
        for (int i = 0; i < V; i++) {
            double e = draws * p[i] / z;
            chi2 += (counts[i] - e) * (counts[i] - e) / e;
        }
        /* 5 degrees of freedom: P(chi2 > 25) ~ 1.4e-4. */
        CHECK(outside == 0 && chi2 < 25.0, "T=%.1f: padded ids never drawn, chi2 %.2f < 25", temps[ti], chi2);
    }
    SamplerRng rng;
    sampler_seed(&rng, 1);
    uint64_t before = rng.state;
    CHECK(sampler_draw(logits, V, 0.0f, &rng) == 4 && rng.state == before, "temperature 0 = argmax, no RNG use");
    float nanlog[3] = {NAN, 0.0f, INFINITY};
    CHECK(sampler_draw(nanlog, 3, 1.0f, &rng) == 1, "non-finite logits are never drawn");
    float allnan[2] = {NAN, NAN};
    CHECK(sampler_draw(allnan, 2, 1.0f, &rng) == -1, "no finite logit: -1");
    int ids[3] = {15496, 995, 50256};
    char buf[64];
    sampler_decode(NULL, ids, 3, buf, sizeof(buf));
    CHECK(strcmp(buf, "15496 995 50256") == 0, "decode without a tokenizer prints ids ('%s')", buf);
    sampler_decode(NULL, ids, 3, buf, 8);
    CHECK(strlen(buf) < 8, "decode truncates to the buffer");
}

static void fill_state(ResumeState* s, size_t n, float* m, float* v) {
    memset(s, 0, sizeof(*s));
    char err[128];
    gpt_config_from_descriptor("tiny", &s->config, err, sizeof(err));
    s->config_hash = gpt_config_hash(&s->config);
    s->step = 10;
    s->adam_t = 10;
    s->tokens_seen = 10 * 4 * 64;
    s->batch_size = 4;
    s->seq_len = 64;
    s->grad_accum = 1;
    s->world_size = 1;
    s->shuffle = 1;
    s->attn_mode = ATTN_GPROJ;
    s->attn_tile_max_shift = 0;
    s->seed = 1337;
    s->rng_state = 0x0123456789abcdefULL;
    s->params_hash = 0xfedcba9876543210ULL;
    s->data_pos.epoch = 2;
    s->data_pos.shard_pos = 1;
    s->data_pos.sample_pos = 17;
    s->data_pos.seed = 1337;
    s->data_pos.reserved[0] = 0x44504f53;
    s->num_params = n;
    for (size_t i = 0; i < n; i++) {
        m[i] = 0.001f * (float)i - 0.3f;
        v[i] = 1e-6f * (float)(i % 97);
    }
    s->m = m;
    s->v = v;
}

static void copy_file(const char* from, const char* to) {
    FILE* a = fopen(from, "rb");
    FILE* b = fopen(to, "wb");
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), a)) > 0) fwrite(buf, 1, n, b);
    fclose(a);
    fclose(b);
}

/* The bytes of a file, malloc'd, and its size. */
static unsigned char* read_bytes(const char* path, long* size) {
    FILE* f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    *size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char* bytes = (unsigned char*)malloc((size_t)*size);
    CHECK(fread(bytes, 1, (size_t)*size, f) == (size_t)*size, "read %s", path);
    fclose(f);
    return bytes;
}

/* A resume state's bytes (a header edited by hand) with its trailing checksum made right again, into path. */
static void write_state_bytes(const char* path, unsigned char* bytes, long size) {
    const uint64_t sum = resume_hash(bytes, (size_t)size - 8, RESUME_HASH_INIT);
    memcpy(bytes + size - 8, &sum, 8);
    FILE* f = fopen(path, "wb");
    fwrite(bytes, 1, (size_t)size, f);
    fclose(f);
}

static void test_resume_state(void) {
    test_section("resume state: round trip, damage refused, failed save harmless");
    const size_t n = 1000;
    float* m = (float*)malloc(n * 4);
    float* v = (float*)malloc(n * 4);
    ResumeState s, r;
    fill_state(&s, n, m, v);
    char path[300], err[512];
    snprintf(path, sizeof(path), "%s/state_00000010.bin", g_tmpdir);
    CHECK(resume_state_write(path, &s, err, sizeof(err)) == 0, "write (%s)", err);
    char tmp[320];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0, "no .tmp left behind");
    CHECK(resume_state_read(path, &r, err, sizeof(err)) == 0, "read back (%s)", err);
    CHECK(r.step == 10 && r.adam_t == 10 && r.tokens_seen == s.tokens_seen && r.num_params == n &&
              r.config.channels == s.config.channels && r.config.num_layers == s.config.num_layers &&
              r.batch_size == 4 && r.seq_len == 64 && r.grad_accum == 1 && r.world_size == 1 && r.shuffle == 1 &&
              r.attn_mode == ATTN_GPROJ && r.seed == 1337 && r.rng_state == s.rng_state &&
              r.params_hash == s.params_hash && memcmp(&r.data_pos, &s.data_pos, sizeof(DataPosition)) == 0,
          "every field round-trips");
    CHECK(r.m && r.v && memcmp(r.m, m, n * 4) == 0 && memcmp(r.v, v, n * 4) == 0, "moments round-trip bit-exactly");
    CHECK(!r.sched.recorded, "a state written without schedule settings reads with none");
    CHECK(resume_state_check(&r, &s, err, sizeof(err)) == 0, "a state fits the run that wrote it");
    resume_state_free(&r);
    /* the schedule and optimizer settings (version 5) round-trip bit for bit, and do not take part in
       resume_state_check (a resume may change them) */
    {
        ResumeState w = s;
        w.sched = (ResumeSchedule){1, 3000, 700, SCHEDULE_LINEAR, 6e-4f, 0.1f, 0.05f, 0.9f, 0.95f, 1e-8f, 1.0f};
        CHECK(resume_state_write(path, &w, err, sizeof(err)) == 0 &&
                  resume_state_read(path, &r, err, sizeof(err)) == 0 &&
                  memcmp(&r.sched, &w.sched, sizeof(ResumeSchedule)) == 0,
              "the schedule and optimizer settings round-trip (%s)", err);
        CHECK(resume_state_check(&r, &s, err, sizeof(err)) == 0, "... and are not compared by resume_state_check");
        resume_state_free(&r);
        CHECK(resume_state_write(path, &s, err, sizeof(err)) == 0 &&
                  resume_state_read(path, &r, err, sizeof(err)) == 0,
              "rewrite the plain state (%s)", err);
    }
    ResumeState other = s;
    other.batch_size = 8;
    CHECK(resume_state_check(&r, &other, err, sizeof(err)) == -1 && strstr(err, "batch size 4, this run has 8"),
          "another batch size refused (%s)", err);
    other = s;
    gpt_config_from_descriptor("small", &other.config, err, sizeof(err));
    CHECK(resume_state_check(&r, &other, err, sizeof(err)) == -1 && strstr(err, "another model"),
          "another model refused (%s)", err);
    other = s;
    other.config.qk_norm = 1; /* same shape and (here) parameter count, another architecture */
    CHECK(resume_state_check(&r, &other, err, sizeof(err)) == -1 && strstr(err, "options: GPT-2's") &&
              strstr(err, "options: --qk-norm 1"),
          "the same shape with another option refused, naming both (%s)", err);
    resume_state_free(&r);

    /* The architecture options round-trip (version 3) and enter the config hash. */
    {
        ResumeState o = s;
        o.config.pos = GPT_POS_ROPE;
        o.config.rope_base = 12345.5f;
        o.config.norm = GPT_NORM_RMSNORM;
        o.config.mlp = GPT_MLP_SWIGLU;
        o.config.mlp_hidden = 192;
        o.config.qk_norm = 1;
        o.config.bias = 0;
        o.config.tie_embeddings = 0;
        o.config_hash = gpt_config_hash(&o.config);
        CHECK(o.config_hash != s.config_hash, "options change the config hash");
        char opath[320];
        snprintf(opath, sizeof(opath), "%s/options_state.bin", g_tmpdir);
        CHECK(resume_state_write(opath, &o, err, sizeof(err)) == 0, "write with options (%s)", err);
        CHECK(resume_state_read(opath, &r, err, sizeof(err)) == 0 && memcmp(&r.config, &o.config, sizeof(GPTConfig)) == 0,
              "every option reads back (%s)", err);
        CHECK(resume_state_check(&r, &o, err, sizeof(err)) == 0, "and fits its run");
        resume_state_free(&r);
        /* A version-2 file (written before the options existed) is a GPT-2 model: rewrite the version
           slot and the checksum of the GPT-2 state written above, and clear the option slots. */
        long size;
        unsigned char* bytes = read_bytes(path, &size);
        int64_t* h = (int64_t*)bytes;
        h[1] = 2;
        for (int k = 27; k < 35; k++) h[k] = 0; /* RH_OPTIONS: the 8 architecture options */
        snprintf(opath, sizeof(opath), "%s/v2_state.bin", g_tmpdir);
        write_state_bytes(opath, bytes, size);
        free(bytes);
        CHECK(resume_state_read(opath, &r, err, sizeof(err)) == 0 && gpt_config_is_gpt2(&r.config) &&
                  resume_state_check(&r, &s, err, sizeof(err)) == 0,
              "a version-2 state reads as a GPT-2 model and fits its run (%s)", err);
        resume_state_free(&r);
        unlink(opath);
        snprintf(opath, sizeof(opath), "%s/options_state.bin", g_tmpdir);
        unlink(opath);
    }

    /* The GPU trainer's GEMM algorithm records round-trip (version 4); a version-3 file reads with none; a
       record count that does not match the file's size is refused. */
    {
        ResumeState g = s;
        g.num_matmul_algos = 3;
        g.matmul_lib = 130100;
        for (int i = 0; i < 3; i++) {
            MatmulAlgoRecord* rec = &g.matmul_algos[i];
            rec->m = 768 * (i + 1), rec->n = 32768, rec->k = 2304, rec->trans_a = i & 1, rec->trans_b = 0;
            rec->accumulate = i == 2, rec->epilogue = i;
            for (int w = 0; w < 8; w++) rec->algo[w] = 0x9e3779b97f4a7c15ULL * (uint64_t)(8 * i + w + 1);
        }
        char gpath[320];
        snprintf(gpath, sizeof(gpath), "%s/algos_state.bin", g_tmpdir);
        CHECK(resume_state_write(gpath, &g, err, sizeof(err)) == 0, "write with 3 GEMM records (%s)", err);
        CHECK(resume_state_read(gpath, &r, err, sizeof(err)) == 0 && r.num_matmul_algos == 3 &&
                  r.matmul_lib == 130100 && memcmp(r.matmul_algos, g.matmul_algos, 3 * sizeof(MatmulAlgoRecord)) == 0,
              "the GEMM records and the library version read back byte for byte (%s)", err);
        resume_state_free(&r);
        g.num_matmul_algos = MATMUL_MAX_RECORDS + 1;
        CHECK(resume_state_write(gpath, &g, err, sizeof(err)) == -1 && strstr(err, "GEMM algorithm records"),
              "more records than a state holds refused on write (%s)", err);
        /* version 3: the state written first (no records), its version slot set to 3 */
        long size;
        unsigned char* bytes = read_bytes(path, &size);
        int64_t* h = (int64_t*)bytes;
        h[1] = 3;
        snprintf(gpath, sizeof(gpath), "%s/v3_state.bin", g_tmpdir);
        write_state_bytes(gpath, bytes, size);
        CHECK(resume_state_read(gpath, &r, err, sizeof(err)) == 0 && r.num_matmul_algos == 0 && r.matmul_lib == 0 &&
                  resume_state_check(&r, &s, err, sizeof(err)) == 0,
              "a version-3 state reads with no GEMM records and fits its run (%s)", err);
        resume_state_free(&r);
        /* version 4 claiming one record the file does not hold */
        h[1] = 4;
        h[35] = 1; /* RH_NUM_MATMUL_ALGOS */
        write_state_bytes(gpath, bytes, size);
        CHECK(resume_state_read(gpath, &r, err, sizeof(err)) == -1 && strstr(err, "corrupt resume state header"),
              "a record count the file's size does not hold is refused (%s)", err);
        free(bytes);
        unlink(gpath);
        snprintf(gpath, sizeof(gpath), "%s/algos_state.bin", g_tmpdir);
        unlink(gpath);
    }

    /* Truncated. */
    char bad[320];
    snprintf(bad, sizeof(bad), "%s/bad.bin", g_tmpdir);
    struct stat st;
    stat(path, &st);
    copy_file(path, bad);
    CHECK(truncate(bad, st.st_size - 100) == 0, "truncate a copy");
    CHECK(resume_state_read(bad, &r, err, sizeof(err)) == -1 && strstr(err, "truncated"), "truncated refused (%s)",
          err);
    CHECK(truncate(bad, 100) == 0 && resume_state_read(bad, &r, err, sizeof(err)) == -1 && strstr(err, "truncated"),
          "cut inside the header refused (%s)", err);
    /* One flipped byte in the moments. */
    copy_file(path, bad);
    FILE* fp = fopen(bad, "r+b");
    fseek(fp, 512 + 64 + 4 * 500, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, -1, SEEK_CUR);
    fputc(c ^ 0x10, fp);
    fclose(fp);
    CHECK(resume_state_read(bad, &r, err, sizeof(err)) == -1 && strstr(err, "corrupt (checksum"),
          "flipped bit refused (%s)", err);
    /* Not a state file at all (a model checkpoint header). */
    fp = fopen(bad, "wb");
    int32_t hdr[256] = {20240326, 3};
    fwrite(hdr, 4, 256, fp);
    fclose(fp);
    CHECK(resume_state_read(bad, &r, err, sizeof(err)) == -1 && strstr(err, "not a resume state file"),
          "a model checkpoint passed as state refused (%s)", err);
    CHECK(resume_state_read("/nonexistent/state.bin", &r, err, sizeof(err)) == -1 && strstr(err, "cannot open"),
          "missing file refused");

    /* A failed save (the tmp name is taken by a folder) leaves the old file intact. */
    CHECK(mkdir(tmp, 0755) == 0, "block %s", tmp);
    s.step = 20;
    m[0] = 42.0f;
    CHECK(resume_state_write(path, &s, err, sizeof(err)) == -1 && strstr(err, "previous state files are untouched"),
          "failed write reports (%s)", err);
    CHECK(resume_state_read(path, &r, err, sizeof(err)) == 0 && r.step == 10 && r.m[0] != 42.0f,
          "previous state still reads, unchanged");
    resume_state_free(&r);
    rmdir(tmp);

    /* Finding the newest state. */
    char found[300];
    int64_t step = -1;
    snprintf(bad, sizeof(bad), "%s/state_00000002.bin", g_tmpdir);
    copy_file(path, bad);
    snprintf(bad, sizeof(bad), "%s/state_00000099.bin.tmp", g_tmpdir);
    copy_file(path, bad);
    snprintf(bad, sizeof(bad), "%s/state_7.bin", g_tmpdir);
    copy_file(path, bad);
    CHECK(run_find_latest_state(g_tmpdir, found, sizeof(found), &step, err, sizeof(err)) == 0 && step == 10 &&
              strcmp(found, path) == 0,
          "newest state_NNNNNNNN.bin found (%s), .tmp and odd names ignored", found);
    char empty[300];
    snprintf(empty, sizeof(empty), "%s/empty", g_tmpdir);
    mkdir(empty, 0755);
    CHECK(run_find_latest_state(empty, found, sizeof(found), &step, err, sizeof(err)) == 1, "empty folder: none");
    run_file_path(found, sizeof(found), "runs/a", "model", 10);
    CHECK(strcmp(found, "runs/a/model_00000010.bin") == 0, "file naming");
    free(m);
    free(v);
}

static void test_runlog(void) {
    test_section("run log: JSON lines, null for non-finite, escaped text");
    char path[300], err[256];
    snprintf(path, sizeof(path), "%s/log.jsonl", g_tmpdir);
    RunLog log;
    CHECK(runlog_open(&log, path, 0, err, sizeof(err)) == 0, "open");
    StepRecord r = {3, 10, 5.25, 1e-3, 0.5, 1000.0, 12.5, "bf16"};
    runlog_step(&log, &r);
    r.loss = NAN;
    runlog_step(&log, &r);
    runlog_eval(&log, 4, 4.5, 2);
    int ids[2] = {1, 2};
    runlog_sample(&log, 4, "say \"hi\"\n", ids, 2);
    FILE* f = runlog_begin(&log, "stop");
    fprintf(f, ", \"step\": 4");
    runlog_end(&log);
    runlog_close(&log);
    char* text = read_text(path);
    const char* want =
        "{\"step\": 3, \"loss\": 5.25, \"lr\": 0.001, \"grad_norm\": 0.5, \"tokens_per_s\": 1000, \"ms\": 12.5, "
        "\"attn\": \"bf16\"}\n"
        "{\"step\": 3, \"loss\": null, \"lr\": 0.001, \"grad_norm\": 0.5, \"tokens_per_s\": 1000, \"ms\": 12.5, "
        "\"attn\": \"bf16\"}\n"
        "{\"step\": 4, \"val_loss\": 4.5, \"val_batches\": 2}\n"
        "{\"step\": 4, \"sample\": \"say \\\"hi\\\"\\n\", \"tokens\": [1, 2]}\n"
        "{\"event\": \"stop\", \"step\": 4}\n";
    CHECK(text && strcmp(text, want) == 0, "log content exact:\n%s", text ? text : "(none)");
    free(text);
    CHECK(runlog_open(&log, "/nonexistent/dir/log.jsonl", 1, err, sizeof(err)) == -1 &&
              strstr(err, "/nonexistent/dir/log.jsonl"),
          "unwritable log path named in the error");
    char d[32];
    runlog_format_duration(83, d, sizeof(d));
    CHECK(strcmp(d, "1m23s") == 0, "83 s = %s", d);
    runlog_format_duration(4000, d, sizeof(d));
    CHECK(strcmp(d, "1h06m40s") == 0, "4000 s = %s", d);
}

static jmp_buf g_log_failed;
static char g_log_msg[600];
static void catch_log_error(void* ctx, const char* msg) {
    (void)ctx;
    snprintf(g_log_msg, sizeof(g_log_msg), "%s", msg);
    longjmp(g_log_failed, 1);
}

static void test_runlog_write_failure(void) {
    test_section("run log: a failed write reaches the error handler");
    char err[256];
    RunLog log;
    /* /dev/full accepts the open and fails every write with ENOSPC, as a full disk does */
    if (runlog_open(&log, "/dev/full", 1, err, sizeof(err)) != 0) {
        printf("  note: /dev/full cannot be opened here (%s); the end-to-end test (ulimit -f) covers this\n", err);
        return;
    }
    runlog_set_error_handler(&log, catch_log_error, NULL);
    g_log_msg[0] = '\0';
    if (setjmp(g_log_failed) == 0) {
        runlog_eval(&log, 1, 2.0, 3);
        CHECK(0, "a write to /dev/full returned as if it had worked");
    } else {
        CHECK(strstr(g_log_msg, "writing the run log '/dev/full' failed: No space left on device") != NULL,
              "the handler got the file and the reason: %s", g_log_msg);
    }
    CHECK(log.fp == NULL, "the broken log is closed (nothing more is written to it)");
}

static void test_run_driver_helpers(void) {
    test_section("run driver: run files, resume command, finite weights, checkpoint listing");
    CHECK(run_is_run_file("log.jsonl") && run_is_run_file("model_00000010.bin") &&
              run_is_run_file("state_00000010.bin.tmp") && !run_is_run_file("model_best.bin") &&
              !run_is_run_file("model_0000001.bin") && !run_is_run_file("notes.txt"),
          "run files: log.jsonl and model_/state_ + 8 digits only");

    const char* argv[] = {"build/train_gpt_cpu", "--steps", "20", "--overwrite", "--out-dir", "runs/x y",
                          "--lr=3e-3", "--init-from", "m.bin", "--resume", "--model", "tiny", "--batch-size", "4",
                          "--overwrite", "1", "--val-data", "", "--resume=latest"};
    char cmd[1024];
    run_resume_command((int)(sizeof(argv) / sizeof(argv[0])), (char**)argv, "runs/x y", NULL, cmd, sizeof(cmd));
    const char* want = "build/train_gpt_cpu --steps 20 --lr=3e-3 --batch-size 4 --val-data '' --resume --out-dir "
                       "'runs/x y'";
    CHECK(strcmp(cmd, want) == 0, "resume command drops --overwrite/--init-from/--model/--resume/--out-dir and "
          "quotes:\n    got  %s\n    want %s", cmd, want);
    run_resume_command(1, (char**)argv, "r", "r/state_00000004.bin", cmd, sizeof(cmd));
    CHECK(strcmp(cmd, "build/train_gpt_cpu --resume r/state_00000004.bin --out-dir r") == 0,
          "resume command with a state: %s", cmd);

    GPTConfig cfg;
    char err[512];
    gpt_config_from_descriptor("tiny", &cfg, err, sizeof(err));
    ParamTensorInfo table[NUM_PARAM_TENSORS];
    const size_t n = gpt_param_table(&cfg, table);
    float* p = (float*)calloc(n, sizeof(float));
    CHECK(run_check_finite_params(&cfg, p, err, sizeof(err)) == 0, "finite weights pass");
    const size_t per_layer = table[P_QKVW].count / (size_t)table[P_QKVW].layers;
    p[table[P_QKVW].offset + per_layer + 7] = INFINITY;
    char want_err[128];
    snprintf(want_err, sizeof(want_err), "tensor 'qkvw' element %zu (layer 1, element 7 of the layer", per_layer + 7);
    CHECK(run_check_finite_params(&cfg, p, err, sizeof(err)) == -1 && strstr(err, want_err) && strstr(err, "infinite"),
          "an infinite weight is named by tensor, layer and index: %s", err);
    free(p);

    char dir[300], path[400], listing[4500];
    snprintf(dir, sizeof(dir), "%s/ck", g_tmpdir);
    mkdir(dir, 0755);
    run_describe_checkpoints(dir, listing, sizeof(listing));
    CHECK(strstr(listing, "none") != NULL && run_newest_checkpoint(dir, -1) == -1, "empty folder: %s", listing);
    const char* names[] = {"model_00000010.bin", "state_00000010.bin", "model_00000020.bin", "state_00000020.bin",
                           "state_00000030.bin" /* its model is missing: not a checkpoint */};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        FILE* fp = fopen(path, "wb");
        if (fp) fclose(fp);
    }
    run_describe_checkpoints(dir, listing, sizeof(listing));
    snprintf(path, sizeof(path), "%s/state_00000020.bin (newest of 2 on disk)", dir);
    CHECK(strcmp(listing, path) == 0, "listing names the newest complete pair: %s", listing);
    CHECK(run_newest_checkpoint(dir, 19) == 10 && run_newest_checkpoint(dir, -1) == 20,
          "newest checkpoint at or before a step");
}

int main(void) {
    snprintf(g_tmpdir, sizeof(g_tmpdir), "/tmp/test_train_cpu_XXXXXX");
    if (mkdtemp(g_tmpdir) == NULL) {
        printf("cannot make a temp folder\n0 passed, 1 failed\n");
        return 1;
    }
    test_flags();
    test_schedule();
    test_sampler();
    test_resume_state();
    test_runlog();
    test_runlog_write_failure();
    test_run_driver_helpers();
    char cmd[300];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_tmpdir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", g_tmpdir);
    return test_summary();
}
