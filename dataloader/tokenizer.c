/*
 * dataloader/tokenizer.c - GPT-2 byte-level BPE: loading, encoding, decoding.
 *
 * Why: see tokenizer.h. This file owns the vocabulary tables, the GPT-2
 * pre-tokenizer (a hand-written matcher equal to the GPT-2 regex, much faster
 * than a regex engine), and the BPE merge loop.
 *
 * How it is built:
 * - Vocabulary: encoder.json keys are byte strings written in GPT-2's
 *   "bytes to unicode" alphabet (every byte gets a printable code point); they
 *   are mapped back to raw bytes and stored in one arena. An open-addressing
 *   hash table maps byte strings to ids.
 * - Merge ranks: GPT-2's merge i creates token 256 + i, so the rank of a merge
 *   is the id of the merged token (the load checks this against vocab.bpe). BPE
 *   then works as in tiktoken: repeatedly merge the adjacent pair whose
 *   concatenation has the lowest id, leftmost first. Short pieces use an
 *   array scan (cheap for the usual few bytes); long ones use a heap with
 *   lazy deletion so a 100 KB run of one character stays O(n log n).
 * - Cache: encoded pieces that are not single tokens are kept in a hash table
 *   (cleared when full), since natural text repeats its words.
 */
#include "dataloader/tokenizer.h"
#include "dataloader/unicode_tables.h"
#include "common/utils.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define NUM_BYTE_TOKENS 256
#define NUM_MERGES (TOKENIZER_VOCAB_SIZE - NUM_BYTE_TOKENS - 1) /* 50000: all ids but bytes and EOT */
#define EOT_TEXT "<|endoftext|>"
#define NO_RANK INT32_MAX
/* Pieces up to this many bytes are merged by the array scan, longer ones by the heap. */
#define BPE_SCAN_MAX_BYTES 128
/* Pieces up to this many bytes go into the cache; longer ones are rare and would crowd it. */
#define CACHE_MAX_PIECE_BYTES 128
#define CACHE_SLOTS (1u << 18)
#define CACHE_MAX_ENTRIES (CACHE_SLOTS / 2)
#define CACHE_KEY_ARENA_BYTES (8u << 20)
#define CACHE_ID_ARENA_INTS (4u << 20)

/* One slot of the vocabulary hash table. It holds the token's first 8 bytes
 * and its length, so most lookups touch this slot only (one cache miss). */
typedef struct {
    uint64_t prefix;    /* first 8 bytes of the token, zero-padded */
    uint32_t hash_lo;   /* low 32 bits of the key's hash */
    uint16_t id_plus_1; /* 0 = empty slot (ids < 50257 fit) */
    uint16_t len;
} VocabSlot;

typedef struct {
    uint32_t key_off, key_len; /* key bytes in cache_keys */
    uint32_t ids_off, n_ids;   /* ids in cache_ids */
    uint64_t hash;             /* 0 = empty slot (real hashes are forced non-zero) */
} CacheSlot;

typedef struct {
    int32_t rank;  /* id of the merged token */
    uint32_t left; /* start of the left part */
    uint32_t end;  /* end of the right part when the entry was pushed (validity check) */
} MergeCandidate;

struct Tokenizer {
    /* vocabulary: token id -> bytes, and bytes -> id */
    uint8_t* token_bytes;
    uint32_t token_off[TOKENIZER_VOCAB_SIZE];
    uint32_t token_len[TOKENIZER_VOCAB_SIZE];
    VocabSlot* vocab_slots;
    uint32_t vocab_mask;
    /* cache of encoded multi-token pieces */
    CacheSlot* cache_slots;
    uint32_t cache_entries;
    uint8_t* cache_keys;
    uint32_t cache_keys_used;
    int* cache_ids;
    uint32_t cache_ids_used;
    /* scratch for BPE, grown on demand (no allocation per piece) */
    uint32_t* scratch_pos;
    int32_t* scratch_rank;
    uint32_t* scratch_next;
    uint32_t* scratch_prev;
    MergeCandidate* scratch_heap;
    size_t scratch_cap; /* bytes of piece the scratch arrays can hold */
    int* piece_ids;     /* ids of the piece being encoded */
    int decode_only;    /* loaded from llm.c's gpt2_tokenizer.bin: token bytes only, no merges */
};

/* ---------------------------------------------------------------- hashing */

static inline uint64_t mix64(uint64_t h) {
    h ^= h >> 32;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h;
}

/* The first min(n, 8) bytes of p as a zero-padded little-endian word. */
static inline uint64_t load_prefix(const uint8_t* p, size_t n) {
    uint64_t w = 0;
    if (n >= 8) { memcpy(&w, p, 8); return w; }
    size_t off = 0; /* fixed-size loads only: a variable-length memcpy would be a library call */
    if (n & 4) { uint32_t x; memcpy(&x, p, 4); w = x; off = 4; }
    if (n & 2) { uint16_t x; memcpy(&x, p + off, 2); w |= (uint64_t)x << (8 * off); off += 2; }
    if (n & 1) w |= (uint64_t)p[off] << (8 * off);
    return w;
}

/* Hash of n bytes whose first 8 are `prefix` (from load_prefix). */
static inline uint64_t hash_bytes(const uint8_t* p, size_t n, uint64_t prefix) {
    uint64_t h = (prefix ^ ((uint64_t)n * 0xff51afd7ed558ccdull)) * 0x9e3779b97f4a7c15ull;
    for (size_t i = 8; i < n; i += 8) {
        uint64_t w = load_prefix(p + i, n - i);
        h = ((h ^ (h >> 29)) ^ w) * 0xbf58476d1ce4e5b9ull;
    }
    return mix64(h) | 1; /* never 0: 0 marks an empty cache slot */
}

/* Id of the token with exactly these bytes, or -1. Never returns the EOT id (not in the table). */
static inline int vocab_lookup_hashed(const Tokenizer* t, const uint8_t* p, size_t n, uint64_t prefix, uint64_t h) {
    uint32_t i = (uint32_t)h & t->vocab_mask;
    for (;;) {
        const VocabSlot* s = &t->vocab_slots[i];
        if (s->id_plus_1 == 0) return -1;
        if (s->hash_lo == (uint32_t)h && s->len == n && s->prefix == prefix) {
            int id = s->id_plus_1 - 1;
            if (n <= 8 || memcmp(t->token_bytes + t->token_off[id] + 8, p + 8, n - 8) == 0) return id;
        }
        i = (i + 1) & t->vocab_mask;
    }
}

static inline int vocab_lookup(const Tokenizer* t, const uint8_t* p, size_t n) {
    uint64_t prefix = load_prefix(p, n);
    return vocab_lookup_hashed(t, p, n, prefix, hash_bytes(p, n, prefix));
}

static void vocab_insert(Tokenizer* t, int id) {
    const uint8_t* p = t->token_bytes + t->token_off[id];
    size_t n = t->token_len[id];
    uint64_t prefix = load_prefix(p, n);
    uint64_t h = hash_bytes(p, n, prefix);
    uint32_t i = (uint32_t)h & t->vocab_mask;
    while (t->vocab_slots[i].id_plus_1 != 0) i = (i + 1) & t->vocab_mask;
    t->vocab_slots[i] = (VocabSlot){prefix, (uint32_t)h, (uint16_t)(id + 1), (uint16_t)n};
}

/* ---------------------------------------------------------------- loading */

/* GPT-2 writes byte b as a printable code point: bytes that are printable
 * Latin-1 (33..126, 161..172, 174..255) stand for themselves, and the other 68
 * (0..32, 127..160, 173, in that order) map to 256, 257, ... 323. Returns the
 * byte for code point cp, or -1 if cp is not in that alphabet. */
static int gpt2_codepoint_to_byte(uint32_t cp) {
    if (cp < 256) return ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || cp >= 174) ? (int)cp : -1;
    uint32_t k = cp - 256;
    if (k < 33) return (int)k;              /* 0..32 */
    if (k < 33 + 34) return (int)(k + 94);  /* 127..160 */
    if (k == 67) return 173;
    return -1;
}

/* Reads a vocabulary file whole. Only a regular file is opened: a folder
 * would "open" and report an absurd size, and a FIFO would block the open. */
static char* read_whole_file(const char* path, size_t* size, char* err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "'%s' is %s, not a file\n  hint: pass --vocab DIR, the folder that holds encoder.json "
                 "and vocab.bpe (scripts/setup_data.sh puts them in .cache/gpt2)", path,
                 S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" : "a special file");
        return NULL;
    }
    FILE* f = fopen(path, "rb");
    if (!f) {
        snprintf(err, errlen, "cannot open '%s': %s\n  hint: pass --vocab DIR with encoder.json and vocab.bpe "
                 "(scripts/setup_data.sh puts them in .cache/gpt2)", path, strerror(errno));
        return NULL;
    }
    if (fseeko(f, 0, SEEK_END) != 0) { fclose(f); snprintf(err, errlen, "cannot seek in '%s'", path); return NULL; }
    off_t n = ftello(f);
    fseeko(f, 0, SEEK_SET);
    if (n < 0) {
        fclose(f);
        snprintf(err, errlen, "cannot tell the size of '%s': %s", path, strerror(errno));
        return NULL;
    }
    char* buf = mallocCheck((size_t)n + 1);
    if (fread(buf, 1, (size_t)n, f) != (size_t)n) {
        fclose(f);
        free(buf);
        snprintf(err, errlen, "cannot read '%s': %s", path, strerror(errno));
        return NULL;
    }
    fclose(f);
    buf[n] = '\0';
    *size = (size_t)n;
    return buf;
}

/* One UTF-8 character at s[*i] (see tokenizer.h). */
int32_t tokenizer_utf8_next(const uint8_t* s, size_t n, size_t* i) {
    uint8_t b = s[*i];
    if (b < 0x80) { (*i)++; return b; }
    int len = (b >= 0xc2 && b <= 0xdf) ? 2 : (b >= 0xe0 && b <= 0xef) ? 3 : (b >= 0xf0 && b <= 0xf4) ? 4 : 0;
    if (len == 0 || *i + (size_t)len > n) return -1;
    uint32_t cp = b & (0x7f >> len);
    for (int k = 1; k < len; k++) {
        uint8_t c = s[*i + k];
        if ((c & 0xc0) != 0x80) return -1;
        cp = (cp << 6) | (c & 0x3f);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
        return -1;
    *i += len;
    return (int32_t)cp;
}

/* Appends the GPT-2 bytes of code point cp to out; returns false if cp is not in the alphabet. */
static bool put_gpt2_byte(uint32_t cp, uint8_t* out, size_t* n) {
    int b = gpt2_codepoint_to_byte(cp);
    if (b < 0) return false;
    out[(*n)++] = (uint8_t)b;
    return true;
}

/* Parses a JSON string starting at s[*i] == '"' and writes its characters,
 * translated from the GPT-2 alphabet to raw bytes, into out (capacity: the
 * string's own length suffices, since each character gives one byte).
 * Returns NULL on success, else a static message. */
static const char* parse_json_token(const char* js, size_t n, size_t* i, uint8_t* out, size_t* out_len) {
    const uint8_t* s = (const uint8_t*)js;
    *out_len = 0;
    if (*i >= n || s[*i] != '"') return "expected '\"' (a token string)";
    (*i)++;
    for (;;) {
        if (*i >= n) return "unterminated string";
        uint8_t c = s[*i];
        if (c == '"') { (*i)++; return NULL; }
        uint32_t cp;
        if (c == '\\') {
            if (*i + 1 >= n) return "unterminated escape";
            char e = (char)s[*i + 1];
            *i += 2;
            switch (e) {
                case '"': cp = '"'; break;
                case '\\': cp = '\\'; break;
                case '/': cp = '/'; break;
                case 'b': cp = '\b'; break;
                case 'f': cp = '\f'; break;
                case 'n': cp = '\n'; break;
                case 'r': cp = '\r'; break;
                case 't': cp = '\t'; break;
                case 'u': {
                    if (*i + 4 > n) return "truncated \\u escape";
                    /* exactly 4 hex digits, as JSON says (strtoul alone would take a sign or spaces) */
                    cp = 0;
                    for (int k = 0; k < 4; k++) {
                        uint8_t h = s[*i];
                        int d = (h >= '0' && h <= '9') ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                              : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
                        if (d < 0) return "bad \\u escape (JSON wants exactly 4 hex digits)";
                        cp = cp * 16 + (uint32_t)d;
                        (*i)++;
                    }
                    break; /* surrogates are not in the GPT-2 alphabet and fail below */
                }
                default: return "unknown escape in string";
            }
        } else {
            int32_t u = tokenizer_utf8_next(s, n, i);
            if (u < 0) return "invalid UTF-8 in string";
            cp = (uint32_t)u;
        }
        if (!put_gpt2_byte(cp, out, out_len))
            return "a character outside GPT-2's byte-to-unicode alphabet (is this a GPT-2 encoder.json?)";
    }
}

static void skip_ws(const char* s, size_t n, size_t* i) {
    while (*i < n && (s[*i] == ' ' || s[*i] == '\n' || s[*i] == '\r' || s[*i] == '\t')) (*i)++;
}

/* Reads encoder.json into t's token arena. Returns 0, or -1 with err set. */
static int load_encoder_json(Tokenizer* t, const char* path, char* err, size_t errlen) {
    size_t n;
    char* js = read_whole_file(path, &n, err, errlen);
    if (!js) return -1;
    t->token_bytes = mallocCheck(n); /* every token byte comes from at least one byte of JSON */
    for (int id = 0; id < TOKENIZER_VOCAB_SIZE; id++) t->token_len[id] = UINT32_MAX; /* "not seen yet" */
    size_t used = 0, i = 0, count = 0;
    const char* problem = NULL;
    skip_ws(js, n, &i);
    if (i >= n || js[i] != '{') { problem = "expected '{' at the start"; goto fail; }
    i++;
    skip_ws(js, n, &i);
    if (i < n && js[i] == '}') { problem = "the object is empty"; goto fail; }
    for (;;) {
        skip_ws(js, n, &i);
        size_t len;
        if ((problem = parse_json_token(js, n, &i, t->token_bytes + used, &len)) != NULL) goto fail;
        skip_ws(js, n, &i);
        if (i >= n || js[i] != ':') { problem = "expected ':' after a token string"; goto fail; }
        i++;
        skip_ws(js, n, &i);
        char* endp;
        if (i >= n || js[i] < '0' || js[i] > '9') { problem = "expected an integer id (digits) after ':'"; goto fail; }
        long id = strtol(js + i, &endp, 10);
        if (id < 0 || id >= TOKENIZER_VOCAB_SIZE) { problem = "id out of range 0..50256 (not GPT-2's vocabulary?)"; goto fail; }
        if (t->token_len[id] != UINT32_MAX) { problem = "the same id appears twice"; goto fail; }
        if (len == 0 || len > UINT16_MAX) { problem = "empty or over-long token string"; goto fail; }
        i = (size_t)(endp - js);
        t->token_off[id] = (uint32_t)used;
        t->token_len[id] = (uint32_t)len;
        used += len;
        count++;
        skip_ws(js, n, &i);
        if (i < n && js[i] == ',') { i++; continue; }
        if (i < n && js[i] == '}') break;
        problem = "expected ',' or '}' after an id";
        goto fail;
    }
    i++;
    skip_ws(js, n, &i);
    if (i < n) { problem = "something follows the top-level object's closing '}'"; goto fail; }
    if (count != TOKENIZER_VOCAB_SIZE) {
        snprintf(err, errlen, "%s: has %zu tokens, GPT-2 has %d\n  hint: use GPT-2's encoder.json "
                 "(scripts/setup_data.sh fetches it)", path, count, TOKENIZER_VOCAB_SIZE);
        free(js);
        return -1;
    }
    const uint32_t eot = TOKENIZER_EOT;
    if (t->token_len[eot] != strlen(EOT_TEXT) || memcmp(t->token_bytes + t->token_off[eot], EOT_TEXT, strlen(EOT_TEXT)) != 0) {
        snprintf(err, errlen, "%s: id %d is not \"%s\"\n  hint: use GPT-2's encoder.json", path, TOKENIZER_EOT, EOT_TEXT);
        free(js);
        return -1;
    }
    free(js);
    return 0;
fail:
    snprintf(err, errlen, "%s: malformed at byte %zu: %s\n  hint: use GPT-2's encoder.json "
             "(scripts/setup_data.sh fetches it)", path, i, problem);
    free(js);
    return -1;
}

/* Parses one side of a merge line ("Ġt" etc.) into raw bytes. Returns its length or -1. */
static int merge_side_bytes(const uint8_t* s, size_t n, uint8_t* out) {
    size_t i = 0, len = 0;
    while (i < n) {
        int32_t cp = tokenizer_utf8_next(s, n, &i);
        if (cp < 0 || !put_gpt2_byte((uint32_t)cp, out, &len)) return -1;
    }
    return (int)len;
}

/* Checks vocab.bpe against the loaded vocabulary: merge i (0-based, after the
 * "#version" line) must join two tokens into token 256 + i. That is what lets
 * BPE use token ids as merge ranks. */
static int check_vocab_bpe(Tokenizer* t, const char* path, char* err, size_t errlen) {
    size_t n;
    char* text = read_whole_file(path, &n, err, errlen);
    if (!text) return -1;
    const uint8_t* s = (const uint8_t*)text;
    size_t i = 0, line_no = 0;
    int merges = 0;
    uint8_t a[256], b[256], ab[512];
    const char* problem = NULL;
    while (i < n) {
        size_t start = i;
        while (i < n && s[i] != '\n') i++;
        size_t end = i;
        if (i < n) i++;
        line_no++;
        if (end > start && s[end - 1] == '\r') end--;
        if (end == start) continue;
        if (line_no == 1 && end - start >= 8 && memcmp(s + start, "#version", 8) == 0) continue; /* header */
        const uint8_t* sp = memchr(s + start, ' ', end - start);
        if (!sp) { problem = "expected two tokens separated by one space"; goto fail; }
        size_t la_n = (size_t)(sp - (s + start)), lb_n = end - (size_t)(sp - s) - 1;
        if (la_n > 256 || lb_n > 256) { problem = "token longer than any GPT-2 token"; goto fail; }
        int la = merge_side_bytes(s + start, la_n, a);
        int lb = merge_side_bytes(sp + 1, lb_n, b);
        if (la <= 0 || lb <= 0) { problem = "a token with characters outside GPT-2's byte-to-unicode alphabet"; goto fail; }
        memcpy(ab, a, (size_t)la);
        memcpy(ab + la, b, (size_t)lb);
        if (vocab_lookup(t, a, (size_t)la) < 0 || vocab_lookup(t, b, (size_t)lb) < 0) {
            problem = "merges a token that encoder.json does not have";
            goto fail;
        }
        if (vocab_lookup(t, ab, (size_t)(la + lb)) != NUM_BYTE_TOKENS + merges) {
            problem = "the merged token's id in encoder.json is not 256 + the merge's rank "
                      "(encoder.json and vocab.bpe do not belong together)";
            goto fail;
        }
        merges++;
    }
    free(text);
    if (merges != NUM_MERGES) {
        snprintf(err, errlen, "%s: has %d merges, GPT-2 has %d\n  hint: use GPT-2's vocab.bpe "
                 "(scripts/setup_data.sh fetches it)", path, merges, NUM_MERGES);
        return -1;
    }
    return 0;
fail:
    snprintf(err, errlen, "%s: line %zu: %s\n  hint: use GPT-2's vocab.bpe together with its encoder.json "
             "(scripts/setup_data.sh fetches both)", path, line_no, problem);
    free(text);
    return -1;
}

/* llm.c's tokenizer file (gpt2_tokenizer.bin): uint32 header[256] = {20240328, version 1|2,
 * vocab size, (version 2) the EOT id, 0...}, then per token a uint8 length (>= 1) and its bytes.
 * Fills t's token table for decoding; 0, or -1 with err naming the file, the problem and its offset. */
#define LLMC_TOKENIZER_MAGIC 20240328u
static int load_llmc_tokenizer(Tokenizer* t, const char* path, char* err, size_t errlen) {
    size_t n;
    char* raw = read_whole_file(path, &n, err, errlen);
    if (!raw) return -1;
    const uint8_t* b = (const uint8_t*)raw;
    uint32_t h[4] = {0, 0, 0, 0};
    for (int k = 0; k < 4 && n >= 1024; k++)
        h[k] = (uint32_t)b[4 * k] | (uint32_t)b[4 * k + 1] << 8 | (uint32_t)b[4 * k + 2] << 16 | (uint32_t)b[4 * k + 3] << 24;
    const char* problem = NULL;
    size_t at = 1024;
    if (n < 1024) problem = "shorter than its 1024-byte header";
    else if (h[0] != LLMC_TOKENIZER_MAGIC) problem = "bad magic at byte 0 (expected 20240328: not llm.c's tokenizer file)";
    else if (h[1] != 1 && h[1] != 2) problem = "unsupported version at byte 4 (expected 1 or 2)";
    else if (h[2] != TOKENIZER_VOCAB_SIZE) problem = "vocab size at byte 8 is not GPT-2's 50257";
    else if (h[1] == 2 && h[3] != TOKENIZER_EOT) problem = "EOT token id at byte 12 is not GPT-2's 50256";
    if (problem) {
        snprintf(err, errlen, "%s: %s\n  hint: pass llm.c's gpt2_tokenizer.bin, or a folder with GPT-2's encoder.json "
                 "and vocab.bpe", path, problem);
        free(raw);
        return -1;
    }
    t->token_bytes = mallocCheck(n);
    size_t used = 0;
    for (int id = 0; id < TOKENIZER_VOCAB_SIZE; id++) {
        if (at >= n || b[at] == 0 || at + 1 + b[at] > n) {
            snprintf(err, errlen, "%s: token %d at byte %zu: %s\n  hint: the file is truncated or corrupt; use "
                     "llm.c's gpt2_tokenizer.bin", path, id, at, at >= n ? "the file ends before it" :
                     b[at] == 0 ? "length 0" : "its bytes run past the end of the file");
            free(raw);
            return -1;
        }
        const size_t len = b[at];
        memcpy(t->token_bytes + used, b + at + 1, len);
        t->token_off[id] = (uint32_t)used;
        t->token_len[id] = (uint32_t)len;
        used += len;
        at += 1 + len;
    }
    if (at != n) {
        snprintf(err, errlen, "%s: %zu bytes follow the last token (at byte %zu)\n  hint: the file is corrupt or not "
                 "GPT-2's; use llm.c's gpt2_tokenizer.bin", path, n - at, at);
        free(raw);
        return -1;
    }
    free(raw);
    t->decode_only = 1;
    return 0;
}

/* A vocabulary path names llm.c's tokenizer file: the file itself, or a folder holding
 * gpt2_tokenizer.bin but no encoder.json. Writes that file's path into buf. */
static int llmc_tokenizer_path(const char* vocab, char* buf, size_t cap) {
    struct stat st;
    if (stat(vocab, &st) == 0 && S_ISREG(st.st_mode)) {
        snprintf(buf, cap, "%s", vocab);
        return 1;
    }
    snprintf(buf, cap, "%s/encoder.json", vocab);
    if (stat(buf, &st) == 0) return 0;
    snprintf(buf, cap, "%s/gpt2_tokenizer.bin", vocab);
    return stat(buf, &st) == 0 && S_ISREG(st.st_mode);
}

int tokenizer_can_encode(const Tokenizer* t) { return !t->decode_only; }

int tokenizer_load(Tokenizer** out, const char* vocab_dir, char* err, size_t errlen) {
    char dummy[1];
    if (err == NULL || errlen == 0) { err = dummy; errlen = sizeof(dummy); }
    err[0] = '\0';
    *out = NULL;
    size_t dl = strlen(vocab_dir);
    char* path = mallocCheck(dl + 32);
    Tokenizer* t = callocCheck(1, sizeof(Tokenizer));
    if (llmc_tokenizer_path(vocab_dir, path, dl + 32)) {
        if (load_llmc_tokenizer(t, path, err, errlen) != 0) goto fail;
        free(path);
        *out = t;
        return 0;
    }

    snprintf(path, dl + 32, "%s/encoder.json", vocab_dir);
    if (load_encoder_json(t, path, err, errlen) != 0) goto fail;

    uint32_t slots = 1;
    while (slots < 2u * TOKENIZER_VOCAB_SIZE) slots <<= 1;
    t->vocab_slots = callocCheck(slots, sizeof(VocabSlot));
    t->vocab_mask = slots - 1;
    for (int id = 0; id < TOKENIZER_VOCAB_SIZE; id++) {
        if (id == TOKENIZER_EOT) continue; /* special: never produced by BPE, only by the caller */
        if (vocab_lookup(t, t->token_bytes + t->token_off[id], t->token_len[id]) >= 0) {
            snprintf(err, errlen, "%s: two ids have the same token bytes (id %d)\n  hint: use GPT-2's encoder.json",
                     path, id);
            goto fail;
        }
        vocab_insert(t, id);
    }
    for (int byte = 0; byte < NUM_BYTE_TOKENS; byte++) {
        uint8_t c = (uint8_t)byte;
        if (vocab_lookup(t, &c, 1) < 0) {
            snprintf(err, errlen, "%s: byte %d has no token of its own, so some text could not be encoded\n"
                     "  hint: use GPT-2's encoder.json", path, byte);
            goto fail;
        }
    }

    snprintf(path, dl + 32, "%s/vocab.bpe", vocab_dir);
    if (check_vocab_bpe(t, path, err, errlen) != 0) goto fail;

    t->cache_slots = callocCheck(CACHE_SLOTS, sizeof(CacheSlot));
    t->cache_keys = mallocCheck(CACHE_KEY_ARENA_BYTES);
    t->cache_ids = mallocCheck(CACHE_ID_ARENA_INTS * sizeof(int));
    free(path);
    *out = t;
    return 0;
fail:
    free(path);
    tokenizer_free(t);
    return -1;
}

void tokenizer_free(Tokenizer* t) {
    if (!t) return;
    free(t->token_bytes);
    free(t->vocab_slots);
    free(t->cache_slots);
    free(t->cache_keys);
    free(t->cache_ids);
    free(t->scratch_pos);
    free(t->scratch_rank);
    free(t->scratch_next);
    free(t->scratch_prev);
    free(t->scratch_heap);
    free(t->piece_ids);
    free(t);
}

/* ---------------------------------------------------------------- BPE */

static void ensure_scratch(Tokenizer* t, size_t n) {
    if (n <= t->scratch_cap) return;
    if (n >= UINT32_MAX) die("tokenizer: one pre-token of %zu bytes (a 4 GiB run of one character class?) is "
                             "too long for BPE\n  hint: split the text into documents", n);
    size_t cap = t->scratch_cap ? t->scratch_cap : 256;
    while (cap < n) cap *= 2;
    free(t->scratch_pos); free(t->scratch_rank); free(t->scratch_next); free(t->scratch_prev);
    free(t->scratch_heap); free(t->piece_ids);
    t->scratch_pos = mallocCheck((cap + 1) * sizeof(uint32_t));
    t->scratch_rank = mallocCheck((cap + 1) * sizeof(int32_t));
    t->scratch_next = mallocCheck((cap + 1) * sizeof(uint32_t));
    t->scratch_prev = mallocCheck((cap + 1) * sizeof(uint32_t));
    t->scratch_heap = mallocCheck(3 * (cap + 1) * sizeof(MergeCandidate)); /* n-1 initial + 2 per merge */
    t->piece_ids = mallocCheck((cap + 1) * sizeof(int));
    t->scratch_cap = cap;
}

static inline int32_t rank_of(const Tokenizer* t, const uint8_t* p, size_t n) {
    int id = vocab_lookup(t, p, n);
    return id < 0 ? NO_RANK : id;
}

/* BPE by array scan (n >= 2): parts are [pos[k], pos[k+1]); rank[k] is the rank of
 * joining parts k and k+1. Each step finds the lowest rank (leftmost on ties),
 * joins, and recomputes the two ranks that changed. Writes ids, returns count. */
static size_t bpe_scan(Tokenizer* t, const uint8_t* p, size_t n, int* ids) {
    uint32_t* pos = t->scratch_pos;
    int32_t* rank = t->scratch_rank;
    size_t parts = n;
    for (size_t k = 0; k <= n; k++) pos[k] = (uint32_t)k;
    for (size_t k = 0; k + 1 < parts; k++) rank[k] = rank_of(t, p + k, 2);
    while (parts > 1) {
        int32_t best = NO_RANK;
        size_t bk = 0;
        for (size_t k = 0; k + 1 < parts; k++)
            if (rank[k] < best) { best = rank[k]; bk = k; }
        if (best == NO_RANK) break;
        /* join parts bk and bk+1: drop boundary bk+1 */
        memmove(pos + bk + 1, pos + bk + 2, (parts - bk - 1) * sizeof(uint32_t));
        memmove(rank + bk + 1, rank + bk + 2, (parts >= bk + 3 ? parts - bk - 3 : 0) * sizeof(int32_t));
        parts--;
        if (bk + 1 < parts) rank[bk] = rank_of(t, p + pos[bk], pos[bk + 2] - pos[bk]);
        if (bk > 0) rank[bk - 1] = rank_of(t, p + pos[bk - 1], pos[bk + 1] - pos[bk - 1]);
    }
    for (size_t k = 0; k < parts; k++) ids[k] = vocab_lookup(t, p + pos[k], pos[k + 1] - pos[k]);
    return parts;
}

static inline bool candidate_less(MergeCandidate a, MergeCandidate b) {
    return a.rank < b.rank || (a.rank == b.rank && a.left < b.left);
}

static void heap_push(MergeCandidate* h, size_t* n, MergeCandidate c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!candidate_less(c, h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = c;
}

static MergeCandidate heap_pop(MergeCandidate* h, size_t* n) {
    MergeCandidate top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && candidate_less(h[c + 1], h[c])) c++;
        if (!candidate_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

/* BPE with a min-heap of candidate joins (rank, left start), for long pieces.
 * Parts form a linked list by start offset: next[s] is the start of the part
 * after the one starting at s (n at the end). An entry is stale, and skipped,
 * if its left part is gone or the pair no longer ends where it did. Joining
 * the lowest (rank, left) first is the same order as the array scan. */
static size_t bpe_heap(Tokenizer* t, const uint8_t* p, size_t n, int* ids) {
    uint32_t* next = t->scratch_next;
    uint32_t* prev = t->scratch_prev;
    uint8_t* alive = (uint8_t*)t->scratch_pos; /* reuse: n + 1 bytes fit in n + 1 uint32 */
    MergeCandidate* heap = t->scratch_heap;
    size_t hn = 0;
    for (size_t k = 0; k < n; k++) { next[k] = (uint32_t)k + 1; prev[k] = (uint32_t)k - 1; alive[k] = 1; }
    for (size_t k = 0; k + 1 < n; k++) {
        int32_t r = rank_of(t, p + k, 2);
        if (r != NO_RANK) heap_push(heap, &hn, (MergeCandidate){r, (uint32_t)k, (uint32_t)k + 2});
    }
    while (hn > 0) {
        MergeCandidate c = heap_pop(heap, &hn);
        uint32_t left = c.left;
        if (!alive[left]) continue;
        uint32_t right = next[left];
        if (right >= n || next[right] != c.end) continue;
        /* join left and right */
        uint32_t after = next[right];
        alive[right] = 0;
        next[left] = after;
        if (after < n) prev[after] = left;
        if (after < n) {
            int32_t r = rank_of(t, p + left, next[after] - left);
            if (r != NO_RANK) heap_push(heap, &hn, (MergeCandidate){r, left, next[after]});
        }
        if (left > 0) {
            uint32_t before = prev[left];
            int32_t r = rank_of(t, p + before, after - before);
            if (r != NO_RANK) heap_push(heap, &hn, (MergeCandidate){r, before, after});
        }
    }
    size_t count = 0;
    for (uint32_t s = 0; s < n; s = next[s]) ids[count++] = vocab_lookup(t, p + s, next[s] - s);
    return count;
}

/* ---------------------------------------------------------------- pre-tokenizer */

/* Class and byte length of the character at s[i]. A byte that does not start
 * a valid UTF-8 sequence is one OTHER character of length 1. */
static inline enum UnicodeClass char_at(const uint8_t* s, size_t n, size_t i, size_t* len) {
    uint8_t b = s[i];
    if (b < 0x80) {
        *len = 1;
        return (enum UnicodeClass)unicode_ascii_class[b];
    }
    size_t j = i;
    int32_t cp = tokenizer_utf8_next(s, n, &j);
    if (cp < 0) { *len = 1; return UCLASS_OTHER; }
    *len = j - i;
    return unicode_class((uint32_t)cp);
}

/* End of the run of characters of class cls starting at i. */
static inline size_t run_end(const uint8_t* s, size_t n, size_t i, enum UnicodeClass cls) {
    while (i < n) {
        if (s[i] < 0x80) { /* ASCII fast path */
            if (unicode_ascii_class[s[i]] != cls) break;
            i++;
            continue;
        }
        size_t len;
        if (char_at(s, n, i, &len) != cls) break;
        i += len;
    }
    return i;
}

/* Length of the GPT-2 pre-token starting at s[i] (i < n): the match of
 *   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 * at i, alternatives tried in that order. */
static size_t pretoken_length(const uint8_t* s, size_t n, size_t i) {
    uint8_t c = s[i];
    if (c == '\'' && i + 1 < n) {
        uint8_t d = s[i + 1];
        if (d == 's' || d == 't' || d == 'm' || d == 'd') return 2;
        if (i + 2 < n) {
            uint8_t e = s[i + 2];
            if ((d == 'r' && e == 'e') || (d == 'v' && e == 'e') || (d == 'l' && e == 'l')) return 3;
        }
    }
    size_t len;
    enum UnicodeClass cls = char_at(s, n, i, &len);
    size_t start = i;
    if (c == ' ' && i + 1 < n) {
        size_t len2;
        enum UnicodeClass next = char_at(s, n, i + 1, &len2);
        if (next != UCLASS_SPACE) return run_end(s, n, i + 1, next) - start; /* " ?" + letters/numbers/others */
    }
    if (cls != UCLASS_SPACE) return run_end(s, n, i, cls) - start;
    /* whitespace: \s+(?!\S) takes the run but leaves its last character when a non-space follows */
    size_t last = i, chars = 0;
    while (i < n) {
        size_t l;
        if (char_at(s, n, i, &l) != UCLASS_SPACE) break;
        last = i;
        i += l;
        chars++;
    }
    if (i == n || chars == 1) return i - start; /* at the end, or \s+ for a lone character */
    return last - start;
}

/* ---------------------------------------------------------------- encoding */

static inline void push_ids(int** ids, size_t* n, size_t* cap, const int* src, size_t k) {
    if (k == 1 && *n < *cap) { (*ids)[(*n)++] = src[0]; return; } /* the usual case: one token */
    if (*n + k > *cap) {
        size_t c = *cap ? *cap : 1024;
        while (c < *n + k) c *= 2;
        int* grown = realloc(*ids, c * sizeof(int));
        if (!grown) die("out of host memory growing the token array to %zu ids", c);
        *ids = grown;
        *cap = c;
    }
    memcpy(*ids + *n, src, k * sizeof(int));
    *n += k;
}

static void cache_clear(Tokenizer* t) {
    memset(t->cache_slots, 0, CACHE_SLOTS * sizeof(CacheSlot));
    t->cache_entries = 0;
    t->cache_keys_used = 0;
    t->cache_ids_used = 0;
}

/* Appends the ids of one pre-token. */
static void encode_piece(Tokenizer* t, const uint8_t* p, size_t n, int** ids, size_t* count, size_t* cap) {
    uint64_t prefix = load_prefix(p, n);
    uint64_t h = hash_bytes(p, n, prefix);
    int whole = vocab_lookup_hashed(t, p, n, prefix, h);
    if (whole >= 0) { push_ids(ids, count, cap, &whole, 1); return; }
    bool cacheable = n <= CACHE_MAX_PIECE_BYTES;
    uint32_t slot = (uint32_t)(h >> 32) & (CACHE_SLOTS - 1);
    if (cacheable) {
        for (;;) {
            CacheSlot* cs = &t->cache_slots[slot];
            if (cs->hash == 0) break;
            if (cs->hash == h && cs->key_len == n && memcmp(t->cache_keys + cs->key_off, p, n) == 0) {
                push_ids(ids, count, cap, t->cache_ids + cs->ids_off, cs->n_ids);
                return;
            }
            slot = (slot + 1) & (CACHE_SLOTS - 1);
        }
    }
    ensure_scratch(t, n);
    size_t k = n <= BPE_SCAN_MAX_BYTES ? bpe_scan(t, p, n, t->piece_ids) : bpe_heap(t, p, n, t->piece_ids);
    push_ids(ids, count, cap, t->piece_ids, k);
    if (!cacheable) return;
    if (t->cache_entries >= CACHE_MAX_ENTRIES || t->cache_keys_used + n > CACHE_KEY_ARENA_BYTES ||
        t->cache_ids_used + k > CACHE_ID_ARENA_INTS) {
        cache_clear(t);
        slot = (uint32_t)(h >> 32) & (CACHE_SLOTS - 1);
        /* the table is empty now: the first slot is free */
    }
    CacheSlot* cs = &t->cache_slots[slot];
    memcpy(t->cache_keys + t->cache_keys_used, p, n);
    memcpy(t->cache_ids + t->cache_ids_used, t->piece_ids, k * sizeof(int));
    *cs = (CacheSlot){t->cache_keys_used, (uint32_t)n, t->cache_ids_used, (uint32_t)k, h};
    t->cache_keys_used += (uint32_t)n;
    t->cache_ids_used += (uint32_t)k;
    t->cache_entries++;
}

size_t tokenizer_encode_append(Tokenizer* t, const char* text, size_t len, int** ids, size_t* n, size_t* cap) {
    if (t->decode_only)
        die("the tokenizer was loaded from llm.c's gpt2_tokenizer.bin, which can only decode: encoding needs "
            "GPT-2's encoder.json and vocab.bpe (scripts/setup_data.sh fetches them)");
    const uint8_t* s = (const uint8_t*)text;
    size_t before = *n, i = 0;
    while (i < len) {
        size_t plen = pretoken_length(s, len, i);
        encode_piece(t, s + i, plen, ids, n, cap);
        i += plen;
    }
    return *n - before;
}

int* tokenizer_encode(Tokenizer* t, const char* text, size_t len, size_t* n_out) {
    int* ids = NULL;
    size_t n = 0, cap = 0;
    tokenizer_encode_append(t, text, len, &ids, &n, &cap);
    if (!ids) ids = mallocCheck(sizeof(int));
    *n_out = n;
    return ids;
}

/* ---------------------------------------------------------------- decoding */

const char* tokenizer_decode_token(const Tokenizer* t, int id, size_t* len) {
    if (id < 0 || id >= TOKENIZER_VOCAB_SIZE) { *len = 0; return NULL; }
    *len = t->token_len[id];
    return (const char*)t->token_bytes + t->token_off[id];
}

size_t tokenizer_decode(const Tokenizer* t, const int* ids, size_t n, char* buf, size_t cap) {
    size_t need = 0;
    for (size_t k = 0; k < n; k++) {
        size_t len;
        const char* bytes = tokenizer_decode_token(t, ids[k], &len);
        if (!bytes) continue;
        if (need + len <= cap) memcpy(buf + need, bytes, len);
        else if (need < cap) memcpy(buf + need, bytes, cap - need);
        need += len;
    }
    return need;
}
