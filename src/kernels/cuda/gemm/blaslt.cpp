#include "kernels/cuda/gemm/blaslt.h"

#include <cublasLt.h>

#include <array>
#include <map>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/elementwise/pointwise.h"

// LT_CHECK(call): throws ms::Error naming the failing cuBLASLt call and its status.
#define LT_CHECK(call)                                                                            \
  do {                                                                                            \
    cublasStatus_t st_ = (call);                                                                  \
    if (st_ != CUBLAS_STATUS_SUCCESS)                                                             \
      MS_THROW("{} failed: {} ({})", #call, cublasLtGetStatusString(st_), static_cast<int>(st_)); \
  } while (0)

namespace ms::cuda {

namespace {

// Descriptors and algorithm of one GEMM shape, made once.
struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

struct Preference {
  cublasLtMatmulPreference_t pref = nullptr;
  Preference() { LT_CHECK(cublasLtMatmulPreferenceCreate(&pref)); }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  ~Preference() { cublasLtMatmulPreferenceDestroy(pref); }
  template <typename T>
  void set(cublasLtMatmulPreferenceAttributes_t attr, T v) {
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &v, sizeof v));
  }
};

// dtype, m, n, k, x_stride, w_stride, y_stride and the three pointers' alignments.
using PlanKey = std::array<int64_t, 10>;

// Largest power of two (up to 256) dividing the address: what cuBLASLt may assume of the buffer.
uint32_t alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && a % al != 0) al /= 2;
  return al;
}

}  // namespace

struct BlasLtHandle::Impl {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::map<PlanKey, std::unique_ptr<Plan>> plans;
  std::map<std::array<int64_t, 15>, std::unique_ptr<Plan>> batched;

  // y [m, n] = x [m, k] W^T, x and W of `type`, f32 accumulation and output.
  void run(cudaDataType_t type, const void* x, int64_t x_stride, const void* w, int64_t w_stride, float* y,
           int64_t y_stride, int64_t m, int64_t n, int64_t k, cudaStream_t stream, float alpha = 1.0f) {
    const uint32_t ax = alignment_of(x), aw = alignment_of(w), ay = alignment_of(y);
    const PlanKey key{static_cast<int64_t>(type), m, n, k, x_stride, w_stride, y_stride, ax, aw, ay};
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, make_plan(type, key, ax, aw, ay)).first;
    const Plan& plan = *it->second;
    const float beta = 0.0f;
    LT_CHECK(cublasLtMatmul(handle, plan.desc, &alpha, w, plan.a, x, plan.b, &beta, y, plan.d, y, plan.d,
                            &plan.algo, workspace, workspace_bytes, stream));
  }

  std::unique_ptr<Plan> make_plan(cudaDataType_t type, const PlanKey& key, uint32_t ax, uint32_t aw,
                                  uint32_t ay) {
    const int64_t m = key[1], n = key[2], k = key[3], x_stride = key[4], w_stride = key[5], y_stride = key[6];
    auto plan = std::make_unique<Plan>();
    LT_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    // Column-major views: W as stored is [k, n] with ld w_stride, x is [k, m] with ld x_stride, y is [n, m]
    // with ld y_stride.
    LT_CHECK(cublasLtMatrixLayoutCreate(&plan->a, type, static_cast<uint64_t>(k), static_cast<uint64_t>(n),
                                        w_stride));
    LT_CHECK(cublasLtMatrixLayoutCreate(&plan->b, type, static_cast<uint64_t>(k), static_cast<uint64_t>(m),
                                        x_stride));
    LT_CHECK(cublasLtMatrixLayoutCreate(&plan->d, CUDA_R_32F, static_cast<uint64_t>(n),
                                        static_cast<uint64_t>(m), y_stride));
    Preference pref;
    pref.set<uint64_t>(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes);
    pref.set<uint32_t>(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, aw);
    pref.set<uint32_t>(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, ax);
    pref.set<uint32_t>(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, ay);
    pref.set<uint32_t>(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, ay);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, plan->desc, plan->a, plan->b, plan->d, plan->d, pref.pref,
                                            1, &result, &found));
    MS_CHECK(
        found > 0,
        "cuBLASLt has no algorithm for a {} GEMM m={} n={} k={} (strides x {} w {} y {}, alignments {} {} "
        "{} bytes)",
        type == CUDA_R_16BF      ? "bf16"
        : type == CUDA_R_8F_E4M3 ? "fp8 e4m3"
                                 : "f32",
        m, n, k, x_stride, w_stride, y_stride, ax, aw, ay);
    plan->algo = result.algo;
    return plan;
  }
};

BlasLtHandle::BlasLtHandle(size_t workspace_bytes) : impl_(std::make_unique<Impl>()) {
  LT_CHECK(cublasLtCreate(&impl_->handle));
  if (workspace_bytes > 0) {
    const cudaError_t err = cudaMalloc(&impl_->workspace, workspace_bytes);
    if (err != cudaSuccess) {
      cublasLtDestroy(impl_->handle);
      MS_THROW("cudaMalloc of the {} byte cuBLASLt workspace failed: {}", workspace_bytes,
               cudaGetErrorString(err));
    }
  }
  impl_->workspace_bytes = workspace_bytes;
}

BlasLtHandle::~BlasLtHandle() {
  impl_->plans.clear();
  impl_->batched.clear();
  if (impl_->workspace) cudaFree(impl_->workspace);
  if (impl_->handle) cublasLtDestroy(impl_->handle);
}

size_t BlasLtHandle::workspace_bytes() const {
  return impl_->workspace_bytes;
}

size_t BlasLtHandle::cached_plans() const {
  return impl_->plans.size() + impl_->batched.size();
}

void gemm_bf16_batched(const GemmBf16BatchedParams& p, BlasLtHandle& lt, cudaStream_t stream) {
  MS_CHECK(p.m >= 0 && p.n >= 0 && p.k > 0 && p.batch >= 0,
           "gemm_bf16_batched: m = {}, n = {}, k = {}, batch = {} (k must be positive)", p.m, p.n, p.k,
           p.batch);
  if (p.m == 0 || p.n == 0 || p.batch == 0) return;
  MS_CHECK(p.x && p.w && p.y, "gemm_bf16_batched: x, w and y must be set");
  MS_CHECK(p.x_stride >= p.k && p.y_stride >= p.n && p.w_stride >= (p.w_kn ? p.n : p.k),
           "gemm_bf16_batched: strides x {} w {} y {} are narrower than their rows (m {}, n {}, k {})",
           p.x_stride, p.w_stride, p.y_stride, p.m, p.n, p.k);
  BlasLtHandle::Impl& I = lt.impl();
  const uint32_t ax = alignment_of(p.x), aw = alignment_of(p.w), ay = alignment_of(p.y);
  const std::array<int64_t, 15> key{p.m,
                                    p.n,
                                    p.k,
                                    p.batch,
                                    p.x_stride,
                                    p.w_stride,
                                    p.y_stride,
                                    p.x_batch_stride,
                                    p.w_batch_stride,
                                    p.y_batch_stride,
                                    p.w_kn,
                                    ax,
                                    aw,
                                    ay,
                                    0};
  auto it = I.batched.find(key);
  if (it == I.batched.end()) {
    auto plan = std::make_unique<Plan>();
    LT_CHECK(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    // Column-major: D_b [n, m] = op(A_b) [n, k] x B_b [k, m]; A as stored is [k, n] (ld w_stride, op T) for W
    // [n, k] row-major, or [n, k] (ld w_stride, op N) for W [k, n] row-major.
    const cublasOperation_t ta = p.w_kn ? CUBLAS_OP_N : CUBLAS_OP_T, tb = CUBLAS_OP_N;
    LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (p.w_kn) {
      LT_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, static_cast<uint64_t>(p.n),
                                          static_cast<uint64_t>(p.k), p.w_stride));
    } else {
      LT_CHECK(cublasLtMatrixLayoutCreate(&plan->a, CUDA_R_16BF, static_cast<uint64_t>(p.k),
                                          static_cast<uint64_t>(p.n), p.w_stride));
    }
    LT_CHECK(cublasLtMatrixLayoutCreate(&plan->b, CUDA_R_16BF, static_cast<uint64_t>(p.k),
                                        static_cast<uint64_t>(p.m), p.x_stride));
    LT_CHECK(cublasLtMatrixLayoutCreate(&plan->d, CUDA_R_32F, static_cast<uint64_t>(p.n),
                                        static_cast<uint64_t>(p.m), p.y_stride));
    const int32_t batch = static_cast<int32_t>(p.batch);
    const struct {
      cublasLtMatrixLayout_t l;
      int64_t stride;
    } layouts[] = {{plan->a, p.w_batch_stride}, {plan->b, p.x_batch_stride}, {plan->d, p.y_batch_stride}};
    for (const auto& l : layouts) {
      LT_CHECK(
          cublasLtMatrixLayoutSetAttribute(l.l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof batch));
      LT_CHECK(cublasLtMatrixLayoutSetAttribute(l.l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &l.stride,
                                                sizeof l.stride));
    }
    Preference pref;
    pref.set<uint64_t>(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, I.workspace_bytes);
    pref.set<uint32_t>(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, aw);
    pref.set<uint32_t>(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, ax);
    pref.set<uint32_t>(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, ay);
    pref.set<uint32_t>(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, ay);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    LT_CHECK(cublasLtMatmulAlgoGetHeuristic(I.handle, plan->desc, plan->a, plan->b, plan->d, plan->d,
                                            pref.pref, 1, &result, &found));
    MS_CHECK(found > 0, "cuBLASLt has no algorithm for a batched bf16 GEMM m={} n={} k={} batch={}", p.m, p.n,
             p.k, p.batch);
    plan->algo = result.algo;
    it = I.batched.emplace(key, std::move(plan)).first;
  }
  const Plan& plan = *it->second;
  const float alpha = 1.0f, beta = 0.0f;
  LT_CHECK(cublasLtMatmul(I.handle, plan.desc, &alpha, p.w, plan.a, p.x, plan.b, &beta, p.y, plan.d, p.y,
                          plan.d, &plan.algo, I.workspace, I.workspace_bytes, stream));
}

void gemm_bf16(const GemmBf16Params& p, BlasLtHandle& lt, cudaStream_t stream) {
  MS_CHECK(p.m >= 0 && p.n >= 0 && p.k > 0, "gemm_bf16: m = {}, n = {}, k = {} (k must be positive)", p.m,
           p.n, p.k);
  check_matrix(p.x_bf16, p.m, p.k, p.x_bf16_stride, "gemm_bf16", "x_bf16");
  check_matrix(p.w, p.n, p.k, p.w_stride, "gemm_bf16", "w");
  check_matrix(p.y, p.m, p.n, p.y_stride, "gemm_bf16", "y");
  if (p.x_f32) check_matrix(p.x_f32, p.m, p.k, p.x_f32_stride, "gemm_bf16", "x_f32");
  if (p.m == 0 || p.n == 0) return;
  if (p.x_f32) {
    CastBf16Params c;
    c.x = p.x_f32;
    c.x_stride = p.x_f32_stride;
    c.out = p.x_bf16;
    c.out_stride = p.x_bf16_stride;
    c.m = p.m;
    c.n = p.k;
    cast_f32_to_bf16(c, stream);
  }
  lt.impl().run(CUDA_R_16BF, p.x_bf16, p.x_bf16_stride, p.w, p.w_stride, p.y, p.y_stride, p.m, p.n, p.k,
                stream);
}

void gemm_f32(const GemmF32Params& p, BlasLtHandle& lt, cudaStream_t stream) {
  MS_CHECK(p.m >= 0 && p.n >= 0 && p.k > 0, "gemm_f32: m = {}, n = {}, k = {} (k must be positive)", p.m, p.n,
           p.k);
  check_matrix(p.x, p.m, p.k, p.x_stride, "gemm_f32", "x");
  check_matrix(p.w, p.n, p.k, p.w_stride, "gemm_f32", "w");
  check_matrix(p.y, p.m, p.n, p.y_stride, "gemm_f32", "y");
  if (p.m == 0 || p.n == 0) return;
  lt.impl().run(CUDA_R_32F, p.x, p.x_stride, p.w, p.w_stride, p.y, p.y_stride, p.m, p.n, p.k, stream);
}

void gemm_fp8(const GemmFp8Params& p, BlasLtHandle& lt, cudaStream_t stream) {
  MS_CHECK(p.m >= 0 && p.n >= 0 && p.k > 0 && p.k % 16 == 0,
           "gemm_fp8: m = {}, n = {}, k = {} (k must be a positive multiple of 16)", p.m, p.n, p.k);
  MS_CHECK(p.x_stride % 16 == 0 && p.w_stride % 16 == 0,
           "gemm_fp8: x_stride {} and w_stride {} must be multiples of 16 bytes", p.x_stride, p.w_stride);
  MS_CHECK(alignment_of(p.x) >= 16 && alignment_of(p.w) >= 16 && alignment_of(p.y) >= 16,
           "gemm_fp8: x, w and y must be 16-byte aligned");
  MS_CHECK(p.y_stride % 4 == 0, "gemm_fp8: y_stride {} must be a multiple of 4 floats", p.y_stride);
  check_matrix(p.x, p.m, p.k, p.x_stride, "gemm_fp8", "x");
  check_matrix(p.w, p.n, p.k, p.w_stride, "gemm_fp8", "w");
  check_matrix(p.y, p.m, p.n, p.y_stride, "gemm_fp8", "y");
  if (p.m == 0 || p.n == 0) return;
  lt.impl().run(CUDA_R_8F_E4M3, p.x, p.x_stride, p.w, p.w_stride, p.y, p.y_stride, p.m, p.n, p.k, stream,
                p.scale);
}

}  // namespace ms::cuda
