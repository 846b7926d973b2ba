#if MOESERVE_HAVE_CUDA
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/launch.h"
#include "kernels/cuda/elementwise/pointwise.h"
#include "kernels/cuda/gemm/dequant_weight.h"
#include "kernels/cuda/gemm/linear.h"
#include "kernels/cuda/nvfp4_gemv/nvfp4_gemv.h"
#include "ops/cuda/backend_impl.h"
#include "ops/cuda/cuda_ops.h"

namespace ms::ops::cuda_ops {

cuda::DeviceWeight device_weight(const LinearWeight& w) {
  MS_CHECK(w.weight.device() == Device::CUDA, "linear {}: the weight is not on the GPU", w.name);
  cuda::DeviceWeight d;
  d.format = static_cast<cuda::WeightFormat>(static_cast<uint8_t>(w.format));
  d.rows = w.out;
  d.cols = w.in;
  d.data = w.weight.raw();
  d.scale = (w.scale.defined() && w.scale.numel() > 0) ? w.scale.raw() : nullptr;
  d.scale2 = w.scale2;
  d.block = w.block;
  return d;
}

namespace {

// NVFP4 weights and a decode batch: the split-K tensor-core GEMV reads the packed weights once for all rows.
// A row slice [row0, row0 + n) starts 16-byte aligned whenever the weight does (k % 32 == 0).
bool use_nvfp4_gemv(const LinearWeight& w, int64_t m, int64_t n) {
  return w.format == WeightFormat::NVFP4 && m >= 1 && m <= cuda::kNvfp4GemvMaxM && w.in % 32 == 0 &&
         n <= INT32_MAX && w.in <= INT32_MAX && cuda::is_aligned(w.weight.raw(), 16) &&
         cuda::is_aligned(w.scale.raw(), 2);
}

// Rows of x read in place as f32 by the GEMVs (float4 loads); otherwise they go through a bf16 cast.
bool x_f32_direct(const Tensor& x) {
  return cuda::is_aligned(x.data<float>(), 16) && x.stride(0) % 4 == 0;
}

}  // namespace

void linear_rows(const Ctx& ctx, const Tensor& x, const LinearWeight& w, int64_t row0, const Tensor& y) {
  CudaBackend::Impl& be = cuda_impl(ctx);
  const cudaStream_t stream = cuda_stream(ctx);
  const int64_t m = x.size(0), n = y.size(1), k = w.in;
  if (m == 0) return;
  if (!be.exact_linear && use_nvfp4_gemv(w, m, n)) {
    cuda::Nvfp4GemvParams p;
    p.w = static_cast<const uint8_t*>(w.weight.raw()) + row0 * (k / 2);
    p.w_scale = static_cast<const uint8_t*>(w.scale.raw()) + row0 * (k / 16);
    p.w_scale2 = w.scale2;
    p.x = nullptr;
    if (x_f32_direct(x)) {
      p.x_f32 = x.data<float>();
      p.x_f32_stride = x.stride(0);
    } else {
      auto* xb = static_cast<__nv_bfloat16*>(be.linear_x.get(static_cast<size_t>(m * k) * 2, stream));
      cuda::CastBf16Params c;
      c.x = x.data<float>();
      c.x_stride = x.stride(0);
      c.out = xb;
      c.out_stride = k;
      c.m = m;
      c.n = k;
      cuda::cast_f32_to_bf16(c, stream);
      p.x = xb;
    }
    p.y = y.data<float>();
    p.y_stride = y.stride(0);
    p.m = static_cast<int>(m);
    p.n = static_cast<int>(n);
    p.k = static_cast<int>(k);
    const size_t ws = cuda::nvfp4_gemv_workspace_bytes(p.m, p.n, p.k);
    p.workspace = ws ? static_cast<float*>(be.gemv_ws.get(ws, stream)) : nullptr;
    if (ws)
      p.counters =
          static_cast<uint32_t*>(be.gemv_counters.get_zeroed(cuda::nvfp4_gemv_counter_bytes(p.n), stream));
    cuda::nvfp4_gemv(p, stream);
    return;
  }
  cuda::LinearParams p;
  p.x = x.data<float>();
  p.x_stride = x.stride(0);
  p.w = device_weight(w);
  p.row0 = row0;
  p.n = n;
  p.y = y.data<float>();
  p.y_stride = y.stride(0);
  p.m = m;
  cuda::LinearPath path = cuda::linear_plan(p.w.format, m, n, k);
  // The GEMVs load weight rows 16 bytes at a time; a weight stored at an odd offset (or FP8 blocks other
  // than 128 x 128) goes to cuBLASLt.
  if (path == cuda::LinearPath::GemvBf16 &&
      !cuda::is_aligned(static_cast<const __nv_bfloat16*>(p.w.data) + row0 * k, 16))
    path = cuda::LinearPath::BlasLtBf16;
  if (path == cuda::LinearPath::GemvFp8Block && (!cuda::is_aligned(p.w.data, 16) || p.w.block != 128))
    path = cuda::LinearPath::DequantBlasLt;
  if (be.exact_linear && (path == cuda::LinearPath::BlasLtBf16 || path == cuda::LinearPath::DequantBlasLt ||
                          path == cuda::LinearPath::GemvBf16 || path == cuda::LinearPath::GemvFp8Block)) {
    // f32 math throughout (parity tests): the weight rows expanded to f32, then an f32 GEMM (no TF32).
    auto* wf = static_cast<float*>(be.linear_w.get(static_cast<size_t>(n * k) * 4, stream));
    cuda::DequantWeightParams d;
    d.w = p.w;
    d.row0 = row0;
    d.n = n;
    d.out_f32 = wf;
    d.out_stride = k;
    cuda::dequant_weight(d, stream);
    cuda::GemmF32Params g;
    g.x = p.x;
    g.x_stride = p.x_stride;
    g.w = wf;
    g.w_stride = k;
    g.y = p.y;
    g.y_stride = p.y_stride;
    g.m = m;
    g.n = n;
    g.k = k;
    cuda::gemm_f32(g, be.lt, stream);
    return;
  }
  const cuda::LinearScratchBytes sb = cuda::linear_scratch_bytes(path, m, n, k);
  if (sb.x_bytes) p.x_scratch = static_cast<__nv_bfloat16*>(be.linear_x.get(sb.x_bytes, stream));
  if (sb.w_bytes) p.w_scratch = static_cast<__nv_bfloat16*>(be.linear_w.get(sb.w_bytes, stream));
  if (sb.gemv_partial_bytes)
    p.gemv_partial = static_cast<float*>(be.gemv_ws.get(sb.gemv_partial_bytes, stream));
  if (sb.gemv_counter_bytes)
    p.gemv_counters = static_cast<uint32_t*>(be.gemv_counters.get_zeroed(sb.gemv_counter_bytes, stream));
  cuda::linear(p, path, be.lt, stream);
}

}  // namespace ms::ops::cuda_ops
#endif
