/*
 * attention/attention_common.c - the small shared pieces of the attention
 * module: mode names and their parser, buffer sizes, the two softmax
 * constants, and bit-faithful BF16 rounding.
 *
 * Why: the CPU emulation, the CUDA kernels (through their host code), the
 * trainers, the probe and the tests must agree on these to the bit: one
 * definition of the mode names for --attn, one definition of s and c (a
 * different rounding of c alone shifts every exponent), and one BF16 rounding
 * that matches __float2bfloat16_rn (round to nearest, ties to even; NaN stays
 * NaN; values past the largest finite BF16 round to +-Inf).
 */
#include <math.h>
#include <string.h>
#include "attention/attention.h"
#include "common/utils.h"

static const char* const k_mode_names[ATTN_NUM_MODES] = {"fp32", "bf16", "repair", "gproj", "cudnn"};

const char* attn_mode_name(AttnMode mode) {
    if ((int)mode < 0 || mode >= ATTN_NUM_MODES) return "invalid";
    return k_mode_names[mode];
}

int attn_mode_parse(const char* name, AttnMode* mode) {
    if (name == NULL) return -1;
    for (int m = 0; m < ATTN_NUM_MODES; m++) {
        if (strcmp(name, k_mode_names[m]) == 0) {
            *mode = (AttnMode)m;
            return 0;
        }
    }
    return -1;
}

const char* attn_mode_choices(void) { return "fp32|bf16|repair|gproj|cudnn"; }
const char* attn_emulated_mode_choices(void) { return "fp32|bf16|repair|gproj"; }

int attn_mode_is_emulated(AttnMode mode) { return (int)mode >= 0 && (int)mode < ATTN_NUM_EMULATED_MODES; }

void attn_mode_require_emulated(AttnMode mode, const char* who) {
    if (attn_mode_is_emulated(mode)) return;
    if (mode == ATTN_CUDNN) {
        die("%s: attention mode cudnn runs only on the GPU (it is cuDNN's own kernel, with no CPU emulation)\n"
            "  hint: the CPU side computes %s; run cudnn with the GPU trainer (build/train_gpt --attn cudnn)",
            who, attn_emulated_mode_choices());
    }
    die("%s: invalid attention mode %d\n  hint: use one of %s (attn_mode_parse)", who, (int)mode,
        attn_mode_choices());
}

int attn_mode_parse_list(const char* list, int selected[ATTN_NUM_MODES], char* err, size_t errlen) {
    char* copy = (char*)mallocCheck(strlen(list) + 1);
    strcpy(copy, list);
    int named = 0;
    char* save = NULL;
    for (char* tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        AttnMode m;
        if (attn_mode_parse(tok, &m) != 0) {
            snprintf(err, errlen, "unknown mode '%s'; choose from %s", tok, attn_mode_choices());
            free(copy);
            return -1;
        }
        selected[m] = 1;
        named++;
    }
    free(copy);
    return named;
}

size_t attn_stats_count(AttnShape s) { return (size_t)s.B * s.NH * s.T * 2; }
size_t attn_qkv_count(AttnShape s) { return (size_t)s.B * s.T * 3 * s.NH * s.HS; }
size_t attn_out_count(AttnShape s) { return (size_t)s.B * s.T * s.NH * s.HS; }

void attn_shape_check(AttnShape s, const char* who) {
    if (s.B < 1 || s.NH < 1 || s.T < 1 || s.HS < 1) {
        die("%s: invalid attention shape B=%d NH=%d T=%d HS=%d\n"
            "  hint: batch, heads, sequence length and head size must all be >= 1",
            who, s.B, s.NH, s.T, s.HS);
    }
}

float attn_softmax_scale(int HS) { return (float)(1.0 / sqrt((double)HS)); }
/* log2(e) * s, rounded once: c multiplies raw scores into base-2 exponents. */
float attn_exp2_scale(int HS) { return (float)(1.4426950408889634074 / sqrt((double)HS)); }

unsigned short float_to_bf16_bits(float x) {
    uint32_t bits;
    memcpy(&bits, &x, sizeof bits);
    if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0) {
        /* NaN: keep the sign and the top payload bits, force it quiet so the
           truncated payload can never become zero (which would read as Inf). */
        return (unsigned short)((bits >> 16) | 0x0040u);
    }
    /* Round to nearest, ties to even: add 0x7FFF plus the lowest kept bit.
       A carry out of the mantissa bumps the exponent, which is exactly right,
       and turns values at or past the BF16 maximum's halfway point into Inf. */
    uint32_t lsb = (bits >> 16) & 1u;
    bits += 0x7FFFu + lsb;
    return (unsigned short)(bits >> 16);
}

float bf16_bits_to_float(unsigned short b) {
    uint32_t bits = (uint32_t)b << 16;
    float x;
    memcpy(&x, &bits, sizeof x);
    return x;
}

float bf16_round(float x) { return bf16_bits_to_float(float_to_bf16_bits(x)); }
