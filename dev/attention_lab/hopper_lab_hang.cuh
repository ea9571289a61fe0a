/*
 * dev/attention_lab/hopper_lab_hang.cuh - the bounded mbarrier wait and hang record of the Hopper labs that
 * carry their own kernels (hopper_bwd_fast, hopper_bwd_gproj): the device side (mbar_wait_bounded, the
 * record's device pointer) and the host side (hang_record_install, hang_site_name).
 *
 * Why: a pipeline protocol bug must end a blind run on the H200 with the name of the barrier that hung, not
 * with a stuck job; both labs had their own identical copy of this machinery. It is the device half of
 * dev/attention_lab/hopper_lab.cuh and a header of its own because it defines a __device__ global: the labs
 * without kernels (hopper_fwd, hopper_bwd, hopper_rows, which build for any NVCC_ARCH) include hopper_lab.cuh
 * only and so stay free of device code. Needs attention/hopper_wgmma.cuh (sm_90a only). Of the production
 * kernels only fp32's HS-64 key-major pass traps (attention/attention_hopper_bwd64_fp32.cu, no setmaxnreg);
 * the others give up and write NaN, as here (setmaxnreg kernels cannot trap, see below).
 *
 * The wait polls for about kHangCycles clock cycles (~2 s at 1.98 GHz; a legitimate wait is microseconds),
 * then writes which barrier hung into g_hang_record (host-mapped pinned memory) and GIVES UP: it sets the
 * CTA's abort flag (shared memory), after which every bounded wait of the CTA returns at once, so the CTA
 * runs to its end on garbage in a few microseconds and the host, which checks the record after every
 * synchronisation (the lab's sync_or_report), names the barrier and stops. Why not __trap() as the
 * production backward: a trap on the path makes ptxas ignore setmaxnreg.inc (the consumer code is then
 * compiled for the launch's 168 registers: 260 bytes of spills and serialised wgmmas, seen with -Xptxas -v
 * in hopper_bwd_fast), and no thread may leave early either (the named barriers and the .sync.aligned
 * wgmmas need every thread of their warpgroup). No printf: a function call makes ptxas serialise every
 * wgmma (C7510).
 *
 * Everything is in the including file's anonymous namespace (one lab = one translation unit).
 */
#ifndef DEV_ATTENTION_LAB_HOPPER_LAB_HANG_CUH
#define DEV_ATTENTION_LAB_HOPPER_LAB_HANG_CUH

#include <stdint.h>
#include <string.h>
#include <cuda_runtime.h>
#include "attention/hopper_wgmma.cuh"
#include "common/cuda_utils.cuh"

namespace {

constexpr long long kHangCycles = 4000000000ll;
enum HangSite { kHangNone = 0, kHangKvFull = 1, kHangFull = 2, kHangEmpty = 3, kHangProbe = 4 };
struct HangRecord {
    int site, index, parity, block_x, block_y, thread;
};
__device__ HangRecord* g_hang_record; /* set by the host (hang_record_install); NULL: no record */
__device__ __forceinline__ void mbar_wait_bounded(uint64_t* bar, uint32_t parity, HangSite site, int index,
                                                  volatile int* cta_abort) {
    const uint32_t addr = hopper_wgmma::smem_u32(bar);
    uint32_t done = 0;
    const long long start = clock64();
    while (!done) {
        done = hopper_wgmma::mbar_try_wait(addr, parity);
        if (!done && (*cta_abort != 0 || clock64() - start > kHangCycles)) {
            if (*cta_abort == 0) {
                *cta_abort = 1;
                volatile HangRecord* rec = g_hang_record;
                if (rec != NULL && rec->site == kHangNone) {
                    rec->index = index;
                    rec->parity = (int)parity;
                    rec->block_x = (int)blockIdx.x;
                    rec->block_y = (int)blockIdx.y;
                    rec->thread = (int)threadIdx.x;
                    __threadfence_system();
                    rec->site = (int)site;
                    __threadfence_system();
                }
            }
            break;
        }
    }
}

/* ---- host ---- */

/* The record lives in pinned host memory mapped into the device, so it can still be read after the
   kernel's results (or the context) are gone. */
static HangRecord* g_hang_host = NULL;
static inline void hang_record_install(void) {
    cudaCheck(cudaHostAlloc((void**)&g_hang_host, sizeof(HangRecord), cudaHostAllocMapped));
    memset(g_hang_host, 0, sizeof(HangRecord));
    HangRecord* dev = NULL;
    cudaCheck(cudaHostGetDevicePointer((void**)&dev, g_hang_host, 0));
    cudaCheck(cudaMemcpyToSymbol(g_hang_record, &dev, sizeof dev));
}
/* The barrier a recorded site names, for the lab's HANG line. */
static inline const char* hang_site_name(int site) {
    static const char* kSite[] = {"none", "kv_full (K/V tiles)", "full (Q/dO tile + row state)",
                                  "empty (stage released by the consumers)", "probe tiles"};
    return site >= kHangNone && site <= kHangProbe ? kSite[site] : "unknown";
}

}  // namespace

#endif /* DEV_ATTENTION_LAB_HOPPER_LAB_HANG_CUH */
