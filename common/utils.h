/*
 * common/utils.h - fail-loudly wrappers shared by every host-side module.
 *
 * Why: a training run that dies should say where and why in one line, with a
 * hint for the user, instead of a bare errno or a crash later on. Every file
 * open, allocation, read and write in the project goes through these checks
 * (the llm.c habit), so callers never test return codes by hand.
 *
 * Offers: fopenCheck, freadCheck, fwriteCheck, fseekCheck, fcloseCheck,
 * mallocCheck, callocCheck, die (printf-style fatal error with file:line),
 * and fopen_sized (open for reading with the file's size, or an error
 * message for a reader that reports instead of dying).
 * Plain C99, header-only; usable from .c and .cu files alike.
 */
#ifndef COMMON_UTILS_H
#define COMMON_UTILS_H

#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>

/* Print "error: <message>" with the source location and exit(1). */
static inline void die_at(const char* file, int line, const char* fmt, ...) {
    va_list ap;
    fflush(stdout);
    fprintf(stderr, "error: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n  (at %s:%d)\n", file, line);
    exit(EXIT_FAILURE);
}
#define die(...) die_at(__FILE__, __LINE__, __VA_ARGS__)

static inline FILE* fopen_check(const char* path, const char* mode, const char* file, int line) {
    FILE* fp = fopen(path, mode);
    if (fp == NULL) {
        die_at(file, line, "cannot open '%s' (mode %s): %s\n"
               "  hint: check that the path exists and is %s", path, mode, strerror(errno),
               (mode[0] == 'r') ? "readable" : "writable (and that its folder exists)");
    }
    return fp;
}
#define fopenCheck(path, mode) fopen_check(path, mode, __FILE__, __LINE__)

/* Opens path for reading and sets *size to its length in bytes; NULL with
   "cannot open|stat WHAT 'PATH': reason" in err when that fails (what names
   the kind of file, e.g. "checkpoint"). */
static inline FILE* fopen_sized(const char* path, const char* what, uint64_t* size, char* err, size_t errlen) {
    FILE* fp = fopen(path, "rb");
    if (fp == NULL) {
        snprintf(err, errlen, "cannot open %s '%s': %s", what, path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fileno(fp), &st) != 0) {
        snprintf(err, errlen, "cannot stat %s '%s': %s", what, path, strerror(errno));
        fclose(fp);
        return NULL;
    }
    if (S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s '%s' is a folder, not a file", what, path);
        fclose(fp);
        return NULL;
    }
    *size = (uint64_t)st.st_size;
    return fp;
}

static inline void fread_check(void* ptr, size_t size, size_t nmemb, FILE* fp, const char* what,
                               const char* file, int line) {
    size_t got = fread(ptr, size, nmemb, fp);
    if (got != nmemb) {
        die_at(file, line, "short read of %s: wanted %zu items of %zu bytes, got %zu (%s)\n"
               "  hint: the file is truncated or corrupt; re-create it",
               what, nmemb, size, got, feof(fp) ? "end of file" : strerror(errno));
    }
}
#define freadCheck(ptr, size, nmemb, fp, what) fread_check(ptr, size, nmemb, fp, what, __FILE__, __LINE__)

static inline void fwrite_check(const void* ptr, size_t size, size_t nmemb, FILE* fp, const char* what,
                                const char* file, int line) {
    size_t put = fwrite(ptr, size, nmemb, fp);
    if (put != nmemb) {
        die_at(file, line, "short write of %s: wanted %zu items of %zu bytes, wrote %zu (%s)\n"
               "  hint: is the disk full?", what, nmemb, size, put, strerror(errno));
    }
}
#define fwriteCheck(ptr, size, nmemb, fp, what) fwrite_check(ptr, size, nmemb, fp, what, __FILE__, __LINE__)

/* 64-bit seek: shards and checkpoints may exceed 2 GiB. */
static inline void fseek_check(FILE* fp, int64_t offset, int whence, const char* file, int line) {
    if (fseeko(fp, (off_t)offset, whence) != 0) {
        die_at(file, line, "seek to offset %lld failed: %s", (long long)offset, strerror(errno));
    }
}
#define fseekCheck(fp, off, whence) fseek_check(fp, off, whence, __FILE__, __LINE__)

static inline void fclose_check(FILE* fp, const char* file, int line) {
    if (fclose(fp) != 0) {
        die_at(file, line, "closing a file failed: %s\n  hint: is the disk full?", strerror(errno));
    }
}
#define fcloseCheck(fp) fclose_check(fp, __FILE__, __LINE__)

static inline void* malloc_check(size_t size, const char* file, int line) {
    void* p = malloc(size ? size : 1);
    if (p == NULL) {
        die_at(file, line, "out of host memory allocating %zu bytes (%.2f GiB)\n"
               "  hint: lower the batch size, sequence length or model size", size,
               (double)size / (1024.0 * 1024.0 * 1024.0));
    }
    return p;
}
#define mallocCheck(size) malloc_check(size, __FILE__, __LINE__)

static inline void* calloc_check(size_t n, size_t size, const char* file, int line) {
    void* p = calloc(n ? n : 1, size ? size : 1);
    if (p == NULL) {
        die_at(file, line, "out of host memory allocating %zu x %zu bytes\n"
               "  hint: lower the batch size, sequence length or model size", n, size);
    }
    return p;
}
#define callocCheck(n, size) calloc_check(n, size, __FILE__, __LINE__)

#endif /* COMMON_UTILS_H */
