/*
 * train/sampler.c - seeded sampling from logits and decoding to valid UTF-8 (see sampler.h).
 */
#include "train/sampler.h"
#include "dataloader/tokenizer.h"
#include "common/utils.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t splitmix64(uint64_t* x) {
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

void sampler_seed(SamplerRng* rng, uint64_t seed) {
    uint64_t x = seed;
    rng->state = splitmix64(&x);
    if (rng->state == 0) rng->state = 0x9E3779B97F4A7C15ULL;
}

uint64_t sampler_next_u64(SamplerRng* rng) {
    uint64_t x = rng->state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    rng->state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

float sampler_uniform(SamplerRng* rng) { return (float)(sampler_next_u64(rng) >> 40) / 16777216.0f; }

int sampler_draw(const float* logits, int vocab_size, float temperature, SamplerRng* rng) {
    int best = -1;
    for (int i = 0; i < vocab_size; i++) {
        if (!isfinite(logits[i])) continue;
        if (best < 0 || logits[i] > logits[best]) best = i;
    }
    if (best < 0 || temperature <= 0.0f) return best;
    const double maxv = logits[best], inv_t = 1.0 / (double)temperature;
    double sum = 0.0;
    for (int i = 0; i < vocab_size; i++) {
        if (isfinite(logits[i])) sum += exp(((double)logits[i] - maxv) * inv_t);
    }
    /* Inverse CDF: the first id whose cumulative mass exceeds u * sum. */
    const double target = (double)sampler_uniform(rng) * sum;
    double cum = 0.0;
    int last = best;
    for (int i = 0; i < vocab_size; i++) {
        if (!isfinite(logits[i])) continue;
        cum += exp(((double)logits[i] - maxv) * inv_t);
        last = i;
        if (target < cum) return i;
    }
    return last; /* rounding left target at the very top */
}

/* Writes text[0..n) into buf (cap > 0 bytes, NUL-terminated) as valid UTF-8:
 * each valid character is copied whole or not at all (the output is cut only
 * between characters); a byte that does not start a valid character, with the
 * continuation bytes after it (at most 3), becomes one U+FFFD; control
 * characters other than '\n' and '\t' (and DEL) become '?'. */
static void write_valid_utf8(const uint8_t* text, size_t n, char* buf, size_t cap) {
    static const char replacement[3] = {(char)0xEF, (char)0xBF, (char)0xBD}; /* U+FFFD */
    size_t used = 0, i = 0;
    while (i < n) {
        size_t start = i;
        const char* piece = (const char*)text + i;
        size_t len;
        int32_t cp = tokenizer_utf8_next(text, n, &i);
        char ctrl = '?';
        if (cp < 0) {
            i++;
            for (int k = 0; k < 3 && i < n && (text[i] & 0xC0) == 0x80; k++) i++;
            piece = replacement;
            len = sizeof(replacement);
        } else if ((cp < 0x20 && cp != '\n' && cp != '\t') || cp == 0x7f) {
            piece = &ctrl;
            len = 1;
        } else {
            len = i - start;
        }
        if (used + len > cap - 1) break;
        memcpy(buf + used, piece, len);
        used += len;
    }
    buf[used] = '\0';
}

void sampler_decode(const struct Tokenizer* tok, const int* ids, int n, char* buf, size_t cap) {
    if (cap == 0) return;
    buf[0] = '\0';
    if (tok == NULL) {
        size_t used = 0;
        for (int i = 0; i < n && used + 1 < cap; i++) {
            int w = snprintf(buf + used, cap - used, "%s%d", i ? " " : "", ids[i]);
            if (w < 0 || (size_t)w >= cap - used) {
                buf[used] = '\0';
                break;
            }
            used += (size_t)w;
        }
        return;
    }
    /* All ids' bytes first, then one validation pass: a character whose bytes
       span two tokens is whole again once they are joined. */
    size_t need = tokenizer_decode(tok, ids, (size_t)(n > 0 ? n : 0), NULL, 0);
    uint8_t* bytes = (uint8_t*)mallocCheck(need + 1);
    tokenizer_decode(tok, ids, (size_t)(n > 0 ? n : 0), (char*)bytes, need);
    write_valid_utf8(bytes, need, buf, cap);
    free(bytes);
}
