/*
 * dataloader/dataloader.c - the shard reader behind dataloader.h: validates
 * shards, orders samples per epoch (sequential or seeded shuffle), hands each
 * rank its slice of every global batch, and saves/restores its position.
 *
 * Why it is built this way:
 * - Every shard is checked once, when dataloader_open first opens it: type
 *   (regular files only: a FIFO would block forever), header, size, and every
 *   token id below the vocab size (one sequential read of the payload), so a
 *   bad shard stops the run before its first step, not at the step that
 *   happens to read the bad id.
 * - Orders are computed, not stored: a keyed pseudo-random permutation
 *   (Feistel network + cycle walking, below) maps "i-th sample of the epoch"
 *   to a sample index in O(1) time and memory, so a 4 GiB shard with tens of
 *   millions of samples costs nothing to shuffle, and seeking to any position
 *   is exact without replaying the epoch.
 * - Everything is integer arithmetic on uint64 with fixed constants, so the
 *   order is the same on every machine and compiler.
 * - Reads use pread() with 64-bit offsets on file descriptors kept in a tiny
 *   cache (a global batch touches one or two shards), one pread per sample;
 *   no file is re-opened per batch, and a run over thousands of shards never
 *   holds more than a few descriptors.
 * - Byte order of ids is decoded explicitly (little-endian, as llm.c writes).
 */
#define _GNU_SOURCE
#define _FILE_OFFSET_BITS 64
#include "dataloader/dataloader.h"
#include "dataloader/shard.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The trainer stores DataPosition as raw bytes in its resume-state file: keep its layout fixed. */
_Static_assert(sizeof(DataPosition) == 64, "DataPosition must stay 8 x 64-bit fields");

#define FD_CACHE_SLOTS 4
/* Domain tags so the shard order and each shard's sample order use unrelated keys. */
#define KEY_TAG_SHARD_ORDER 0x5348524400000000ULL  /* "SHRD" */
#define KEY_TAG_SAMPLE_ORDER 0x534d504c00000000ULL /* "SMPL" */
#define FEISTEL_ROUNDS 6

struct DataLoader {
    /* configuration */
    char* pattern;
    int B, T, rank, world_size, shuffle, vocab_size;
    uint64_t seed;
    /* shards, in glob (name) order */
    int num_shards;
    char** paths;
    int64_t* shard_tokens;  /* token count from the header */
    int64_t* shard_samples; /* S_s = (n_s - 1) / T */
    int64_t total_tokens, total_samples;
    /* the current epoch's stream */
    int64_t epoch;
    int* shard_order;      /* shard_order[p] = shard index visited p-th */
    int64_t* order_prefix; /* samples before order position p; [num_shards] = N */
    int64_t stream_pos;    /* stream index of the next global batch's first sample */
    /* open descriptors: slot i holds shard cache_shard[i] (-1 = empty) */
    int cache_fd[FD_CACHE_SLOTS];
    int cache_shard[FD_CACHE_SLOTS];
    int cache_victim;
    unsigned char* sample_bytes; /* (T+1) * 2 bytes, one sample as read from disk */
};

/* ---- portable keyed permutation ---- */

/* A 64-bit finalizer (the splitmix64 mixing function): a bijective avalanche hash. */
static uint64_t mix64(uint64_t x) {
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ULL;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebULL;
    x ^= x >> 31;
    return x;
}

static uint64_t order_key(uint64_t seed, int64_t epoch, uint64_t tag) {
    return mix64(mix64(mix64(seed) ^ (uint64_t)epoch) ^ tag);
}

/*
 * The i-th element (i < n) of a pseudo-random permutation of [0, n) chosen by
 * key. A balanced Feistel network over 2*half bits is a bijection on
 * [0, 4^half) for any round function; cycle walking (re-applying it until the
 * result falls below n) restricts it to a bijection on [0, n). 4^half < 4n,
 * so the walk takes fewer than 4 steps on average.
 */
static int64_t permute_index(uint64_t key, int64_t n, int64_t i) {
    if (n <= 1) return i;
    int half = 1;
    while (((uint64_t)1 << (2 * half)) < (uint64_t)n) half++;
    uint64_t mask = ((uint64_t)1 << half) - 1;
    uint64_t x = (uint64_t)i;
    do {
        uint64_t left = x >> half, right = x & mask;
        for (int round = 0; round < FEISTEL_ROUNDS; round++) {
            uint64_t f = mix64(key ^ mix64(right + 0x9e3779b97f4a7c15ULL * (uint64_t)(round + 1))) & mask;
            uint64_t new_right = left ^ f;
            left = right;
            right = new_right;
        }
        x = (left << half) | right;
    } while (x >= (uint64_t)n);
    return (int64_t)x;
}

/* ---- epoch order ---- */

static void build_epoch_order(DataLoader* dl) {
    uint64_t key = order_key(dl->seed, dl->epoch, KEY_TAG_SHARD_ORDER);
    dl->order_prefix[0] = 0;
    for (int p = 0; p < dl->num_shards; p++) {
        int s = dl->shuffle ? (int)permute_index(key, dl->num_shards, p) : p;
        dl->shard_order[p] = s;
        dl->order_prefix[p + 1] = dl->order_prefix[p] + dl->shard_samples[s];
    }
}

/* The order position p whose samples contain stream index g: the largest p
 * with order_prefix[p] <= g (g == N maps to the last shard, one past its end). */
static int order_pos_of(const DataLoader* dl, int64_t g) {
    int lo = 0, hi = dl->num_shards - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (dl->order_prefix[mid] <= g) lo = mid; else hi = mid - 1;
    }
    return lo;
}

/* ---- file access ---- */

static void close_cached_files(DataLoader* dl) {
    for (int i = 0; i < FD_CACHE_SLOTS; i++) {
        if (dl->cache_fd[i] >= 0) close(dl->cache_fd[i]);
        dl->cache_fd[i] = -1;
        dl->cache_shard[i] = -1;
    }
}

static int shard_fd(DataLoader* dl, int s, char* err, size_t errlen) {
    for (int i = 0; i < FD_CACHE_SLOTS; i++) {
        if (dl->cache_shard[i] == s) return dl->cache_fd[i];
    }
    int fd = open(dl->paths[s], O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot open shard for reading: %s (was it moved or deleted during the run?)",
                 dl->paths[s], strerror(errno));
        return -1;
    }
    int slot = dl->cache_victim;
    dl->cache_victim = (dl->cache_victim + 1) % FD_CACHE_SLOTS;
    if (dl->cache_fd[slot] >= 0) close(dl->cache_fd[slot]);
    dl->cache_fd[slot] = fd;
    dl->cache_shard[slot] = s;
    return fd;
}

/* Reads exactly len bytes at a 64-bit offset, or fails with a message naming path. */
static int read_exact(int fd, const char* path, void* buf, size_t len, int64_t offset, char* err, size_t errlen) {
    size_t done = 0;
    while (done < len) {
        ssize_t got = pread(fd, (char*)buf + done, len - done, (off_t)(offset + (int64_t)done));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            snprintf(err, errlen, "%s: read of %zu bytes at byte offset %lld failed: %s", path, len,
                     (long long)offset, strerror(errno));
            return -1;
        }
        if (got == 0) {
            snprintf(err, errlen, "%s: file ended early (short read at byte offset %lld): it changed since the "
                     "loader opened it; do not rewrite shards during a run", path, (long long)(offset + (int64_t)done));
            return -1;
        }
        done += (size_t)got;
    }
    return 0;
}

/* Bytes of ids read per pass of the id scan (a multiple of 2). */
#define ID_SCAN_CHUNK_BYTES ((size_t)1 << 20)

/* Checks that every id of the n-token payload of path (open as fd) is below
 * vocab_size: one sequential read in 1 MiB chunks (skipping the holes of a
 * sparse file, which read as id 0), the max of each chunk
 * first (a loop the compiler vectorises), the position of the first bad id
 * only in a chunk whose max is too large. 0, or -1 naming the file, the id,
 * its token index and byte offset. */
static int scan_ids(int fd, const char* path, int64_t n, int vocab_size, char* err, size_t errlen) {
    unsigned char* buf = (unsigned char*)malloc(ID_SCAN_CHUNK_BYTES);
    if (buf == NULL) {
        snprintf(err, errlen, "%s: out of memory for the token id check", path);
        return -1;
    }
    int rc = 0;
    const int64_t payload_end = (int64_t)SHARD_HEADER_BYTES + 2 * n;
    for (int64_t first = 0; first < n && rc == 0;) {
        /* Holes of a sparse file read as zeros, and id 0 is valid: go to the next byte that holds data
           (SEEK_DATA; where the file system cannot say, every byte counts as data). */
        off_t data = lseek(fd, (off_t)((int64_t)SHARD_HEADER_BYTES + 2 * first), SEEK_DATA);
        if (data < 0 && errno == ENXIO) break; /* only a hole up to the end */
        if (data > (off_t)((int64_t)SHARD_HEADER_BYTES + 2 * first)) {
            if ((int64_t)data >= payload_end) break;
            first = ((int64_t)data - SHARD_HEADER_BYTES) / 2;
        }
        int64_t count = n - first;
        if (count > (int64_t)(ID_SCAN_CHUNK_BYTES / 2)) count = (int64_t)(ID_SCAN_CHUNK_BYTES / 2);
        const int64_t offset = (int64_t)SHARD_HEADER_BYTES + 2 * first;
        if (read_exact(fd, path, buf, (size_t)count * 2, offset, err, errlen) != 0) {
            rc = -1;
            break;
        }
        unsigned max_id = 0;
        for (int64_t i = 0; i < count; i++) {
            unsigned id = (unsigned)buf[2 * i] | (unsigned)buf[2 * i + 1] << 8; /* little-endian, as llm.c writes */
            max_id = id > max_id ? id : max_id;
        }
        if (max_id >= (unsigned)vocab_size) {
            for (int64_t i = 0; i < count; i++) {
                unsigned id = (unsigned)buf[2 * i] | (unsigned)buf[2 * i + 1] << 8;
                if (id < (unsigned)vocab_size) continue;
                snprintf(err, errlen, "%s: token id %u at token index %lld (byte offset %lld) is not below the "
                         "vocab size %d: the shard was made with another tokenizer or is corrupt; re-create it with "
                         "the tokenize tool or leave it out of the pattern", path, id, (long long)(first + i),
                         (long long)(offset + 2 * i), vocab_size);
                break;
            }
            rc = -1;
        }
        first += count;
    }
    free(buf);
    return rc;
}

/* Validates shard s at open: a regular file (checked before opening it, so a
 * FIFO never blocks the open), header, size, at least T+1 tokens, every
 * token id below the vocab size. */
static int inspect_shard(DataLoader* dl, int s, char* err, size_t errlen) {
    const char* path = dl->paths[s];
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "%s: cannot open shard: %s (check the path and its permissions)", path,
                 strerror(errno));
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file (%s): the shard pattern should match only token shards "
                 "(.bin files); narrow the pattern or move it out of the folder", path,
                 S_ISDIR(st.st_mode) ? "a directory" : S_ISFIFO(st.st_mode) ? "a FIFO" :
                 S_ISSOCK(st.st_mode) ? "a socket" : "a device or other special file");
        return -1;
    }
    /* O_NONBLOCK: should the path turn into a FIFO between stat and open, the open still returns at once. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        snprintf(err, errlen, "%s: cannot open shard: %s (check the path and its permissions)", path,
                 strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file: the shard pattern should match only token shards (.bin)",
                 path);
        close(fd);
        return -1;
    }
    int64_t file_size = (int64_t)st.st_size;
    unsigned char raw[SHARD_HEADER_BYTES];
    int32_t header[SHARD_HEADER_INTS];
    memset(raw, 0, sizeof(raw));
    if (file_size >= SHARD_HEADER_BYTES && read_exact(fd, path, raw, sizeof(raw), 0, err, errlen) != 0) {
        close(fd);
        return -1;
    }
    for (int i = 0; i < SHARD_HEADER_INTS; i++) {
        uint32_t v = (uint32_t)raw[4 * i] | (uint32_t)raw[4 * i + 1] << 8 | (uint32_t)raw[4 * i + 2] << 16 |
                     (uint32_t)raw[4 * i + 3] << 24;
        header[i] = (int32_t)v;
    }
    int64_t n = 0;
    const char* problem = shard_header_check(header, file_size, &n);
    if (problem != NULL) {
        snprintf(err, errlen, "%s: bad token shard: %s (file size %lld bytes); re-create it with the tokenize "
                 "tool or remove it from the pattern", path, problem, (long long)file_size);
        close(fd);
        return -1;
    }
    if (n < (int64_t)dl->T + 1) {
        snprintf(err, errlen, "%s: shard holds %lld tokens, fewer than one sample of T+1 = %d tokens: use a "
                 "smaller sequence length or leave this shard out of the pattern", path, (long long)n, dl->T + 1);
        close(fd);
        return -1;
    }
    int rc = scan_ids(fd, path, n, dl->vocab_size, err, errlen);
    close(fd);
    if (rc != 0) return -1;
    dl->shard_tokens[s] = n;
    dl->shard_samples[s] = (n - 1) / dl->T;
    return 0;
}

/* ---- public API ---- */

/* Byte-wise name order: glob's own sort follows the locale (strcoll), and the
 * shard order must not change with the user's LC_COLLATE. */
static int compare_paths(const void* a, const void* b) {
    return strcmp(*(char* const*)a, *(char* const*)b);
}

int dataloader_open(DataLoader** out, const char* glob_pattern, int B, int T, int rank, int world_size,
                    int shuffle, uint64_t seed, int vocab_size, char* err, size_t errlen) {
    *out = NULL;
    if (glob_pattern == NULL || glob_pattern[0] == '\0') {
        snprintf(err, errlen, "data loader: empty shard pattern: pass a glob such as data/default/*_train_*.bin");
        return -1;
    }
    if (B < 1 || T < 1 || (int64_t)B * T > INT_MAX) {
        snprintf(err, errlen, "data loader for '%s': batch size B = %d and sequence length T = %d must be >= 1 "
                 "with B*T <= %d", glob_pattern, B, T, INT_MAX);
        return -1;
    }
    if (world_size < 1 || rank < 0 || rank >= world_size) {
        snprintf(err, errlen, "data loader for '%s': rank %d is not in [0, world_size = %d)", glob_pattern, rank,
                 world_size);
        return -1;
    }
    if (vocab_size < 1 || vocab_size > 65536) {
        snprintf(err, errlen, "data loader for '%s': vocab size %d is outside [1, 65536] (shards hold uint16 ids)",
                 glob_pattern, vocab_size);
        return -1;
    }
    if (shuffle != 0 && shuffle != 1) {
        snprintf(err, errlen, "data loader for '%s': shuffle must be 0 or 1, got %d", glob_pattern, shuffle);
        return -1;
    }

    glob_t matches;
    memset(&matches, 0, sizeof(matches));
    int grc = glob(glob_pattern, GLOB_NOSORT, NULL, &matches);
    if (grc == GLOB_NOMATCH || (grc == 0 && matches.gl_pathc == 0)) {
        snprintf(err, errlen, "no file matches the shard pattern '%s': check the path, or create the shards "
                 "first (scripts/setup_data.sh for the default data, or the tokenize tool)", glob_pattern);
        globfree(&matches);
        return -1;
    }
    if (grc != 0) {
        snprintf(err, errlen, "cannot expand the shard pattern '%s': %s (check that its folders are readable)",
                 glob_pattern, grc == GLOB_NOSPACE ? "out of memory" : "read error");
        globfree(&matches);
        return -1;
    }
    if (matches.gl_pathc > (size_t)INT_MAX / 2) {
        snprintf(err, errlen, "shard pattern '%s' matches %zu files, too many", glob_pattern, matches.gl_pathc);
        globfree(&matches);
        return -1;
    }

    DataLoader* dl = (DataLoader*)calloc(1, sizeof(DataLoader));
    if (dl == NULL) {
        snprintf(err, errlen, "data loader for '%s': out of memory", glob_pattern);
        globfree(&matches);
        return -1;
    }
    for (int i = 0; i < FD_CACHE_SLOTS; i++) { dl->cache_fd[i] = -1; dl->cache_shard[i] = -1; }
    dl->B = B; dl->T = T; dl->rank = rank; dl->world_size = world_size;
    dl->shuffle = shuffle; dl->seed = seed; dl->vocab_size = vocab_size;
    dl->num_shards = (int)matches.gl_pathc;
    int ns = dl->num_shards;
    dl->pattern = strdup(glob_pattern);
    dl->paths = (char**)calloc((size_t)ns, sizeof(char*));
    dl->shard_tokens = (int64_t*)calloc((size_t)ns, sizeof(int64_t));
    dl->shard_samples = (int64_t*)calloc((size_t)ns, sizeof(int64_t));
    dl->shard_order = (int*)calloc((size_t)ns, sizeof(int));
    dl->order_prefix = (int64_t*)calloc((size_t)ns + 1, sizeof(int64_t));
    dl->sample_bytes = (unsigned char*)malloc(((size_t)T + 1) * 2);
    int oom = !dl->pattern || !dl->paths || !dl->shard_tokens || !dl->shard_samples || !dl->shard_order ||
              !dl->order_prefix || !dl->sample_bytes;
    for (int s = 0; s < ns && !oom; s++) {
        dl->paths[s] = strdup(matches.gl_pathv[s]);
        oom = dl->paths[s] == NULL;
    }
    globfree(&matches);
    if (!oom) qsort(dl->paths, (size_t)ns, sizeof(char*), compare_paths);
    if (oom) {
        snprintf(err, errlen, "data loader for '%s': out of memory", glob_pattern);
        dataloader_close(dl);
        return -1;
    }

    for (int s = 0; s < ns; s++) {
        if (inspect_shard(dl, s, err, errlen) != 0) {
            dataloader_close(dl);
            return -1;
        }
        dl->total_tokens += dl->shard_tokens[s];
        dl->total_samples += dl->shard_samples[s];
    }
    int64_t global_batch = (int64_t)world_size * B;
    if (dl->total_samples < global_batch) {
        const char* what = ns == 1 ? dl->paths[0] : glob_pattern;
        snprintf(err, errlen, "%s: %lld tokens in %d shard(s) make only %lld samples of T+1 = %d tokens, fewer "
                 "than one global batch of world_size*B = %lld samples (%lld tokens): use a smaller batch size or "
                 "sequence length, or more data", what, (long long)dl->total_tokens, ns,
                 (long long)dl->total_samples, T + 1, (long long)global_batch, (long long)global_batch * T);
        dataloader_close(dl);
        return -1;
    }
    dataloader_reset(dl);
    *out = dl;
    return 0;
}

int dataloader_next(DataLoader* dl, int* inputs, int* targets, char* err, size_t errlen) {
    int64_t global_batch = (int64_t)dl->world_size * dl->B;
    if (dl->stream_pos + global_batch > dl->total_samples) {
        /* the rest of this epoch is the skipped tail: start the next epoch */
        dl->epoch++;
        dl->stream_pos = 0;
        build_epoch_order(dl);
    }
    const int T = dl->T;
    int64_t first = dl->stream_pos + (int64_t)dl->rank * dl->B;
    for (int b = 0; b < dl->B; b++) {
        int64_t g = first + b;
        int p = order_pos_of(dl, g);
        int s = dl->shard_order[p];
        int64_t i = g - dl->order_prefix[p];
        int64_t k = dl->shuffle
                        ? permute_index(order_key(dl->seed, dl->epoch, KEY_TAG_SAMPLE_ORDER ^ (uint64_t)s),
                                        dl->shard_samples[s], i)
                        : i;
        int64_t first_token = k * T;
        int fd = shard_fd(dl, s, err, errlen);
        if (fd < 0) return -1;
        int64_t offset = (int64_t)SHARD_HEADER_BYTES + 2 * first_token;
        if (read_exact(fd, dl->paths[s], dl->sample_bytes, ((size_t)T + 1) * 2, offset, err, errlen) != 0) {
            return -1;
        }
        int* in_row = inputs + (size_t)b * T;
        int* tg_row = targets + (size_t)b * T;
        for (int t = 0; t <= T; t++) {
            int id = (int)dl->sample_bytes[2 * t] | (int)dl->sample_bytes[2 * t + 1] << 8;
            if (id >= dl->vocab_size) { /* every id passed the check at open: the file changed since */
                snprintf(err, errlen, "%s: token id %d at token index %lld (byte offset %lld) is not below the "
                         "vocab size %d, though every id was below it when the loader opened the shard: the file "
                         "changed during the run; do not rewrite shards during a run", dl->paths[s], id,
                         (long long)(first_token + t), (long long)(offset + 2 * t), dl->vocab_size);
                return -1;
            }
            if (t < T) in_row[t] = id;
            if (t > 0) tg_row[t - 1] = id;
        }
    }
    dl->stream_pos += global_batch;
    return 0;
}

void dataloader_reset(DataLoader* dl) {
    dl->epoch = 0;
    dl->stream_pos = 0;
    build_epoch_order(dl);
}

DataPosition dataloader_position(const DataLoader* dl) {
    DataPosition pos;
    memset(&pos, 0, sizeof(pos));
    int p = order_pos_of(dl, dl->stream_pos);
    pos.epoch = dl->epoch;
    pos.shard_pos = p;
    pos.sample_pos = dl->stream_pos - dl->order_prefix[p];
    pos.seed = dl->seed;
    pos.reserved[0] = DATALOADER_POSITION_TAG;
    pos.reserved[1] = dl->T;
    pos.reserved[2] = dl->total_samples;
    pos.reserved[3] = dl->shuffle;
    return pos;
}

int dataloader_seek(DataLoader* dl, const DataPosition* pos, char* err, size_t errlen) {
    if (pos->reserved[0] != DATALOADER_POSITION_TAG) {
        snprintf(err, errlen, "data position for '%s' is not one saved by dataloader_position (tag missing): "
                 "the resume state is corrupt or from another program", dl->pattern);
        return -1;
    }
    if (pos->reserved[1] != dl->T || pos->reserved[3] != dl->shuffle) {
        snprintf(err, errlen, "data position for '%s' was saved with T = %lld, shuffle = %lld, but the loader has "
                 "T = %d, shuffle = %d: resume with the same sequence length and shuffle setting",
                 dl->pattern, (long long)pos->reserved[1], (long long)pos->reserved[3], dl->T, dl->shuffle);
        return -1;
    }
    if (pos->reserved[2] != dl->total_samples) {
        snprintf(err, errlen, "data position for '%s' was saved over %lld samples per epoch, but these shards make "
                 "%lld: the data set changed since the run was saved; resume on the same shards",
                 dl->pattern, (long long)pos->reserved[2], (long long)dl->total_samples);
        return -1;
    }
    if (dl->shuffle && pos->seed != dl->seed) {
        snprintf(err, errlen, "data position for '%s' was saved with shuffle seed %llu, but the loader has seed "
                 "%llu: resume with the saved seed", dl->pattern, (unsigned long long)pos->seed,
                 (unsigned long long)dl->seed);
        return -1;
    }
    if (pos->epoch < 0 || pos->shard_pos < 0 || pos->shard_pos >= dl->num_shards || pos->sample_pos < 0) {
        snprintf(err, errlen, "data position for '%s' is out of range (epoch %lld, shard_pos %lld of %d, "
                 "sample_pos %lld): the resume state is corrupt", dl->pattern, (long long)pos->epoch,
                 (long long)pos->shard_pos, dl->num_shards, (long long)pos->sample_pos);
        return -1;
    }
    int64_t saved_epoch = dl->epoch;
    dl->epoch = pos->epoch;
    build_epoch_order(dl);
    int s = dl->shard_order[pos->shard_pos];
    if (pos->sample_pos > dl->shard_samples[s]) {
        snprintf(err, errlen, "data position for '%s' is out of range: sample_pos %lld but shard %s has %lld "
                 "samples: the resume state is corrupt", dl->pattern, (long long)pos->sample_pos, dl->paths[s],
                 (long long)dl->shard_samples[s]);
        dl->epoch = saved_epoch;
        build_epoch_order(dl);
        return -1;
    }
    dl->stream_pos = dl->order_prefix[pos->shard_pos] + pos->sample_pos;
    return 0;
}

int64_t dataloader_num_tokens(const DataLoader* dl) { return dl->total_tokens; }
int64_t dataloader_num_samples(const DataLoader* dl) { return dl->total_samples; }
int64_t dataloader_batches_per_epoch(const DataLoader* dl) {
    return dl->total_samples / ((int64_t)dl->world_size * dl->B);
}
int dataloader_num_shards(const DataLoader* dl) { return dl->num_shards; }
const char* dataloader_shard_path(const DataLoader* dl, int i) {
    return (i >= 0 && i < dl->num_shards) ? dl->paths[i] : NULL;
}

void dataloader_close(DataLoader* dl) {
    if (dl == NULL) return;
    close_cached_files(dl);
    if (dl->paths != NULL) {
        for (int s = 0; s < dl->num_shards; s++) free(dl->paths[s]);
    }
    free(dl->paths);
    free(dl->pattern);
    free(dl->shard_tokens);
    free(dl->shard_samples);
    free(dl->shard_order);
    free(dl->order_prefix);
    free(dl->sample_bytes);
    free(dl);
}
