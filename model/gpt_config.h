/*
 * model/gpt_config.h - GPT-2 model shapes, presets and the named parameter table.
 *
 * Why: the CPU reference, the GPU trainer, checkpoints and the PyTorch twin
 * must agree on every parameter tensor's name, shape and place in the one
 * contiguous parameter buffer. This table is that agreement; nobody indexes
 * parameters by magic numbers. The order is llm.c's checkpoint order, so an
 * llm.c GPT-2 checkpoint maps onto it unchanged.
 *
 * Offers: GPTConfig, gpt_config_from_descriptor ("tiny", "d12", "450m", ...),
 * the ParamId enum, gpt_param_table (name, shape, offset, weight decay),
 * gpt_num_parameters.
 */
#ifndef MODEL_GPT_CONFIG_H
#define MODEL_GPT_CONFIG_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define GPT2_EOT_TOKEN 50256
#define GPT2_VOCAB_SIZE 50257
#define GPT2_PADDED_VOCAB_SIZE 50304  /* multiple of 128: faster matmuls */

typedef struct {
    int max_seq_len;        /* T max (wpe rows) */
    int vocab_size;         /* V: 50257 for GPT-2 */
    int padded_vocab_size;  /* Vp: rows of wte; logits past V are masked */
    int num_layers;         /* L */
    int num_heads;          /* NH */
    int channels;           /* C = NH * head size */
} GPTConfig;

/*
 * Presets by name:
 *   "tiny"  L2  C64   NH4  T64   (tests)
 *   "small" L4  C256  NH4  T256  (quick runs; the docs/attention_numerics.md first measurement shape)
 *   "dN"    llm.c descriptors: d6, d12 (124M), d24 (350M), d36, d48
 *   "450m"  L20 C1280 NH20 T1024 (about 459M parameters)
 * Returns 0 on success, -1 (with a message in err) for an unknown name.
 */
int gpt_config_from_descriptor(const char* name, GPTConfig* cfg, char* err, size_t errlen);
/* Checks invariants (C % NH == 0, head size, Vp >= V, ...); 0 if fine, else message in err. */
int gpt_config_validate(const GPTConfig* cfg, char* err, size_t errlen);
/* "tiny|small|d6|d12|d24|d36|d48|450m" for help texts. */
const char* gpt_config_choices(void);

typedef enum {
    P_WTE = 0,      /* (Vp, C)     token embedding, tied with the output head */
    P_WPE,          /* (maxT, C)   position embedding */
    P_LN1W,         /* (L, C) */
    P_LN1B,         /* (L, C) */
    P_QKVW,         /* (L, 3C, C)  fused q|k|v projection, output rows q then k then v */
    P_QKVB,         /* (L, 3C) */
    P_ATTPROJW,     /* (L, C, C) */
    P_ATTPROJB,     /* (L, C) */
    P_LN2W,         /* (L, C) */
    P_LN2B,         /* (L, C) */
    P_FCW,          /* (L, 4C, C) */
    P_FCB,          /* (L, 4C) */
    P_FCPROJW,      /* (L, C, 4C) */
    P_FCPROJB,      /* (L, C) */
    P_LNFW,         /* (C) */
    P_LNFB,         /* (C) */
    NUM_PARAM_TENSORS
} ParamId;

typedef struct {
    const char* name;   /* "wte", "qkvw", ... (llm.c names) */
    size_t count;       /* elements, all layers together */
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
