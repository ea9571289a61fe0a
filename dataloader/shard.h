/*
 * dataloader/shard.h - the llm.c token-shard format: one header, uint16 ids.
 *
 * Why: existing llm.c shards (FineWeb etc.) must work unchanged, and every
 * reader and writer of shards in this project (the tokenize tool, the loader,
 * tests) must check the header the same way. This header is that one place.
 *
 * Format: 256 little-endian int32 (1024 bytes): [0] magic 20240520,
 * [1] version 1, [2] token count; the rest zero. Then `count` uint16 ids.
 * File size must equal 1024 + 2*count. Offsets are 64-bit (shards > 2 GiB).
 *
 * Offers: shard_header_init, shard_header_check (returns a message naming the
 * problem, or NULL), shard_write (header + ids to path.tmp, then rename, so a
 * crash never leaves a half-written shard under the real name), SHARD_*
 * constants. Ids are written in host byte order (little-endian on every
 * machine this project targets), as llm.c does.
 */
#ifndef DATALOADER_SHARD_H
#define DATALOADER_SHARD_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <errno.h>
#include <stdlib.h>

#include "common/atomic_file.h" /* shard_write: programs calling it link common/atomic_file.o */

#define SHARD_MAGIC 20240520
#define SHARD_VERSION 1
#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)

static inline void shard_header_init(int32_t header[SHARD_HEADER_INTS], int64_t num_tokens) {
    for (int i = 0; i < SHARD_HEADER_INTS; i++) header[i] = 0;
    header[0] = SHARD_MAGIC;
    header[1] = SHARD_VERSION;
    header[2] = (int32_t)num_tokens;
}

/*
 * Validates a header against the file size. Returns NULL if good, else a
 * static message that names the problem (the caller adds the file name).
 * The token count field is an int32, so one shard holds < 2^31 tokens
 * (4 GiB of ids); file offsets are still computed in 64 bits.
 */
static inline const char* shard_header_check(const int32_t header[SHARD_HEADER_INTS], int64_t file_size,
                                             int64_t* num_tokens) {
    if (file_size < SHARD_HEADER_BYTES) return "file is shorter than the 1024-byte shard header (truncated?)";
    if (header[0] != SHARD_MAGIC) return "bad magic number (expected 20240520: not an llm.c token shard)";
    if (header[1] != SHARD_VERSION) return "unsupported shard version (expected 1)";
    if (header[2] < 0) return "negative token count in header (corrupt header)";
    int64_t n = header[2];
    int64_t expected = (int64_t)SHARD_HEADER_BYTES + 2 * n;
    if (file_size < expected) return "file is shorter than its header's token count says (truncated)";
    if (file_size > expected) return "file is longer than its header's token count says (corrupt or mixed file)";
    *num_tokens = n;
    return NULL;
}

/*
 * Writes a complete shard: header for n ids, then the ids. Goes to
 * "<path>.tmp" first and is renamed to path only when fully written and
 * fsync'ed (common/atomic_file). Returns 0, or -1 with a message naming the file in err.
 */
static inline int shard_write(const char* path, const uint16_t* ids, int64_t n, char* err, size_t errlen) {
    if (n < 0 || n > INT32_MAX) {
        snprintf(err, errlen, "%s: cannot write %lld tokens into one shard (the header's count is an int32; "
                 "the limit is %d): split the data into more shards", path, (long long)n, INT32_MAX);
        return -1;
    }
    char msg[512];
    AtomicFile af;
    FILE* fp = atomic_file_open(&af, path, msg, sizeof(msg));
    if (fp == NULL) {
        snprintf(err, errlen, "%s: %s (does its folder exist and is it writable?)", path, msg);
        return -1;
    }
    int32_t header[SHARD_HEADER_INTS];
    shard_header_init(header, n);
    int ok = fwrite(header, sizeof(int32_t), SHARD_HEADER_INTS, fp) == SHARD_HEADER_INTS;
    if (ok && n > 0) ok = fwrite(ids, sizeof(uint16_t), (size_t)n, fp) == (size_t)n;
    if (!ok) {
        snprintf(msg, sizeof(msg), "writing '%s' failed: %s", af.tmp_path, strerror(errno));
        atomic_file_abort(&af);
    }
    if (!ok || atomic_file_commit(&af, msg, sizeof(msg)) != 0) {
        snprintf(err, errlen, "%s: %s (is the disk full?)", path, msg);
        return -1;
    }
    return 0;
}

#endif /* DATALOADER_SHARD_H */
