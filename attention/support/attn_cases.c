/*
 * attention/support/attn_cases.c - the hard-case input generators declared in
 * attn_cases.h (what each case is, and why, is documented there and in
 * docs/attention_numerics.md).
 *
 * Every value goes through bf16_round before it is stored, so the buffers are
 * exactly what a BF16 kernel sees and the fp64 reference can take the very
 * same numbers. Random numbers come from our own splitmix64 + Box-Muller, in
 * a fixed order (per-head directions first, then token by token), so a case
 * is reproducible across programs and machines.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "attention/support/attn_cases.h"
#include "common/utils.h"

/* ---- PRNG ---- */

void attn_rng_init(AttnRng* r, uint64_t seed) {
    r->state = seed;
    r->has_spare = 0;
    r->spare = 0.0;
}

uint64_t attn_rng_u64(AttnRng* r) {
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double attn_rng_uniform(AttnRng* r) { return (double)(attn_rng_u64(r) >> 11) * 0x1.0p-53; }

double attn_rng_normal(AttnRng* r) {
    if (r->has_spare) {
        r->has_spare = 0;
        return r->spare;
    }
    double u1 = attn_rng_uniform(r);
    double u2 = attn_rng_uniform(r);
    if (u1 < 0x1.0p-60) u1 = 0x1.0p-60; /* log(0) guard */
    double radius = sqrt(-2.0 * log(u1));
    double angle = 2.0 * M_PI * u2;
    r->spare = radius * sin(angle);
    r->has_spare = 1;
    return radius * cos(angle);
}

/* ---- constructors and names ---- */

static AttnCase make_case(AttnCaseKind kind, uint64_t seed) {
    AttnCase c;
    memset(&c, 0, sizeof c);
    c.kind = kind;
    c.qscale = 1.0;
    c.seed = seed;
    return c;
}

AttnCase attn_case_random(double qscale, uint64_t seed) {
    AttnCase c = make_case(ATTN_CASE_RANDOM, seed);
    c.qscale = qscale;
    return c;
}

AttnCase attn_case_key_offset(double rho, double qscale, uint64_t seed) {
    AttnCase c = make_case(ATTN_CASE_KEY_OFFSET, seed);
    c.rho = rho;
    c.qscale = qscale;
    return c;
}

AttnCase attn_case_sharp(double logit, uint64_t seed) {
    AttnCase c = make_case(ATTN_CASE_SHARP, seed);
    c.logit = logit;
    return c;
}

AttnCase attn_case_extreme(uint64_t seed) { return make_case(ATTN_CASE_EXTREME, seed); }

char* attn_case_name(const AttnCase* c, char* buf, size_t len) {
    switch (c->kind) {
    case ATTN_CASE_RANDOM: snprintf(buf, len, "random, q x%g", c->qscale); break;
    case ATTN_CASE_KEY_OFFSET: snprintf(buf, len, "rho %g, q x%g", c->rho, c->qscale); break;
    case ATTN_CASE_SHARP: {
        double e = floor(log10(c->logit) + 0.5);
        if (c->logit > 0 && fabs(c->logit - pow(10.0, e)) < 1e-9 * c->logit)
            snprintf(buf, len, "sharp, logits 1e%d", (int)e);
        else
            snprintf(buf, len, "sharp, logits %g", c->logit);
        break;
    }
    case ATTN_CASE_EXTREME: snprintf(buf, len, "extreme %g", (double)ATTN_EXTREME_VALUE); break;
    default: snprintf(buf, len, "invalid case kind %d", (int)c->kind); break;
    }
    return buf;
}

const char* attn_case_syntax(void) { return "random[:QSCALE] | offset:RHO[:QSCALE] | sharp:LOGIT | extreme"; }

/* Parses a non-negative finite number; returns 0 on success. */
static int parse_number(const char* text, double* out) {
    char* end = NULL;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || !isfinite(v) || v < 0) return -1;
    *out = v;
    return 0;
}

int attn_case_parse(const char* text, uint64_t seed, AttnCase* out, char* err, size_t errlen) {
    char buf[128];
    if (text == NULL || strlen(text) >= sizeof buf) {
        snprintf(err, errlen, "attention case '%s' is missing or too long; expected %s",
                 text ? text : "(null)", attn_case_syntax());
        return -1;
    }
    strcpy(buf, text);
    char* fields[3] = {buf, NULL, NULL};
    int nfields = 1;
    for (char* p = buf; *p; p++) {
        if (*p == ':') {
            *p = '\0';
            if (nfields == 3) { nfields = 4; break; }
            fields[nfields++] = p + 1;
        }
    }
    double a = 0, b = 1;
    int ok = 0;
    if (strcmp(fields[0], "random") == 0 && nfields <= 2) {
        ok = nfields == 1 || parse_number(fields[1], &b) == 0;
        if (ok) *out = attn_case_random(b, seed);
    } else if (strcmp(fields[0], "offset") == 0 && (nfields == 2 || nfields == 3)) {
        ok = parse_number(fields[1], &a) == 0 && (nfields == 2 || parse_number(fields[2], &b) == 0);
        if (ok) *out = attn_case_key_offset(a, b, seed);
    } else if (strcmp(fields[0], "sharp") == 0 && nfields == 2) {
        ok = parse_number(fields[1], &a) == 0 && a > 0;
        if (ok) *out = attn_case_sharp(a, seed);
    } else if (strcmp(fields[0], "extreme") == 0 && nfields == 1) {
        ok = 1;
        *out = attn_case_extreme(seed);
    }
    if (!ok) {
        snprintf(err, errlen, "cannot parse attention case '%s'; expected %s (numbers >= 0, e.g. offset:256:8)",
                 text, attn_case_syntax());
        return -1;
    }
    return 0;
}

int attn_case_table(AttnCase* cases, int max_cases, uint64_t seed) {
    AttnCase all[] = {
        attn_case_key_offset(0, 1, seed),    attn_case_key_offset(16, 1, seed),
        attn_case_key_offset(64, 8, seed),   attn_case_key_offset(256, 8, seed),
        attn_case_key_offset(1024, 8, seed), attn_case_sharp(1e3, seed),
        attn_case_extreme(seed),
    };
    int n = (int)(sizeof all / sizeof all[0]);
    if (n > max_cases) n = max_cases;
    for (int i = 0; i < n; i++) cases[i] = all[i];
    return n;
}

/* ---- generation ---- */

static size_t qkv_index(AttnShape s, int b, int t, int part, int h, int d) {
    return ((((size_t)b * s.T + t) * 3 + part) * s.NH + h) * s.HS + d;
}

/* A random unit vector of length n, drawn from the normal distribution. */
static void random_unit(AttnRng* rng, double* u, int n) {
    double norm2 = 0;
    for (int d = 0; d < n; d++) {
        u[d] = attn_rng_normal(rng);
        norm2 += u[d] * u[d];
    }
    double inv = 1.0 / sqrt(norm2);
    for (int d = 0; d < n; d++) u[d] *= inv;
}

enum { PART_Q = 0, PART_K = 1, PART_V = 2 };

void attn_case_fill(const AttnCase* c, AttnShape s, float* qkv, float* dout) {
    attn_shape_check(s, "attn_case_fill");
    AttnRng rng;
    attn_rng_init(&rng, c->seed ^ (0x5DEECE66Dull * (uint64_t)(c->kind + 1)));
    const int HS = s.HS;
    const double sqrt_d = sqrt((double)HS);

    /* Per-head directions: the key offset u_h, or the sharp case's clusters. */
    int ndirs = c->kind == ATTN_CASE_KEY_OFFSET ? 1 : c->kind == ATTN_CASE_SHARP ? ATTN_SHARP_CLUSTERS : 0;
    double* dirs = (double*)mallocCheck(sizeof(double) * (size_t)s.NH * (ndirs ? ndirs : 1) * HS);
    for (int h = 0; h < s.NH; h++)
        for (int k = 0; k < ndirs; k++) random_unit(&rng, dirs + ((size_t)h * ndirs + k) * HS, HS);

    /* Sharp case: keys of length sqrt(HS) along their cluster direction plus a
       jitter of ATTN_SHARP_KEY_JITTER per element; queries exactly along their
       cluster direction with length logit * sqrt(HS) / |k|, so same-cluster
       logits are about `logit` and spread by about logit * jitter / sqrt(HS). */
    const double sharp_klen = sqrt_d;
    const double sharp_qlen = c->kind == ATTN_CASE_SHARP ? c->logit * sqrt_d / sharp_klen : 0;
    const double sharp_kjit = ATTN_SHARP_KEY_JITTER, sharp_qjit = 0.0;

    for (int b = 0; b < s.B; b++) {
        for (int t = 0; t < s.T; t++) {
            for (int h = 0; h < s.NH; h++) {
                int cq = 0, ck = 0;
                if (c->kind == ATTN_CASE_SHARP) {
                    cq = (int)(attn_rng_u64(&rng) % ATTN_SHARP_CLUSTERS);
                    ck = (int)(attn_rng_u64(&rng) % ATTN_SHARP_CLUSTERS);
                }
                for (int d = 0; d < HS; d++) {
                    double q, k, v;
                    switch (c->kind) {
                    case ATTN_CASE_KEY_OFFSET:
                        q = c->qscale * attn_rng_normal(&rng);
                        k = attn_rng_normal(&rng) + c->rho * sqrt_d * dirs[(size_t)h * HS + d];
                        v = attn_rng_normal(&rng);
                        break;
                    case ATTN_CASE_SHARP:
                        q = sharp_qlen * dirs[((size_t)h * ndirs + cq) * HS + d] + sharp_qjit * attn_rng_normal(&rng);
                        k = sharp_klen * dirs[((size_t)h * ndirs + ck) * HS + d] + sharp_kjit * attn_rng_normal(&rng);
                        v = attn_rng_normal(&rng);
                        break;
                    case ATTN_CASE_EXTREME:
                        q = k = v = ATTN_EXTREME_VALUE;
                        break;
                    case ATTN_CASE_RANDOM:
                        q = c->qscale * attn_rng_normal(&rng);
                        k = attn_rng_normal(&rng);
                        v = attn_rng_normal(&rng);
                        break;
                    default:
                        die("attn_case_fill: unknown case kind %d\n  hint: build the case with attn_case_* or attn_case_parse",
                            (int)c->kind);
                    }
                    qkv[qkv_index(s, b, t, PART_Q, h, d)] = bf16_round((float)q);
                    qkv[qkv_index(s, b, t, PART_K, h, d)] = bf16_round((float)k);
                    qkv[qkv_index(s, b, t, PART_V, h, d)] = bf16_round((float)v);
                }
            }
        }
    }
    free(dirs);

    if (dout != NULL) {
        /* A separate stream, so dO does not depend on how many numbers the
           inputs used (same dO for every case with the same seed and shape). */
        AttnRng rng_dout;
        attn_rng_init(&rng_dout, c->seed ^ 0xD0D0D0D0D0D0D0D0ull);
        size_t n = attn_out_count(s);
        for (size_t i = 0; i < n; i++) dout[i] = bf16_round((float)attn_rng_normal(&rng_dout));
    }
}
