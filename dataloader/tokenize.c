/*
 * dataloader/tokenize.c - the `tokenize` program: text files -> llm.c token shards.
 *
 * Why: training reads llm.c shards (dataloader/shard.h); this turns any UTF-8
 * text into them with the C GPT-2 tokenizer, so no Python is needed. It also
 * offers the tokenizer on the command line (--ids, --decode) for tests and
 * scripts, and a single-thread speed measurement (--bench).
 *
 * Documents: each input file is one document, or, with --doc-separator STR,
 * the parts of a file between lines equal to STR. Every document is written
 * as <|endoftext|> (50256) followed by its tokens, as in llm.c. Validation:
 * --val-fraction F holds out the last F of the documents (rounded, at least
 * one when F > 0); with a single document it holds out the last F of that
 * document's tokens instead, and the held-out part starts with its own
 * <|endoftext|>. Shards hold --shard-tokens tokens; a last shard shorter than
 * --min-shard-tokens (which the trainer's loader would refuse at a long
 * --seq-len, blocking the whole glob) is appended to the one before it.
 * Shards are written as NAME.tmp and renamed when complete; existing shards
 * with the same names are never silently replaced (--overwrite).
 *
 * One flag table drives both the parser and --help.
 */
#include "dataloader/tokenizer.h"
#include "dataloader/shard.h"
#include "common/utils.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- flags */

typedef enum { FLAG_STRING, FLAG_INT, FLAG_DOUBLE, FLAG_SWITCH } FlagKind;

typedef struct {
    const char* name;
    FlagKind kind;
    const char* arg; /* how --help names the value */
    const char* help;
    void* value;
} Flag;

static const char* opt_vocab = ".cache/gpt2";
static const char* opt_out = NULL;
static const char* opt_name = "data";
static int64_t opt_shard_tokens = 100000000;
static int64_t opt_min_shard_tokens = 1025;
static double opt_val_fraction = 0.0;
static const char* opt_doc_separator = NULL;
static int opt_ids = 0, opt_decode = 0, opt_help = 0, opt_overwrite = 0;
static const char* opt_bench = NULL;
static int64_t opt_repeat = 5;

static Flag flags[] = {
    {"vocab", FLAG_STRING, "DIR", "folder with GPT-2's encoder.json and vocab.bpe (default .cache/gpt2); for "
     "--decode also llm.c's gpt2_tokenizer.bin", &opt_vocab},
    {"out", FLAG_STRING, "DIR", "folder for the shards (created if missing; required to write shards)", &opt_out},
    {"name", FLAG_STRING, "PREFIX", "shard names: PREFIX_train_000000.bin ..., PREFIX_val_000000.bin (default data)", &opt_name},
    {"shard-tokens", FLAG_INT, "N", "at most N tokens per shard, but for a short tail (default 100000000)",
     &opt_shard_tokens},
    {"min-shard-tokens", FLAG_INT, "N", "no shard but a split's only one holds fewer than N tokens: a shorter last "
     "shard is appended to the one before (the trainer's loader refuses a shard shorter than --seq-len + 1; "
     "default 1025, enough for --seq-len 1024)", &opt_min_shard_tokens},
    {"val-fraction", FLAG_DOUBLE, "F", "hold out the last fraction F (0..1) of the documents for validation (rounded, "
     "at least 1 document when F > 0); with a single document, the last F of its tokens, which then start with "
     "their own <|endoftext|> (default 0: no validation shard)", &opt_val_fraction},
    {"doc-separator", FLAG_STRING, "STR", "split each file into documents at lines equal to STR (the line is dropped; "
     "empty documents are skipped); without it each file is one document", &opt_doc_separator},
    {"overwrite", FLAG_SWITCH, NULL, "delete existing PREFIX_train_*.bin / PREFIX_val_*.bin in --out first (without "
     "it, tokenize refuses to mix new shards with old ones)", &opt_overwrite},
    {"ids", FLAG_SWITCH, NULL, "read text on stdin, print its ids on one line, separated by spaces", &opt_ids},
    {"decode", FLAG_SWITCH, NULL, "read ids (separated by white space) on stdin, write their text to stdout", &opt_decode},
    {"bench", FLAG_STRING, "FILE", "encode FILE --repeat times in one thread and print MB/s", &opt_bench},
    {"repeat", FLAG_INT, "N", "passes over the file for --bench (default 5)", &opt_repeat},
    {"help", FLAG_SWITCH, NULL, "print this help", &opt_help},
};
#define NUM_FLAGS ((int)(sizeof(flags) / sizeof(flags[0])))

static void print_help(FILE* f) {
    fprintf(f, "usage: tokenize [flags] FILE...      text files -> llm.c token shards (GPT-2 BPE)\n"
               "       tokenize --ids < text         print ids\n"
               "       tokenize --decode < ids       print text\n"
               "       tokenize --bench FILE         single-thread encoding speed\n"
               "Each FILE is one document (or several, with --doc-separator); each document is written as\n"
               "<|endoftext|> (50256) followed by its tokens. Shards: 1024-byte header (magic 20240520,\n"
               "version 1, token count) then uint16 ids.\nflags:\n");
    const int indent = 24, width = 100; /* "  " + 22 columns of flag names */
    for (int i = 0; i < NUM_FLAGS; i++) {
        char left[64];
        snprintf(left, sizeof(left), "--%s%s%s", flags[i].name, flags[i].arg ? " " : "", flags[i].arg ? flags[i].arg : "");
        fprintf(f, "  %-22s", left);
        /* word-wrap the help text into the right-hand column */
        const char* h = flags[i].help;
        int col = indent;
        while (*h) {
            size_t word = strcspn(h, " ");
            if (col > indent && col + 1 + (int)word > width) { fprintf(f, "\n%*s", indent, ""); col = indent; }
            fprintf(f, " %.*s", (int)word, h);
            col += 1 + (int)word;
            h += word;
            while (*h == ' ') h++;
        }
        fprintf(f, "\n");
    }
}

__attribute__((format(printf, 1, 2), noreturn)) static void bad_usage(const char* fmt, ...) {
    va_list ap;
    fprintf(stderr, "tokenize: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  hint: run 'tokenize --help' for the flags\n");
    exit(2);
}

/* Parses argv into the flag variables; returns the positional arguments (NULL-terminated). */
static char** parse_flags(int argc, char** argv, int* n_pos) {
    char** pos = callocCheck((size_t)argc + 1, sizeof(char*));
    *n_pos = 0;
    for (int i = 1; i < argc; i++) {
        char* a = argv[i];
        if (a[0] != '-' || a[1] == '\0') { pos[(*n_pos)++] = a; continue; }
        if (strcmp(a, "--") == 0) { while (++i < argc) pos[(*n_pos)++] = argv[i]; break; }
        if (strcmp(a, "-h") == 0) { opt_help = 1; continue; }
        if (a[1] != '-') bad_usage("unknown flag '%s' (flags are long: --name)", a);
        char* name = a + 2;
        char* eq = strchr(name, '=');
        size_t name_len = eq ? (size_t)(eq - name) : strlen(name);
        Flag* f = NULL;
        for (int k = 0; k < NUM_FLAGS; k++)
            if (strlen(flags[k].name) == name_len && strncmp(flags[k].name, name, name_len) == 0) f = &flags[k];
        if (!f) bad_usage("unknown flag '%s'", a);
        if (f->kind == FLAG_SWITCH) {
            if (eq) bad_usage("flag --%s takes no value (got '%s')", f->name, eq + 1);
            *(int*)f->value = 1;
            continue;
        }
        const char* v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) bad_usage("flag --%s needs a value (%s)", f->name, f->arg);
        if (f->kind == FLAG_STRING) { *(const char**)f->value = v; continue; }
        char* end;
        errno = 0;
        if (f->kind == FLAG_INT) {
            long long x = strtoll(v, &end, 10);
            if (*v == '\0' || *end != '\0' || errno || x <= 0) bad_usage("--%s wants a positive integer, got '%s'", f->name, v);
            *(int64_t*)f->value = x;
        } else {
            double x = strtod(v, &end);
            if (*v == '\0' || *end != '\0' || errno) bad_usage("--%s wants a number, got '%s'", f->name, v);
            *(double*)f->value = x;
        }
    }
    return pos;
}

/* ---------------------------------------------------------------- input */

typedef struct {
    const char* data;
    size_t size;
    void* map; /* mmap'd region, or malloc'd buffer when map_len == 0 */
    size_t map_len;
    dev_t dev; /* the file's identity, to refuse one file given twice */
    ino_t ino;
} InputFile;

/* Dies unless the first 64 KiB of the input look like text: a NUL byte means a binary file (a compressed
   corpus, a token shard), which would tokenize into garbage without an error. */
static void require_text(const InputFile* in, const char* path) {
    const size_t n = in->size < (1u << 16) ? in->size : (1u << 16);
    const unsigned char* p = (const unsigned char*)in->data;
    const void* nul = memchr(p, 0, n);
    if (nul == NULL) return;
    const char* kind = n >= 6 && memcmp(p, "\xfd" "7zXZ", 6) == 0 ? " (an xz archive: decompress it first, xz -dk)"
                       : n >= 2 && p[0] == 0x1f && p[1] == 0x8b  ? " (a gzip archive: decompress it first, gzip -dk)"
                       : n >= 4 && (uint32_t)(p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24) == SHARD_MAGIC
                           ? " (an llm.c token shard: pass it to the trainer's --train-data as it is)"
                           : "";
    die("input '%s' is not text: a NUL byte at offset %zu%s\n  hint: tokenize takes UTF-8 text files", path,
        (size_t)((const unsigned char*)nul - p), kind);
}

static InputFile open_input(const char* path) {
    InputFile in = {0};
    int fd = open(path, O_RDONLY);
    if (fd < 0) die("cannot open input '%s': %s\n  hint: check the path", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) die("input '%s' is not a regular file", path);
    in.size = (size_t)st.st_size;
    in.dev = st.st_dev;
    in.ino = st.st_ino;
    if (in.size > 0) {
        in.map = mmap(NULL, in.size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (in.map == MAP_FAILED) die("cannot map input '%s': %s", path, strerror(errno));
        in.map_len = in.size;
        in.data = in.map;
    } else {
        in.data = "";
    }
    close(fd);
    return in;
}

static void close_input(InputFile* in) {
    if (in->map_len) munmap(in->map, in->map_len);
}

static char* read_stdin(size_t* size) {
    size_t cap = 1 << 16, n = 0;
    char* buf = mallocCheck(cap);
    for (;;) {
        if (n == cap) {
            cap *= 2;
            char* grown = realloc(buf, cap);
            if (!grown) die("out of memory reading stdin (%zu bytes)", cap);
            buf = grown;
        }
        size_t got = fread(buf + n, 1, cap - n, stdin);
        if (got == 0) break;
        n += got;
    }
    if (ferror(stdin)) die("error reading stdin: %s", strerror(errno));
    *size = n;
    return buf;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------- shards */

/* Streams tokens into numbered shards of at most max_tokens, each written as
 * NAME.tmp and renamed to NAME when complete. The trainer's loader refuses a
 * shard shorter than one sample (T+1 tokens), and one refused shard blocks
 * the whole glob; so a full shard is kept open until min_tokens more tokens
 * have arrived (they wait in tail[]): if the split ends first, they are
 * appended to it (it then holds up to max_tokens + min_tokens - 1), and no
 * shard but a split's only one is ever shorter than min_tokens. */
typedef struct {
    const char* dir;
    const char* prefix;
    const char* split; /* "train" or "val" */
    int64_t max_tokens, min_tokens;
    AtomicFile file; /* file.fp non-NULL while a shard is open (as NAME.tmp) */
    char path[4096];
    int64_t in_shard, total;
    int shards;
    uint16_t buf[8192];
    int buf_n;
    bool held;      /* the open shard is full; the next tokens wait in tail */
    uint16_t* tail; /* min_tokens ids, allocated on first use */
    int64_t tail_n;
    int64_t merged; /* tokens of a short last shard appended to the one before (0: none) */
} ShardWriter;

/* Any write failure removes the shard's .tmp and dies: no half-written shard is ever left. */
static void writer_write_or_die(ShardWriter* w, const void* data, size_t size, size_t n) {
    if (fwrite(data, size, n, w->file.fp) != n) {
        int saved = errno;
        atomic_file_abort(&w->file);
        die("writing shard '%s' failed: %s\n  hint: is the disk full?", w->path, strerror(saved));
    }
}

static void writer_flush_buf(ShardWriter* w) {
    if (w->buf_n) writer_write_or_die(w, w->buf, sizeof(uint16_t), (size_t)w->buf_n);
    w->buf_n = 0;
}

static void writer_finish_shard(ShardWriter* w) {
    if (!w->file.fp) return;
    writer_flush_buf(w);
    int32_t header[SHARD_HEADER_INTS];
    shard_header_init(header, w->in_shard);
    if (fseek(w->file.fp, 0, SEEK_SET) != 0) {
        int saved = errno;
        atomic_file_abort(&w->file);
        die("cannot seek in shard '%s': %s", w->path, strerror(saved));
    }
    writer_write_or_die(w, header, sizeof(int32_t), SHARD_HEADER_INTS);
    char err[8400];
    if (atomic_file_commit(&w->file, err, sizeof(err)) != 0)
        die("cannot finish shard '%s': %s\n  hint: is the disk full, is the folder writable?", w->path, err);
    w->shards++;
    w->held = false;
}

/* Appends id to the open shard (opening the next one first if none is). */
static void writer_append(ShardWriter* w, uint16_t id) {
    if (!w->file.fp) {
        snprintf(w->path, sizeof(w->path), "%s/%s_%s_%06d.bin", w->dir, w->prefix, w->split, w->shards);
        char err[4400];
        if (atomic_file_open(&w->file, w->path, err, sizeof(err)) == NULL)
            die("cannot write shard: %s\n  hint: check that the output folder exists and is writable", err);
        int32_t header[SHARD_HEADER_INTS] = {0}; /* placeholder until the count is known */
        writer_write_or_die(w, header, sizeof(int32_t), SHARD_HEADER_INTS);
        w->in_shard = 0;
    }
    w->buf[w->buf_n++] = id;
    if (w->buf_n == (int)(sizeof(w->buf) / sizeof(w->buf[0]))) writer_flush_buf(w);
    w->in_shard++;
    if (w->in_shard == w->max_tokens) {
        if (w->min_tokens > 1) w->held = true;
        else writer_finish_shard(w);
    }
}

static void writer_put(ShardWriter* w, int id) {
    if (id < 0 || id > UINT16_MAX) die("token id %d does not fit the uint16 shard format", id);
    w->total++;
    if (!w->held) {
        writer_append(w, (uint16_t)id);
        return;
    }
    if (!w->tail) w->tail = mallocCheck((size_t)w->min_tokens * sizeof(uint16_t));
    w->tail[w->tail_n++] = (uint16_t)id;
    if (w->tail_n < w->min_tokens) return;
    /* enough for a shard the loader accepts: the full one is final, the waiting tokens start the next */
    writer_finish_shard(w);
    int64_t n = w->tail_n;
    w->tail_n = 0;
    for (int64_t k = 0; k < n; k++) writer_append(w, w->tail[k]);
}

/* Ends the split: a short tail goes into the last full shard; the last shard is committed. */
static void writer_close(ShardWriter* w) {
    if (w->held && w->tail_n > 0) {
        writer_flush_buf(w);
        writer_write_or_die(w, w->tail, sizeof(uint16_t), (size_t)w->tail_n);
        w->in_shard += w->tail_n;
        w->merged = w->tail_n;
        w->tail_n = 0;
    }
    writer_finish_shard(w);
    free(w->tail);
    w->tail = NULL;
}

/* Says what the split's shards are: where a short tail went, or that its only shard is short. */
static void writer_report(const ShardWriter* w) {
    if (w->merged > 0)
        printf("tokenize: %s: the last %lld tokens (fewer than --min-shard-tokens %lld) were appended to %s, which "
               "holds %lld tokens, more than --shard-tokens %lld: a shard that short would be refused by the "
               "trainer's loader at --seq-len >= %lld\n", w->split, (long long)w->merged, (long long)w->min_tokens,
               w->path, (long long)w->in_shard, (long long)w->max_tokens, (long long)w->merged);
    else if (w->shards == 1 && w->in_shard < w->min_tokens)
        printf("tokenize: note: %s: its only shard %s holds %lld tokens, fewer than --min-shard-tokens %lld: the "
               "trainer's loader refuses it at --seq-len >= %lld (a shard must hold one sample, T+1 tokens); use "
               "more text%s\n", w->split, w->path, (long long)w->in_shard, (long long)w->min_tokens,
               (long long)w->in_shard, strcmp(w->split, "val") == 0 ? " or a larger --val-fraction" : "");
}

/* ---------------------------------------------------------------- documents */

typedef struct {
    int file;
    size_t start, len;
} Document;

/* Splits a file into documents at lines equal to sep (or makes it one document). */
static void find_documents(const InputFile* in, int file, const char* sep, Document** docs, size_t* n, size_t* cap) {
    size_t start = 0, i = 0, sep_len = sep ? strlen(sep) : 0;
    while (sep && i < in->size) {
        size_t line_end = i;
        while (line_end < in->size && in->data[line_end] != '\n') line_end++;
        size_t content_end = line_end;
        if (content_end > i && in->data[content_end - 1] == '\r') content_end--;
        size_t next = line_end < in->size ? line_end + 1 : line_end;
        if (content_end - i == sep_len && memcmp(in->data + i, sep, sep_len) == 0) {
            if (i > start) {
                if (*n == *cap) { *cap = *cap ? 2 * *cap : 64; *docs = realloc(*docs, *cap * sizeof(Document)); }
                if (!*docs) die("out of memory listing documents");
                (*docs)[(*n)++] = (Document){file, start, i - start};
            }
            start = next;
        }
        i = next;
    }
    if (in->size > start) {
        if (*n == *cap) { *cap = *cap ? 2 * *cap : 64; *docs = realloc(*docs, *cap * sizeof(Document)); }
        if (!*docs) die("out of memory listing documents");
        (*docs)[(*n)++] = (Document){file, start, in->size - start};
    }
}

static void make_dir(const char* dir) {
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) die("cannot create --out folder '%s': %s", dir, strerror(errno));
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) die("--out '%s' exists but is not a folder", dir);
}

/* True if name is PREFIX_train_... or PREFIX_val_... ending in .bin or .bin.tmp. */
static bool is_our_shard(const char* name, const char* prefix) {
    size_t pl = strlen(prefix), nl = strlen(name);
    if (strncmp(name, prefix, pl) != 0) return false;
    const char* rest = name + pl;
    if (strncmp(rest, "_train_", 7) != 0 && strncmp(rest, "_val_", 5) != 0) return false;
    return (nl > 4 && strcmp(name + nl - 4, ".bin") == 0) || (nl > 8 && strcmp(name + nl - 8, ".bin.tmp") == 0);
}

/* Old shards with our names would mix with the new ones in a loader's glob: refuse, or delete with --overwrite. */
static void check_existing_shards(const char* dir, const char* prefix) {
    DIR* d = opendir(dir);
    if (!d) die("cannot list --out folder '%s': %s", dir, strerror(errno));
    struct dirent* e;
    int found = 0;
    char first[512] = "";
    while ((e = readdir(d)) != NULL) {
        if (!is_our_shard(e->d_name, prefix)) continue;
        if (!opt_overwrite) {
            if (!found) snprintf(first, sizeof(first), "%s", e->d_name);
            found++;
            continue;
        }
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        if (unlink(path) != 0) die("--overwrite: cannot delete '%s': %s", path, strerror(errno));
    }
    closedir(d);
    if (found)
        die("--out '%s' already holds %d shard file(s) named %s_* (e.g. %s)\n"
            "  hint: pass --overwrite to replace them, or choose another --out or --name", dir, found, prefix, first);
}

static int run_shards(Tokenizer* tok, char** files, int n_files) {
    if (!opt_out) bad_usage("no --out folder given (shards need a destination)");
    if (opt_val_fraction < 0.0 || opt_val_fraction >= 1.0)
        bad_usage("--val-fraction must be in [0, 1), got %g", opt_val_fraction);
    if (opt_shard_tokens > INT32_MAX) bad_usage("--shard-tokens must be below 2^31 (the header's count is int32)");
    if (opt_min_shard_tokens > opt_shard_tokens)
        bad_usage("--shard-tokens %lld is below --min-shard-tokens %lld: every shard would be shorter than the "
                  "trainer's loader accepts at --seq-len >= %lld; raise --shard-tokens, or lower --min-shard-tokens "
                  "to the longest --seq-len you will train with plus 1", (long long)opt_shard_tokens,
                  (long long)opt_min_shard_tokens, (long long)opt_shard_tokens);
    if (opt_shard_tokens + opt_min_shard_tokens - 1 > INT32_MAX)
        bad_usage("--shard-tokens + --min-shard-tokens - 1 must be below 2^31 (a last shard may take a short tail)");
    if (strchr(opt_name, '/') || opt_name[0] == '\0') bad_usage("--name must be a plain file-name prefix, got '%s'", opt_name);
    make_dir(opt_out);
    check_existing_shards(opt_out, opt_name);
    InputFile* inputs = callocCheck((size_t)n_files, sizeof(InputFile));
    Document* docs = NULL;
    size_t n_docs = 0, cap_docs = 0, total_bytes = 0;
    for (int i = 0; i < n_files; i++) {
        inputs[i] = open_input(files[i]);
        require_text(&inputs[i], files[i]);
        for (int k = 0; k < i; k++)
            if (inputs[k].dev == inputs[i].dev && inputs[k].ino == inputs[i].ino)
                die("input '%s' is given twice (also as '%s'): it would be tokenized twice\n  hint: name each file "
                    "once", files[i], files[k]);
        total_bytes += inputs[i].size;
        find_documents(&inputs[i], i, opt_doc_separator, &docs, &n_docs, &cap_docs);
    }
    if (n_docs == 0) die("the input files hold no text (no documents to tokenize)");
    ShardWriter train = {.dir = opt_out, .prefix = opt_name, .split = "train", .max_tokens = opt_shard_tokens,
                         .min_tokens = opt_min_shard_tokens};
    ShardWriter val = {.dir = opt_out, .prefix = opt_name, .split = "val", .max_tokens = opt_shard_tokens,
                       .min_tokens = opt_min_shard_tokens};
    int* ids = NULL;
    size_t n_ids = 0, cap_ids = 0;
    double t0 = now_seconds();
    const char* val_rule;
    if (n_docs == 1) {
        /* one document: split its token stream */
        const Document* d = &docs[0];
        tokenizer_encode_append(tok, inputs[d->file].data + d->start, d->len, &ids, &n_ids, &cap_ids);
        size_t n_val = (size_t)(opt_val_fraction * (double)n_ids + 0.5);
        if (opt_val_fraction > 0 && n_val == 0) n_val = 1;
        if (n_val >= n_ids && n_val > 0) die("--val-fraction %g leaves no training tokens (the document has %zu tokens)",
                                            opt_val_fraction, n_ids);
        writer_put(&train, TOKENIZER_EOT);
        for (size_t k = 0; k < n_ids - n_val; k++) writer_put(&train, ids[k]);
        if (n_val) {
            writer_put(&val, TOKENIZER_EOT);
            for (size_t k = n_ids - n_val; k < n_ids; k++) writer_put(&val, ids[k]);
        }
        val_rule = "last fraction of the single document's tokens";
    } else {
        size_t n_val = (size_t)(opt_val_fraction * (double)n_docs + 0.5);
        if (opt_val_fraction > 0 && n_val == 0) n_val = 1;
        if (n_val >= n_docs && n_val > 0) die("--val-fraction %g leaves no training documents (%zu documents)",
                                             opt_val_fraction, n_docs);
        for (size_t k = 0; k < n_docs; k++) {
            const Document* d = &docs[k];
            n_ids = 0;
            tokenizer_encode_append(tok, inputs[d->file].data + d->start, d->len, &ids, &n_ids, &cap_ids);
            ShardWriter* w = k < n_docs - n_val ? &train : &val;
            writer_put(w, TOKENIZER_EOT);
            for (size_t j = 0; j < n_ids; j++) writer_put(w, ids[j]);
        }
        val_rule = "last documents";
    }
    writer_close(&train);
    writer_close(&val);
    double dt = now_seconds() - t0;
    printf("tokenize: %zu documents from %d files, %.1f MB in %.2f s (%.1f MB/s incl. writing)\n", n_docs, n_files,
           (double)total_bytes / 1e6, dt, (double)total_bytes / 1e6 / (dt > 0 ? dt : 1e-9));
    printf("tokenize: train: %lld tokens in %d shards; val: %lld tokens in %d shards (%s); written to %s/%s_*.bin\n",
           (long long)train.total, train.shards, (long long)val.total, val.shards,
           opt_val_fraction > 0 ? val_rule : "none requested", opt_out, opt_name);
    writer_report(&train);
    if (val.shards) writer_report(&val);
    free(ids);
    free(docs);
    for (int i = 0; i < n_files; i++) close_input(&inputs[i]);
    free(inputs);
    return 0;
}

/* ---------------------------------------------------------------- other modes */

static int run_ids(Tokenizer* tok) {
    size_t n;
    char* text = read_stdin(&n);
    size_t k;
    int* ids = tokenizer_encode(tok, text, n, &k);
    for (size_t i = 0; i < k; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    free(text);
    return 0;
}

static int run_decode(Tokenizer* tok) {
    size_t n;
    char* text = read_stdin(&n);
    text = realloc(text, n + 1);
    if (!text) die("out of memory");
    text[n] = '\0';
    char* p = text;
    for (;;) {
        while (*p == ' ' || *p == '\n' || *p == '\t' || *p == '\r' || *p == ',') p++;
        if (*p == '\0') break;
        char* end;
        errno = 0;
        long id = strtol(p, &end, 10);
        if (end == p || errno || id < 0 || id >= TOKENIZER_VOCAB_SIZE) {
            char word[32];
            snprintf(word, sizeof(word), "%.*s", (int)strcspn(p, " \n\t\r,"), p);
            die("--decode: '%s' is not a token id (0..%d)", word, TOKENIZER_VOCAB_SIZE - 1);
        }
        size_t len;
        const char* bytes = tokenizer_decode_token(tok, (int)id, &len);
        fwrite(bytes, 1, len, stdout);
        p = end;
    }
    free(text);
    return 0;
}

static int run_bench(Tokenizer* tok, const char* path) {
    InputFile in = open_input(path);
    if (in.size == 0) die("--bench: '%s' is empty", path);
    int* ids = NULL;
    size_t n_ids = 0, cap_ids = 0;
    double first = 0, total = 0;
    for (int64_t r = 0; r < opt_repeat; r++) {
        n_ids = 0;
        double t0 = now_seconds();
        tokenizer_encode_append(tok, in.data, in.size, &ids, &n_ids, &cap_ids);
        double dt = now_seconds() - t0;
        if (r == 0) first = dt;
        total += dt;
    }
    printf("bench: %s: %zu bytes, %zu tokens, %lld passes, 1 thread\n", path, in.size, n_ids, (long long)opt_repeat);
    printf("bench: first pass (cold cache) %.2f MB/s\n", (double)in.size / 1e6 / first);
    printf("bench: all passes %.2f MB/s\n", (double)in.size * (double)opt_repeat / 1e6 / total);
    free(ids);
    close_input(&in);
    return 0;
}

int main(int argc, char** argv) {
    int n_pos;
    char** pos = parse_flags(argc, argv, &n_pos);
    if (opt_help) { print_help(stdout); return 0; }
    int modes = opt_ids + opt_decode + (opt_bench != NULL) + (n_pos > 0);
    if (modes == 0) bad_usage("nothing to do: give input FILEs, or --ids, --decode or --bench FILE");
    if (modes > 1) bad_usage("choose one of: input FILEs, --ids, --decode, --bench FILE");
    char err[1024];
    Tokenizer* tok;
    if (tokenizer_load(&tok, opt_vocab, err, sizeof(err)) != 0) {
        fprintf(stderr, "tokenize: %s\n", err);
        free(pos);
        return 1;
    }
    if (!opt_decode && !tokenizer_can_encode(tok)) {
        fprintf(stderr, "tokenize: --vocab %s is llm.c's gpt2_tokenizer.bin, which can only decode (--decode): "
                "encoding needs GPT-2's encoder.json and vocab.bpe\n  hint: scripts/setup_data.sh fetches them "
                "into .cache/gpt2\n", opt_vocab);
        tokenizer_free(tok);
        free(pos);
        return 1;
    }
    int rc = opt_ids ? run_ids(tok) : opt_decode ? run_decode(tok) : opt_bench ? run_bench(tok, opt_bench)
                                                                              : run_shards(tok, pos, n_pos);
    tokenizer_free(tok);
    free(pos);
    return rc;
}
