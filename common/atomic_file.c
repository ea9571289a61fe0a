/*
 * common/atomic_file.c - tmp + fsync + rename writes (see atomic_file.h).
 */
#include "common/atomic_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void release(AtomicFile* af) {
    free(af->path);
    free(af->tmp_path);
    af->fp = NULL;
    af->path = NULL;
    af->tmp_path = NULL;
}

static FILE* open_with_suffix(AtomicFile* af, const char* path, const char* suffix, char* err, size_t errlen) {
    memset(af, 0, sizeof(*af));
    size_t tmp_len = strlen(path) + strlen(suffix) + 1;
    af->path = strdup(path);
    af->tmp_path = (char*)malloc(tmp_len);
    if (af->path == NULL || af->tmp_path == NULL) {
        snprintf(err, errlen, "cannot create '%s%s': out of memory", path, suffix);
        release(af);
        errno = ENOMEM;
        return NULL;
    }
    snprintf(af->tmp_path, tmp_len, "%s%s", path, suffix);
    af->fp = fopen(af->tmp_path, "wb");
    if (af->fp == NULL) {
        int saved = errno;
        snprintf(err, errlen, "cannot create '%s': %s", af->tmp_path, strerror(saved));
        release(af);
        errno = saved;
        return NULL;
    }
    return af->fp;
}

FILE* atomic_file_open(AtomicFile* af, const char* path, char* err, size_t errlen) {
    return open_with_suffix(af, path, ".tmp", err, errlen);
}

FILE* atomic_file_open_unique(AtomicFile* af, const char* path, char* err, size_t errlen) {
    char suffix[32];
    snprintf(suffix, sizeof(suffix), ".tmp.%ld", (long)getpid());
    return open_with_suffix(af, path, suffix, err, errlen);
}

/* fsync the folder holding path, so the rename itself survives a crash.
   Best effort: some file systems refuse to open or sync a directory. */
static void sync_parent_folder(const char* path) {
    char* dir = strdup(path);
    if (dir == NULL) return;
    char* slash = strrchr(dir, '/');
    const char* d = ".";
    if (slash == dir) d = "/";
    else if (slash != NULL) { *slash = '\0'; d = dir; }
    int dfd = open(d, O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    free(dir);
}

int atomic_file_commit(AtomicFile* af, char* err, size_t errlen) {
    if (af->fp == NULL) {
        snprintf(err, errlen, "'%s': nothing to commit (the file was never opened)", af->path ? af->path : "?");
        release(af);
        errno = EBADF;
        return -1;
    }
    const char* step = NULL;
    int saved = 0;
    if (ferror(af->fp)) { step = "writing"; saved = errno ? errno : EIO; }
    else if (fflush(af->fp) != 0) { step = "writing"; saved = errno; }
    else if (fsync(fileno(af->fp)) != 0) { step = "syncing"; saved = errno; }
    if (fclose(af->fp) != 0 && step == NULL) { step = "closing"; saved = errno; }
    af->fp = NULL;
    if (step != NULL) {
        snprintf(err, errlen, "%s '%s' failed: %s", step, af->tmp_path, strerror(saved));
    } else if (rename(af->tmp_path, af->path) != 0) {
        saved = errno;
        snprintf(err, errlen, "cannot rename '%s' to '%s': %s", af->tmp_path, af->path, strerror(saved));
        step = "renaming";
    }
    if (step != NULL) {
        remove(af->tmp_path);
        release(af);
        errno = saved;
        return -1;
    }
    sync_parent_folder(af->path);
    release(af);
    return 0;
}

void atomic_file_abort(AtomicFile* af) {
    int saved = errno;
    if (af->fp != NULL) fclose(af->fp);
    if (af->tmp_path != NULL) remove(af->tmp_path);
    release(af);
    errno = saved;
}
