/*
 * tests/test_sampler_text.c - the sampler's text (train/sampler.c) and the
 * sample records it feeds into log.jsonl (train/runlog.c) are valid UTF-8
 * and valid JSON whatever ids the model draws.
 *
 * Why: a GPT-2 token may hold only part of a multi-byte character (the
 * byte-level BPE splits rare characters into single bytes), so a sample cut
 * after such a token, or a token drawn out of context, is not valid UTF-8 on
 * its own; written raw, it makes the whole log.jsonl unreadable to strict
 * JSON readers (Python's json module reads the file as UTF-8 and stops).
 * Checked here, with ids from the real GPT-2 vocabulary:
 *   - a 4-byte character split over several tokens decodes whole when all its
 *     tokens are present, and each cut-off prefix or stray continuation byte
 *     becomes exactly one U+FFFD;
 *   - control characters become '?', '\n' and '\t' stay;
 *   - truncation to the buffer never cuts a character;
 *   - runlog_sample writes a line that is valid UTF-8 throughout and whose
 *     "sample" string unescapes (by the JSON rules, parsed here) to the text.
 * Needs .cache/gpt2/{encoder.json,vocab.bpe} (scripts/setup_data.sh; `make
 * test` runs it first).
 */
#include "dataloader/tokenizer.h"
#include "train/runlog.h"
#include "train/sampler.h"
#include "tests/testing.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VOCAB_DIR ".cache/gpt2"
#define FFFD "\xEF\xBF\xBD"

/* True when s[0..n) is valid UTF-8 (strict: no overlongs, surrogates or cut-off characters). */
static bool valid_utf8(const char* s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (tokenizer_utf8_next((const uint8_t*)s, n, &i) < 0) return false;
    }
    return true;
}

static int* encode(Tokenizer* t, const char* text, size_t* n) { return tokenizer_encode(t, text, strlen(text), n); }

/* The ids of text; checks that they split a character (some id alone is not valid UTF-8). */
static bool splits_a_character(Tokenizer* t, const int* ids, size_t n) {
    for (size_t k = 0; k < n; k++) {
        size_t len;
        const char* b = tokenizer_decode_token(t, ids[k], &len);
        if (b && !valid_utf8(b, len)) return true;
    }
    return false;
}

static void test_split_characters(Tokenizer* t) {
    test_section("tokens that split a multi-byte character");
    const char* text = "A\xF0\x9D\x93\x90" "B"; /* "A𝓐B": U+1D4D0 is 4 bytes */
    size_t n;
    int* ids = encode(t, text, &n);
    CHECK(n >= 3 && splits_a_character(t, ids, n), "the vocabulary splits U+1D4D0 over several tokens (%zu ids)", n);
    char buf[256];
    sampler_decode(t, ids, (int)n, buf, sizeof(buf));
    CHECK(strcmp(buf, text) == 0, "all the character's tokens: it decodes whole ('%s')", buf);
    /* Every cut inside the character: the kept prefix becomes one U+FFFD. */
    for (size_t keep = 1; keep < n; keep++) {
        sampler_decode(t, ids, (int)keep, buf, sizeof(buf));
        size_t len;
        char want[64] = "";
        size_t wl = 0;
        for (size_t k = 0; k < keep; k++) {
            const char* b = tokenizer_decode_token(t, ids[k], &len);
            memcpy(want + wl, b, len);
            wl += len;
        }
        want[wl] = '\0';
        bool cut = !valid_utf8(want, wl);
        CHECK(valid_utf8(buf, strlen(buf)), "first %zu ids: valid UTF-8", keep);
        if (cut) CHECK(strcmp(buf, "A" FFFD) == 0, "first %zu ids: the cut-off character is one U+FFFD ('%s')", keep, buf);
    }
    /* The character's tokens without its first: stray continuation bytes, one U+FFFD, then B. */
    size_t first_part = 0;
    for (size_t k = 0; k < n; k++) {
        size_t len;
        const char* b = tokenizer_decode_token(t, ids[k], &len);
        if (memchr(b, 0xF0, len)) { first_part = k; break; }
    }
    sampler_decode(t, ids + first_part + 1, (int)(n - first_part - 1), buf, sizeof(buf));
    CHECK(strcmp(buf, FFFD "B") == 0, "continuation bytes without their lead byte: one U+FFFD ('%s')", buf);
    free(ids);
}

static void test_controls_and_truncation(Tokenizer* t) {
    test_section("control characters and truncation");
    size_t n;
    int* ids = encode(t, "a\x01" "b\tc\nd\x7f" "e", &n);
    char buf[64];
    sampler_decode(t, ids, (int)n, buf, sizeof(buf));
    CHECK(strcmp(buf, "a?b\tc\nd?e") == 0, "controls become '?', tab and newline stay ('%s')", buf);
    free(ids);
    ids = encode(t, "ab\xE4\xB8\xAD", &n); /* "ab中" */
    sampler_decode(t, ids, (int)n, buf, 6);
    CHECK(strcmp(buf, "ab\xE4\xB8\xAD") == 0, "a buffer of 6 holds 'ab' and the 3-byte character");
    sampler_decode(t, ids, (int)n, buf, 5);
    CHECK(strcmp(buf, "ab") == 0, "a buffer of 5 drops the whole character, not part of it ('%s')", buf);
    free(ids);
}

/* Parses the JSON string at *p (which points at its opening quote) into out;
   false on any escape or byte JSON does not allow in a string. */
static bool parse_json_string(const char** p, char* out, size_t cap) {
    const char* s = *p;
    if (*s++ != '"') return false;
    size_t o = 0;
    while (*s != '"') {
        unsigned char c = (unsigned char)*s;
        if (c == '\0' || c < 0x20 || o + 4 >= cap) return false;
        if (c != '\\') { out[o++] = (char)c; s++; continue; }
        s++;
        switch (*s) {
            case '"': out[o++] = '"'; break;
            case '\\': out[o++] = '\\'; break;
            case '/': out[o++] = '/'; break;
            case 'n': out[o++] = '\n'; break;
            case 't': out[o++] = '\t'; break;
            case 'r': out[o++] = '\r'; break;
            case 'b': out[o++] = '\b'; break;
            case 'f': out[o++] = '\f'; break;
            case 'u': {
                unsigned v = 0;
                for (int k = 1; k <= 4; k++) {
                    char h = s[k];
                    int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                          : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                    if (d < 0) return false;
                    v = v * 16 + (unsigned)d;
                }
                if (v >= 0x80) return false; /* the writer escapes control characters only */
                out[o++] = (char)v;
                s += 4;
                break;
            }
            default: return false;
        }
        s++;
    }
    out[o] = '\0';
    *p = s + 1;
    return true;
}

static void test_log_record(Tokenizer* t) {
    test_section("sample records in log.jsonl");
    char path[] = "/tmp/test_sampler_textXXXXXX";
    int fd = mkstemp(path);
    close(fd);
    RunLog log;
    char err[256];
    CHECK(runlog_open(&log, path, 0, err, sizeof(err)) == 0, "log opens (%s)", err);
    /* Quotes, backslashes, newline, a control byte, then a character cut after its first token. */
    size_t n1, n2;
    int* a = encode(t, "say \"hi\\there\"\n\x02 ", &n1);
    int* b = encode(t, "\xF0\x9D\x93\x90", &n2);
    int ids[64];
    memcpy(ids, a, n1 * sizeof(int));
    ids[n1] = b[0];
    int n = (int)n1 + 1;
    char text[256];
    sampler_decode(t, ids, n, text, sizeof(text));
    runlog_sample(&log, 5, text, ids, n);
    runlog_close(&log);
    free(a);
    free(b);

    FILE* f = fopen(path, "rb");
    char line[4096];
    size_t got = f ? fread(line, 1, sizeof(line) - 1, f) : 0;
    if (f) fclose(f);
    line[got] = '\0';
    unlink(path);
    CHECK(got > 0 && line[got - 1] == '\n' && memchr(line, '\n', got) == line + got - 1, "one line, newline-terminated");
    CHECK(valid_utf8(line, got), "the whole line is valid UTF-8");
    const char* key = strstr(line, "\"sample\": ");
    char value[512];
    const char* p = key ? key + strlen("\"sample\": ") : NULL;
    bool parsed = p && parse_json_string(&p, value, sizeof(value));
    CHECK(parsed, "the sample is a well-formed JSON string");
    CHECK(parsed && strcmp(value, "say \"hi\\there\"\n? " FFFD) == 0, "it reads back as the text, cut character as U+FFFD");
}

int main(void) {
    Tokenizer* t = NULL;
    char err[512];
    if (tokenizer_load(&t, VOCAB_DIR, err, sizeof(err)) != 0) {
        printf("cannot load the GPT-2 vocabulary: %s\n", err);
        CHECK(false, "vocabulary loads from %s (run scripts/setup_data.sh)", VOCAB_DIR);
        return test_summary();
    }
    test_split_characters(t);
    test_controls_and_truncation(t);
    test_log_record(t);
    tokenizer_free(t);
    return test_summary();
}
