/*
 * train/dist.h - who am I in a multi-process run, and which part is mine.
 *
 * Why: one process drives one GPU; a run of N GPUs is N processes that must
 * agree on their rank, on the data slice each reads and on the piece of the
 * optimizer state each owns (ZeRO-1). This file owns that arithmetic and the
 * start-up handshake, in plain C, so that it is tested on the CPU in CI.
 *
 * Launchers (detected from the environment, in this order):
 *   mpirun (OpenMPI): OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK; the NCCL id
 *                     is broadcast over MPI (needs a build with MPI);
 *   env vars:         RANK, WORLD_SIZE, LOCAL_RANK (torchrun/SLURM style);
 *                     the NCCL id is passed through a file on a shared path;
 *   single:           none of the above: rank 0 of 1.
 * NVLink multicast (NVLS) must stay off in every process: dist_detect sets
 * NCCL_NVLS_ENABLE=0 in this process's environment before NCCL starts.
 *
 * Offers: DistInfo, dist_detect, ZeroShard/zero_shard (ZeRO-1 ranges),
 * dist_id_file_publish/dist_id_file_wait (the env-var launch's id exchange),
 * dist_mpi_* (MPI handshake; a build without MPI links dist_nompi.c, whose
 * functions fail with a message saying the build has no MPI).
 */
#ifndef TRAIN_DIST_H
#define TRAIN_DIST_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { LAUNCH_SINGLE = 0, LAUNCH_MPI = 1, LAUNCH_ENV = 2 } LaunchKind;

typedef struct {
    int rank;         /* 0 .. world_size-1 */
    int world_size;   /* number of processes (one GPU each) */
    int local_rank;   /* rank on this node: selects the GPU */
    LaunchKind launch;
} DistInfo;

const char* dist_launch_name(LaunchKind k);

/* Reads the launcher's environment; validates ranges; sets NCCL_NVLS_ENABLE=0.
   Returns 0, or -1 with a message (e.g. RANK without WORLD_SIZE). */
int dist_detect(DistInfo* d, char* err, size_t errlen);

/*
 * ZeRO-1: the flat parameter buffer of `total` elements is padded to a
 * multiple of world_size * align and cut into equal shards; rank r owns
 * [offset, offset + count) of the padded buffer, of which `valid` elements are
 * real parameters (the rest is padding past `total`). Equal shard sizes are
 * what NCCL's reduce-scatter and all-gather need.
 */
typedef struct {
    size_t padded_total;  /* total rounded up to a multiple of world_size * align */
    size_t shard_size;    /* padded_total / world_size, a multiple of align */
    size_t offset;        /* this rank's first element */
    size_t valid;         /* elements of this shard below `total` */
} ZeroShard;
ZeroShard zero_shard(size_t total, int world_size, int rank, size_t align);

/*
 * Splits `steps_tokens` of one optimizer step into micro-steps: with a total
 * batch of total_tokens and B*T tokens per rank per micro-step, the gradient
 * accumulation count is total_tokens / (B*T*world_size). Returns it, or -1
 * with a message when it does not divide exactly.
 */
int64_t dist_grad_accum_steps(int64_t total_tokens, int B, int T, int world_size, char* err, size_t errlen);

/* Env-var launch: rank 0 writes the NCCL id (nbytes) to path (tmp + rename);
   the others wait for it up to timeout_s. 0 or -1 with a message. */
int dist_id_file_publish(const char* path, const void* id, size_t nbytes, char* err, size_t errlen);
int dist_id_file_wait(const char* path, void* id, size_t nbytes, double timeout_s, char* err, size_t errlen);

/* FNV-1a 64-bit digest of a byte range: ranks compare config and data digests
   before the first step. */
uint64_t dist_digest(const void* data, size_t nbytes, uint64_t seed);

/* MPI handshake (dist_mpi.c, or dist_nompi.c in builds without MPI). */
int dist_mpi_available(void);
int dist_mpi_init(char* err, size_t errlen);
/* Broadcast nbytes from rank 0 to all. */
int dist_mpi_broadcast(void* data, size_t nbytes, char* err, size_t errlen);
/* Every rank contributes nbytes; out receives world_size * nbytes in rank order. */
int dist_mpi_allgather(const void* in, void* out, size_t nbytes, char* err, size_t errlen);
void dist_mpi_finalize(void);
/* Ends every process of the MPI job (a failing rank calls it so the others do
   not wait forever in a collective); returns only without MPI. */
void dist_mpi_abort(int code);

#ifdef __cplusplus
}
#endif

#endif /* TRAIN_DIST_H */
