// Hopper (sm_90a) warpgroup MMA and the shared-memory pipeline pieces around it: the shared-memory matrix
// descriptor of the 128-byte swizzle, wgmma fence / commit / wait, wgmma.mma_async m64nNk16 bf16 -> f32 with
// both operands in shared memory (N = 64, 128, 256) or A from registers (N = 64, 128, 192, 256), the generic
// -> async proxy fence, and mbarrier helpers. General on purpose: the MoE prefill GEMMs use it, other
// tensor-core kernels may.
//
// Guards: wgmma exists only in the architecture-specific sm_90a target, so those wrappers compile to a trap
// elsewhere (other archs still build; launchers must never pick such a kernel there: KernelNeed arch_exact).
// mbarrier (with expect_tx / try_wait.parity) and fence.proxy.async need sm_90.
//
// Shared-memory operand layout used here ("K-major, 128-byte swizzle"): a tile of R rows x 64 bf16 (128 bytes
// a row, k contiguous) starts at a 1024-byte aligned address; row r's 16-byte chunk c (k = 8c .. 8c + 7) is
// stored at byte  r * 128 + ((c ^ (r % 8)) * 16).  8 consecutive rows (1024 bytes) form one swizzle atom; the
// hardware applies the XOR to address bits 4-6 from bits 7-9, which is why the tile must be 1024-aligned. A
// wgmma k16 step kk (k = 16 kk .. 16 kk + 15, 32 bytes of each row) is addressed by the descriptor of the
// tile's start plus 32 kk bytes (smem_desc_sw128(base + 32 * kk)): the XOR is applied after the addition.
// The same layout serves A (rows = M) and B (rows = N: a weight matrix W[n][k] as stored, i.e. B = W^T).
//
// Accumulator layout of wgmma m64nNk16 (f32, N / 2 registers per thread; warp w = warp index % 4 within the
// warpgroup, lane l, g = l / 4, t = l % 4): register 4j + c of n8 block j (j = 0 .. N/8 - 1) holds
//   c = 0, 1: D[16 w + g    ][8 j + 2 t + c]
//   c = 2, 3: D[16 w + g + 8][8 j + 2 t + c - 2]
// i.e. warp w owns rows 16 w .. 16 w + 15 and the per-warp pattern is mma.sync m16n8's C fragment, repeated
// over the N / 8 column blocks.
//
// Protocol of one use (all 128 threads of the warpgroup, warp-uniform control flow):
//   fence_operands(acc); wgmma_fence(); mma_...(acc, da, db, 1) x k steps; wgmma_commit(); wgmma_wait<0>();
//   fence_operands(acc);
// Operands written to shared memory by ordinary stores or cp.async must be made visible to the async proxy
// that wgmma reads through: the writer executes fence_proxy_async() after its writes landed and before the
// barrier (mbarrier arrive or bar.sync) the consumer waits on.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define MS_SM90 1
#else
#define MS_SM90 0
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MS_WGMMA_SM90A 1
#else
#define MS_WGMMA_SM90A 0
#endif

namespace ms::cuda::wg {

// Reached only if a kernel built for another target is launched anyway (the launchers refuse that first).
__device__ __forceinline__ void trap_not_sm90a() {
#if defined(__CUDA_ARCH__)
  __trap();
#endif
}

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Byte offset of (row, 16-byte chunk) in a K-major 128-byte-swizzled tile (see above).
__host__ __device__ constexpr uint32_t sw128_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// Shared-memory matrix descriptor (64 bits) of a K-major operand in the 128-byte swizzle layout:
//   bits  0-13  start address >> 4 (shared window address; tile base 1024-aligned, + 32 kk for k step kk)
//   bits 16-29  leading-dimension byte offset >> 4: unused for a swizzled K-major operand whose k16 step
//               lies inside one 128-byte row; set to 1 (16 bytes) as is customary
//   bits 32-45  stride-dimension byte offset >> 4: 1024 bytes from one 8-row atom to the next
//   bits 49-51  base offset: 0 (atoms are 1024-aligned)
//   bits 62-63  layout: 1 = 128-byte swizzle (2 = 64-byte, 3 = 32-byte, 0 = none)
__device__ __forceinline__ uint64_t smem_desc_sw128(uint32_t smem_addr) {
  uint64_t d = static_cast<uint64_t>((smem_addr & 0x3FFFFu) >> 4);
  d |= static_cast<uint64_t>(1) << 16;
  d |= static_cast<uint64_t>(1024 >> 4) << 32;
  d |= static_cast<uint64_t>(1) << 62;
  return d;
}

// The descriptor of k step kk of a tile whose k-step-0 descriptor is d: start address + 32 kk bytes (the
// address field counts 16-byte units, so + 2 kk; no carry out of the 14-bit field for addresses < 256 KB).
__device__ __forceinline__ uint64_t desc_advance(uint64_t d, int kk) {
  return d + static_cast<uint64_t>(2 * kk);
}

// Orders this warpgroup's register and shared-memory accesses before the wgmma that follow (wgmma.fence):
// needed before the first wgmma and whenever the accumulators were touched by other instructions.
__device__ __forceinline__ void wgmma_fence() {
#if MS_WGMMA_SM90A
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  trap_not_sm90a();
#endif
}

// Closes the wgmma issued since the last commit into one group.
__device__ __forceinline__ void wgmma_commit() {
#if MS_WGMMA_SM90A
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#else
  trap_not_sm90a();
#endif
}

// Waits until at most N committed groups of this warp are still pending (their accumulators and shared
// operands are then free).
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#if MS_WGMMA_SM90A
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#else
  trap_not_sm90a();
#endif
}

// Keeps the compiler from moving accesses of the accumulators across the asynchronous MMA window (an empty
// asm that "reads and writes" every register).
template <int R>
__device__ __forceinline__ void fence_operands(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Makes this thread's earlier generic-proxy shared-memory writes (st.shared, landed cp.async) visible to
// later async-proxy reads (wgmma operands, bulk copies out of shared memory).
__device__ __forceinline__ void fence_proxy_async() {
#if MS_SM90
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

// Re-balances the register file between warpgroups (setmaxnreg; sm_90a). N: a multiple of 8 in 24 .. 256.
template <int N>
__device__ __forceinline__ void regs_dealloc() {
#if MS_WGMMA_SM90A
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void regs_alloc() {
#if MS_WGMMA_SM90A
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

// ---- mbarrier (sm_90: expect_tx, try_wait.parity). A phase completes when `count` arrivals (and, with
// expect_tx, the announced bytes of bulk copies) have happened; waiters name the phase by its parity.

__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
#if MS_SM90
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#endif
}

// Makes initialised barriers visible to the other threads (and the async proxy); then __syncthreads().
__device__ __forceinline__ void mbar_init_fence() {
#if MS_SM90
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// One arrival (release semantics at CTA scope: this thread's earlier writes are visible to the waiters).
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
#if MS_SM90
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#endif
}

// One arrival that also announces `bytes` of bulk-copy data the phase must wait for.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#if MS_SM90
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
#endif
}

// An arrival triggered when all of this thread's earlier cp.async have landed; it does not count towards
// `count` beyond the one arrival it replaces (.noinc: init count must include it).
__device__ __forceinline__ void mbar_arrive_cp_async(uint64_t* bar) {
#if MS_SM90
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_u32(bar)) : "memory");
#endif
}

// Whether the phase of `parity` has completed (one probe; the hardware may suspend the thread briefly).
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t parity) {
#if MS_SM90
  uint32_t done;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(done)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return done != 0;
#else
  return true;
#endif
}

// Returns once the phase of `parity` has completed (acquire: the arrivers' writes are visible). The retry
// loop lives inside one asm statement, so the compiler sees no divergent branch around later wgmma (a visible
// per-thread loop makes ptxas serialise them).
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
#if MS_SM90
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "MS_MBAR_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra MS_MBAR_WAIT_%=;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
#endif
}

// The value of v in lane 0 of the warp: a branch on it is visibly warp-uniform to the compiler (wgmma under a
// branch the compiler cannot prove uniform is serialised).
__device__ __forceinline__ int warp_uniform(int v) {
  return __shfl_sync(0xffffffffu, v, 0);
}

// Bulk copy global -> shared (16-byte aligned, size a multiple of 16) completing `bytes` on bar.
__device__ __forceinline__ void bulk_copy_g2s(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
#if MS_SM90
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
#endif
}

// 2D tensor copy global -> shared (TMA) completing its box's bytes on bar. tmap: a CUtensorMap in the
// kernel's parameters (__grid_constant__) or in global memory (then acquired first: tmap_acquire); c0 the
// innermost coordinate (elements), c1 the row. Box elements outside the tensor land as zeros and still count
// as bytes. c0 times the element size must be a multiple of 16 (the box's first global byte 16-byte aligned;
// the hardware reports any other start as an illegal instruction, whatever the map allows); dst 128-byte
// aligned (1024 for a 128-byte-swizzled box, so that the swizzle matches sw128_offset).
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const void* tmap, int c0, int c1, uint64_t* bar) {
#if MS_SM90
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, "
      "%3}], "
      "[%4];\n" ::"r"(dst),
      "l"(tmap), "r"(c0), "r"(c1), "r"(smem_u32(bar))
      : "memory");
#endif
}

// Makes a tensor map written to global memory by the host (cudaMemcpy before the launch) visible to this
// thread's tensor copies (the tensormap proxy); once per map before its first use.
__device__ __forceinline__ void tmap_acquire(const void* gmem_tmap) {
#if MS_SM90
  asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;\n" ::"l"(gmem_tmap) : "memory");
#endif
}

// A wait that has not seen its phase complete after this long is a hang (a phase completes within
// microseconds): the waiter records it and traps, so the launch fails instead of never returning.
constexpr uint64_t kMbarTimeoutNs = uint64_t{4} << 30;  // about 4.3 s

// Where a timed-out wait is recorded: host memory mapped into the device (readable after the trap has made
// the context unusable). `seen` is written last.
struct MbarTimeout {
  uint32_t seen;
  uint32_t barrier;  // the kernel's own numbering of its mbarriers
  uint32_t parity;
  uint32_t block[3];
  uint32_t thread;
  uint32_t pad;
};

// mbar_wait with a bound: after kMbarTimeoutNs (%globaltimer, read only once a try_wait has failed) it
// records `barrier` in `rec` (may be null) and traps. One asm statement, the record and the trap included:
// a visible per-thread loop or branch around later wgmma makes ptxas serialise them.
__device__ __forceinline__ void mbar_wait_bounded(uint64_t* bar, uint32_t parity, uint32_t barrier,
                                                  MbarTimeout* rec) {
#if MS_SM90
  asm volatile(
      "{\n.reg .pred p;\n.reg .u64 t0, t1;\n.reg .u32 v;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@p bra MS_WG_MBAR_DONE_%=;\n"
      "mov.u64 t0, %%globaltimer;\n"
      "MS_WG_MBAR_RETRY_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@p bra MS_WG_MBAR_DONE_%=;\n"
      "mov.u64 t1, %%globaltimer;\n"
      "sub.u64 t1, t1, t0;\n"
      "setp.lt.u64 p, t1, %3;\n"
      "@p bra MS_WG_MBAR_RETRY_%=;\n"
      "setp.eq.u64 p, %4, 0;\n"
      "@p bra MS_WG_MBAR_TRAP_%=;\n"
      "st.volatile.global.u32 [%4 + 4], %2;\n"
      "st.volatile.global.u32 [%4 + 8], %1;\n"
      "mov.u32 v, %%ctaid.x;\n"
      "st.volatile.global.u32 [%4 + 12], v;\n"
      "mov.u32 v, %%ctaid.y;\n"
      "st.volatile.global.u32 [%4 + 16], v;\n"
      "mov.u32 v, %%ctaid.z;\n"
      "st.volatile.global.u32 [%4 + 20], v;\n"
      "mov.u32 v, %%tid.x;\n"
      "st.volatile.global.u32 [%4 + 24], v;\n"
      "membar.sys;\n"
      "st.volatile.global.u32 [%4], 1;\n"
      "membar.sys;\n"
      "MS_WG_MBAR_TRAP_%=:\n"
      "trap;\n"
      "MS_WG_MBAR_DONE_%=:\n}\n" ::"r"(smem_u32(bar)),
      "r"(parity), "r"(barrier), "l"(kMbarTimeoutNs), "l"(rec)
      : "memory");
#else
  (void)bar;
  (void)parity;
  (void)barrier;
  (void)rec;
#endif
}

static_assert(offsetof(MbarTimeout, seen) == 0 && offsetof(MbarTimeout, barrier) == 4 &&
                  offsetof(MbarTimeout, parity) == 8 && offsetof(MbarTimeout, block) == 12 &&
                  offsetof(MbarTimeout, thread) == 24,
              "the offsets mbar_wait_bounded stores to");

// ---- wgmma.mma_async m64nNk16, f32 += bf16 x bf16, A and B from shared memory (descriptors), both K-major
// (no transpose), no operand negation. scale_d 0: D = A.B (the accumulators' old values are ignored).

// d[0 .. 32) = A (64 x 16, smem desc) . B (64 x 16, smem desc)^T; + (scale_d ? d : 0); both operands K-major.
__device__ __forceinline__ void mma_m64n64k16_bf16_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                      int scale_d) {
#if MS_WGMMA_SM90A
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, %32, %33, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#else
  trap_not_sm90a();
#endif
}

// d[0 .. 64) = A (64 x 16, smem desc) . B (128 x 16, smem desc)^T; + (scale_d ? d : 0); both operands
// K-major.
__device__ __forceinline__ void mma_m64n128k16_bf16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                       int scale_d) {
#if MS_WGMMA_SM90A
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#else
  trap_not_sm90a();
#endif
}

// d[0 .. 128) = A (64 x 16, smem desc) . B (256 x 16, smem desc)^T; + (scale_d ? d : 0); both operands
// K-major.
__device__ __forceinline__ void mma_m64n256k16_bf16_ss(float (&d)[128], uint64_t desc_a, uint64_t desc_b,
                                                       int scale_d) {
#if MS_WGMMA_SM90A
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %130, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),
        "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]),
        "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]),
        "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
        "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]),
        "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
        "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
#else
  trap_not_sm90a();
#endif
}

// The same selected by N at compile time.
template <int N>
__device__ __forceinline__ void mma_bf16_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                            int scale_d) {
  static_assert(N == 64 || N == 128 || N == 256, "wgmma wrappers exist for N = 64, 128, 256");
  if constexpr (N == 64) {
    mma_m64n64k16_bf16_ss(d, desc_a, desc_b, scale_d);
  } else if constexpr (N == 128) {
    mma_m64n128k16_bf16_ss(d, desc_a, desc_b, scale_d);
  } else {
    mma_m64n256k16_bf16_ss(d, desc_a, desc_b, scale_d);
  }
}

// ---- wgmma.mma_async m64nNk16, f32 += bf16 x bf16, A from registers, B from shared memory (descriptor,
// K-major). A fragment of warp w = 0..3 of the warpgroup, lane = 4 g + t (mma.sync m16n8k16's A, one 16-row
// slice a warp): a[0] = A[16 w + g][2 t .. 2 t + 1], a[1] = A[16 w + g + 8][2 t ..], a[2] = A[16 w + g][2 t +
// 8
// ..], a[3] = A[16 w + g + 8][2 t + 8 ..] (lower half the first element). The registers of a must keep their
// values until the wgmma that read them completed (wgmma_wait).

// d[0 .. 32) (+)= A (64 x 16, registers: the fragment above) . B (64 x 16, smem desc)^T; B K-major. d may be
// longer than 32 (R >= 32): the rest is untouched.
template <int R>
__device__ __forceinline__ void mma_m64n64k16_bf16_rs(float (&d)[R], const uint32_t (&a)[4], uint64_t desc_b,
                                                      int scale_d) {
  static_assert(R >= 32, "the accumulator holds 32 values a thread");
#if MS_WGMMA_SM90A
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#else
  (void)d;
  (void)a;
  (void)desc_b;
  (void)scale_d;
  trap_not_sm90a();
#endif
}

// d[0 .. 64) (+)= A (64 x 16, registers: the fragment above) . B (128 x 16, smem desc)^T; B K-major. d may be
// longer than 64 (R >= 64): the rest is untouched.
template <int R>
__device__ __forceinline__ void mma_m64n128k16_bf16_rs(float (&d)[R], const uint32_t (&a)[4], uint64_t desc_b,
                                                       int scale_d) {
  static_assert(R >= 64, "the accumulator holds 64 values a thread");
#if MS_WGMMA_SM90A
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, {%64, %65, %66, %67}, %68, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#else
  (void)d;
  (void)a;
  (void)desc_b;
  (void)scale_d;
  trap_not_sm90a();
#endif
}

// The same for N = 192 and 256 (d[0 .. N / 2)).
template <int R>
__device__ __forceinline__ void mma_m64n192k16_bf16_rs(float (&d)[R], const uint32_t (&a)[4], uint64_t desc_b,
                                                       int scale_d) {
  static_assert(R >= 96, "the accumulator holds 96 values a thread");
#if MS_WGMMA_SM90A
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %101, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
      "}, {%96, %97, %98, %99}, %100, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),
        "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]),
        "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]),
        "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#else
  (void)d;
  (void)a;
  (void)desc_b;
  (void)scale_d;
  trap_not_sm90a();
#endif
}

template <int R>
__device__ __forceinline__ void mma_m64n256k16_bf16_rs(float (&d)[R], const uint32_t (&a)[4], uint64_t desc_b,
                                                       int scale_d) {
  static_assert(R >= 128, "the accumulator holds 128 values a thread");
#if MS_WGMMA_SM90A
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, {%128, %129, %130, %131}, %132, p, 1, 1, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]),
        "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]),
        "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]),
        "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),
        "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]),
        "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
        "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]),
        "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
#else
  (void)d;
  (void)a;
  (void)desc_b;
  (void)scale_d;
  trap_not_sm90a();
#endif
}

// The same selected by N at compile time.
template <int N, int R>
__device__ __forceinline__ void mma_bf16_rs(float (&d)[R], const uint32_t (&a)[4], uint64_t desc_b,
                                            int scale_d) {
  static_assert(N == 64 || N == 128 || N == 192 || N == 256,
                "register-A wgmma wrappers exist for N = 64 .. 256");
  if constexpr (N == 64) {
    mma_m64n64k16_bf16_rs(d, a, desc_b, scale_d);
  } else if constexpr (N == 128) {
    mma_m64n128k16_bf16_rs(d, a, desc_b, scale_d);
  } else if constexpr (N == 192) {
    mma_m64n192k16_bf16_rs(d, a, desc_b, scale_d);
  } else {
    mma_m64n256k16_bf16_rs(d, a, desc_b, scale_d);
  }
}

// Keeps the compiler from moving or reusing the registers of a wgmma's A fragment before the wgmma that read
// them completed (after wgmma_wait; the analogue of fence_operands).
__device__ __forceinline__ void fence_fragment(uint32_t (&a)[4]) {
  asm volatile("" : "+r"(a[0]), "+r"(a[1]), "+r"(a[2]), "+r"(a[3])::"memory");
}

}  // namespace ms::cuda::wg
