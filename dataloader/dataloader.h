/*
 * dataloader/dataloader.h - reads llm.c token shards as micro-batches of
 * (inputs, targets) for every trainer: the CPU trainer, the GPU trainer and
 * the multi-GPU trainer (one loader per rank).
 *
 * Why: the loader decides what data a run sees, in what order, and where a
 * resumed run picks up. All of that must be exact (every sample once per
 * epoch, the same order for the same seed on any machine, bit-exact resume)
 * and checked (bad shards and bad token ids stop the run with one message
 * naming the file). llm.c's loader casts offsets to int (shards over 2 GiB
 * break) and cannot resume mid-epoch under shuffling; this one fixes both.
 *
 * ---- Definitions (the contract) ----
 * Shards: the files matching a glob(3) pattern (a plain path is a pattern
 *   matching one file), sorted by name byte-wise (strcmp, whatever the
 *   locale). Each is validated at open: it must be a regular file, its
 *   header and file size must agree (shard.h), it must hold at least T+1
 *   tokens, and every token id in it must be < vocab_size (the open reads
 *   each shard once, start to end; the message of a bad id names the file,
 *   the id, its token index and its byte offset).
 * Sample: shard s with n_s tokens is cut into S_s = floor((n_s - 1) / T)
 *   samples; sample k is the T+1 tokens [k*T, k*T + T]. Consecutive samples
 *   share one token (the last target of one is the first input of the next,
 *   as in llm.c); the < T leftover tokens at a shard's end are never used.
 *   inputs[t] = tok[k*T + t], targets[t] = tok[k*T + t + 1], t in [0, T).
 * Epoch stream: epoch e visits the shards in a shard order and, inside each
 *   shard, its samples in a sample order; the stream is that concatenation,
 *   N = sum_s S_s samples long. Without shuffling both orders are the
 *   identity (shards by name, samples by offset). With shuffling both are
 *   pseudo-random permutations drawn from (seed, epoch) (and the shard's
 *   index for its sample order) by a small portable keyed permutation (a
 *   Feistel network on 64-bit integer hashes; no rand(), no floating point),
 *   so the same seed gives the same order on any machine and each epoch a
 *   new one. The stream does not depend on B or world_size.
 * Global batch: one micro-step takes the next world_size * B samples of the
 *   stream; rank r gets samples [r*B, (r+1)*B) of them, row b of its arrays
 *   being its b-th sample. Each rank reads only its own B samples from disk.
 *   A global batch may span two or more shards.
 * Epoch tail: batches_per_epoch = floor(N / (world_size * B)). The last
 *   N mod (world_size * B) samples of an epoch's stream (fewer than one
 *   global batch) are skipped, and the next batch starts epoch e+1. Under
 *   shuffling a different set is skipped each epoch; without it the same
 *   last samples are. No sample is ever seen twice within an epoch.
 * Position: where the next global batch starts: (epoch, shard_pos =
 *   index into that epoch's shard order, sample_pos = index into that
 *   shard's sample order). It is the same on every rank. Saving it after
 *   any next() and seeking a freshly opened loader (same shards, T, seed and
 *   shuffle flag; B and world_size may differ) to it yields exactly the
 *   batches an uninterrupted run would have produced. A position that points
 *   at the epoch's skipped tail is legal: next() moves on to epoch+1.
 *
 * ---- Errors ----
 * Functions that can fail return 0 on success and -1 with a one-line
 * message in err (naming the file, the problem, and what to do) so a trainer
 * can add context and die(), and tests can check the text. Nothing here
 * exits the process.
 *
 * Offers: DataLoader (opaque), DataPosition, dataloader_open/next/reset/
 * position/seek/num_tokens/num_samples/batches_per_epoch/num_shards/close.
 */
#ifndef DATALOADER_DATALOADER_H
#define DATALOADER_DATALOADER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct DataLoader DataLoader;

/*
 * A plain struct (no pointers) the trainer writes into its resume-state file
 * as is. Get it from dataloader_position(); do not fill it by hand:
 * reserved[] records the tag, T, stream length and shuffle flag it was
 * made with, which dataloader_seek() checks against the loader.
 */
typedef struct {
    int64_t epoch;       /* 0-based epoch of the next global batch */
    int64_t shard_pos;   /* index into the epoch's shard order */
    int64_t sample_pos;  /* index into that shard's sample order */
    uint64_t seed;       /* shuffle seed of the loader that made it */
    int64_t reserved[4]; /* [0] DATALOADER_POSITION_TAG, [1] T, [2] N (samples per epoch), [3] shuffle */
} DataPosition;

#define DATALOADER_POSITION_TAG 0x44504f53 /* "DPOS": marks a struct made by dataloader_position */

/*
 * Opens every shard matching glob_pattern and validates it. B sequences of
 * T tokens per rank; rank in [0, world_size). shuffle: 0 = sequential order,
 * 1 = permuted per epoch from (seed, epoch). vocab_size: ids must be below it
 * (50257 for GPT-2). Fails (returns -1, message in err) on: no match, a
 * match that is not a regular file, a bad shard, a shard shorter than T+1
 * tokens, a token id >= vocab_size, fewer than world_size*B samples in
 * total, bad arguments. On success *out holds the validated shard list;
 * files are opened on first read and at most 4 stay open. Close it.
 */
int dataloader_open(DataLoader** out, const char* glob_pattern, int B, int T, int rank, int world_size,
                    int shuffle, uint64_t seed, int vocab_size, char* err, size_t errlen);

/* Fills this rank's B*T inputs and targets (row-major [B][T]) and advances
 * the position by one global batch. Fails on a read error, or on a shard
 * that changed after the open (shorter, or holding a bad id). */
int dataloader_next(DataLoader* dl, int* inputs, int* targets, char* err, size_t errlen);

/* Back to the start of epoch 0 (for the validation loader before each eval). */
void dataloader_reset(DataLoader* dl);

/* Where the next global batch starts (see the contract above). */
DataPosition dataloader_position(const DataLoader* dl);

/* Continues from a saved position. Fails if the position was made with a
 * different seed, T, shuffle flag or data set, or is out of range. */
int dataloader_seek(DataLoader* dl, const DataPosition* pos, char* err, size_t errlen);

int64_t dataloader_num_tokens(const DataLoader* dl);       /* total tokens over all shards */
int64_t dataloader_num_samples(const DataLoader* dl);      /* N: samples per epoch stream */
int64_t dataloader_batches_per_epoch(const DataLoader* dl); /* floor(N / (world_size*B)) */
int dataloader_num_shards(const DataLoader* dl);
/* Path of shard i (in name order), for banners and messages. */
const char* dataloader_shard_path(const DataLoader* dl, int i);
void dataloader_close(DataLoader* dl); /* NULL is fine */

#ifdef __cplusplus
}
#endif

#endif /* DATALOADER_DATALOADER_H */
