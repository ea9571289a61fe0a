/*
 * train/comm_nccl.cu - train/comm.h over NCCL (one communicator, one process
 * per GPU). The NCCL id reaches the other ranks over MPI (mpirun) or through
 * a file on a shared path (env-var launch); see train/dist.h.
 */
#include "train/comm.h"

#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/cuda_utils.cuh"

struct Comm {
    DistInfo dist;
    ncclComm_t nccl;
    float* d_scalars;      /* world_size * kMaxScalars, gather target */
    uint64_t* d_digests;   /* world_size digests */
    char failure_path[4096]; /* env-var launch: "<id_file>.failed"; "" = none */
    int stopping;            /* this rank is already stopping (do not report again) */
};

static const int kMaxScalars = 64;

#define ncclCheck(call) do {                                                         \
        ncclResult_t r_ = (call);                                                    \
        if (r_ != ncclSuccess) die("NCCL call %s failed: %s\n  hint: NCCL_DEBUG=WARN shows why; " \
                                   "check that every rank runs and sees its GPU", #call, ncclGetErrorString(r_)); \
    } while (0)

int comm_multi_process_capable(void) { return 1; }

Comm* comm_create(const DistInfo* d, const char* id_file, char* err, size_t errlen) {
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (d->world_size > 1) {
        if (d->launch == LAUNCH_MPI) {
            if (dist_mpi_init(err, errlen) != 0) return NULL;
            if (d->rank == 0) ncclCheck(ncclGetUniqueId(&id));
            if (dist_mpi_broadcast(&id, sizeof id, err, errlen) != 0) return NULL;
        } else {
            if (id_file == NULL || id_file[0] == '\0') {
                snprintf(err, errlen, "a launch through RANK/WORLD_SIZE needs --nccl-id-file PATH on a path "
                         "all ranks share (rank 0 writes the NCCL id there)");
                return NULL;
            }
            if (d->rank == 0) {
                char stale[4096];
                snprintf(stale, sizeof stale, "%s.failed", id_file);
                remove(stale); /* a failure marker of an earlier run would stop this one */
                ncclCheck(ncclGetUniqueId(&id));
                if (dist_id_file_publish(id_file, &id, sizeof id, err, errlen) != 0) return NULL;
            } else if (dist_id_file_wait(id_file, &id, sizeof id, 300.0, err, errlen) != 0) {
                return NULL;
            }
        }
    } else {
        ncclCheck(ncclGetUniqueId(&id));
    }
    Comm* c = (Comm*)callocCheck(1, sizeof(Comm));
    c->dist = *d;
    if (d->world_size > 1 && d->launch == LAUNCH_ENV) snprintf(c->failure_path, sizeof c->failure_path, "%s.failed", id_file);
    ncclCheck(ncclCommInitRank(&c->nccl, d->world_size, id, d->rank));
    cudaCheck(cudaMalloc(&c->d_scalars, (size_t)d->world_size * kMaxScalars * sizeof(float)));
    cudaCheck(cudaMalloc(&c->d_digests, (size_t)d->world_size * sizeof(uint64_t)));
    if (d->world_size > 1 && d->launch == LAUNCH_ENV && d->rank == 0) {
        /* Every rank is connected now: the id file has done its job. A stale
           one would hang the next launch on an old id. */
        remove(id_file);
    }
    return c;
}

void comm_report_failure(Comm* c) {
    if (c == NULL || c->stopping || c->failure_path[0] == '\0') return;
    c->stopping = 1;
    FILE* fp = fopen(c->failure_path, "w");
    if (fp == NULL) return; /* nothing more to do on the way out */
    fprintf(fp, "rank %d of %d\n", c->dist.rank, c->dist.world_size);
    fclose(fp);
}

/* Waits for stream s like cudaStreamSynchronize, but under the env-var launch
   also watches for a failed peer (its marker file) and NCCL errors, so a dead
   rank cannot leave this one waiting forever. */
void comm_synchronize(Comm* c, cudaStream_t s) {
    if (c->failure_path[0] == '\0') {
        cudaCheck(cudaStreamSynchronize(s));
        return;
    }
    const struct timespec nap = {0, 50 * 1000}; /* 50 us: negligible next to a training step */
    for (long spins = 0;; spins++) {
        const cudaError_t q = cudaStreamQuery(s);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) cudaCheck(q);
        if (spins % 2000 == 0) { /* about every 0.1 s */
            ncclResult_t async = ncclSuccess;
            ncclCommGetAsyncError(c->nccl, &async);
            char who[128] = "";
            FILE* fp = fopen(c->failure_path, "r");
            if (fp != NULL) {
                if (fgets(who, sizeof who, fp) == NULL) snprintf(who, sizeof who, "another rank");
                fclose(fp);
                who[strcspn(who, "\n")] = 0;
            }
            if (who[0] != '\0' || (async != ncclSuccess && async != ncclInProgress)) {
                /* Say why first, then leave at once with _exit: ncclCommAbort, or the CUDA teardown in exit(),
                   can wait forever on the collective kernel that spins for the dead peer, leaving the rank
                   silent until its job limit. The driver reclaims the GPU when the process ends. This path
                   has not been exercised on several GPUs. */
                c->stopping = 1;
                fflush(stdout);
                if (who[0] != '\0')
                    fprintf(stderr, "error: rank %d stops: %s failed (see its output; marker %s)\n", c->dist.rank, who,
                            c->failure_path);
                else
                    fprintf(stderr, "error: rank %d stops: NCCL reports %s\n  hint: NCCL_DEBUG=WARN shows why\n",
                            c->dist.rank, ncclGetErrorString(async));
                fprintf(stderr, "  (at %s:%d)\n", __FILE__, __LINE__);
                fflush(stderr);
                _exit(EXIT_FAILURE);
            }
        }
        nanosleep(&nap, NULL);
    }
}

void comm_destroy(Comm* c) {
    if (c == NULL) return;
    ncclCommDestroy(c->nccl);
    cudaFree(c->d_scalars);
    cudaFree(c->d_digests);
    if (c->dist.launch == LAUNCH_MPI) dist_mpi_finalize();
    free(c);
}

int comm_world_size(const Comm* c) { return c->dist.world_size; }
int comm_rank(const Comm* c) { return c->dist.rank; }

void comm_all_reduce_bf16(Comm* c, __nv_bfloat16* data, size_t count, cudaStream_t s) {
    if (c->dist.world_size == 1) return;
    ncclCheck(ncclAllReduce(data, data, count, ncclBfloat16, ncclSum, c->nccl, s));
}

void comm_reduce_bf16(Comm* c, __nv_bfloat16* data, size_t count, int root, cudaStream_t s) {
    if (c->dist.world_size == 1 || count == 0) return;
    ncclCheck(ncclReduce(data, data, count, ncclBfloat16, ncclSum, root, c->nccl, s));
}

void comm_group_begin(Comm* c) {
    if (c->dist.world_size > 1) ncclCheck(ncclGroupStart());
}
void comm_group_end(Comm* c) {
    if (c->dist.world_size > 1) ncclCheck(ncclGroupEnd());
}

void comm_reduce_scatter_bf16(Comm* c, const __nv_bfloat16* send, __nv_bfloat16* recv, size_t shard_count,
                              cudaStream_t s) {
    if (c->dist.world_size == 1) {
        if (recv != send) cudaCheck(cudaMemcpyAsync(recv, send, shard_count * sizeof(__nv_bfloat16),
                                                        cudaMemcpyDeviceToDevice, s));
        return;
    }
    ncclCheck(ncclReduceScatter(send, recv, shard_count, ncclBfloat16, ncclSum, c->nccl, s));
}

void comm_all_gather_bf16(Comm* c, __nv_bfloat16* full, size_t shard_count, cudaStream_t s) {
    if (c->dist.world_size == 1) return;
    const __nv_bfloat16* mine = full + (size_t)c->dist.rank * shard_count;
    ncclCheck(ncclAllGather(mine, full, shard_count, ncclBfloat16, c->nccl, s));
}

void comm_sum_scalars(Comm* c, const float* d_in, double* h_out, int n, cudaStream_t s) {
    if (n > kMaxScalars) die("comm_sum_scalars: %d scalars requested, at most %d", n, kMaxScalars);
    int W = c->dist.world_size;
    float host[64 * 64];
    float* gathered = W * n <= 64 * 64 ? host : (float*)mallocCheck((size_t)W * n * sizeof(float));
    if (W == 1) {
        cudaCheck(cudaMemcpyAsync(gathered, d_in, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    } else {
        ncclCheck(ncclAllGather(d_in, c->d_scalars, (size_t)n, ncclFloat32, c->nccl, s));
        cudaCheck(cudaMemcpyAsync(gathered, c->d_scalars, (size_t)W * n * sizeof(float),
                                      cudaMemcpyDeviceToHost, s));
    }
    comm_synchronize(c, s);
    for (int i = 0; i < n; i++) {
        double sum = 0.0;
        for (int r = 0; r < W; r++) sum += (double)gathered[r * n + i];  /* rank order: deterministic */
        h_out[i] = sum;
    }
    if (gathered != host) free(gathered);
}

int comm_check_agreement(Comm* c, uint64_t digest, const char* what, char* err, size_t errlen) {
    int W = c->dist.world_size;
    if (W == 1) return 0;
    uint64_t* all = (uint64_t*)mallocCheck((size_t)W * sizeof(uint64_t));
    cudaCheck(cudaMemcpy(c->d_digests + c->dist.rank, &digest, sizeof digest, cudaMemcpyHostToDevice));
    ncclCheck(ncclAllGather(c->d_digests + c->dist.rank, c->d_digests, 8, ncclUint8, c->nccl, 0));
    comm_synchronize(c, 0);
    cudaCheck(cudaMemcpy(all, c->d_digests, (size_t)W * sizeof(uint64_t), cudaMemcpyDeviceToHost));
    int rc = 0;
    for (int r = 0; r < W; r++) {
        if (all[r] != all[0]) {
            snprintf(err, errlen, "rank %d disagrees with rank 0 on %s (digest %016llx vs %016llx)\n"
                     "  hint: every rank must be started with the same flags, model and data files", r, what,
                     (unsigned long long)all[r], (unsigned long long)all[0]);
            rc = -1;
            break;
        }
    }
    free(all);
    return rc;
}
