/*
 * train/sampler.h - drawing tokens from the model's logits with a seeded,
 * portable RNG, and turning the ids into text.
 *
 * Why: the trainers print samples during training; a resumed run must draw
 * the very same samples as an uninterrupted one, so the RNG is a small
 * explicit state (one uint64, saved in the resume state) rather than rand().
 * The draw itself is computed in double from the logits of the real vocab
 * (the padded tail, ids >= V, can never be drawn).
 *
 * RNG: xorshift64* (Vigna), seeded through splitmix64 so any seed, 0
 * included, gives a good non-zero state. sampler_uniform gives 24-bit floats
 * in [0, 1).
 *
 * Offers: SamplerRng, sampler_seed, sampler_next_u64, sampler_uniform,
 * sampler_draw (temperature sampling; temperature 0 = argmax),
 * sampler_decode (ids -> printable, valid UTF-8 text through the tokenizer, or the ids).
 */
#ifndef TRAIN_SAMPLER_H
#define TRAIN_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    uint64_t state;  /* never 0 */
} SamplerRng;

void sampler_seed(SamplerRng* rng, uint64_t seed);
uint64_t sampler_next_u64(SamplerRng* rng);
/* Uniform in [0, 1), 24 random bits. */
float sampler_uniform(SamplerRng* rng);

/* Draws an id in [0, vocab_size) from softmax(logits[0..vocab_size) / temperature).
   temperature <= 0 returns the argmax (first on ties) and uses no randomness.
   Non-finite logits are never drawn; if none is finite, returns -1. */
int sampler_draw(const float* logits, int vocab_size, float temperature, SamplerRng* rng);

struct Tokenizer;
/* Writes the text of ids into buf (cap bytes, NUL-terminated, truncated to fit).
   With a tokenizer: its decoding, always valid UTF-8 (log.jsonl and the
   console get it as is): a GPT-2 token may hold part of a character, so the
   bytes of all ids are joined first, then each byte sequence that is not a
   valid character (a character cut by the last token, a stray continuation
   byte) becomes U+FFFD, control characters other than '\n' and '\t' become
   '?', and truncation never cuts a character. Without a tokenizer (NULL): the
   ids, space-separated. */
void sampler_decode(const struct Tokenizer* tok, const int* ids, int n, char* buf, size_t cap);

#ifdef __cplusplus
}
#endif

#endif /* TRAIN_SAMPLER_H */
