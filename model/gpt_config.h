/*
 * model/gpt_config.h - model shapes, architecture options, presets and the named
 * parameter table.
 *
 * Why: the CPU reference, the GPU trainer, checkpoints and the PyTorch twin
 * must agree on every parameter tensor's name, shape and place in the one
 * contiguous parameter buffer. This table is that agreement; nobody indexes
 * parameters by magic numbers. The order is llm.c's checkpoint order, so an
 * llm.c GPT-2 checkpoint maps onto it unchanged.
 *
 * The architecture options (docs/modern_stacks.md, the contract shared by the
 * CPU model, the PyTorch twin and the GPU kernels): position encoding
 * (learned wpe or RoPE), normalisation (LayerNorm or RMSNorm), MLP (GELU or
 * SwiGLU, with its hidden size), per-head QK-norm, linear biases on or off,
 * tied or separate output head. Their GPT-2 values (gpt_config_set_gpt2_options)
 * give GPT-2 exactly: the same table, offsets and numerics as llm.c.
 *
 * Offers: GPTConfig, gpt_config_from_descriptor ("tiny", "d12", "llama-small",
 * ...), gpt_config_set_gpt2_options, gpt_config_default_mlp_hidden,
 * gpt_config_is_gpt2, gpt_config_options_pack / _unpack, the option names (gpt_pos_name, ... and their parsers),
 * the ParamId enum, gpt_param_table (name, shape, offset, weight decay),
 * gpt_num_parameters.
 */
#ifndef MODEL_GPT_CONFIG_H
#define MODEL_GPT_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPT2_EOT_TOKEN 50256
#define GPT2_VOCAB_SIZE 50257
#define GPT2_PADDED_VOCAB_SIZE 50304  /* multiple of 128: faster matmuls */

typedef enum { GPT_POS_LEARNED = 0, GPT_POS_ROPE = 1 } GPTPosKind;
typedef enum { GPT_NORM_LAYERNORM = 0, GPT_NORM_RMSNORM = 1 } GPTNormKind;
typedef enum { GPT_MLP_GELU = 0, GPT_MLP_SWIGLU = 1 } GPTMlpKind;

#define GPT_ROPE_BASE_DEFAULT 10000.0f
#define GPT_NORM_EPS 1e-5  /* LayerNorm, RMSNorm and QK-norm */

typedef struct {
    int max_seq_len;        /* T max (wpe rows) */
    int vocab_size;         /* V: 50257 for GPT-2 */
    int padded_vocab_size;  /* Vp: rows of wte; logits past V are masked */
    int num_layers;         /* L */
    int num_heads;          /* NH */
    int channels;           /* C = NH * head size */
    /* architecture options; a config built by hand must set them all
       (gpt_config_set_gpt2_options gives GPT-2's) - validate refuses mlp_hidden 0 */
    int pos;                /* GPTPosKind: learned wpe, or RoPE on q and k (no wpe) */
    float rope_base;        /* RoPE's base (10000) */
    int norm;               /* GPTNormKind: LayerNorm (weight, bias) or RMSNorm (gain only) */
    int mlp;                /* GPTMlpKind: GELU-tanh, or SwiGLU with fused gate|up rows */
    int mlp_hidden;         /* H: the MLP's hidden width (4C for GPT-2) */
    int qk_norm;            /* 1: per-head RMSNorm of q and k with gains of size HS per layer */
    int bias;               /* 1: qkv, attproj, fc and fcproj have biases */
    int tie_embeddings;     /* 1: the output head is wte; 0: a separate lm_head (Vp, C) */
} GPTConfig;

/*
 * Presets by name:
 *   "tiny"  L2  C64   NH4  T64   (tests)
 *   "small" L4  C256  NH4  T256  (quick runs; the docs/attention_numerics.md first measurement shape)
 *   "dN"    llm.c descriptors: d6, d12 (124M), d24 (350M), d36, d48
 *   "450m"  L20 C1280 NH20 T1024 (about 459M parameters)
 *   "llama-small", "llama-d12": small's and d12's shapes with RoPE, RMSNorm,
 *           SwiGLU (H = round_up(8C/3, 64)), no linear biases, tied head
 * The GPT-2 presets get GPT-2's options. Returns 0 on success, -1 (with a
 * message in err) for an unknown name.
 */
int gpt_config_from_descriptor(const char* name, GPTConfig* cfg, char* err, size_t errlen);
/* Checks invariants (C % NH == 0, Vp >= V, an even head size for RoPE, the
   options in range, ...); 0 if fine, else one message in err naming the field. */
int gpt_config_validate(const GPTConfig* cfg, char* err, size_t errlen);
/* "tiny|small|d6|d12|d24|d36|d48|450m|llama-small|llama-d12" for help texts. */
const char* gpt_config_choices(void);

/* GPT-2's options: learned wpe, LayerNorm, GELU with H = 4C, no QK-norm,
   biases, tied head, rope_base 10000 (unused). Needs channels set. */
void gpt_config_set_gpt2_options(GPTConfig* cfg);
/* The MLP hidden size when none is given: 4C for GELU, round_up(8C/3, 64) for SwiGLU. */
int gpt_config_default_mlp_hidden(int mlp, int channels);
/* 1 if every option has its GPT-2 value (what llm.c's checkpoint layout can hold). */
int gpt_config_is_gpt2(const GPTConfig* cfg);
/* The architecture options as the model and resume files store them, consecutively in this order: pos,
   rope_base's float bits, norm, mlp, mlp_hidden, qk_norm, bias, tie_embeddings (model/checkpoint.c's
   version-6 header, train/resume_state.c's header). Unpack reads the bits from the low 32 of their field, so a
   32-bit header's value round-trips. */
#define GPT_CONFIG_OPTION_FIELDS 8
void gpt_config_options_pack(const GPTConfig* cfg, int64_t out[GPT_CONFIG_OPTION_FIELDS]);
void gpt_config_options_unpack(GPTConfig* cfg, const int64_t in[GPT_CONFIG_OPTION_FIELDS]);
/* The options that differ from GPT-2's as flags ("--pos rope --norm rmsnorm ..."; "" for GPT-2),
   for messages and banners. Returns buf. */
const char* gpt_config_describe_options(const GPTConfig* cfg, char* buf, size_t n);
/* Rows of fcw per layer: H for GELU, 2H for SwiGLU (gate rows [0,H), up rows [H,2H)). */
int gpt_config_fc_rows(const GPTConfig* cfg);

/* Option names as the flags spell them ("learned", "rope", ...), and their parsers
   (0 with *out set, -1 for an unknown name). */
const char* gpt_pos_name(int pos);
const char* gpt_norm_name(int norm);
const char* gpt_mlp_name(int mlp);
int gpt_pos_parse(const char* name, int* out);
int gpt_norm_parse(const char* name, int* out);
int gpt_mlp_parse(const char* name, int* out);

/* GPT-2's 16 tensors in llm.c's order, then the options' tensors. A tensor the
   config does not use has count 0 (and rows = cols = 0) at the offset where it
   would start: wpe with RoPE; ln1b, ln2b, lnfb with RMSNorm; qkvb, attprojb,
   fcb, fcprojb without biases; qnormw, knormw without QK-norm; lmheadw when tied. */
typedef enum {
    P_WTE = 0,      /* (Vp, C)     token embedding (and the output head when tied) */
    P_WPE,          /* (maxT, C)   position embedding (learned positions only) */
    P_LN1W,         /* (L, C)      LayerNorm weight or RMSNorm gain */
    P_LN1B,         /* (L, C)      LayerNorm only */
    P_QKVW,         /* (L, 3C, C)  fused q|k|v projection, output rows q then k then v */
    P_QKVB,         /* (L, 3C) */
    P_ATTPROJW,     /* (L, C, C) */
    P_ATTPROJB,     /* (L, C) */
    P_LN2W,         /* (L, C) */
    P_LN2B,         /* (L, C) */
    P_FCW,          /* (L, F, C)   F = H (GELU) or 2H (SwiGLU: gate rows then up rows) */
    P_FCB,          /* (L, F) */
    P_FCPROJW,      /* (L, C, H) */
    P_FCPROJB,      /* (L, C) */
    P_LNFW,         /* (C) */
    P_LNFB,         /* (C) */
    P_QNORMW,       /* (L, HS)     QK-norm gain of q, shared by the heads */
    P_KNORMW,       /* (L, HS)     QK-norm gain of k */
    P_LMHEADW,      /* (Vp, C)     untied output head */
    NUM_PARAM_TENSORS
} ParamId;

/* llm.c's GPT-2 checkpoint holds exactly the first 16 tensors. */
#define GPT2_NUM_PARAM_TENSORS 16

typedef struct {
    const char* name;   /* "wte", "qkvw", ... (llm.c names; qnormw, knormw, lmheadw) */
    size_t count;       /* elements, all layers together (0: not in this config) */
    size_t offset;      /* elements from the start of the parameter buffer */
    int layers;         /* 1 for wte/wpe/lnf, L for per-layer tensors */
    int rows, cols;     /* per-layer matrix shape; cols == 0 for vectors */
    int weight_decay;   /* 1 for 2-D weights (AdamW decays these only) */
} ParamTensorInfo;

/* Fills table[NUM_PARAM_TENSORS]; returns the total parameter count. */
size_t gpt_param_table(const GPTConfig* cfg, ParamTensorInfo table[NUM_PARAM_TENSORS]);
size_t gpt_num_parameters(const GPTConfig* cfg);

#ifdef __cplusplus
}
#endif

#endif /* MODEL_GPT_CONFIG_H */
