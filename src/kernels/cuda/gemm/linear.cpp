#include "kernels/cuda/gemm/linear.h"

#include "core/error.h"
#include "kernels/cuda/gemm/dequant_weight.h"
#include "kernels/cuda/gemm/direct_linear.h"

namespace ms::cuda {

const char* linear_path_name(LinearPath p) {
  switch (p) {
    case LinearPath::Direct:
      return "direct";
    case LinearPath::BlasLtF32:
      return "cublaslt-f32";
    case LinearPath::BlasLtBf16:
      return "cublaslt-bf16";
    case LinearPath::DequantBlasLt:
      return "dequant-cublaslt-bf16";
    case LinearPath::GemvBf16:
      return "gemv-bf16";
    case LinearPath::GemvFp8Block:
      return "gemv-fp8-block";
  }
  return "unknown";
}

LinearScratchBytes linear_scratch_bytes(LinearPath path, int64_t m, int64_t n, int64_t k) {
  LinearScratchBytes s;
  const size_t mk = static_cast<size_t>(m > 0 ? m : 0) * static_cast<size_t>(k > 0 ? k : 0);
  const size_t nk = static_cast<size_t>(n > 0 ? n : 0) * static_cast<size_t>(k > 0 ? k : 0);
  if (path == LinearPath::BlasLtBf16 || path == LinearPath::DequantBlasLt) s.x_bytes = mk * 2;
  if (path == LinearPath::DequantBlasLt) s.w_bytes = nk * 2;
  if ((path == LinearPath::GemvBf16 || path == LinearPath::GemvFp8Block) && m > 0 && n > 0 && k > 0 &&
      m <= kBf16GemvMaxM && n <= INT32_MAX && k <= INT32_MAX) {
    const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
    const Bf16GemvScratch g = path == LinearPath::GemvBf16 ? bf16_gemv_scratch_bytes(mi, ni, ki)
                                                           : fp8_block_gemv_scratch_bytes(mi, ni, ki);
    s.gemv_partial_bytes = g.partial_bytes;
    s.gemv_counter_bytes = g.counter_bytes;
  }
  return s;
}

namespace {

// The decode GEMVs (bf16_gemv, fp8_block_gemv) take at most kBf16GemvMaxM rows and 32-bit sizes.
void check_gemv_shape(const LinearParams& p, LinearPath path, int64_t k) {
  MS_CHECK(p.m <= kBf16GemvMaxM && p.n <= INT32_MAX && k <= INT32_MAX,
           "linear: path {} takes at most {} rows (m = {}, n = {}, k = {})", linear_path_name(path),
           kBf16GemvMaxM, p.m, p.n, k);
}

}  // namespace

void linear(const LinearParams& p, LinearPath path, BlasLtHandle& lt, cudaStream_t stream) {
  check_weight(p.w, "linear");
  MS_CHECK(p.row0 >= 0 && p.n >= 0 && p.row0 + p.n <= p.w.rows,
           "linear: rows [{}, {}) outside the weight's {} rows", p.row0, p.row0 + p.n, p.w.rows);
  const int64_t k = p.w.cols;
  switch (path) {
    case LinearPath::Direct: {
      DirectLinearParams d;
      d.x = p.x;
      d.x_stride = p.x_stride;
      d.w = p.w;
      d.row0 = p.row0;
      d.n = p.n;
      d.y = p.y;
      d.y_stride = p.y_stride;
      d.m = p.m;
      direct_linear(d, stream);
      return;
    }
    case LinearPath::BlasLtF32: {
      MS_CHECK(p.w.format == WeightFormat::F32, "linear: path {} needs f32 weights, got {}",
               linear_path_name(path), weight_format_name(p.w.format));
      GemmF32Params g;
      g.x = p.x;
      g.x_stride = p.x_stride;
      g.w = static_cast<const float*>(p.w.data) + p.row0 * k;
      g.w_stride = k;
      g.y = p.y;
      g.y_stride = p.y_stride;
      g.m = p.m;
      g.n = p.n;
      g.k = k;
      gemm_f32(g, lt, stream);
      return;
    }
    case LinearPath::GemvBf16: {
      MS_CHECK(p.w.format == WeightFormat::BF16, "linear: path {} needs bf16 weights, got {}",
               linear_path_name(path), weight_format_name(p.w.format));
      if (p.m == 0 || p.n == 0) return;
      check_gemv_shape(p, path, k);
      Bf16GemvParams g;
      g.x = p.x;
      g.x_stride = p.x_stride;
      g.w = static_cast<const __nv_bfloat16*>(p.w.data) + p.row0 * k;
      g.w_stride = k;
      g.y = p.y;
      g.y_stride = p.y_stride;
      g.m = static_cast<int>(p.m);
      g.n = static_cast<int>(p.n);
      g.k = static_cast<int>(k);
      g.partial = p.gemv_partial;
      g.counters = p.gemv_counters;
      bf16_gemv(g, stream);
      return;
    }
    case LinearPath::GemvFp8Block: {
      MS_CHECK(p.w.format == WeightFormat::FP8Block && p.w.block == 128,
               "linear: path {} needs FP8-block weights with 128 x 128 blocks, got {} (block {})",
               linear_path_name(path), weight_format_name(p.w.format), p.w.block);
      if (p.m == 0 || p.n == 0) return;
      check_gemv_shape(p, path, k);
      Fp8BlockGemvParams g;
      g.x = p.x;
      g.x_stride = p.x_stride;
      g.w = static_cast<const uint8_t*>(p.w.data);
      g.w_scale = static_cast<const float*>(p.w.scale);
      g.row0 = p.row0;
      g.y = p.y;
      g.y_stride = p.y_stride;
      g.m = static_cast<int>(p.m);
      g.n = static_cast<int>(p.n);
      g.k = static_cast<int>(k);
      g.partial = p.gemv_partial;
      g.counters = p.gemv_counters;
      fp8_block_gemv(g, stream);
      return;
    }
    case LinearPath::BlasLtBf16:
    case LinearPath::DequantBlasLt: {
      const bool dequant = path == LinearPath::DequantBlasLt;
      MS_CHECK(dequant || p.w.format == WeightFormat::BF16, "linear: path {} needs bf16 weights, got {}",
               linear_path_name(path), weight_format_name(p.w.format));
      MS_CHECK(p.m == 0 || p.x_scratch != nullptr, "linear: path {} needs x_scratch ({} bytes)",
               linear_path_name(path), linear_scratch_bytes(path, p.m, p.n, k).x_bytes);
      MS_CHECK(!dequant || p.n == 0 || p.w_scratch != nullptr, "linear: path {} needs w_scratch ({} bytes)",
               linear_path_name(path), linear_scratch_bytes(path, p.m, p.n, k).w_bytes);
      GemmBf16Params g;
      if (dequant) {
        if (p.m == 0 || p.n == 0) return;
        DequantWeightParams d;
        d.w = p.w;
        d.row0 = p.row0;
        d.n = p.n;
        d.out_bf16 = p.w_scratch;
        d.out_stride = k;
        dequant_weight(d, stream);
        g.w = p.w_scratch;
      } else {
        g.w = static_cast<const __nv_bfloat16*>(p.w.data) + p.row0 * k;
      }
      g.w_stride = k;
      g.x_f32 = p.x;
      g.x_f32_stride = p.x_stride;
      g.x_bf16 = p.x_scratch;
      g.x_bf16_stride = k;
      g.y = p.y;
      g.y_stride = p.y_stride;
      g.m = p.m;
      g.n = p.n;
      g.k = k;
      gemm_bf16(g, lt, stream);
      return;
    }
  }
  MS_THROW("linear: unknown path {}", static_cast<int>(path));
}

}  // namespace ms::cuda
