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
 * problem, or NULL), SHARD_* constants.
 */
#ifndef DATALOADER_SHARD_H
#define DATALOADER_SHARD_H

#include <stdint.h>
#include <stdio.h>

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

#endif /* DATALOADER_SHARD_H */
