/*
 * tests/test_gpu_host.cu - the host-side logic of the GPU model, checked on
 * the CPU (no GPU needed; compiled with nvcc because it includes the model's
 * CUDA headers, and registered only where nvcc exists).
 *
 * Why: pieces of the model's and the attention module's CUDA code decide
 * things before any kernel runs and can be wrong without a GPU ever noticing:
 * the token bucketing that makes the embedding backward deterministic (a
 * wrong bucket = a silently wrong wte gradient), the memory plan that the
 * trainer compares with free GPU memory (a wrong plan = an out-of-memory
 * crash mid-run or a refused run that would fit), the message the user gets
 * when it does not fit, the attention calls' refusals of bad pointers, the
 * deterministic attention backward's workspace size and its refusal, and the
 * activation table of the architecture options (a GPT-2 configuration must
 * keep GPT-2's sizes; a modern one must size fch, the scratch and the new
 * entries for its options) with the GPU model's refusals of shapes its
 * kernels cannot take, and the Hopper passes' launch switches and their
 * grid over work items (a typo in a switch must stop the program, not time
 * the wrong launch).
 * References here are brute force or written from the buffer list by hand.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <algorithm>
#include <vector>

#include "tests/testing.h"
#include "model/gpt_cuda.cuh"
#include "attention/attention_cuda.cuh"
#include "attention/cuda/hopper/hopper_host.cuh"

static uint64_t g_state = 88172645463325252ull;
static int rand_below(int n) {
    g_state ^= g_state << 13; g_state ^= g_state >> 7; g_state ^= g_state << 17;
    return (int)(g_state % (uint64_t)n);
}

static void test_bucket_sort(int BT, int vocab, int distinct) {
    char name[96];
    snprintf(name, sizeof(name), "encoder bucket sort: %d positions, ids below %d", BT, distinct);
    test_section(name);
    std::vector<int> tokens(BT), out(3 * BT + 2), count(vocab);
    for (int i = 0; i < BT; i++) tokens[i] = rand_below(distinct);
    const int num = encoder_buckets_sort(out.data(), tokens.data(), BT, vocab, count.data());
    const int* start = out.data();
    const int* token = out.data() + num + 1;
    const int* pos = out.data() + 2 * num + 1;
    /* brute force: the distinct ids in order, each with its positions in order */
    std::vector<int> want_tokens;
    for (int t = 0; t < vocab; t++)
        for (int i = 0; i < BT; i++)
            if (tokens[i] == t) { want_tokens.push_back(t); break; }
    CHECK(num == (int)want_tokens.size(), "bucket count %d == distinct ids %zu", num, want_tokens.size());
    int ok = start[0] == 0 && start[num] == BT;
    for (int k = 0; k < num && ok; k++) {
        if (token[k] != want_tokens[k]) ok = 0;
        int p = start[k];
        for (int i = 0; i < BT && ok; i++)
            if (tokens[i] == token[k]) {
                if (p >= start[k + 1] || pos[p] != i) ok = 0;
                p++;
            }
        if (p != start[k + 1]) ok = 0;
    }
    CHECK(ok, "every bucket lists exactly its token's positions, ascending, buckets in token order");
}

static void test_memory_plan(const char* model, int B, int T) {
    char name[96], err[256];
    snprintf(name, sizeof(name), "memory plan %s B%d T%d", model, B, T);
    test_section(name);
    GPTConfig cfg;
    CHECK(gpt_config_from_descriptor(model, &cfg, err, sizeof(err)) == 0, "preset %s exists", model);
    const size_t P = gpt_num_parameters(&cfg);
    const size_t N = (size_t)B * T, C = cfg.channels, L = cfg.num_layers, Vp = cfg.padded_vocab_size;
    GpuMemoryPlan plan[3];
    for (int r = 0; r < 3; r++) plan[r] = gpt_cuda_memory_plan(&cfg, B, T, r);
    CHECK(plan[0].params_bytes == 4 * P, "params + grads = 2 x 2 bytes per parameter");
    CHECK(plan[0].optimizer_bytes == 12 * P, "master + m + v = 3 x 4 bytes per parameter");
    /* BF16 activations by hand: encoded, ln1, qkv, atty, residual2, ln2, fch, fch_gelu, residual3, lnf,
       logits, proj_out, dresidual, dbuf_c, dbuf_4c (each rounded up to 8 elements; all are multiples here) */
    const size_t acts0 = N * C * (1 + L + 3 * L + L + L + L + 4 * L + 4 * L + L + 1 + 1 + 1 + 1 + 4) + N * Vp;
    CHECK(plan[0].acts_bytes == 2 * acts0, "recompute 0: BF16 activations %zu == hand count %zu", plan[0].acts_bytes,
          2 * acts0);
    CHECK(plan[0].acts_bytes - plan[1].acts_bytes == 2 * (L - 1) * N * 4 * C,
          "recompute 1 keeps one fch_gelu buffer instead of L");
    CHECK(plan[1].acts_bytes - plan[2].acts_bytes == 2 * 2 * (L - 1) * N * C,
          "recompute 2 also keeps one ln1 and one ln2 buffer instead of L");
    GpuActTable t;
    gpu_act_table(&cfg, B, T, 1, &t);
    int aligned = 1, disjoint = 1;
    for (int i = 0; i < NUM_GPU_ACTS; i++) {
        if (t.offset[i] % 8) aligned = 0;
        if (i + 1 < NUM_GPU_ACTS && t.offset[i] + t.count[i] > t.offset[i + 1]) disjoint = 0;
    }
    CHECK(aligned && disjoint, "activation offsets are 16-byte aligned and tensors do not overlap");
    CHECK(t.count[GA_LOGITS] == N * Vp, "logits hold N x padded vocab");
    CHECK(t.stat_count[GS_ATT_STATS] == L * (size_t)B * cfg.num_heads * T * 2,
          "attention stats: 2 floats per (layer, batch, head, row)");
}

static void test_memory_check(void) {
    test_section("out-of-memory check before the first step");
    GPTConfig cfg;
    char err[256], msg[1024];
    gpt_config_from_descriptor("d12", &cfg, err, sizeof(err));
    const GpuMemoryPlan plan = gpt_cuda_memory_plan(&cfg, 32, 1024, 1);
    CHECK(gpt_cuda_memory_check(&plan, plan.total_bytes + GPU_MEMORY_HEADROOM_BYTES, 32, 1024, 1, "GPU", msg,
                                sizeof(msg)) == 0, "exactly enough memory is accepted");
    CHECK(gpt_cuda_memory_check(&plan, plan.total_bytes, 32, 1024, 1, "TestGPU", msg, sizeof(msg)) == 1,
          "less than plan + headroom is refused");
    CHECK(strstr(msg, "--batch-size (now 32") && strstr(msg, "--seq-len (now 1024") && strstr(msg, "--recompute") &&
              strstr(msg, "TestGPU"),
          "the message names the device and what to lower: %s", msg);
    const GpuMemoryPlan plan2 = gpt_cuda_memory_plan(&cfg, 32, 1024, 2);
    gpt_cuda_memory_check(&plan2, 1ull << 30, 32, 1024, 2, "TestGPU", msg, sizeof(msg));
    CHECK(strstr(msg, "--recompute") == NULL, "at --recompute 2 it does not suggest raising --recompute");
    CHECK(plan2.total_bytes < plan.total_bytes, "recompute 2 plans less memory than recompute 1");
}

/* test_run_captured for a lambda: fn runs in a child process with stderr captured into msg. */
template <typename Fn>
static int run_captured(Fn fn, char* msg, size_t cap) {
    return test_run_captured([](void* f) { (*(Fn*)f)(); }, &fn, msg, cap);
}

/* The activation and statistics tables of the architecture options against hand counts (N = B*T a
   multiple of 8, so no rounding). */
static void test_option_tables(const char* model, int qk_norm, int bias, int tie, int B, int T) {
    char name[160], err[256];
    snprintf(name, sizeof(name), "activation table %s qk-norm %d bias %d tie %d, B%d T%d", model, qk_norm, bias, tie,
             B, T);
    test_section(name);
    GPTConfig cfg;
    CHECK(gpt_config_from_descriptor(model, &cfg, err, sizeof(err)) == 0, "preset %s exists", model);
    cfg.qk_norm = qk_norm;
    cfg.bias = bias;
    cfg.tie_embeddings = tie;
    const size_t N = (size_t)B * T, C = cfg.channels, L = cfg.num_layers, Vp = cfg.padded_vocab_size;
    const size_t NH = cfg.num_heads, H = cfg.mlp_hidden, F = gpt_config_fc_rows(&cfg);
    const int swiglu = cfg.mlp == GPT_MLP_SWIGLU, rms = cfg.norm == GPT_NORM_RMSNORM;
    for (int r = 0; r < 3; r++) {
        GpuActTable t;
        gpu_act_table(&cfg, B, T, r, &t);
        const size_t ln_layers = r >= 2 ? 1 : L, act_layers = r >= 1 ? 1 : L;
        /* encoded, ln1, qkv, atty, residual2, ln2, residual3, lnf, proj_out, dresidual, dbuf_c; then fch,
           fch_gelu, logits, dbuf_4c, qkv_raw, dbuf_h */
        const size_t want = N * C * (1 + ln_layers + 3 * L + L + L + ln_layers + L + 1 + 1 + 1 + 1) + N * L * F +
                            N * act_layers * H + N * Vp + N * (F > 3 * C ? F : 3 * C) +
                            (qk_norm ? L * N * 3 * C : 0) + (swiglu ? N * H : 0);
        CHECK(t.total_acts == want, "recompute %d: BF16 activations %zu == hand count %zu", r, t.total_acts, want);
        CHECK(t.count[GA_FCH] == L * N * F && t.count[GA_FCH_GELU] == act_layers * N * H,
              "recompute %d: fch holds F = %zu columns, its activation H = %zu", r, F, H);
    }
    GpuActTable t;
    gpu_act_table(&cfg, B, T, 0, &t);
    CHECK(t.count[GA_QKV_RAW] == (qk_norm ? L * N * 3 * C : 0) &&
              t.stat_count[GS_QKNORM_RSTD] == (qk_norm ? L * N * 2 * NH : 0),
          "qkv_raw and the QK-norm rstd exist exactly with --qk-norm 1");
    CHECK(t.count[GA_DBUF_H] == (swiglu ? N * H : 0), "dbuf_h exists exactly with SwiGLU");
    CHECK(t.stat_count[GS_LN1_MEAN] == (rms ? 0 : L * N) && t.stat_count[GS_LNF_MEAN] == (rms ? 0 : N) &&
              t.stat_count[GS_LN1_RSTD] == L * N,
          "the norm means exist exactly with LayerNorm, the rstds always");
    /* the widest matmul bias summed on its own: 3C (qkvb), F (fcb) with biases; the norm backward's partials;
       then QK-norm's partials */
    size_t widest = 3 * C;
    if (bias && F > widest) widest = F;
    size_t scratch = colreduce_scratch_floats((long long)N, (long long)widest);
    if (rownorm_backward_scratch_floats((long long)N, (long long)C) > scratch)
        scratch = rownorm_backward_scratch_floats((long long)N, (long long)C);
    const size_t qk_scratch = qknorm_scratch_floats((long long)N, (int)NH, (int)(C / NH));
    if (qk_norm && qk_scratch > scratch) scratch = qk_scratch;
    CHECK(t.stat_count[GS_REDUCE_SCRATCH] == scratch, "column-sum scratch %zu == %zu (widest %zu columns)",
          t.stat_count[GS_REDUCE_SCRATCH], scratch, widest);
    int aligned = 1, disjoint = 1;
    for (int i = 0; i < NUM_GPU_ACTS; i++) {
        if (t.offset[i] % 8) aligned = 0;
        if (i + 1 < NUM_GPU_ACTS && t.offset[i] + t.count[i] > t.offset[i + 1]) disjoint = 0;
    }
    CHECK(aligned && disjoint, "activation offsets are 16-byte aligned and tensors do not overlap");
    const size_t rope = cfg.pos == GPT_POS_ROPE ? (size_t)cfg.max_seq_len * (C / NH / 2) * 8 : 0;
    const GpuMemoryPlan plan = gpt_cuda_memory_plan(&cfg, B, T, 0);
    CHECK(plan.workspace_bytes == attention_workspace_all_modes(&cfg, B, T, AttnOptions{}) + MATMUL_WORKSPACE_BYTES +
              rope, "the workspace holds the RoPE table (%zu bytes) and nothing else new", rope);
    CHECK(plan.params_bytes == 4 * gpt_num_parameters(&cfg), "params + grads cover the options' tensors");
}

/* GPT-2 presets keep the GPT-2 model's sizes: fch and fch_gelu 4C wide, dbuf_4c 4C, the column-sum scratch
   the larger of colreduce_scratch_floats(N, 4C) and the norm backward's, no RoPE table, the options' entries empty at the ends of the tables (so
   every other offset is where it was). */
static void test_gpt2_tables_unchanged(void) {
    test_section("GPT-2 presets: the activation table and workspace of the GPT-2 model");
    static const char* presets[] = {"tiny", "small", "d12", "d24", "450m"};
    char err[256];
    for (const char* name : presets) {
        GPTConfig cfg;
        gpt_config_from_descriptor(name, &cfg, err, sizeof(err));
        const int B = 2, T = 64;
        const size_t N = (size_t)B * T, C = cfg.channels, L = cfg.num_layers;
        GpuActTable t;
        gpu_act_table(&cfg, B, T, 0, &t);
        CHECK(t.count[GA_FCH] == L * N * 4 * C && t.count[GA_FCH_GELU] == L * N * 4 * C &&
                  t.count[GA_DBUF_4C] == N * 4 * C && t.count[GA_QKV_RAW] == 0 && t.count[GA_DBUF_H] == 0 &&
                  t.stat_count[GS_QKNORM_RSTD] == 0 && t.stat_count[GS_LN1_MEAN] == L * N &&
                  t.stat_count[GS_REDUCE_SCRATCH] == std::max(colreduce_scratch_floats((long long)N, 4 * (long long)C),
                                                              rownorm_backward_scratch_floats((long long)N,
                                                                                              (long long)C)) &&
                  t.offset[GA_QKV_RAW] == t.total_acts && t.stat_offset[GS_QKNORM_RSTD] == t.total_stats,
              "%s: GPT-2's sizes, and the options' entries empty at the ends of the tables", name);
        CHECK(gpu_rope_table_bytes(&cfg) == 0, "%s: no RoPE table", name);
    }
}

/* The GPU model's refusals of shapes its kernels cannot take, each naming the flag. */
static void test_option_refusals(void) {
    test_section("GPU model: refused option shapes name the flag");
    struct { const char* what; int C, NH, pos, qk, H; const char* want; } cases[] = {
        {"--mlp-hidden 100", 256, 4, GPT_POS_LEARNED, 0, 100, "--mlp-hidden 100 must be a multiple of 8"},
        {"rope with head size 8", 64, 8, GPT_POS_ROPE, 0, 256, "--pos rope needs a head size that is a multiple of 16"},
        {"qk-norm with head size 4", 64, 16, GPT_POS_LEARNED, 1, 256, "--qk-norm 1 needs a head size"},
    };
    char err[256], msg[1024];
    for (const auto& c : cases) {
        GPTConfig cfg;
        gpt_config_from_descriptor("tiny", &cfg, err, sizeof(err));
        cfg.channels = c.C; cfg.num_heads = c.NH; cfg.pos = c.pos; cfg.qk_norm = c.qk; cfg.mlp_hidden = c.H;
        const int status = run_captured([&] { gpt_cuda_check_options(&cfg); }, msg, sizeof msg);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1 && strstr(msg, c.want) != NULL,
              "%s: exits 1 naming the flag (got: %.200s)", c.what, msg);
    }
    GPTConfig ok;
    gpt_config_from_descriptor("llama-d12", &ok, err, sizeof(err));
    ok.qk_norm = 1;
    const int status = run_captured([&] { gpt_cuda_check_options(&ok); }, msg, sizeof msg);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "llama-d12 with --qk-norm 1 is accepted (status %d)", status);
}

/* The attention calls refuse a BF16 pointer off 16-byte alignment before touching the device (the kernels
   move 16-byte vectors; such a pointer would fault mid-kernel with "misaligned address"). Each call runs in a
   child process: it must exit 1 (die) with a message naming the call, the tensor and the fix. */
static void expect_alignment_refusal(int backward, int which, const char* name) {
    char label[128];
    snprintf(label, sizeof label, "%s with %s 2 bytes off 16-byte alignment",
             backward ? "attention_backward_cuda" : "attention_forward_cuda", name);
    char msg[1024];
    const int status = run_captured([&] {
        const AttnShape s = {1, 2, 8, 64};
        __nv_bfloat16* ptr[4]; /* qkv, out, dout, dqkv: never dereferenced, the check comes first */
        for (int i = 0; i < 4; i++) ptr[i] = (__nv_bfloat16*)(uintptr_t)(4096 * (i + 1));
        ptr[which] = (__nv_bfloat16*)((uintptr_t)ptr[which] + 2);
        float* stats = (float*)(uintptr_t)65536;
        if (backward)
            attention_backward_cuda(ATTN_BF16, AttnOptions{}, s, ptr[0], ptr[1], stats, ptr[2], ptr[3], (void*)stats, 0);
        else
            attention_forward_cuda(ATTN_BF16, AttnOptions{}, s, ptr[0], ptr[1], stats, NULL, 0);
    }, msg, sizeof msg);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1, "%s: exits 1 (status %d)", label, status);
    char want[64];
    snprintf(want, sizeof want, "%s (", name);
    CHECK(strstr(msg, want) != NULL && strstr(msg, "not 16-byte aligned") != NULL && strstr(msg, "hint:") != NULL,
          "%s: the message names %s, the alignment and a hint (got: %.200s)", label, name, msg);
}

static void test_attention_alignment(void) {
    test_section("attention calls refuse BF16 pointers off 16-byte alignment, with a hint");
    static const char* kNames[4] = {"qkv", "out", "dout", "dqkv"};
    expect_alignment_refusal(0, 0, "qkv");
    expect_alignment_refusal(0, 1, "out");
    for (int i = 0; i < 4; i++) expect_alignment_refusal(1, i, kNames[i]);
}

/* The deterministic backward's workspace (AttnOptions.deterministic): one FP32 dQ slice per 128-key block in
   bf16, repair and fp32 mode, none extra in gproj, and a clear refusal past ATTN_CUDA_DETERMINISTIC_MAX_BYTES,
   from attention_cuda_workspace_bytes and from attention_backward_cuda before it touches the device. The sizes
   are written out by hand: ceil(T / 128) * B*NH*T*HS + 2 * B*NH*T floats. */
static void test_deterministic_workspace(void) {
    test_section("deterministic backward: workspace arithmetic and the refusal past its bound");
    AttnOptions det = {}, off = {};
    det.deterministic = 1;
    struct { AttnShape s; size_t blocks; } cases[] = {
        {{1, 1, 1, 64}, 1}, {{2, 3, 128, 64}, 1}, {{2, 3, 129, 64}, 2}, {{4, 12, 1024, 64}, 8},
        {{2, 16, 4096, 128}, 32}, {{1, 2, 1000, 128}, 8},
    };
    for (const auto& c : cases) {
        const size_t rows = (size_t)c.s.B * c.s.NH * c.s.T;
        for (int m = 0; m < ATTN_NUM_EMULATED_MODES; m++) {
            const AttnMode mode = (AttnMode)m;
            const size_t slices = (mode == ATTN_GPROJ) ? 1 : c.blocks;
            const size_t want = (slices * rows * c.s.HS + 2 * rows) * 4;
            const size_t got = attention_cuda_workspace_bytes(c.s, mode, det);
            CHECK(got == want, "B%d NH%d T%d HS%d %s deterministic: %zu bytes == %zu (%zu dQ slices)", c.s.B, c.s.NH,
                  c.s.T, c.s.HS, attn_mode_name(mode), got, want, slices);
            CHECK(attention_cuda_workspace_bytes(c.s, mode, off) == (rows * c.s.HS + 2 * rows) * 4 &&
                      attention_cuda_workspace_bytes(c.s, mode) == (rows * c.s.HS + 2 * rows) * 4,
                  "B%d NH%d T%d HS%d %s: deterministic off (and the two-argument form) keeps one dQ accumulator",
                  c.s.B, c.s.NH, c.s.T, c.s.HS, attn_mode_name(mode));
        }
    }
    /* B8 NH16 T8192 HS128: 64 slices of 512 MiB = 32 GiB, over the 16 GiB bound; B2: 8 GiB, accepted */
    const AttnShape big = {8, 16, 8192, 128}, fits = {2, 16, 8192, 128};
    const size_t fits_rows = (size_t)2 * 16 * 8192;
    CHECK(attention_cuda_workspace_bytes(fits, ATTN_BF16, det) == (64 * fits_rows * 128 + 2 * fits_rows) * 4,
          "B2 NH16 T8192 HS128 bf16 deterministic: 8 GiB of slices, under the bound, accepted");
    CHECK(attention_cuda_workspace_bytes(big, ATTN_GPROJ, det) == ((size_t)8 * 16 * 8192 * 130) * 4,
          "gproj needs no slices: the large shape is accepted with deterministic on");
    char msg[2048];
    int status = run_captured([&] { attention_cuda_workspace_bytes(big, ATTN_FP32, det); }, msg, sizeof msg);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1, "attention_cuda_workspace_bytes past the bound exits 1 (status %d)",
          status);
    CHECK(strstr(msg, "deterministic") && strstr(msg, "fp32") && strstr(msg, "32.0 GiB") && strstr(msg, "16 GiB") &&
              strstr(msg, "T=8192") && strstr(msg, "hint:") && strstr(msg, "--attn gproj"),
          "the refusal names the mode, the shape, the size, the bound and the fixes (got: %.400s)", msg);
    /* attention_backward_cuda refuses the same before any device call (none here: no GPU needed) */
    status = run_captured([&] {
        __nv_bfloat16* p = (__nv_bfloat16*)(uintptr_t)4096; /* never dereferenced: the check comes first */
        attention_backward_cuda(ATTN_BF16, det, big, p, p, (const float*)p, p, p, (void*)p, 0);
    }, msg, sizeof msg);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 1 && strstr(msg, "deterministic") && strstr(msg, "hint:"),
          "attention_backward_cuda with deterministic on past the bound is refused with the same message (status %d: "
          "%.200s)", status, msg);
}

/* The Hopper passes' launch switches (ATTN_FWD_PERSISTENT, ATTN_BWD_PERSISTENT: hopper_env_switch) and the grid of
   a launch of one CTA per work item (hopper_item_grid with persistent 0; the persistent grid asks the device for
   its SM count and is left to the GPU tests). */
struct SwitchCase {
    const char* value; /* NULL: unset */
};
static void switch_dies(void* ctx) {
    setenv("ATTN_TEST_SWITCH", ((const SwitchCase*)ctx)->value, 1);
    hopper_env_switch("ATTN_TEST_SWITCH", 1);
}
static void item_grid_dies(void* ctx) { hopper_item_grid(*(const long long*)ctx, 0, "a test pass"); }
static void test_launch_switches(void) {
    test_section("Hopper launch switches and the one-CTA-per-item grid");
    unsetenv("ATTN_TEST_SWITCH");
    CHECK(hopper_env_switch("ATTN_TEST_SWITCH", 1) == 1 && hopper_env_switch("ATTN_TEST_SWITCH", 0) == 0,
          "unset: the default");
    setenv("ATTN_TEST_SWITCH", "", 1);
    CHECK(hopper_env_switch("ATTN_TEST_SWITCH", 1) == 1, "empty: the default");
    setenv("ATTN_TEST_SWITCH", "0", 1);
    CHECK(hopper_env_switch("ATTN_TEST_SWITCH", 1) == 0, "\"0\": off");
    setenv("ATTN_TEST_SWITCH", "1", 1);
    CHECK(hopper_env_switch("ATTN_TEST_SWITCH", 0) == 1, "\"1\": on");
    unsetenv("ATTN_TEST_SWITCH");
    static const SwitchCase kBad[] = {{"2"}, {"yes"}, {"01"}, {"1 "}, {"-1"}};
    for (const SwitchCase& c : kBad) {
        char msg[512];
        const int rc = test_run_captured(switch_dies, (void*)&c, msg, sizeof(msg));
        CHECK(rc != 0 && strstr(msg, "ATTN_TEST_SWITCH") && strstr(msg, "hint: 1 (on) or 0 (off)"),
              "ATTN_TEST_SWITCH=\"%s\" stops the program naming the switch and its values (rc %d: %s)", c.value, rc,
              msg);
    }
    CHECK(hopper_item_grid(1, 0, "a test pass") == 1u && hopper_item_grid(3072, 0, "a test pass") == 3072u &&
              hopper_item_grid(0x7fffffffLL, 0, "a test pass") == 0x7fffffffu,
          "one CTA per item: the grid is the item count (1, 3072, 2^31 - 1)");
    static const long long kBadItems[] = {0, -5, 0x80000000LL};
    for (const long long& n : kBadItems) {
        char msg[512];
        const int rc = test_run_captured(item_grid_dies, (void*)&n, msg, sizeof(msg));
        CHECK(rc != 0 && strstr(msg, "a test pass") && strstr(msg, "work items") && strstr(msg, "hint:"),
              "%lld work items: refused with the pass's name and a hint (rc %d: %s)", n, rc, msg);
    }
}

int main(void) {
    test_bucket_sort(1, 50304, 50257);
    test_bucket_sort(4096, 50304, 50257);
    test_bucket_sort(5000, 1000, 17);
    test_memory_plan("d12", 4, 64);
    test_memory_plan("450m", 2, 128);
    test_memory_check();
    test_gpt2_tables_unchanged();
    test_option_tables("llama-small", 0, 0, 1, 4, 64);
    test_option_tables("llama-small", 1, 0, 1, 4, 64);
    test_option_tables("llama-d12", 0, 1, 1, 2, 64); /* SwiGLU with biases: fcb's F = 4096 > 4C is the widest */
    test_option_tables("small", 0, 0, 1, 4, 64);
    test_option_tables("small", 0, 1, 0, 4, 64);
    test_option_tables("d12", 1, 1, 1, 2, 64);
    test_option_refusals();
    test_attention_alignment();
    test_deterministic_workspace();
    test_launch_switches();
    return test_summary();
}
