/*
 * train/comm.h - the collectives the GPU trainer needs, one process per GPU.
 *
 * Why: data parallelism needs five operations (gradient reduce-scatter or
 * all-reduce, parameter all-gather, a deterministic reduction of a few
 * scalars, and the ranks' agreement check). The trainer calls only these, so
 * it reads the same on one GPU and on many. comm_nccl.cu implements them with
 * NCCL; comm_single.cu (builds without NCCL) serves world size 1 with local
 * copies, so the ZeRO-1 code path runs, and is tested, on one GPU too.
 *
 * Bytes are BF16 for gradients and parameters (the model's storage type);
 * scalars are reduced by all-gathering the per-rank values and summing them
 * in rank order on every rank: bit-identical on all ranks and run to run.
 */
#ifndef TRAIN_COMM_H
#define TRAIN_COMM_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include "train/dist.h"

typedef struct Comm Comm;

/* Starts the communicator for d (after dist_detect and cudaSetDevice).
   NCCL id: over MPI for LAUNCH_MPI, through id_file for LAUNCH_ENV (rank 0
   writes it; required when world_size > 1). Returns NULL with a message. */
Comm* comm_create(const DistInfo* d, const char* id_file, char* err, size_t errlen);
void comm_destroy(Comm* c);
int comm_world_size(const Comm* c);
int comm_rank(const Comm* c);
/* 1 if this build can run more than one process (NCCL linked in). */
int comm_multi_process_capable(void);

/* Sum over ranks of `count` BF16 elements, in place. */
void comm_all_reduce_bf16(Comm* c, __nv_bfloat16* data, size_t count, cudaStream_t s);
/* Sum over ranks of `count` BF16 elements, in place, delivered to rank
   `root` only (the other ranks' data is left as it was). ZeRO-1 with
   overlap: a layer's gradient slices are reduced to the ranks whose shards
   they fall in as soon as backward finishes that layer. */
void comm_reduce_bf16(Comm* c, __nv_bfloat16* data, size_t count, int root, cudaStream_t s);
/* Brackets several collectives so the library launches them together
   (ncclGroupStart/End); no-ops without NCCL. */
void comm_group_begin(Comm* c);
void comm_group_end(Comm* c);
/* ZeRO-1: send holds world_size * shard_count elements; recv gets this
   rank's shard of the sum. send and recv may not overlap (recv may be
   send + rank * shard_count, NCCL's in-place form). */
void comm_reduce_scatter_bf16(Comm* c, const __nv_bfloat16* send, __nv_bfloat16* recv, size_t shard_count,
                              cudaStream_t s);
/* ZeRO-1: every rank contributes shard_count elements at
   full + rank * shard_count (in place); afterwards full holds all shards. */
void comm_all_gather_bf16(Comm* c, __nv_bfloat16* full, size_t shard_count, cudaStream_t s);
/* Deterministic scalar sums: in[n] per rank (device memory) -> out[n] (host),
   summed in rank order in double. Synchronizes s. */
void comm_sum_scalars(Comm* c, const float* d_in, double* h_out, int n, cudaStream_t s);
/* Every rank passes its digest of config + data; returns 0 when all agree,
   else -1 with a message naming the first rank that differs. */
int comm_check_agreement(Comm* c, uint64_t digest, const char* what, char* err, size_t errlen);

/* A rank that fails says so to the others. Under the env-var launch with
   more than one process, it writes "<id_file>.failed" (rank 0 deletes a stale
   one before publishing the NCCL id); every rank's host waits in
   comm_sum_scalars and comm_check_agreement poll for that file (and for NCCL
   errors) and then print a message naming the failed rank and leave at once
   (_exit: no ncclCommAbort, no exit-time CUDA teardown, either of which can
   wait on the collective kernel spinning for the gone peer), instead of
   waiting forever in a collective whose peer is gone. Under mpirun the trainer uses MPI_Abort instead; elsewhere a no-op.
   c may be NULL (failure before the communicator existed: nothing to say). */
void comm_report_failure(Comm* c);
/* cudaStreamSynchronize(s) that also stops (as above) when a peer failed:
   use it wherever the host waits on a stream with collectives in flight. */
void comm_synchronize(Comm* c, cudaStream_t s);

#endif /* TRAIN_COMM_H */
