/*
 * attention/support/attn_cases.h - generators of the hard attention inputs of
 * docs/attention_numerics.md (key-offset sweep, sharp attention, extreme
 * values, plain random), shared by the CPU tests, the GPU tests and the probe.
 *
 * Why: every mode is judged on the same inputs everywhere, so a number in a
 * GPU test, a probe table and a CPU test means the same thing. A case is a
 * small struct (kind, rho, qscale, logit, seed) with a printable name; the
 * generator is seeded with a portable PRNG of our own (splitmix64 +
 * Box-Muller in double), so the same case gives the same bits on any machine
 * and in any program.
 *
 * Output: qkv [B, T, 3, NH, HS] and dout [B, T, NH, HS] (layout of
 * attention.h), float arrays whose values are already BF16-representable, so
 * an fp64 copy of them is the reference input "on the same BF16 inputs".
 *
 * Offers: attn_case_random / _key_offset / _sharp / _extreme (constructors),
 * attn_case_name, attn_case_parse (for command lines), attn_case_fill,
 * attn_case_table (the rows of the published table plus the extreme case),
 * and the PRNG itself (attn_rng_*) for tests that need more random numbers.
 */
#ifndef ATTENTION_ATTN_CASES_H
#define ATTENTION_ATTN_CASES_H

#include <stddef.h>
#include <stdint.h>
#include "attention/attention.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    /* q = qscale * N(0,1), k, v, dO ~ N(0,1) */
    ATTN_CASE_RANDOM = 0,
    /* K = K0 + rho * sqrt(HS) * u_h with K0 ~ N(0,1) and u_h a random unit
       vector per head (shared across the batch): rho = |mean key| / rms
       spread of the keys. q = qscale * N(0,1); v, dO ~ N(0,1). */
    ATTN_CASE_KEY_OFFSET = 1,
    /* Sharp attention: ATTN_SHARP_CLUSTERS shared unit directions c per head;
       each token's q and k belong to one of them (chosen at random):
       k = sqrt(HS) * c + ATTN_SHARP_KEY_JITTER * N(0,1) per element,
       q = logit * c, so same-cluster logits are about `logit` (spread about
       logit * jitter / sqrt(HS): soft at 1e2, one-hot at 1e5), other-cluster
       logits much lower. Keys carry a common part (the cluster directions) and
       P is nearly one-hot: D errors dominate dK. v, dO ~ N(0,1). */
    ATTN_CASE_SHARP = 2,
    /* q = k = v = ATTN_EXTREME_VALUE in every element (the input that turns the
       FMA softmax flaw into Inf/NaN); dO ~ N(0,1). All keys are equal, so the
       exact dQ and dK are zero and O = v. */
    ATTN_CASE_EXTREME = 3,
} AttnCaseKind;

#define ATTN_EXTREME_VALUE 133120.0f
#define ATTN_SHARP_CLUSTERS 4
#define ATTN_SHARP_KEY_JITTER 0.1

typedef struct {
    AttnCaseKind kind;
    double rho;     /* KEY_OFFSET: key offset in units of the key spread */
    double qscale;  /* RANDOM, KEY_OFFSET: query scale factor */
    double logit;   /* SHARP: typical same-cluster logit, e.g. 1e2 .. 1e5 */
    uint64_t seed;
} AttnCase;

AttnCase attn_case_random(double qscale, uint64_t seed);
AttnCase attn_case_key_offset(double rho, double qscale, uint64_t seed);
AttnCase attn_case_sharp(double logit, uint64_t seed);
AttnCase attn_case_extreme(uint64_t seed);

/* Writes a short name such as "rho 16, q x8", "sharp, logits 1e3",
   "extreme 133120", "random, q x1" into buf; returns buf. */
char* attn_case_name(const AttnCase* c, char* buf, size_t len);

/* Parses "random[:QSCALE]", "offset:RHO[:QSCALE]", "sharp:LOGIT", "extreme"
   (seed taken from `seed`). Returns 0 on success, -1 with a message in err. */
int attn_case_parse(const char* text, uint64_t seed, AttnCase* out, char* err, size_t errlen);
/* "random[:QSCALE] | offset:RHO[:QSCALE] | sharp:LOGIT | extreme", for help texts. */
const char* attn_case_syntax(void);

/* Fills qkv (attn_qkv_count(s) floats) and dout (attn_out_count(s) floats,
   may be NULL) with the case's BF16-representable values. Deterministic in
   (case, shape). */
void attn_case_fill(const AttnCase* c, AttnShape s, float* qkv, float* dout);

/* The rows of the published table of docs/attention_numerics.md: rho 0 q x1,
   rho 16 q x1, rho 64 q x8, rho 256 q x8, rho 1024 q x8, sharp logits 1e3,
   then extreme. Writes up to max_cases, returns how many it wrote. */
int attn_case_table(AttnCase* cases, int max_cases, uint64_t seed);

/* Portable PRNG: splitmix64 stream, uniform doubles in [0, 1) from the top 53
   bits, standard normals by Box-Muller. */
typedef struct { uint64_t state; int has_spare; double spare; } AttnRng;
void attn_rng_init(AttnRng* r, uint64_t seed);
uint64_t attn_rng_u64(AttnRng* r);
double attn_rng_uniform(AttnRng* r);
double attn_rng_normal(AttnRng* r);

#ifdef __cplusplus
}
#endif

#endif /* ATTENTION_ATTN_CASES_H */
