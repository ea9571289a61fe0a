/*
 * model/gpt_config.c - presets and the parameter table (see gpt_config.h).
 */
#include "gpt_config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char* gpt_config_choices(void) { return "tiny|small|d6|d12|d24|d36|d48|450m"; }

static void set_config(GPTConfig* cfg, int L, int C, int NH, int T) {
    cfg->max_seq_len = T;
    cfg->vocab_size = GPT2_VOCAB_SIZE;
    cfg->padded_vocab_size = GPT2_PADDED_VOCAB_SIZE;
    cfg->num_layers = L;
    cfg->num_heads = NH;
    cfg->channels = C;
}

int gpt_config_from_descriptor(const char* name, GPTConfig* cfg, char* err, size_t errlen) {
    /* llm.c's depth descriptors: dN sets layers; width and heads follow GPT-2's family. */
    static const struct { const char* name; int L, C, NH, T; } presets[] = {
        {"tiny", 2, 64, 4, 64},
        {"small", 4, 256, 4, 256},
        {"d6", 6, 384, 6, 1024},
        {"d12", 12, 768, 12, 1024},
        {"d24", 24, 1024, 16, 1024},
        {"d36", 36, 1280, 20, 1024},
        {"d48", 48, 1600, 25, 1024},
        {"450m", 20, 1280, 20, 1024},
    };
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
        if (strcmp(name, presets[i].name) == 0) {
            set_config(cfg, presets[i].L, presets[i].C, presets[i].NH, presets[i].T);
            return 0;
        }
    }
    snprintf(err, errlen, "unknown model '%s'; choose one of %s", name, gpt_config_choices());
    return -1;
}

int gpt_config_validate(const GPTConfig* c, char* err, size_t errlen) {
    if (c->num_layers < 1 || c->channels < 1 || c->num_heads < 1 || c->max_seq_len < 1) {
        snprintf(err, errlen, "layers, channels, heads and sequence length must be positive");
        return -1;
    }
    if (c->channels % c->num_heads != 0) {
        snprintf(err, errlen, "channels (%d) must be a multiple of heads (%d)", c->channels, c->num_heads);
        return -1;
    }
    if (c->vocab_size < 1 || c->padded_vocab_size < c->vocab_size) {
        snprintf(err, errlen, "padded vocab (%d) must be >= vocab (%d)", c->padded_vocab_size, c->vocab_size);
        return -1;
    }
    return 0;
}

size_t gpt_param_table(const GPTConfig* cfg, ParamTensorInfo t[NUM_PARAM_TENSORS]) {
    const int L = cfg->num_layers, C = cfg->channels;
    const struct { ParamId id; const char* name; int layers, rows, cols, decay; } spec[NUM_PARAM_TENSORS] = {
        {P_WTE, "wte", 1, cfg->padded_vocab_size, C, 1},
        {P_WPE, "wpe", 1, cfg->max_seq_len, C, 1},
        {P_LN1W, "ln1w", L, C, 0, 0},
        {P_LN1B, "ln1b", L, C, 0, 0},
        {P_QKVW, "qkvw", L, 3 * C, C, 1},
        {P_QKVB, "qkvb", L, 3 * C, 0, 0},
        {P_ATTPROJW, "attprojw", L, C, C, 1},
        {P_ATTPROJB, "attprojb", L, C, 0, 0},
        {P_LN2W, "ln2w", L, C, 0, 0},
        {P_LN2B, "ln2b", L, C, 0, 0},
        {P_FCW, "fcw", L, 4 * C, C, 1},
        {P_FCB, "fcb", L, 4 * C, 0, 0},
        {P_FCPROJW, "fcprojw", L, C, 4 * C, 1},
        {P_FCPROJB, "fcprojb", L, C, 0, 0},
        {P_LNFW, "lnfw", 1, C, 0, 0},
        {P_LNFB, "lnfb", 1, C, 0, 0},
    };
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        ParamTensorInfo* p = &t[spec[i].id];
        p->name = spec[i].name;
        p->layers = spec[i].layers;
        p->rows = spec[i].rows;
        p->cols = spec[i].cols;
        p->weight_decay = spec[i].decay;
        p->count = (size_t)spec[i].layers * (size_t)spec[i].rows * (size_t)(spec[i].cols ? spec[i].cols : 1);
        p->offset = offset;
        offset += p->count;
    }
    return offset;
}

size_t gpt_num_parameters(const GPTConfig* cfg) {
    ParamTensorInfo t[NUM_PARAM_TENSORS];
    return gpt_param_table(cfg, t);
}
