/*
 * train/dist.c - launcher detection, ZeRO-1 shard arithmetic and the NCCL id
 * file exchange (see dist.h). No MPI or NCCL calls here: those live in
 * dist_mpi.c and the trainer's communicator, so this file is CPU-testable.
 */
#include "train/dist.h"

#include "common/atomic_file.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char* dist_launch_name(LaunchKind k) {
    switch (k) {
        case LAUNCH_MPI: return "mpirun";
        case LAUNCH_ENV: return "env (RANK/WORLD_SIZE)";
        default: return "single process";
    }
}

/* Parses a non-negative decimal environment value; -2 if malformed, -1 if unset. */
static int env_int(const char* name) {
    const char* s = getenv(name);
    if (s == NULL || *s == '\0') return -1;
    char* end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < 0 || v > 1000000) return -2;
    return (int)v;
}

int dist_detect(DistInfo* d, char* err, size_t errlen) {
    /* Keep NVLink multicast off in every process, whatever the caller's environment said. */
    const char* nvls = getenv("NCCL_NVLS_ENABLE");
    if (nvls != NULL && strcmp(nvls, "0") != 0) {
        fprintf(stderr, "warning: NCCL_NVLS_ENABLE=%s overridden to 0 (NVLink multicast stays off)\n", nvls);
    }
    setenv("NCCL_NVLS_ENABLE", "0", 1);

    const char* names[2][3] = {
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"},
        {"RANK", "WORLD_SIZE", "LOCAL_RANK"},
    };
    const LaunchKind kinds[2] = {LAUNCH_MPI, LAUNCH_ENV};
    for (int k = 0; k < 2; k++) {
        int rank = env_int(names[k][0]), size = env_int(names[k][1]), local = env_int(names[k][2]);
        if (rank == -1 && size == -1) continue;
        if (rank < 0 || size < 1) {
            snprintf(err, errlen, "launcher variables %s=%s %s=%s are incomplete or not numbers\n"
                     "  hint: set both (and %s), e.g. RANK=0 WORLD_SIZE=2 LOCAL_RANK=0", names[k][0],
                     getenv(names[k][0]) ? getenv(names[k][0]) : "(unset)", names[k][1],
                     getenv(names[k][1]) ? getenv(names[k][1]) : "(unset)", names[k][2]);
            return -1;
        }
        if (rank >= size) {
            snprintf(err, errlen, "%s=%d must be smaller than %s=%d", names[k][0], rank, names[k][1], size);
            return -1;
        }
        if (local == -2) {
            snprintf(err, errlen, "%s is not a number", names[k][2]);
            return -1;
        }
        d->rank = rank;
        d->world_size = size;
        d->local_rank = local >= 0 ? local : (kinds[k] == LAUNCH_ENV && size == 1 ? 0 : rank);
        d->launch = kinds[k];
        return 0;
    }
    d->rank = 0;
    d->world_size = 1;
    d->local_rank = 0;
    d->launch = LAUNCH_SINGLE;
    return 0;
}

ZeroShard zero_shard(size_t total, int world_size, int rank, size_t align) {
    ZeroShard z;
    if (align == 0) align = 1;
    size_t unit = (size_t)world_size * align;
    z.padded_total = (total + unit - 1) / unit * unit;
    z.shard_size = z.padded_total / (size_t)world_size;
    z.offset = (size_t)rank * z.shard_size;
    z.valid = z.offset >= total ? 0 : (total - z.offset < z.shard_size ? total - z.offset : z.shard_size);
    return z;
}

int64_t dist_grad_accum_steps(int64_t total_tokens, int B, int T, int world_size, char* err, size_t errlen) {
    int64_t per_micro = (int64_t)B * T * world_size;
    if (B < 1 || T < 1 || world_size < 1 || total_tokens < 1) {
        snprintf(err, errlen, "batch size, sequence length, world size and total batch must be positive");
        return -1;
    }
    if (total_tokens % per_micro != 0) {
        snprintf(err, errlen, "--total-batch-tokens %lld is not a multiple of B*T*GPUs = %d*%d*%d = %lld\n"
                 "  hint: use a multiple of %lld, e.g. %lld", (long long)total_tokens, B, T, world_size,
                 (long long)per_micro, (long long)per_micro,
                 (long long)((total_tokens + per_micro - 1) / per_micro * per_micro));
        return -1;
    }
    const int64_t accum = total_tokens / per_micro;
    if (accum > INT_MAX) { /* the trainers count micro-steps in an int */
        snprintf(err, errlen, "--total-batch-tokens %lld gives %lld accumulation steps of B*T*GPUs = %lld tokens, "
                 "more than the %d one optimizer step can run\n  hint: lower --total-batch-tokens (or raise "
                 "--batch-size)", (long long)total_tokens, (long long)accum, (long long)per_micro, INT_MAX);
        return -1;
    }
    return accum;
}

int dist_id_file_publish(const char* path, const void* id, size_t nbytes, char* err, size_t errlen) {
    /* a per-process tmp name: two launches sharing one id path never write into each other's tmp */
    char msg[4200];
    AtomicFile af;
    FILE* fp = atomic_file_open_unique(&af, path, msg, sizeof(msg));
    if (fp == NULL) {
        snprintf(err, errlen, "cannot write the NCCL id file: %s\n"
                 "  hint: --nccl-id-file must be on a path every node can read and rank 0 can write", msg);
        return -1;
    }
    if (fwrite(id, 1, nbytes, fp) != nbytes) {
        snprintf(msg, sizeof(msg), "%s", strerror(errno));
        atomic_file_abort(&af);
        snprintf(err, errlen, "writing the NCCL id file '%s' failed: %s", path, msg);
        return -1;
    }
    if (atomic_file_commit(&af, msg, sizeof(msg)) != 0) {
        snprintf(err, errlen, "writing the NCCL id file '%s' failed: %s", path, msg);
        return -1;
    }
    return 0;
}

int dist_id_file_wait(const char* path, void* id, size_t nbytes, double timeout_s, char* err, size_t errlen) {
    struct timespec start, now, nap = {0, 50 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    for (;;) {
        FILE* fp = fopen(path, "rb");
        if (fp != NULL) {
            size_t got = fread(id, 1, nbytes, fp);
            int extra = fgetc(fp);
            fclose(fp);
            if (got == nbytes && extra == EOF) return 0;
            snprintf(err, errlen, "the NCCL id file '%s' has the wrong size (%zu bytes, expected %zu)\n"
                     "  hint: delete stale id files before launching; each run needs a fresh one", path,
                     got + (extra != EOF), nbytes);
            return -1;
        }
        clock_gettime(CLOCK_MONOTONIC, &now);
        double waited = (double)(now.tv_sec - start.tv_sec) + 1e-9 * (double)(now.tv_nsec - start.tv_nsec);
        if (waited > timeout_s) {
            snprintf(err, errlen, "waited %.0f s for rank 0 to write the NCCL id file '%s'\n"
                     "  hint: is rank 0 running, and is the path shared between the nodes?", waited, path);
            return -1;
        }
        nanosleep(&nap, NULL);
    }
}

uint64_t dist_digest(const void* data, size_t nbytes, uint64_t seed) {
    const unsigned char* p = (const unsigned char*)data;
    uint64_t h = 14695981039346656037ULL ^ seed;
    for (size_t i = 0; i < nbytes; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}
