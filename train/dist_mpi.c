/*
 * train/dist_mpi.c - the MPI side of the start-up handshake (see dist.h):
 * MPI carries only the NCCL id and the ranks' agreement digests; all tensor
 * traffic goes through NCCL. Linked when the Makefile finds MPI; otherwise
 * dist_nompi.c takes its place.
 */
#include "train/dist.h"

#include <mpi.h>
#include <stdio.h>

int dist_mpi_available(void) { return 1; }

static int mpi_fail(int rc, const char* what, char* err, size_t errlen) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    snprintf(err, errlen, "MPI %s failed: %s", what, msg);
    return -1;
}

int dist_mpi_init(char* err, size_t errlen) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (inited) return 0;
    int rc = MPI_Init(NULL, NULL);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "init", err, errlen);
}

int dist_mpi_broadcast(void* data, size_t nbytes, char* err, size_t errlen) {
    int rc = MPI_Bcast(data, (int)nbytes, MPI_BYTE, 0, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "broadcast", err, errlen);
}

int dist_mpi_allgather(const void* in, void* out, size_t nbytes, char* err, size_t errlen) {
    int rc = MPI_Allgather(in, (int)nbytes, MPI_BYTE, out, (int)nbytes, MPI_BYTE, MPI_COMM_WORLD);
    return rc == MPI_SUCCESS ? 0 : mpi_fail(rc, "allgather", err, errlen);
}

void dist_mpi_abort(int code) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Abort(MPI_COMM_WORLD, code);
}

void dist_mpi_finalize(void) {
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (inited && !finalized) MPI_Finalize();
}
