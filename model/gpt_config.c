/*
 * model/gpt_config.c - presets, the architecture options and the parameter
 * table (see gpt_config.h).
 */
#include "gpt_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char* gpt_config_choices(void) { return "tiny|small|d6|d12|d24|d36|d48|450m|llama-small|llama-d12"; }

int gpt_config_default_mlp_hidden(int mlp, int channels) {
    if (mlp == GPT_MLP_SWIGLU) return (8 * channels + 3 * 64 - 1) / (3 * 64) * 64; /* round_up(8C/3, 64) */
    return 4 * channels;
}

void gpt_config_set_gpt2_options(GPTConfig* cfg) {
    cfg->pos = GPT_POS_LEARNED;
    cfg->rope_base = GPT_ROPE_BASE_DEFAULT;
    cfg->norm = GPT_NORM_LAYERNORM;
    cfg->mlp = GPT_MLP_GELU;
    cfg->mlp_hidden = gpt_config_default_mlp_hidden(GPT_MLP_GELU, cfg->channels);
    cfg->qk_norm = 0;
    cfg->bias = 1;
    cfg->tie_embeddings = 1;
}

int gpt_config_is_gpt2(const GPTConfig* c) {
    return c->pos == GPT_POS_LEARNED && c->norm == GPT_NORM_LAYERNORM && c->mlp == GPT_MLP_GELU &&
           c->mlp_hidden == 4 * c->channels && c->qk_norm == 0 && c->bias == 1 && c->tie_embeddings == 1;
}

void gpt_config_options_pack(const GPTConfig* c, int64_t out[GPT_CONFIG_OPTION_FIELDS]) {
    uint32_t base_bits;
    memcpy(&base_bits, &c->rope_base, sizeof base_bits);
    const int64_t v[GPT_CONFIG_OPTION_FIELDS] = {c->pos,        base_bits, c->norm, c->mlp,
                                                 c->mlp_hidden, c->qk_norm, c->bias, c->tie_embeddings};
    memcpy(out, v, sizeof v);
}

void gpt_config_options_unpack(GPTConfig* c, const int64_t in[GPT_CONFIG_OPTION_FIELDS]) {
    const uint32_t base_bits = (uint32_t)in[1];
    c->pos = (int)in[0];
    memcpy(&c->rope_base, &base_bits, sizeof base_bits);
    c->norm = (int)in[2];
    c->mlp = (int)in[3];
    c->mlp_hidden = (int)in[4];
    c->qk_norm = (int)in[5];
    c->bias = (int)in[6];
    c->tie_embeddings = (int)in[7];
}

const char* gpt_config_describe_options(const GPTConfig* c, char* buf, size_t n) {
    size_t used = 0;
    buf[0] = '\0';
#define ADD_OPTION(...)                                                              \
    do {                                                                             \
        if (used < n) used += (size_t)snprintf(buf + used, n - used, __VA_ARGS__);   \
    } while (0)
    if (c->pos != GPT_POS_LEARNED) ADD_OPTION("%s--pos %s --rope-base %g", used ? " " : "", gpt_pos_name(c->pos),
                                              (double)c->rope_base);
    if (c->norm != GPT_NORM_LAYERNORM) ADD_OPTION("%s--norm %s", used ? " " : "", gpt_norm_name(c->norm));
    if (c->mlp != GPT_MLP_GELU) ADD_OPTION("%s--mlp %s", used ? " " : "", gpt_mlp_name(c->mlp));
    if (c->mlp_hidden != 4 * c->channels) ADD_OPTION("%s--mlp-hidden %d", used ? " " : "", c->mlp_hidden);
    if (c->qk_norm) ADD_OPTION("%s--qk-norm 1", used ? " " : "");
    if (!c->bias) ADD_OPTION("%s--bias 0", used ? " " : "");
    if (!c->tie_embeddings) ADD_OPTION("%s--tie-embeddings 0", used ? " " : "");
#undef ADD_OPTION
    return buf;
}

int gpt_config_fc_rows(const GPTConfig* c) { return c->mlp == GPT_MLP_SWIGLU ? 2 * c->mlp_hidden : c->mlp_hidden; }

static const char* const g_pos_names[] = {"learned", "rope"};
static const char* const g_norm_names[] = {"layernorm", "rmsnorm"};
static const char* const g_mlp_names[] = {"gelu", "swiglu"};

static const char* name_of(const char* const* names, int n, int v) { return v >= 0 && v < n ? names[v] : "?"; }
static int parse_name(const char* const* names, int n, const char* s, int* out) {
    for (int i = 0; i < n; i++) {
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    return -1;
}
const char* gpt_pos_name(int v) { return name_of(g_pos_names, 2, v); }
const char* gpt_norm_name(int v) { return name_of(g_norm_names, 2, v); }
const char* gpt_mlp_name(int v) { return name_of(g_mlp_names, 2, v); }
int gpt_pos_parse(const char* s, int* out) { return parse_name(g_pos_names, 2, s, out); }
int gpt_norm_parse(const char* s, int* out) { return parse_name(g_norm_names, 2, s, out); }
int gpt_mlp_parse(const char* s, int* out) { return parse_name(g_mlp_names, 2, s, out); }

static void set_config(GPTConfig* cfg, int L, int C, int NH, int T, int modern) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->max_seq_len = T;
    cfg->vocab_size = GPT2_VOCAB_SIZE;
    cfg->padded_vocab_size = GPT2_PADDED_VOCAB_SIZE;
    cfg->num_layers = L;
    cfg->num_heads = NH;
    cfg->channels = C;
    gpt_config_set_gpt2_options(cfg);
    if (modern) { /* the llama-* presets: RoPE, RMSNorm, SwiGLU, no linear biases, tied head */
        cfg->pos = GPT_POS_ROPE;
        cfg->norm = GPT_NORM_RMSNORM;
        cfg->mlp = GPT_MLP_SWIGLU;
        cfg->mlp_hidden = gpt_config_default_mlp_hidden(GPT_MLP_SWIGLU, C);
        cfg->bias = 0;
    }
}

int gpt_config_from_descriptor(const char* name, GPTConfig* cfg, char* err, size_t errlen) {
    /* llm.c's depth descriptors: dN sets layers; width and heads follow GPT-2's family. */
    static const struct { const char* name; int L, C, NH, T, modern; } presets[] = {
        {"tiny", 2, 64, 4, 64, 0},
        {"small", 4, 256, 4, 256, 0},
        {"d6", 6, 384, 6, 1024, 0},
        {"d12", 12, 768, 12, 1024, 0},
        {"d24", 24, 1024, 16, 1024, 0},
        {"d36", 36, 1280, 20, 1024, 0},
        {"d48", 48, 1600, 25, 1024, 0},
        {"450m", 20, 1280, 20, 1024, 0},
        {"llama-small", 4, 256, 4, 256, 1},
        {"llama-d12", 12, 768, 12, 1024, 1},
    };
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++) {
        if (strcmp(name, presets[i].name) == 0) {
            set_config(cfg, presets[i].L, presets[i].C, presets[i].NH, presets[i].T, presets[i].modern);
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
    if (c->pos != GPT_POS_LEARNED && c->pos != GPT_POS_ROPE) {
        snprintf(err, errlen, "position encoding %d is not learned (0) or rope (1)", c->pos);
        return -1;
    }
    const int HS = c->channels / c->num_heads;
    if (c->pos == GPT_POS_ROPE && HS % 2 != 0) {
        snprintf(err, errlen, "--pos rope needs an even head size, and C %d / NH %d = %d is odd; choose channels "
                 "and heads with an even quotient", c->channels, c->num_heads, HS);
        return -1;
    }
    if (c->pos == GPT_POS_ROPE && !(isfinite(c->rope_base) && c->rope_base >= 1.0f)) {
        snprintf(err, errlen, "--rope-base %g must be a finite number >= 1", (double)c->rope_base);
        return -1;
    }
    if (c->norm != GPT_NORM_LAYERNORM && c->norm != GPT_NORM_RMSNORM) {
        snprintf(err, errlen, "norm %d is not layernorm (0) or rmsnorm (1)", c->norm);
        return -1;
    }
    if (c->mlp != GPT_MLP_GELU && c->mlp != GPT_MLP_SWIGLU) {
        snprintf(err, errlen, "mlp %d is not gelu (0) or swiglu (1)", c->mlp);
        return -1;
    }
    if (c->mlp_hidden < 1 || c->mlp_hidden > (1 << 20)) {
        snprintf(err, errlen, "MLP hidden size %d must be from 1 to %d (a config built by hand must set the "
                 "architecture options: gpt_config_set_gpt2_options)", c->mlp_hidden, 1 << 20);
        return -1;
    }
    if ((c->qk_norm != 0 && c->qk_norm != 1) || (c->bias != 0 && c->bias != 1) ||
        (c->tie_embeddings != 0 && c->tie_embeddings != 1)) {
        snprintf(err, errlen, "qk_norm (%d), bias (%d) and tie_embeddings (%d) must each be 0 or 1", c->qk_norm,
                 c->bias, c->tie_embeddings);
        return -1;
    }
    return 0;
}

size_t gpt_param_table(const GPTConfig* cfg, ParamTensorInfo t[NUM_PARAM_TENSORS]) {
    const int L = cfg->num_layers, C = cfg->channels, H = cfg->mlp_hidden, F = gpt_config_fc_rows(cfg);
    const int HS = C / (cfg->num_heads > 0 ? cfg->num_heads : 1);
    const int learned = cfg->pos == GPT_POS_LEARNED, ln = cfg->norm == GPT_NORM_LAYERNORM, bias = cfg->bias != 0;
    const int qk = cfg->qk_norm != 0, untied = cfg->tie_embeddings == 0;
    const struct { ParamId id; const char* name; int present, layers, rows, cols, decay; } spec[NUM_PARAM_TENSORS] = {
        {P_WTE, "wte", 1, 1, cfg->padded_vocab_size, C, 1},
        {P_WPE, "wpe", learned, 1, cfg->max_seq_len, C, 1},
        {P_LN1W, "ln1w", 1, L, C, 0, 0},
        {P_LN1B, "ln1b", ln, L, C, 0, 0},
        {P_QKVW, "qkvw", 1, L, 3 * C, C, 1},
        {P_QKVB, "qkvb", bias, L, 3 * C, 0, 0},
        {P_ATTPROJW, "attprojw", 1, L, C, C, 1},
        {P_ATTPROJB, "attprojb", bias, L, C, 0, 0},
        {P_LN2W, "ln2w", 1, L, C, 0, 0},
        {P_LN2B, "ln2b", ln, L, C, 0, 0},
        {P_FCW, "fcw", 1, L, F, C, 1},
        {P_FCB, "fcb", bias, L, F, 0, 0},
        {P_FCPROJW, "fcprojw", 1, L, C, H, 1},
        {P_FCPROJB, "fcprojb", bias, L, C, 0, 0},
        {P_LNFW, "lnfw", 1, 1, C, 0, 0},
        {P_LNFB, "lnfb", ln, 1, C, 0, 0},
        {P_QNORMW, "qnormw", qk, L, HS, 0, 0},
        {P_KNORMW, "knormw", qk, L, HS, 0, 0},
        {P_LMHEADW, "lmheadw", untied, 1, cfg->padded_vocab_size, C, 1},
    };
    size_t offset = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        ParamTensorInfo* p = &t[spec[i].id];
        p->name = spec[i].name;
        p->layers = spec[i].layers;
        p->rows = spec[i].present ? spec[i].rows : 0;
        p->cols = spec[i].present ? spec[i].cols : 0;
        p->weight_decay = spec[i].decay;
        p->count = (size_t)p->layers * (size_t)p->rows * (size_t)(p->cols ? p->cols : 1);
        p->offset = offset;
        offset += p->count;
    }
    return offset;
}

size_t gpt_num_parameters(const GPTConfig* cfg) {
    ParamTensorInfo t[NUM_PARAM_TENSORS];
    return gpt_param_table(cfg, t);
}
