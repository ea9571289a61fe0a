/*
 * train/dist_nompi.c - stands in for dist_mpi.c in builds without MPI: every
 * call fails with a message that says how to launch instead.
 */
#include "train/dist.h"

#include <stdio.h>

int dist_mpi_available(void) { return 0; }

static int no_mpi(char* err, size_t errlen) {
    snprintf(err, errlen, "this build has no MPI, so it cannot be started by mpirun\n"
             "  hint: install OpenMPI's development files (Debian: libopenmpi-dev) and rebuild, or launch\n"
             "        with RANK, WORLD_SIZE, LOCAL_RANK and --nccl-id-file instead (docs/multi_gpu.md)");
    return -1;
}
int dist_mpi_init(char* err, size_t errlen) { return no_mpi(err, errlen); }
int dist_mpi_broadcast(void* data, size_t nbytes, char* err, size_t errlen) { return no_mpi(err, errlen); }
int dist_mpi_allgather(const void* in, void* out, size_t nbytes, char* err, size_t errlen) {
    return no_mpi(err, errlen);
}
void dist_mpi_finalize(void) {}
void dist_mpi_abort(int code) {}
