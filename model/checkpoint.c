/*
 * model/checkpoint.c - llm.c-layout model files (see checkpoint.h).
 *
 * Why a file of its own: reading must refuse anything odd with a message that
 * names the file and the problem (the trainer turns it into a fatal error or
 * a fallback; tests check each refusal), and writing must never destroy the
 * previous checkpoint, whatever fails along the way (full disk, file-size
 * limit, unwritable folder): common/atomic_file writes "<path>.tmp", fflushes,
 * fsyncs, closes, then renames over <path> and fsyncs the folder.
 */
#include "model/checkpoint.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/atomic_file.h"
#include "common/utils.h"
#include "attention/attention.h"  /* float_to_bf16_bits / bf16_bits_to_float: the project's one BF16 rounding */

/* Generous sanity limits: far above any model this project trains, far below garbage. */
#define CKPT_MAX_LAYERS 1024
#define CKPT_MAX_CHANNELS 65536
#define CKPT_MAX_HEADS 4096
#define CKPT_MAX_SEQ_LEN (1 << 20)
#define CKPT_MAX_VOCAB (1 << 24)

/* Version 6's option slots (checkpoint.h). */
enum {
    HDR_WEIGHT_BITS = 8,
    HDR_OPTIONS, /* GPT_CONFIG_OPTION_FIELDS slots: pos, rope_base's bits, norm, mlp, mlp_hidden, qk_norm, bias,
                    tie_embeddings (gpt_config_options_pack) */
    HDR_FIRST_UNUSED = HDR_OPTIONS + GPT_CONFIG_OPTION_FIELDS
};

/* Elements written per fwrite/fread call when converting bf16 <-> fp32. */
#define CKPT_CHUNK 65536

static int write_all(FILE* fp, const void* data, size_t size, size_t n) {
    return fwrite(data, size, n, fp) == n ? 0 : -1;
}

int checkpoint_write_model(const char* path, const GPTConfig* cfg, const float* params, int bf16,
                           char* err, size_t errlen) {
    char msg[256];
    if (gpt_config_validate(cfg, msg, sizeof(msg)) != 0) {
        snprintf(err, errlen, "not saving checkpoint '%s': invalid model config: %s", path, msg);
        return -1;
    }
    const size_t n = gpt_num_parameters(cfg);
    int32_t header[CHECKPOINT_HEADER_INTS];
    memset(header, 0, sizeof(header));
    header[0] = CHECKPOINT_MAGIC;
    header[1] = bf16 ? CHECKPOINT_VERSION_BF16 : CHECKPOINT_VERSION_FP32;
    header[2] = cfg->max_seq_len;
    header[3] = cfg->vocab_size;
    header[4] = cfg->num_layers;
    header[5] = cfg->num_heads;
    header[6] = cfg->channels;
    header[7] = cfg->padded_vocab_size;
    if (!gpt_config_is_gpt2(cfg)) { /* llm.c's layout cannot say what the model computes: version 6 */
        header[1] = CHECKPOINT_VERSION_OPTIONS;
        header[HDR_WEIGHT_BITS] = bf16 ? 16 : 32;
        int64_t options[GPT_CONFIG_OPTION_FIELDS];
        gpt_config_options_pack(cfg, options);
        for (int i = 0; i < GPT_CONFIG_OPTION_FIELDS; i++) header[HDR_OPTIONS + i] = (int32_t)options[i];
    }

    AtomicFile af;
    FILE* fp = atomic_file_open(&af, path, msg, sizeof(msg));
    if (!fp) {
        snprintf(err, errlen, "cannot save checkpoint: %s (is the folder writable?)", msg);
        return -1;
    }
    int failed = write_all(fp, header, sizeof(int32_t), CHECKPOINT_HEADER_INTS);
    if (!failed && !bf16) {
        failed = write_all(fp, params, sizeof(float), n);
    } else if (!failed) {
        uint16_t* chunk = (uint16_t*)malloc(CKPT_CHUNK * sizeof(uint16_t));
        failed = chunk == NULL;
        for (size_t start = 0; !failed && start < n; start += CKPT_CHUNK) {
            const size_t count = (n - start < CKPT_CHUNK) ? n - start : CKPT_CHUNK;
            for (size_t i = 0; i < count; i++) chunk[i] = float_to_bf16_bits(params[start + i]);
            failed = write_all(fp, chunk, sizeof(uint16_t), count);
        }
        free(chunk);
    }
    if (failed) {
        const int saved_errno = errno;
        atomic_file_abort(&af);
        snprintf(err, errlen, "saving checkpoint '%s' failed: %s (disk full or file too large?); "
                 "the previous file, if any, is unchanged", path, strerror(saved_errno));
        return -1;
    }
    if (atomic_file_commit(&af, msg, sizeof(msg)) != 0) {
        snprintf(err, errlen, "saving checkpoint '%s' failed: %s (disk full or file too large?); "
                 "the previous file, if any, is unchanged", path, msg);
        return -1;
    }
    return 0;
}

int checkpoint_read_model(const char* path, GPTConfig* cfg_out, float** params_out, char* err, size_t errlen) {
    *params_out = NULL;
    uint64_t file_size = 0;
    FILE* fp = fopen_sized(path, "checkpoint", &file_size, err, errlen);
    if (fp == NULL) return -1;
    int32_t header[CHECKPOINT_HEADER_INTS];
    if (file_size < sizeof(header) || fread(header, sizeof(int32_t), CHECKPOINT_HEADER_INTS, fp) != CHECKPOINT_HEADER_INTS) {
        snprintf(err, errlen, "checkpoint '%s' is truncated: %llu bytes, shorter than its %zu-byte header", path,
                 (unsigned long long)file_size, sizeof(header));
        fclose(fp);
        return -1;
    }
    if (header[0] != CHECKPOINT_MAGIC) {
        snprintf(err, errlen, "'%s' is not a model checkpoint: magic %d, expected %d (llm.c model file)", path,
                 header[0], CHECKPOINT_MAGIC);
        fclose(fp);
        return -1;
    }
    const int version = header[1];
    if (version != CHECKPOINT_VERSION_FP32 && version != CHECKPOINT_VERSION_BF16 && version != CHECKPOINT_VERSION_OPTIONS) {
        snprintf(err, errlen, "checkpoint '%s' has version %d; supported are %d (fp32), %d (bf16) and %d (model "
                 "options in the header)", path, version, CHECKPOINT_VERSION_FP32, CHECKPOINT_VERSION_BF16,
                 CHECKPOINT_VERSION_OPTIONS);
        fclose(fp);
        return -1;
    }
    if (version == CHECKPOINT_VERSION_OPTIONS && header[HDR_WEIGHT_BITS] != 32 && header[HDR_WEIGHT_BITS] != 16) {
        snprintf(err, errlen, "checkpoint '%s' (version 6) has %d bits per weight at header int %d; 32 or 16 are "
                 "defined: corrupt header?", path, header[HDR_WEIGHT_BITS], HDR_WEIGHT_BITS);
        fclose(fp);
        return -1;
    }
    /* version 6's unused ints must be 0 (llm.c's files are read as llm.c reads them: [8..255] ignored) */
    for (int i = HDR_FIRST_UNUSED; version == CHECKPOINT_VERSION_OPTIONS && i < CHECKPOINT_HEADER_INTS; i++) {
        if (header[i] != 0) {
            snprintf(err, errlen, "checkpoint '%s' (version %d) has %d at header int %d (byte offset %d), which "
                     "this version leaves 0: corrupt header, or a format this build does not know", path, version,
                     header[i], i, 4 * i);
            fclose(fp);
            return -1;
        }
    }
    const int bf16 = version == CHECKPOINT_VERSION_BF16 ||
                     (version == CHECKPOINT_VERSION_OPTIONS && header[HDR_WEIGHT_BITS] == 16);
    GPTConfig cfg;
    cfg.max_seq_len = header[2];
    cfg.vocab_size = header[3];
    cfg.num_layers = header[4];
    cfg.num_heads = header[5];
    cfg.channels = header[6];
    cfg.padded_vocab_size = header[7];
    gpt_config_set_gpt2_options(&cfg);
    if (version == CHECKPOINT_VERSION_OPTIONS) {
        int64_t options[GPT_CONFIG_OPTION_FIELDS];
        for (int i = 0; i < GPT_CONFIG_OPTION_FIELDS; i++) options[i] = header[HDR_OPTIONS + i];
        gpt_config_options_unpack(&cfg, options);
    }
    char msg[256];
    if (cfg.num_layers > CKPT_MAX_LAYERS || cfg.channels > CKPT_MAX_CHANNELS || cfg.num_heads > CKPT_MAX_HEADS ||
        cfg.max_seq_len > CKPT_MAX_SEQ_LEN || cfg.vocab_size > CKPT_MAX_VOCAB || cfg.padded_vocab_size > CKPT_MAX_VOCAB) {
        snprintf(err, errlen, "checkpoint '%s' has an absurd config (maxT %d V %d L %d NH %d C %d Vp %d): corrupt header?",
                 path, cfg.max_seq_len, cfg.vocab_size, cfg.num_layers, cfg.num_heads, cfg.channels,
                 cfg.padded_vocab_size);
        fclose(fp);
        return -1;
    }
    if (gpt_config_validate(&cfg, msg, sizeof(msg)) != 0) {
        snprintf(err, errlen, "checkpoint '%s' has an invalid config: %s", path, msg);
        fclose(fp);
        return -1;
    }
    const size_t n = gpt_num_parameters(&cfg);
    const uint64_t expected = sizeof(header) + (uint64_t)n * (bf16 ? 2u : 4u);
    if (file_size != expected) {
        snprintf(err, errlen, "checkpoint '%s' is %s: %llu bytes, expected %llu for %zu %s parameters "
                 "(L %d C %d Vp %d maxT %d)", path, file_size < expected ? "truncated" : "too long (trailing bytes)",
                 (unsigned long long)file_size, (unsigned long long)expected, n, bf16 ? "bf16" : "fp32",
                 cfg.num_layers, cfg.channels, cfg.padded_vocab_size, cfg.max_seq_len);
        fclose(fp);
        return -1;
    }
    float* params = (float*)malloc(n * sizeof(float));
    if (!params) {
        snprintf(err, errlen, "out of memory reading checkpoint '%s' (%zu parameters)", path, n);
        fclose(fp);
        return -1;
    }
    int failed = 0;
    if (!bf16) {
        failed = fread(params, sizeof(float), n, fp) != n;
    } else {
        uint16_t* chunk = (uint16_t*)malloc(CKPT_CHUNK * sizeof(uint16_t));
        failed = chunk == NULL;
        for (size_t start = 0; !failed && start < n; start += CKPT_CHUNK) {
            const size_t count = (n - start < CKPT_CHUNK) ? n - start : CKPT_CHUNK;
            failed = fread(chunk, sizeof(uint16_t), count, fp) != count;
            for (size_t i = 0; !failed && i < count; i++) params[start + i] = bf16_bits_to_float(chunk[i]);
        }
        free(chunk);
    }
    fclose(fp);
    if (failed) {
        snprintf(err, errlen, "reading the parameters of checkpoint '%s' failed (file changed while reading?)", path);
        free(params);
        return -1;
    }
    *cfg_out = cfg;
    *params_out = params;
    return 0;
}
