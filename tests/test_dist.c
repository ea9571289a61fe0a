/*
 * tests/test_dist.c - CPU tests of the multi-GPU arithmetic (train/dist.c):
 * ZeRO-1 shards tile the parameter buffer exactly, gradient accumulation
 * divides or fails clearly, launcher detection reads each launcher's
 * variables and rejects bad ones, NVLS stays off, and the NCCL id file
 * exchange works across processes and times out with a message.
 */
#include "train/dist.h"
#include "tests/testing.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void test_zero_shards(void) {
    test_section("ZeRO-1 shards cover every parameter exactly once");
    const size_t totals[] = {1, 7, 128, 1000, 124475904, 459233280 + 17};
    const int worlds[] = {1, 2, 3, 4, 8};
    const size_t aligns[] = {1, 8, 128};
    for (size_t ti = 0; ti < sizeof(totals) / sizeof(totals[0]); ti++)
        for (size_t wi = 0; wi < sizeof(worlds) / sizeof(worlds[0]); wi++)
            for (size_t ai = 0; ai < sizeof(aligns) / sizeof(aligns[0]); ai++) {
                size_t total = totals[ti], align = aligns[ai];
                int world = worlds[wi];
                size_t next = 0, valid_sum = 0;
                int ok = 1;
                ZeroShard z0 = zero_shard(total, world, 0, align);
                for (int r = 0; r < world; r++) {
                    ZeroShard z = zero_shard(total, world, r, align);
                    ok &= z.offset == next;                      /* contiguous, in rank order */
                    ok &= z.shard_size == z0.shard_size;         /* equal sizes for NCCL */
                    ok &= z.shard_size % align == 0;
                    ok &= z.valid <= z.shard_size;
                    ok &= (z.valid == z.shard_size) || (z.offset + z.valid == total) || z.valid == 0;
                    next += z.shard_size;
                    valid_sum += z.valid;
                }
                ok &= next == z0.padded_total;
                ok &= z0.padded_total >= total && z0.padded_total - total < (size_t)world * align;
                ok &= z0.padded_total % ((size_t)world * align) == 0;
                ok &= valid_sum == total;
                CHECK(ok, "total %zu world %d align %zu: shards of %zu tile [0, %zu)", total, world, align,
                      z0.shard_size, z0.padded_total);
            }
    ZeroShard z = zero_shard(10, 4, 3, 1); /* padded 12, shards of 3: rank 3 owns [9,12) with 1 valid */
    CHECK(z.padded_total == 12 && z.shard_size == 3 && z.offset == 9 && z.valid == 1,
          "total 10 world 4: rank 3 owns offset 9, 1 valid (got %zu %zu %zu %zu)", z.padded_total,
          z.shard_size, z.offset, z.valid);
}

static void test_grad_accum(void) {
    test_section("gradient accumulation arithmetic");
    char err[512];
    CHECK(dist_grad_accum_steps(524288, 32, 1024, 1, err, sizeof err) == 16, "0.5M tokens at B32 T1024 x1 -> 16");
    CHECK(dist_grad_accum_steps(524288, 16, 1024, 8, err, sizeof err) == 4, "0.5M tokens at B16 T1024 x8 -> 4");
    CHECK(dist_grad_accum_steps(1000, 4, 64, 1, err, sizeof err) == -1 && strstr(err, "multiple of 256"),
          "1000 tokens at B4 T64 rejected with a hint: %s", err);
    CHECK(dist_grad_accum_steps(0, 4, 64, 1, err, sizeof err) == -1, "zero total batch rejected");
}

static void clear_launch_env(void) {
    const char* vars[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                          "RANK", "WORLD_SIZE", "LOCAL_RANK"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) unsetenv(vars[i]);
}

static void test_detect(void) {
    test_section("launcher detection");
    char err[512];
    DistInfo d;
    clear_launch_env();
    setenv("NCCL_NVLS_ENABLE", "1", 1);
    CHECK(dist_detect(&d, err, sizeof err) == 0 && d.launch == LAUNCH_SINGLE && d.rank == 0 &&
          d.world_size == 1, "no launcher variables: single process rank 0 of 1");
    CHECK(strcmp(getenv("NCCL_NVLS_ENABLE"), "0") == 0, "NCCL_NVLS_ENABLE forced to 0");

    setenv("RANK", "2", 1); setenv("WORLD_SIZE", "4", 1); setenv("LOCAL_RANK", "1", 1);
    CHECK(dist_detect(&d, err, sizeof err) == 0 && d.launch == LAUNCH_ENV && d.rank == 2 &&
          d.world_size == 4 && d.local_rank == 1, "env launch: rank 2 of 4, local 1");
    setenv("OMPI_COMM_WORLD_RANK", "3", 1); setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
    CHECK(dist_detect(&d, err, sizeof err) == 0 && d.launch == LAUNCH_MPI && d.rank == 3 &&
          d.world_size == 8 && d.local_rank == 3, "mpirun variables take precedence");
    clear_launch_env();
    setenv("RANK", "4", 1); setenv("WORLD_SIZE", "4", 1);
    CHECK(dist_detect(&d, err, sizeof err) == -1 && strstr(err, "must be smaller"), "rank >= world rejected: %s", err);
    setenv("RANK", "x", 1);
    CHECK(dist_detect(&d, err, sizeof err) == -1 && strstr(err, "RANK"), "non-numeric RANK rejected: %s", err);
    clear_launch_env();
    setenv("RANK", "0", 1);
    CHECK(dist_detect(&d, err, sizeof err) == -1 && strstr(err, "WORLD_SIZE"), "RANK without WORLD_SIZE rejected");
    clear_launch_env();
}

static void test_id_file(void) {
    test_section("NCCL id file exchange (env-var launch)");
    char path[256], err[512];
    snprintf(path, sizeof path, "/tmp/test_dist_id_%d", (int)getpid());
    remove(path);
    unsigned char id[128], got[128];
    for (int i = 0; i < 128; i++) id[i] = (unsigned char)(i * 37 + 11);
    pid_t child = fork();
    if (child == 0) {  /* "rank 0": publishes after a short delay */
        usleep(200 * 1000);
        _exit(dist_id_file_publish(path, id, sizeof id, err, sizeof err) == 0 ? 0 : 1);
    }
    memset(got, 0, sizeof got);
    int rc = dist_id_file_wait(path, got, sizeof got, 10.0, err, sizeof err);
    int status = 0;
    waitpid(child, &status, 0);
    CHECK(rc == 0 && memcmp(id, got, sizeof id) == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "a waiting rank receives the id another process publishes");
    CHECK(dist_id_file_wait(path, got, 64, 1.0, err, sizeof err) == -1 && strstr(err, "wrong size"),
          "an id file of the wrong size is refused: %s", err);
    remove(path);
    CHECK(dist_id_file_wait(path, got, sizeof got, 0.2, err, sizeof err) == -1 && strstr(err, "waited"),
          "a missing id file times out with a message: %s", err);
    CHECK(dist_id_file_publish("/nonexistent-dir/id", id, sizeof id, err, sizeof err) == -1 &&
          strstr(err, "cannot write"), "an unwritable id path is refused: %s", err);
}

static void test_digest(void) {
    test_section("agreement digest");
    const char a[] = "d12 B32 T1024 gproj", b[] = "d12 B32 T1024 bf16 ";
    CHECK(dist_digest(a, sizeof a, 0) == dist_digest(a, sizeof a, 0), "digest is deterministic");
    CHECK(dist_digest(a, sizeof a, 0) != dist_digest(b, sizeof b, 0), "different configs differ");
    CHECK(dist_digest("", 0, 0) == 14695981039346656037ULL, "FNV-1a offset basis for empty input");
    CHECK(dist_digest("a", 1, 0) == 0xaf63dc4c8601ec8cULL, "FNV-1a of 'a' matches the published value");
}

int main(void) {
    test_zero_shards();
    test_grad_accum();
    test_detect();
    test_id_file();
    test_digest();
    return test_summary();
}
