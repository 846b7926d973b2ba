// sm_90a pieces of the warpgroup-MMA MLA decode kernel (mla_decode_wgmma.cu): shared-memory matrix
// descriptors for the 128-byte swizzle, wgmma fence / commit / wait, the m64nNk16 f16 MMAs it issues (operand
// A from shared memory or from registers), mbarriers and the bulk global -> shared copy that signals one.
// Everything compiles to a trap outside sm_90a (the instructions exist nowhere else), so the file builds for
// every architecture in MOESERVE_CUDA_ARCHS; launchers run the kernel on sm_90 only.
//
// Shared-memory operand layout (both operands, 16-bit elements, 128-byte swizzle): a matrix is stored as
// blocks of 64 elements along its contiguous dimension; inside a block, line r (the other dimension) takes
// 128 bytes at r * 128, and the 16-byte chunk c of a line sits at chunk position c ^ (r % 8). Eight lines
// make a 1024-byte swizzle atom; blocks must start 1024-byte aligned (the hardware swizzles on address bits
// 4-6 with bits 7-9). swizzle128_offset() gives the byte offset of element (line, col) of such a block.
//   K-major operand ([rows][k], k contiguous: Q, and K for S = Q K^T): a block is 64 k wide; the descriptor's
//   stride byte offset (SBO) is 1024 (from rows 0-7 to rows 8-15); the leading byte offset is unused; the k
//   step of 16 inside a block advances the start address by 32 bytes.
//   MN-major operand ([k][n], n contiguous: V for O = P V, keys x dims): a block is 64 n wide; SBO is the
//   distance between groups of 8 k lines (1024), the leading byte offset (LBO) is the distance between
//   blocks of 64 n (the next 64 dims); the k step of 16 advances the start by 2 atoms (2048 bytes).
//
// Register layouts of m64nNk16 (warp w = 0..3 of the warpgroup, lane = 4 g + t):
//   accumulator D (f32, N / 2 registers): d[4 j + 0..1] = D[16 w + g][8 j + 2 t + 0..1],
//                                         d[4 j + 2..3] = D[16 w + g + 8][8 j + 2 t + 0..1], j = 0..N / 8 -
//                                         1;
//   A from registers (f16x2, 4 registers): a0 = A[16 w + g][2 t..2 t + 1], a1 = A[16 w + g + 8][2 t..],
//                                          a2 = A[16 w + g][2 t + 8..], a3 = A[16 w + g + 8][2 t + 8..]
// so the accumulator of a 16-column slice (j = 2 s, 2 s + 1) packs straight into the A fragment of k step s.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/common/wgmma_sm90.cuh"

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MS_MLA_WGMMA_ENABLED 1
#else
#define MS_MLA_WGMMA_ENABLED 0
#endif

namespace ms::cuda::mla_wgmma_ptx {

// The pieces every warpgroup-MMA kernel shares (kernels/cuda/common/wgmma_sm90.cuh).
using wg::bulk_copy_g2s;
using wg::fence_proxy_async;
using wg::mbar_arrive;
using wg::mbar_arrive_expect_tx;
using wg::mbar_init;
using wg::mbar_init_fence;
using wg::regs_alloc;
using wg::regs_dealloc;
using wg::smem_u32;
using wg::wgmma_commit;
using wg::wgmma_fence;
using wg::wgmma_wait;

__host__ __device__ constexpr uint32_t swizzle128_offset(uint32_t line, uint32_t col_elem) {
  return line * 128u + ((((col_elem >> 3) ^ (line & 7u)) & 7u) << 4) + (col_elem & 7u) * 2u;
}

// Matrix descriptor: start address, leading and stride byte offsets (>> 4, 14 bits each), 128-byte swizzle
// (layout type 1 in bits 62-63); base offset 0 (operand blocks are 1024-byte aligned).
__device__ __forceinline__ uint64_t desc_sw128_at(uint32_t a, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  uint64_t d = static_cast<uint64_t>((a & 0x3ffffu) >> 4);
  d |= static_cast<uint64_t>((lbo_bytes >> 4) & 0x3fffu) << 16;
  d |= static_cast<uint64_t>((sbo_bytes >> 4) & 0x3fffu) << 32;
  d |= uint64_t{1} << 62;
  return d;
}
__device__ __forceinline__ uint64_t desc_sw128(const void* smem, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return desc_sw128_at(smem_u32(smem), lbo_bytes, sbo_bytes);
}

// Keeps the compiler from moving reads of a wgmma accumulator above the wait that completes it.
__device__ __forceinline__ void fence_operand(float& r) {
  asm volatile("" : "+f"(r)::"memory");
}
__device__ __forceinline__ void fence_operand(uint32_t& r) {
  asm volatile("" : "+r"(r)::"memory");
}
// Named barrier over `count` threads (a multiple of 32); id 0 is __syncthreads.
__device__ __forceinline__ void named_barrier(int id, int count) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// Arrives on named barrier `id` without waiting: with `count` = arrivals + waiters, the threads that bar.sync
// on it wait for these (a one-way signal from one warpgroup to another).
__device__ __forceinline__ void named_barrier_arrive(int id, int count) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(count) : "memory");
}

// The bounded wait: after wg::kMbarTimeoutNs it records `barrier` in `rec` (wg::MbarTimeout, host memory
// mapped into the device; may be null) and traps, so a hang fails the launch instead of never returning.
using wg::kMbarTimeoutNs;
using wg::mbar_wait_bounded;
using wg::MbarTimeout;

// D[64, 32] (+)= A[64, 16] B[16, 32], A and B from shared memory (descriptors), f16 in, f32 out.
// TransB: 0 = B stored K-major ([n][k]), 1 = MN-major ([k][n]). scale_d 0: D = A B.
template <int TransB>
__device__ __forceinline__ void wgmma_ss_m64n32k16_f16(float (&d)[16], uint64_t desc_a, uint64_t desc_b,
                                                       int scale_d) {
#if MS_MLA_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
      "{"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"
      "}, %16, %17, p, 1, 1, 0, %19;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
#else
  (void)d;
  (void)desc_a;
  (void)desc_b;
  (void)scale_d;
  __trap();
#endif
}

// D[64, 64] (+)= A[64, 16] B[16, 64], A and B from shared memory (descriptors), f16 in, f32 out.
// TransB: 0 = B stored K-major ([n][k]), 1 = MN-major ([k][n]). scale_d 0: D = A B.
template <int TransB>
__device__ __forceinline__ void wgmma_ss_m64n64k16_f16(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                       int scale_d) {
#if MS_MLA_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, %32, %33, p, 1, 1, 0, %35;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(TransB));
#else
  (void)d;
  (void)desc_a;
  (void)desc_b;
  (void)scale_d;
  __trap();
#endif
}

// D[64, 64] (+)= A[64, 16] B[16, 64], A from registers (the fragment above), B from shared memory.
template <int TransB>
__device__ __forceinline__ void wgmma_rs_m64n64k16_f16(float (&d)[32], const uint32_t (&a)[4],
                                                       uint64_t desc_b, int scale_d) {
#if MS_MLA_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
      "{"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"
      "}, {%32,%33,%34,%35}, %36, p, 1, 1, %38;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB));
#else
  (void)d;
  (void)a;
  (void)desc_b;
  (void)scale_d;
  __trap();
#endif
}

// D[64, 256] (+)= A[64, 16] B[16, 256], A from registers (the fragment above), B from shared memory.
template <int TransB>
__device__ __forceinline__ void wgmma_rs_m64n256k16_f16(float (&d)[128], const uint32_t (&a)[4],
                                                        uint64_t desc_b, int scale_d) {
#if MS_MLA_WGMMA_ENABLED
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %133, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16 "
      "{"
      "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
      "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
      "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
      "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"
      "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"
      "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"
      "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"
      "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"
      "}, {%128,%129,%130,%131}, %132, p, 1, 1, %134;\n}\n"
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
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d), "n"(TransB));
#else
  (void)d;
  (void)a;
  (void)desc_b;
  (void)scale_d;
  __trap();
#endif
}

}  // namespace ms::cuda::mla_wgmma_ptx
