/*
 * common/atomic_file.h - write a file so that it is either complete or absent.
 *
 * Why: checkpoints, resume states, token shards, attention captures and the
 * NCCL id file must never be left half-written under their real name (a full
 * disk, a file-size limit or a crash mid-write would otherwise destroy the
 * previous good file or hand a reader garbage). The recipe is always the same
 * - write "<path>.tmp", fflush, fsync, close, rename over <path>, fsync the
 * folder; on any failure remove the tmp and leave <path> as it was - and this
 * is its one implementation.
 *
 * Offers: AtomicFile, atomic_file_open (tmp "<path>.tmp"),
 * atomic_file_open_unique (tmp "<path>.tmp.<pid>", for files several
 * processes may race to publish), atomic_file_commit, atomic_file_abort.
 * Messages name the file and the failed step; errno is kept for callers that
 * word their own message. Plain C; usable from .c and .cu files.
 */
#ifndef COMMON_ATOMIC_FILE_H
#define COMMON_ATOMIC_FILE_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    FILE* fp;        /* open for writing ("wb", seekable) between open and commit/abort */
    char* path;      /* the final name */
    char* tmp_path;  /* where the bytes go until commit */
} AtomicFile;

/* Creates the tmp file and returns its FILE* (also af->fp), or NULL with
   "cannot create '<tmp>': <reason>" in err (errno kept). On NULL nothing needs
   to be cleaned up. */
FILE* atomic_file_open(AtomicFile* af, const char* path, char* err, size_t errlen);
FILE* atomic_file_open_unique(AtomicFile* af, const char* path, char* err, size_t errlen);

/* Finishes the file: fflush, fsync, close, rename the tmp over af->path, fsync
   the folder (best effort). 0, or -1 with a message naming the file and the
   failed step (errno kept); on -1 the tmp is removed and any previous file at
   af->path is untouched. Either way af is released. A write error the caller
   did not check (ferror on the stream) also fails the commit. */
int atomic_file_commit(AtomicFile* af, char* err, size_t errlen);

/* Gives up: closes and removes the tmp, releases af; the previous file at
   af->path is untouched. Safe on an AtomicFile whose open failed. */
void atomic_file_abort(AtomicFile* af);

#ifdef __cplusplus
}
#endif

#endif /* COMMON_ATOMIC_FILE_H */
