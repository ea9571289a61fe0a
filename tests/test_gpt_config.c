/*
 * tests/test_gpt_config.c - presets, architecture options and the parameter
 * table (model/gpt_config.h).
 *
 * Why: the table is the agreement between the CPU model, the GPU model,
 * checkpoints and the PyTorch twin. GPT-2 presets must keep llm.c's table
 * exactly (checked against the layout written out here from llm.c's
 * fill_in_parameter_sizes, not from our table), the options' tensors must
 * have the shapes of docs/modern_stacks.md (llama-small's counts are checked
 * against numbers worked out by hand), and bad options must be refused with
 * a message naming them.
 */
#include <stdio.h>
#include <string.h>

#include "model/gpt_config.h"
#include "tests/testing.h"

/* llm.c's 16 GPT-2 tensor sizes (train_gpt2.c fill_in_parameter_sizes). */
static void llmc_sizes(const GPTConfig* c, size_t out[16]) {
    const size_t Vp = (size_t)c->padded_vocab_size, C = (size_t)c->channels, T = (size_t)c->max_seq_len;
    const size_t L = (size_t)c->num_layers;
    const size_t s[16] = {Vp * C, T * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
                          L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C};
    memcpy(out, s, sizeof(s));
}

static void test_gpt2_presets_unchanged(void) {
    test_section("GPT-2 presets: llm.c's 16 tensors, offsets and total; the options' tensors empty");
    const char* names[] = {"tiny", "small", "d6", "d12", "d24", "d36", "d48", "450m"};
    static const char* llmc_names[16] = {"wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                                         "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"};
    for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
        GPTConfig c;
        char err[256];
        CHECK(gpt_config_from_descriptor(names[k], &c, err, sizeof(err)) == 0, "%s exists", names[k]);
        CHECK(gpt_config_is_gpt2(&c) && gpt_config_validate(&c, err, sizeof(err)) == 0, "%s has GPT-2's options",
              names[k]);
        ParamTensorInfo t[NUM_PARAM_TENSORS];
        const size_t total = gpt_param_table(&c, t);
        size_t want[16], off = 0;
        llmc_sizes(&c, want);
        int same = 1;
        for (int i = 0; i < 16; i++) {
            same &= t[i].count == want[i] && t[i].offset == off && strcmp(t[i].name, llmc_names[i]) == 0;
            off += want[i];
        }
        CHECK(same && total == off, "%s: names, counts and offsets of the 16 tensors are llm.c's (total %zu)",
              names[k], total);
        CHECK(t[P_QNORMW].count == 0 && t[P_KNORMW].count == 0 && t[P_LMHEADW].count == 0 &&
                  t[P_LMHEADW].offset == total,
              "%s: qnormw, knormw, lmheadw are empty, at the end", names[k]);
        CHECK(t[P_LMHEADW].weight_decay == 1 && t[P_QNORMW].weight_decay == 0 && t[P_KNORMW].weight_decay == 0,
              "weight decay: lmheadw yes, the QK-norm gains no");
        char desc[256];
        CHECK(gpt_config_describe_options(&c, desc, sizeof(desc))[0] == '\0', "%s: no non-GPT-2 option", names[k]);
    }
    GPTConfig d12;
    char err[256];
    gpt_config_from_descriptor("d12", &d12, err, sizeof(err));
    CHECK(gpt_num_parameters(&d12) == 124475904, "d12 has llm.c's 124475904 parameters (Vp 50304)");
}

static void test_llama_small_counts(void) {
    test_section("llama-small: RoPE, RMSNorm, SwiGLU H 704, no biases, tied; counts by hand");
    GPTConfig c;
    char err[256];
    CHECK(gpt_config_from_descriptor("llama-small", &c, err, sizeof(err)) == 0, "llama-small exists");
    CHECK(c.num_layers == 4 && c.channels == 256 && c.num_heads == 4 && c.max_seq_len == 256, "small's shape");
    CHECK(c.pos == GPT_POS_ROPE && c.norm == GPT_NORM_RMSNORM && c.mlp == GPT_MLP_SWIGLU && c.mlp_hidden == 704 &&
              c.bias == 0 && c.tie_embeddings == 1 && c.qk_norm == 0 && c.rope_base == 10000.0f,
          "the options (H = round_up(8*256/3 = 682.7, 64) = 704)");
    CHECK(!gpt_config_is_gpt2(&c), "not GPT-2");
    ParamTensorInfo t[NUM_PARAM_TENSORS];
    const size_t total = gpt_param_table(&c, t);
    /* by hand: Vp 50304, C 256, L 4, H 704 */
    const size_t want[NUM_PARAM_TENSORS] = {
        12877824, /* wte 50304*256 */
        0,        /* wpe: RoPE */
        1024,     /* ln1w 4*256 */
        0,        /* ln1b: RMSNorm */
        786432,   /* qkvw 4*768*256 */
        0,        /* qkvb */
        262144,   /* attprojw 4*256*256 */
        0,        /* attprojb */
        1024,     /* ln2w */
        0,        /* ln2b */
        1441792,  /* fcw 4*1408*256 (gate 704 + up 704 rows) */
        0,        /* fcb */
        720896,   /* fcprojw 4*256*704 */
        0,        /* fcprojb */
        256,      /* lnfw */
        0,        /* lnfb */
        0, 0, 0,  /* qnormw, knormw, lmheadw */
    };
    int same = 1;
    size_t off = 0;
    for (int i = 0; i < NUM_PARAM_TENSORS; i++) {
        if (t[i].count != want[i] || t[i].offset != off) {
            printf("  %s: count %zu offset %zu, want %zu at %zu\n", t[i].name, t[i].count, t[i].offset, want[i], off);
            same = 0;
        }
        off += want[i];
    }
    CHECK(same && total == 16091392, "every tensor's count and offset; total 16091392 (got %zu)", total);
    CHECK(t[P_FCW].rows == 1408 && t[P_FCW].cols == 256 && t[P_FCPROJW].rows == 256 && t[P_FCPROJW].cols == 704,
          "fcw (L, 2H, C) and fcprojw (L, C, H)");
    char desc[256];
    gpt_config_describe_options(&c, desc, sizeof(desc));
    CHECK(strcmp(desc, "--pos rope --rope-base 10000 --norm rmsnorm --mlp swiglu --mlp-hidden 704 --bias 0") == 0,
          "described as flags: %s", desc);

    /* + qk-norm and an untied head: (L, HS) gains twice, then lm_head (Vp, C) */
    c.qk_norm = 1;
    c.tie_embeddings = 0;
    const size_t total2 = gpt_param_table(&c, t);
    CHECK(t[P_QNORMW].count == 4 * 64 && t[P_KNORMW].count == 4 * 64 && t[P_QNORMW].offset == 16091392 &&
              t[P_KNORMW].offset == 16091392 + 256 && t[P_LMHEADW].count == 12877824 &&
              t[P_LMHEADW].offset == 16091392 + 512 && total2 == 16091392 + 512 + 12877824,
          "qnormw, knormw (L, HS) after lnfb, then lmheadw (Vp, C)");

    GPTConfig d;
    gpt_config_from_descriptor("llama-d12", &d, err, sizeof(err));
    CHECK(d.num_layers == 12 && d.channels == 768 && d.num_heads == 12 && d.max_seq_len == 1024 &&
              d.mlp_hidden == 2048 && d.pos == GPT_POS_ROPE && d.bias == 0,
          "llama-d12: d12's shape, H 2048");
    CHECK(gpt_config_default_mlp_hidden(GPT_MLP_GELU, 768) == 3072 &&
              gpt_config_default_mlp_hidden(GPT_MLP_SWIGLU, 64) == 192, "default hidden sizes (4C; 8*64/3 -> 192)");
}

static void test_option_tables(void) {
    test_section("each option alone: which tensors change");
    GPTConfig base, c;
    char err[256];
    gpt_config_from_descriptor("tiny", &base, err, sizeof(err));
    ParamTensorInfo t0[NUM_PARAM_TENSORS], t[NUM_PARAM_TENSORS];
    gpt_param_table(&base, t0);
    c = base;
    c.norm = GPT_NORM_RMSNORM;
    gpt_param_table(&c, t);
    CHECK(t[P_LN1B].count == 0 && t[P_LN2B].count == 0 && t[P_LNFB].count == 0 && t[P_LN1W].count == t0[P_LN1W].count,
          "rmsnorm: no ln biases, gains kept");
    c = base;
    c.bias = 0;
    gpt_param_table(&c, t);
    CHECK(t[P_QKVB].count == 0 && t[P_ATTPROJB].count == 0 && t[P_FCB].count == 0 && t[P_FCPROJB].count == 0 &&
              t[P_LN1B].count == t0[P_LN1B].count, "bias 0: the four linear biases gone, LayerNorm's kept");
    c = base;
    c.pos = GPT_POS_ROPE;
    gpt_param_table(&c, t);
    CHECK(t[P_WPE].count == 0 && t[P_LN1W].offset == t0[P_WPE].offset, "rope: no wpe (and nothing in its place)");
    c = base;
    c.mlp = GPT_MLP_GELU;
    c.mlp_hidden = 100;
    gpt_param_table(&c, t);
    CHECK(t[P_FCW].count == 2 * 100 * 64 && t[P_FCB].count == 2 * 100 && t[P_FCPROJW].count == 2 * 64 * 100,
          "gelu with H 100: fcw (L, H, C), fcb (L, H), fcprojw (L, C, H)");
    CHECK(!gpt_config_is_gpt2(&c), "a GELU hidden size other than 4C is not GPT-2");
}

static void expect_invalid(const GPTConfig* c, const char* what, const char* needle) {
    char err[256] = "";
    const int rc = gpt_config_validate(c, err, sizeof(err));
    CHECK(rc != 0 && strstr(err, needle) != NULL, "%s refused naming '%s' (got: %s)", what, needle, err);
}

static void test_validate(void) {
    test_section("gpt_config_validate refuses bad options with a message naming them");
    GPTConfig base, c;
    char err[256];
    gpt_config_from_descriptor("tiny", &base, err, sizeof(err));
    c = base;
    c.pos = GPT_POS_ROPE;
    c.channels = 60;
    c.num_heads = 4; /* HS 15 */
    c.mlp_hidden = 240;
    expect_invalid(&c, "rope with odd head size 15", "even head size");
    c.channels = 64;
    CHECK(gpt_config_validate(&c, err, sizeof(err)) == 0, "rope with head size 16 is fine");
    c.rope_base = 0.5f;
    expect_invalid(&c, "rope base 0.5", "--rope-base");
    c = base;
    c.mlp_hidden = 0;
    expect_invalid(&c, "mlp_hidden 0 (a hand-built config without options)", "gpt_config_set_gpt2_options");
    c = base;
    c.norm = 2;
    expect_invalid(&c, "norm 2", "norm 2");
    c = base;
    c.mlp = 7;
    expect_invalid(&c, "mlp 7", "mlp 7");
    c = base;
    c.bias = 2;
    expect_invalid(&c, "bias 2", "bias (2)");
    c = base;
    c.pos = 3;
    expect_invalid(&c, "pos 3", "position encoding 3");
    int v = -1;
    CHECK(gpt_pos_parse("rope", &v) == 0 && v == GPT_POS_ROPE && gpt_norm_parse("rmsnorm", &v) == 0 &&
              v == GPT_NORM_RMSNORM && gpt_mlp_parse("swiglu", &v) == 0 && v == GPT_MLP_SWIGLU &&
              gpt_mlp_parse("relu", &v) == -1,
          "option names parse");
}

int main(void) {
    test_gpt2_presets_unchanged();
    test_llama_small_counts();
    test_option_tables();
    test_validate();
    return test_summary();
}
