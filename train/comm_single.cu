/*
 * train/comm_single.cu - train/comm.h for builds without NCCL: world size 1
 * only. Collectives become local copies, so the trainer's ZeRO-1 code path
 * still runs (and is checked bit-exact against no sharding) on one GPU.
 */
#include "train/comm.h"

#include <stdio.h>
#include <stdlib.h>

#include "common/cuda_utils.cuh"

struct Comm {
    DistInfo dist;
};


int comm_multi_process_capable(void) { return 0; }

Comm* comm_create(const DistInfo* d, const char* id_file, char* err, size_t errlen) {
    if (d->world_size > 1) {
        snprintf(err, errlen, "this build has no NCCL, so it runs on one GPU only (world size %d requested)\n"
                 "  hint: install NCCL (libnccl-dev) and rebuild for multi-GPU runs", d->world_size);
        return NULL;
    }
    Comm* c = (Comm*)callocCheck(1, sizeof(Comm));
    c->dist = *d;
    return c;
}

void comm_destroy(Comm* c) { free(c); }
int comm_world_size(const Comm* c) { return 1; }
int comm_rank(const Comm* c) { return 0; }
void comm_all_reduce_bf16(Comm* c, __nv_bfloat16* data, size_t count, cudaStream_t s) {}

void comm_reduce_bf16(Comm* c, __nv_bfloat16* data, size_t count, int root, cudaStream_t s) {}
void comm_group_begin(Comm* c) {}
void comm_group_end(Comm* c) {}

void comm_reduce_scatter_bf16(Comm* c, const __nv_bfloat16* send, __nv_bfloat16* recv, size_t shard_count,
                              cudaStream_t s) {
    if (recv != send) cudaCheck(cudaMemcpyAsync(recv, send, shard_count * sizeof(__nv_bfloat16),
                                                    cudaMemcpyDeviceToDevice, s));
}

void comm_all_gather_bf16(Comm* c, __nv_bfloat16* full, size_t shard_count, cudaStream_t s) {}

void comm_sum_scalars(Comm* c, const float* d_in, double* h_out, int n, cudaStream_t s) {
    float host[64];
    if (n > 64) die("comm_sum_scalars: %d scalars requested, at most 64", n);
    cudaCheck(cudaMemcpyAsync(host, d_in, n * sizeof(float), cudaMemcpyDeviceToHost, s));
    cudaCheck(cudaStreamSynchronize(s));
    for (int i = 0; i < n; i++) h_out[i] = (double)host[i];
}

void comm_report_failure(Comm* c) {}
void comm_synchronize(Comm* c, cudaStream_t s) { cudaCheck(cudaStreamSynchronize(s)); }
int comm_check_agreement(Comm* c, uint64_t digest, const char* what, char* err, size_t errlen) { return 0; }
