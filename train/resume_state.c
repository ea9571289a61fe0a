/*
 * train/resume_state.c - writing, reading and checking the resume-state file
 * (format in resume_state.h).
 */
#include "train/resume_state.h"

#include "common/atomic_file.h"
#include "common/utils.h"
#include "train/schedule.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Header slots (int64 each). Never renumber: bump RESUME_VERSION instead. */
enum {
    RH_MAGIC = 0,
    RH_VERSION,
    RH_HEADER_BYTES,
    RH_STEP,
    RH_ADAM_T,
    RH_TOKENS_SEEN,
    RH_NUM_PARAMS,
    RH_CONFIG_HASH,
    RH_MAX_SEQ_LEN,
    RH_VOCAB_SIZE,
    RH_PADDED_VOCAB_SIZE,
    RH_NUM_LAYERS,
    RH_NUM_HEADS,
    RH_CHANNELS,
    RH_BATCH_SIZE,
    RH_SEQ_LEN,
    RH_GRAD_ACCUM,
    RH_WORLD_SIZE,
    RH_SHUFFLE,
    RH_ATTN_MODE,
    RH_ATTN_TILE_MAX_SHIFT,
    RH_SEED,
    RH_RNG_STATE,
    RH_PARAMS_HASH,
    RH_DATA_POS_BYTES,
    RH_FILE_BYTES,
    RH_ZERO_KEY_BIAS_GRAD, /* version 2 */
    RH_OPTIONS,            /* version 3: the architecture options, GPT_CONFIG_OPTION_FIELDS slots in
                              gpt_config_options_pack's order (model/gpt_config.h) */
    RH_NUM_MATMUL_ALGOS = RH_OPTIONS + GPT_CONFIG_OPTION_FIELDS, /* version 4 */
    RH_MATMUL_LIB,                                               /* version 4 */
    RH_STEPS,              /* version 5: ResumeSchedule; the floats as their IEEE-754 bits */
    RH_WARMUP_STEPS,
    RH_SCHEDULE,
    RH_LR,
    RH_MIN_LR_FRAC,
    RH_WEIGHT_DECAY,
    RH_BETA1,
    RH_BETA2,
    RH_ADAM_EPS,
    RH_GRAD_CLIP,
    RH_FIRST_UNUSED,
    RESUME_HEADER_INTS = 64
};
_Static_assert(RH_FIRST_UNUSED <= RESUME_HEADER_INTS, "the resume header holds every field");

#define HEADER_BYTES (RESUME_HEADER_INTS * 8)

static int64_t float_slot(float x) {
    uint32_t bits;
    memcpy(&bits, &x, 4);
    return (int64_t)bits;
}
static float slot_float(int64_t v) {
    const uint32_t bits = (uint32_t)v;
    float x;
    memcpy(&x, &bits, 4);
    return x;
}
/* DataPosition is padded to a multiple of 8 bytes in the file. */
#define DATA_POS_FILE_BYTES ((sizeof(DataPosition) + 7) / 8 * 8)

uint64_t resume_hash(const void* data, size_t nbytes, uint64_t h) {
    const unsigned char* p = (const unsigned char*)data;
    const uint64_t prime = 0x100000001b3ULL;
    size_t words = nbytes / 8;
    for (size_t i = 0; i < words; i++) {
        uint64_t w;
        memcpy(&w, p + 8 * i, 8);
        h = (h ^ w) * prime;
        h ^= h >> 29;
    }
    for (size_t i = words * 8; i < nbytes; i++) h = (h ^ p[i]) * prime;
    return h;
}

uint64_t gpt_config_hash(const GPTConfig* c) {
    int64_t f[6] = {c->max_seq_len, c->vocab_size, c->padded_vocab_size, c->num_layers, c->num_heads, c->channels};
    const uint64_t h = resume_hash(f, sizeof(f), RESUME_HASH_INIT);
    if (gpt_config_is_gpt2(c)) return h;
    int64_t o[8] = {c->pos, float_slot(c->rope_base), c->norm, c->mlp, c->mlp_hidden, c->qk_norm, c->bias,
                    c->tie_embeddings};
    return resume_hash(o, sizeof(o), h);
}

_Static_assert(sizeof(MatmulAlgoRecord) == 96, "a GEMM algorithm record is 96 bytes in the file");

static uint64_t file_bytes(size_t num_params, int64_t num_algos) {
    return (uint64_t)HEADER_BYTES + DATA_POS_FILE_BYTES + 2ULL * 4ULL * (uint64_t)num_params +
           (uint64_t)num_algos * sizeof(MatmulAlgoRecord) + 8ULL;
}

/* fwrite that also feeds the checksum; 0 or -1 (errno kept). */
static int put(FILE* fp, const void* p, size_t n, uint64_t* h) {
    *h = resume_hash(p, n, *h);
    return fwrite(p, 1, n, fp) == n ? 0 : -1;
}

int resume_state_write(const char* path, const ResumeState* s, char* err, size_t errlen) {
    char msg[512];
    if (s->num_matmul_algos < 0 || s->num_matmul_algos > MATMUL_MAX_RECORDS) {
        snprintf(err, errlen, "internal: %d GEMM algorithm records (0..%d)", s->num_matmul_algos, MATMUL_MAX_RECORDS);
        return -1;
    }
    AtomicFile af;
    FILE* fp = atomic_file_open(&af, path, msg, sizeof(msg));
    if (fp == NULL) {
        snprintf(err, errlen, "cannot write the resume state: %s (is the run folder writable?); the previous "
                 "state files are untouched", msg);
        return -1;
    }
    int64_t hdr[RESUME_HEADER_INTS];
    memset(hdr, 0, sizeof(hdr));
    hdr[RH_MAGIC] = RESUME_MAGIC;
    hdr[RH_VERSION] = RESUME_VERSION;
    hdr[RH_HEADER_BYTES] = HEADER_BYTES;
    hdr[RH_STEP] = s->step;
    hdr[RH_ADAM_T] = s->adam_t;
    hdr[RH_TOKENS_SEEN] = s->tokens_seen;
    hdr[RH_NUM_PARAMS] = (int64_t)s->num_params;
    hdr[RH_CONFIG_HASH] = (int64_t)gpt_config_hash(&s->config);
    hdr[RH_MAX_SEQ_LEN] = s->config.max_seq_len;
    hdr[RH_VOCAB_SIZE] = s->config.vocab_size;
    hdr[RH_PADDED_VOCAB_SIZE] = s->config.padded_vocab_size;
    hdr[RH_NUM_LAYERS] = s->config.num_layers;
    hdr[RH_NUM_HEADS] = s->config.num_heads;
    hdr[RH_CHANNELS] = s->config.channels;
    hdr[RH_BATCH_SIZE] = s->batch_size;
    hdr[RH_SEQ_LEN] = s->seq_len;
    hdr[RH_GRAD_ACCUM] = s->grad_accum;
    hdr[RH_WORLD_SIZE] = s->world_size;
    hdr[RH_SHUFFLE] = s->shuffle;
    hdr[RH_ATTN_MODE] = s->attn_mode;
    hdr[RH_ATTN_TILE_MAX_SHIFT] = s->attn_tile_max_shift;
    hdr[RH_SEED] = (int64_t)s->seed;
    hdr[RH_RNG_STATE] = (int64_t)s->rng_state;
    hdr[RH_PARAMS_HASH] = (int64_t)s->params_hash;
    hdr[RH_DATA_POS_BYTES] = (int64_t)sizeof(DataPosition);
    hdr[RH_FILE_BYTES] = (int64_t)file_bytes(s->num_params, s->num_matmul_algos);
    hdr[RH_ZERO_KEY_BIAS_GRAD] = s->zero_key_bias_grad;
    gpt_config_options_pack(&s->config, &hdr[RH_OPTIONS]);
    hdr[RH_NUM_MATMUL_ALGOS] = s->num_matmul_algos;
    hdr[RH_MATMUL_LIB] = s->num_matmul_algos > 0 ? s->matmul_lib : 0;
    hdr[RH_STEPS] = s->sched.recorded ? s->sched.steps : 0; /* 0: none recorded (steps is at least 1) */
    hdr[RH_WARMUP_STEPS] = s->sched.warmup_steps;
    hdr[RH_SCHEDULE] = s->sched.schedule;
    hdr[RH_LR] = float_slot(s->sched.lr);
    hdr[RH_MIN_LR_FRAC] = float_slot(s->sched.min_lr_frac);
    hdr[RH_WEIGHT_DECAY] = float_slot(s->sched.weight_decay);
    hdr[RH_BETA1] = float_slot(s->sched.beta1);
    hdr[RH_BETA2] = float_slot(s->sched.beta2);
    hdr[RH_ADAM_EPS] = float_slot(s->sched.adam_eps);
    hdr[RH_GRAD_CLIP] = float_slot(s->sched.grad_clip);
    unsigned char pos[DATA_POS_FILE_BYTES];
    memset(pos, 0, sizeof(pos));
    memcpy(pos, &s->data_pos, sizeof(DataPosition));

    uint64_t h = RESUME_HASH_INIT;
    int ok = put(fp, hdr, sizeof(hdr), &h) == 0 && put(fp, pos, sizeof(pos), &h) == 0 &&
             put(fp, s->m, 4 * s->num_params, &h) == 0 && put(fp, s->v, 4 * s->num_params, &h) == 0 &&
             put(fp, s->matmul_algos, sizeof(MatmulAlgoRecord) * (size_t)s->num_matmul_algos, &h) == 0 &&
             fwrite(&h, 8, 1, fp) == 1;
    if (!ok) {
        snprintf(msg, sizeof(msg), "writing '%s' failed: %s", af.tmp_path, strerror(errno));
        atomic_file_abort(&af);
    }
    if (!ok || atomic_file_commit(&af, msg, sizeof(msg)) != 0) {
        snprintf(err, errlen, "writing the resume state '%s' failed: %s (is the disk full?); the previous state "
                 "files are untouched", path, msg);
        return -1;
    }
    return 0;
}

void resume_state_free(ResumeState* s) {
    free(s->m);
    free(s->v);
    s->m = s->v = NULL;
}

static int get(FILE* fp, void* p, size_t n, uint64_t* h) {
    if (fread(p, 1, n, fp) != n) return -1;
    *h = resume_hash(p, n, *h);
    return 0;
}

int resume_state_read(const char* path, ResumeState* s, char* err, size_t errlen) {
    memset(s, 0, sizeof(*s));
    uint64_t size = 0;
    FILE* fp = fopen_sized(path, "the resume state", &size, err, errlen);
    if (fp == NULL) return -1;
    int64_t hdr[RESUME_HEADER_INTS];
    uint64_t h = RESUME_HASH_INIT;
    const char* hint = "re-create it, or resume from an older state_NNNNNNNN.bin in the run folder";
    if (size < sizeof(hdr) || get(fp, hdr, sizeof(hdr), &h) != 0) {
        snprintf(err, errlen, "%s: truncated resume state (%llu bytes, shorter than its %d-byte header); %s", path,
                 (unsigned long long)size, HEADER_BYTES, hint);
        fclose(fp);
        return -1;
    }
    if (hdr[RH_MAGIC] != RESUME_MAGIC) {
        snprintf(err, errlen, "%s: not a resume state file (magic %lld, expected %d); pass a state_NNNNNNNN.bin "
                 "file (not a model checkpoint) to --resume", path, (long long)hdr[RH_MAGIC], RESUME_MAGIC);
        fclose(fp);
        return -1;
    }
    if (hdr[RH_VERSION] == 1) {
        snprintf(err, errlen, "%s: resume state version 1 does not record --zero-key-bias-grad (the gauge arm), so "
                 "this build (version %d) cannot tell which arm the run was; continue it with the build that wrote "
                 "it, or start a new run from its weights with --init-from model_NNNNNNNN.bin and the arm you "
                 "mean", path, RESUME_VERSION);
        fclose(fp);
        return -1;
    }
    const int64_t version = hdr[RH_VERSION];
    if (version < 2 || version > RESUME_VERSION) {
        snprintf(err, errlen, "%s: resume state version %lld is not supported (this build reads versions 2 to %d)",
                 path, (long long)hdr[RH_VERSION], RESUME_VERSION);
        fclose(fp);
        return -1;
    }
    if (hdr[RH_HEADER_BYTES] != HEADER_BYTES) {
        snprintf(err, errlen, "%s: corrupt resume state header (header size %lld, every version has %d); %s", path,
                 (long long)hdr[RH_HEADER_BYTES], HEADER_BYTES, hint);
        fclose(fp);
        return -1;
    }
    if (hdr[RH_DATA_POS_BYTES] != (int64_t)sizeof(DataPosition)) {
        snprintf(err, errlen, "%s: its data position has %lld bytes, this build's has %zu (made by another "
                 "version of the program)", path, (long long)hdr[RH_DATA_POS_BYTES], sizeof(DataPosition));
        fclose(fp);
        return -1;
    }
    int64_t np = hdr[RH_NUM_PARAMS];
    const int64_t num_algos = version >= 4 ? hdr[RH_NUM_MATMUL_ALGOS] : 0;
    if (np <= 0 || np > ((int64_t)1 << 40) || num_algos < 0 || num_algos > MATMUL_MAX_RECORDS ||
        hdr[RH_FILE_BYTES] != (int64_t)file_bytes((size_t)np, num_algos)) {
        snprintf(err, errlen, "%s: corrupt resume state header (parameter count %lld, %lld GEMM algorithm records, "
                 "recorded size %lld); %s", path, (long long)np, (long long)num_algos, (long long)hdr[RH_FILE_BYTES],
                 hint);
        fclose(fp);
        return -1;
    }
    if (size != (uint64_t)hdr[RH_FILE_BYTES]) {
        snprintf(err, errlen, "%s: resume state is %llu bytes, its header says %lld (%s); %s", path,
                 (unsigned long long)size, (long long)hdr[RH_FILE_BYTES],
                 size < (uint64_t)hdr[RH_FILE_BYTES] ? "truncated" : "trailing garbage", hint);
        fclose(fp);
        return -1;
    }
    s->step = hdr[RH_STEP];
    s->adam_t = hdr[RH_ADAM_T];
    s->tokens_seen = hdr[RH_TOKENS_SEEN];
    s->num_params = (size_t)np;
    s->config.max_seq_len = (int)hdr[RH_MAX_SEQ_LEN];
    s->config.vocab_size = (int)hdr[RH_VOCAB_SIZE];
    s->config.padded_vocab_size = (int)hdr[RH_PADDED_VOCAB_SIZE];
    s->config.num_layers = (int)hdr[RH_NUM_LAYERS];
    s->config.num_heads = (int)hdr[RH_NUM_HEADS];
    s->config.channels = (int)hdr[RH_CHANNELS];
    gpt_config_set_gpt2_options(&s->config); /* version 2: a GPT-2 model */
    if (version >= 3) gpt_config_options_unpack(&s->config, &hdr[RH_OPTIONS]);
    s->config_hash = (uint64_t)hdr[RH_CONFIG_HASH];
    s->batch_size = (int32_t)hdr[RH_BATCH_SIZE];
    s->seq_len = (int32_t)hdr[RH_SEQ_LEN];
    s->grad_accum = (int32_t)hdr[RH_GRAD_ACCUM];
    s->world_size = (int32_t)hdr[RH_WORLD_SIZE];
    s->shuffle = (int32_t)hdr[RH_SHUFFLE];
    s->attn_mode = (int32_t)hdr[RH_ATTN_MODE];
    s->attn_tile_max_shift = (int32_t)hdr[RH_ATTN_TILE_MAX_SHIFT];
    s->zero_key_bias_grad = (int32_t)hdr[RH_ZERO_KEY_BIAS_GRAD];
    s->seed = (uint64_t)hdr[RH_SEED];
    s->rng_state = (uint64_t)hdr[RH_RNG_STATE];
    s->params_hash = (uint64_t)hdr[RH_PARAMS_HASH];
    s->num_matmul_algos = (int32_t)num_algos;
    s->matmul_lib = version >= 4 ? hdr[RH_MATMUL_LIB] : 0;
    if (version >= 5 && hdr[RH_STEPS] != 0) {
        s->sched.recorded = 1;
        s->sched.steps = (int32_t)hdr[RH_STEPS];
        s->sched.warmup_steps = (int32_t)hdr[RH_WARMUP_STEPS];
        s->sched.schedule = (int32_t)hdr[RH_SCHEDULE];
        s->sched.lr = slot_float(hdr[RH_LR]);
        s->sched.min_lr_frac = slot_float(hdr[RH_MIN_LR_FRAC]);
        s->sched.weight_decay = slot_float(hdr[RH_WEIGHT_DECAY]);
        s->sched.beta1 = slot_float(hdr[RH_BETA1]);
        s->sched.beta2 = slot_float(hdr[RH_BETA2]);
        s->sched.adam_eps = slot_float(hdr[RH_ADAM_EPS]);
        s->sched.grad_clip = slot_float(hdr[RH_GRAD_CLIP]);
    }

    unsigned char pos[DATA_POS_FILE_BYTES];
    s->m = (float*)malloc(4 * s->num_params);
    s->v = (float*)malloc(4 * s->num_params);
    uint64_t stored = 0;
    if (s->m == NULL || s->v == NULL) {
        snprintf(err, errlen, "%s: out of memory for %zu optimizer moments", path, s->num_params);
        resume_state_free(s);
        fclose(fp);
        return -1;
    }
    if (get(fp, pos, sizeof(pos), &h) != 0 || get(fp, s->m, 4 * s->num_params, &h) != 0 ||
        get(fp, s->v, 4 * s->num_params, &h) != 0 ||
        get(fp, s->matmul_algos, sizeof(MatmulAlgoRecord) * (size_t)num_algos, &h) != 0 ||
        fread(&stored, 8, 1, fp) != 1) {
        snprintf(err, errlen, "%s: read error in the resume state: %s; %s", path,
                 ferror(fp) ? strerror(errno) : "unexpected end of file", hint);
        resume_state_free(s);
        fclose(fp);
        return -1;
    }
    fclose(fp);
    if (stored != h) {
        snprintf(err, errlen, "%s: resume state is corrupt (checksum %016llx, computed %016llx); %s", path,
                 (unsigned long long)stored, (unsigned long long)h, hint);
        resume_state_free(s);
        return -1;
    }
    memcpy(&s->data_pos, pos, sizeof(DataPosition));
    if (gpt_config_hash(&s->config) != s->config_hash || s->step < 0 || s->adam_t < 0 || s->batch_size < 1 ||
        s->seq_len < 1 || s->grad_accum < 1 || s->world_size < 1 || s->attn_mode < 0 ||
        (s->zero_key_bias_grad != 0 && s->zero_key_bias_grad != 1) ||
        (s->sched.recorded && (s->sched.steps < 1 || s->sched.warmup_steps < 0 || s->sched.schedule < 0 ||
                               s->sched.schedule > SCHEDULE_CONSTANT || !(s->sched.lr > 0.0f)))) {
        snprintf(err, errlen, "%s: resume state is inconsistent (config hash or counters out of range); %s", path,
                 hint);
        resume_state_free(s);
        return -1;
    }
    return 0;
}

int resume_zero_key_bias_grad(const ResumeState* saved, int flag_value, int flag_given, char* err, size_t errlen) {
    if (!flag_given || flag_value == saved->zero_key_bias_grad) return saved->zero_key_bias_grad;
    snprintf(err, errlen, "the run was saved with --zero-key-bias-grad %d (gauge arm %s) and this resume asks for "
             "--zero-key-bias-grad %d: switching the arm mid-run mixes two experiment arms\n"
             "  hint: resume with --zero-key-bias-grad %d (or leave the flag out to keep the saved value); to train "
             "the other arm, start a new run (--init-from the model file for the same starting weights)",
             saved->zero_key_bias_grad, saved->zero_key_bias_grad ? "on" : "off", flag_value,
             saved->zero_key_bias_grad);
    return -1;
}

int resume_state_check(const ResumeState* saved, const ResumeState* cur, char* err, size_t errlen) {
    const GPTConfig *a = &saved->config, *b = &cur->config;
    if (saved->config_hash != gpt_config_hash(b) || saved->num_params != cur->num_params) {
        char oa[256], ob[256];
        gpt_config_describe_options(a, oa, sizeof(oa));
        gpt_config_describe_options(b, ob, sizeof(ob));
        snprintf(err, errlen, "the resume state is for another model (L%d C%d NH%d T%d V%d, options: %s, %zu "
                 "parameters), this run has L%d C%d NH%d T%d V%d, options: %s, %zu parameters", a->num_layers,
                 a->channels, a->num_heads, a->max_seq_len, a->padded_vocab_size, oa[0] ? oa : "GPT-2's",
                 saved->num_params, b->num_layers, b->channels, b->num_heads, b->max_seq_len, b->padded_vocab_size,
                 ob[0] ? ob : "GPT-2's", cur->num_params);
        return -1;
    }
    struct { const char* what; const char* flag; int64_t was, now; } fields[] = {
        {"batch size", "--batch-size", saved->batch_size, cur->batch_size},
        {"sequence length", "--seq-len", saved->seq_len, cur->seq_len},
        {"gradient accumulation", "--total-batch-tokens", saved->grad_accum, cur->grad_accum},
        {"process count", "the launcher's process count", saved->world_size, cur->world_size},
        {"data shuffling", "--shuffle", saved->shuffle, cur->shuffle},
        {"seed", "--seed", (int64_t)saved->seed, (int64_t)cur->seed},
    };
    for (size_t i = 0; i < sizeof(fields) / sizeof(fields[0]); i++) {
        if (fields[i].was != fields[i].now) {
            snprintf(err, errlen, "the resume state was saved with %s %lld, this run has %lld: give %s as before "
                     "(or start a new run with --init-from the model checkpoint)", fields[i].what,
                     (long long)fields[i].was, (long long)fields[i].now, fields[i].flag);
            return -1;
        }
    }
    return 0;
}

void run_file_path(char* buf, size_t n, const char* dir, const char* prefix, int64_t step) {
    snprintf(buf, n, "%s/%s_%08lld.bin", dir, prefix, (long long)step);
}

int run_find_latest_state(const char* dir, char* path, size_t n, int64_t* step, char* err, size_t errlen) {
    DIR* d = opendir(dir);
    if (d == NULL) {
        snprintf(err, errlen, "cannot read the run folder '%s': %s", dir, strerror(errno));
        return -1;
    }
    int64_t best = -1;
    struct dirent* e;
    while ((e = readdir(d)) != NULL) {
        const char* name = e->d_name;
        /* exactly state_ + 8 digits + .bin */
        if (strlen(name) != 18 || strncmp(name, "state_", 6) != 0 || strcmp(name + 14, ".bin") != 0) continue;
        int64_t v = 0;
        int digits = 1;
        for (int i = 6; i < 14; i++) {
            if (name[i] < '0' || name[i] > '9') { digits = 0; break; }
            v = v * 10 + (name[i] - '0');
        }
        if (digits && v > best) best = v;
    }
    closedir(d);
    if (best < 0) return 1;
    *step = best;
    run_file_path(path, n, dir, "state", best);
    return 0;
}
