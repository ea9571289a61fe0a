/*
 * tests/test_atomic_file.c - common/atomic_file: complete-or-absent writes.
 *
 * Checks: a commit puts exactly the written bytes under the real name and
 * leaves no tmp; overwriting works; a write that fails midway (file-size
 * limit via RLIMIT_FSIZE, SIGXFSZ ignored so write() returns EFBIG) leaves the
 * previous file byte-identical and no tmp behind, with a message naming the
 * file; abort leaves the previous file alone; an unwritable folder gives a
 * message naming the path; the unique variant's tmp carries the pid.
 * Generates its own files in a mkdtemp folder.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/atomic_file.h"
#include "common/utils.h"
#include "tests/testing.h"

static char g_dir[] = "/tmp/test_atomic_file_XXXXXX";

static int exists(const char* p) { return access(p, F_OK) == 0; }

/* Reads the whole file into a malloc'ed buffer; *n its size. NULL if missing. */
static unsigned char* slurp(const char* path, size_t* n) {
    FILE* fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long size = ftell(fp);
    rewind(fp);
    unsigned char* buf = (unsigned char*)mallocCheck((size_t)size + 1);
    *n = fread(buf, 1, (size_t)size, fp);
    fclose(fp);
    return buf;
}

static int file_equals(const char* path, const void* want, size_t n) {
    size_t got_n = 0;
    unsigned char* got = slurp(path, &got_n);
    int same = got != NULL && got_n == n && memcmp(got, want, n) == 0;
    free(got);
    return same;
}

/* Writes n bytes of pattern seed through an AtomicFile; returns commit's result. */
static int write_pattern(const char* path, size_t n, unsigned seed, char* err, size_t errlen) {
    AtomicFile af;
    FILE* fp = atomic_file_open(&af, path, err, errlen);
    if (!fp) return -1;
    unsigned char* buf = (unsigned char*)mallocCheck(n);
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)(i * 31u + seed);
    if (fwrite(buf, 1, n, fp) != n) {
        snprintf(err, errlen, "fwrite failed: %s", strerror(errno));
        atomic_file_abort(&af);
        free(buf);
        return -1;
    }
    free(buf);
    return atomic_file_commit(&af, err, errlen);
}

int main(void) {
    if (!mkdtemp(g_dir)) die("cannot create a temporary folder under /tmp: %s", strerror(errno));
    char path[512], tmp[600], err[1024];
    snprintf(path, sizeof path, "%s/out.bin", g_dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);

    test_section("commit");
    const size_t n_old = 5000;
    unsigned char* want = (unsigned char*)mallocCheck(n_old);
    for (size_t i = 0; i < n_old; i++) want[i] = (unsigned char)(i * 31u + 7u);
    CHECK(write_pattern(path, n_old, 7u, err, sizeof err) == 0, "first commit succeeds (%s)", err);
    CHECK(file_equals(path, want, n_old), "the file holds exactly the written bytes");
    CHECK(!exists(tmp), "no .tmp left after a commit");
    unsigned char* want2 = (unsigned char*)mallocCheck(100);
    for (size_t i = 0; i < 100; i++) want2[i] = (unsigned char)(i * 31u + 9u);
    CHECK(write_pattern(path, 100, 9u, err, sizeof err) == 0 && file_equals(path, want2, 100),
          "a second commit replaces the file (shorter content, no stale tail)");
    CHECK(write_pattern(path, n_old, 7u, err, sizeof err) == 0 && file_equals(path, want, n_old),
          "and back to the first content");

    test_section("abort");
    {
        AtomicFile af;
        FILE* fp = atomic_file_open(&af, path, err, sizeof err);
        CHECK(fp != NULL && exists(tmp), "open creates the .tmp");
        if (fp) fputs("garbage", fp);
        atomic_file_abort(&af);
        CHECK(!exists(tmp) && file_equals(path, want, n_old), "abort removes the .tmp, the file is unchanged");
    }

    test_section("failed write (file-size limit)");
    {
        /* 64 KiB limit, 1 MiB write: write() fails with EFBIG instead of killing us (SIGXFSZ ignored). */
        struct rlimit old_limit, small = {65536, 65536};
        CHECK(getrlimit(RLIMIT_FSIZE, &old_limit) == 0, "read the file-size limit");
        signal(SIGXFSZ, SIG_IGN);
        small.rlim_max = old_limit.rlim_max;
        CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0, "lower the file-size limit to 64 KiB");
        int rc = write_pattern(path, 1 << 20, 3u, err, sizeof err);
        setrlimit(RLIMIT_FSIZE, &old_limit);
        CHECK(rc == -1, "the oversized write is reported as a failure (%s)", err);
        CHECK(file_equals(path, want, n_old), "the previous file is byte-identical");
        CHECK(!exists(tmp), "no .tmp left behind");

        /* The same through commit alone: bytes still buffered when the limit bites fail at the flush. */
        CHECK(setrlimit(RLIMIT_FSIZE, &small) == 0, "lower the limit again");
        AtomicFile af;
        FILE* fp = atomic_file_open(&af, path, err, sizeof err);
        int commit_rc = 0;
        if (fp) {
            static unsigned char block[200000];
            setvbuf(fp, NULL, _IOFBF, sizeof block + 1);
            memset(block, 0xAB, sizeof block);
            (void)fwrite(block, 1, sizeof block, fp); /* may fail or stay buffered: commit must notice either way */
            commit_rc = atomic_file_commit(&af, err, sizeof err);
        }
        setrlimit(RLIMIT_FSIZE, &old_limit);
        CHECK(fp != NULL && commit_rc == -1 && strstr(err, tmp) != NULL,
              "commit of an over-limit file fails naming the file: %s", err);
        CHECK(file_equals(path, want, n_old) && !exists(tmp), "previous file unchanged, no .tmp");
    }

    test_section("unwritable folder");
    {
        char bad[600];
        snprintf(bad, sizeof bad, "%s/no-such-folder/out.bin", g_dir);
        AtomicFile af;
        CHECK(atomic_file_open(&af, bad, err, sizeof err) == NULL && errno == ENOENT && strstr(err, bad) != NULL,
              "open in a missing folder fails naming the path: %s", err);
        char ro[600], in_ro[700];
        snprintf(ro, sizeof ro, "%s/readonly", g_dir);
        CHECK(mkdir(ro, 0555) == 0, "make a read-only folder");
        snprintf(in_ro, sizeof in_ro, "%s/out.bin", ro);
        if (geteuid() != 0) {
            CHECK(atomic_file_open(&af, in_ro, err, sizeof err) == NULL && strstr(err, in_ro) != NULL,
                  "open in a read-only folder fails naming the path: %s", err);
        } else {
            printf("  (running as root: the read-only folder check is skipped, root may write anywhere)\n");
        }
        rmdir(ro);
    }

    test_section("rename blocked");
    {
        /* the final name is a non-empty folder: rename fails, the tmp is removed */
        char blocked[600], inner[700], btmp[700];
        snprintf(blocked, sizeof blocked, "%s/blocked", g_dir);
        snprintf(inner, sizeof inner, "%s/keep", blocked);
        snprintf(btmp, sizeof btmp, "%s.tmp", blocked);
        CHECK(mkdir(blocked, 0755) == 0 && mkdir(inner, 0755) == 0, "make a folder at the target name");
        CHECK(write_pattern(blocked, 10, 1u, err, sizeof err) == -1 && strstr(err, "rename") != NULL &&
              strstr(err, blocked) != NULL, "commit onto a folder fails at the rename: %s", err);
        CHECK(!exists(btmp) && exists(inner), "its .tmp is removed and the folder untouched");
        rmdir(inner);
        rmdir(blocked);
    }

    test_section("unique tmp name");
    {
        AtomicFile af;
        char want_tmp[700];
        snprintf(want_tmp, sizeof want_tmp, "%s.tmp.%ld", path, (long)getpid());
        FILE* fp = atomic_file_open_unique(&af, path, err, sizeof err);
        CHECK(fp != NULL && strcmp(af.tmp_path, want_tmp) == 0 && exists(want_tmp), "tmp is PATH.tmp.<pid>");
        if (fp) fwrite(want2, 1, 100, fp);
        CHECK(fp != NULL && atomic_file_commit(&af, err, sizeof err) == 0 && file_equals(path, want2, 100) &&
              !exists(want_tmp), "and commits like the plain one");
    }

    free(want);
    free(want2);
    remove(path);
    rmdir(g_dir);
    return test_summary();
}
