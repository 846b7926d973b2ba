// MLA decode attention over the paged fp8 latent cache against a CPU reference written here: pages
// dequantised with the layer scale, scores and softmax in double, for short, page-edge and long sequences,
// 64 and 128 heads, f32 and bf16 outputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/mla_decode/mla_decode.h"
#include "quant/float_formats.h"

namespace {

using ms::cuda::kMlaHeadDim;
using ms::cuda::kMlaLatentDim;
using ms::cuda::kMlaPageSize;

template <typename T>
T* to_device(const std::vector<T>& h) {
  T* d = nullptr;
  CUDA_CHECK(cudaMalloc(&d, std::max<size_t>(1, h.size()) * sizeof(T)));
  if (!h.empty()) CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

struct Case {
  int heads;
  std::vector<int> lens;
  bool out_bf16;
  int split_target;  // 0: the device's multiprocessor count
};

void run_case(const Case& c, uint32_t seed) {
  const int batch = static_cast<int>(c.lens.size());
  const int max_pages =
      (*std::max_element(c.lens.begin(), c.lens.end()) + kMlaPageSize - 1) / kMlaPageSize + 1;
  int used_pages = 0;
  for (int len : c.lens) used_pages += (len + kMlaPageSize - 1) / kMlaPageSize;
  const int num_pages = used_pages + 3;  // a few pages nobody owns
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);

  // Pool: random fp8 values, except the unused tails of pages which hold NaN bytes (0x7f): a kernel that
  // lets them into the softmax or the value sum fails.
  std::vector<uint8_t> pool(static_cast<size_t>(num_pages) * kMlaPageSize * kMlaHeadDim, 0x7f);
  std::vector<int> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table(static_cast<size_t>(batch) * max_pages, 0);
  int next = 0;
  for (int b = 0; b < batch; ++b)
    for (int pg = 0; pg * kMlaPageSize < c.lens[b]; ++pg) {
      const int id = perm[next++];
      table[static_cast<size_t>(b) * max_pages + pg] = id;
      const int valid = std::min(kMlaPageSize, c.lens[b] - pg * kMlaPageSize);
      for (int t = 0; t < valid; ++t)
        for (int d = 0; d < kMlaHeadDim; ++d)
          pool[(static_cast<size_t>(id) * kMlaPageSize + t) * kMlaHeadDim + d] =
              ms::quant::f32_to_fp8_e4m3(dist(rng));
    }
  std::vector<uint16_t> q(static_cast<size_t>(batch) * c.heads * kMlaHeadDim);
  for (auto& v : q) v = ms::quant::f32_to_bf16(dist(rng));
  const float kv_scale = 0.5f, softmax_scale = 1.f / std::sqrt(256.f);

  // Reference.
  std::vector<double> ref(static_cast<size_t>(batch) * c.heads * kMlaLatentDim, 0.0);
  for (int b = 0; b < batch; ++b) {
    const int len = c.lens[b];
    std::vector<float> kv(static_cast<size_t>(len) * kMlaHeadDim);
    for (int t = 0; t < len; ++t) {
      const int id = table[static_cast<size_t>(b) * max_pages + t / kMlaPageSize];
      for (int d = 0; d < kMlaHeadDim; ++d)
        kv[static_cast<size_t>(t) * kMlaHeadDim + d] =
            ms::quant::fp8_e4m3_to_f32(
                pool[(static_cast<size_t>(id) * kMlaPageSize + t % kMlaPageSize) * kMlaHeadDim + d]) *
            kv_scale;
    }
    std::vector<double> s(len);
    for (int h = 0; h < c.heads; ++h) {
      const uint16_t* qh = q.data() + (static_cast<size_t>(b) * c.heads + h) * kMlaHeadDim;
      double mx = -1e300;
      for (int t = 0; t < len; ++t) {
        double acc = 0;
        for (int d = 0; d < kMlaHeadDim; ++d)
          acc += static_cast<double>(ms::quant::bf16_to_f32(qh[d])) *
                 kv[static_cast<size_t>(t) * kMlaHeadDim + d];
        s[t] = acc * softmax_scale;
        mx = std::max(mx, s[t]);
      }
      double sum = 0;
      for (int t = 0; t < len; ++t) sum += (s[t] = std::exp(s[t] - mx));
      double* out = ref.data() + (static_cast<size_t>(b) * c.heads + h) * kMlaLatentDim;
      for (int t = 0; t < len; ++t)
        for (int d = 0; d < kMlaLatentDim; ++d)
          out[d] += s[t] / sum * kv[static_cast<size_t>(t) * kMlaHeadDim + d];
    }
  }

  const int sms = c.split_target > 0 ? c.split_target : ms::cuda::query_device(0).multiprocessors;
  auto* dq = to_device(q);
  auto* dpool = to_device(pool);
  auto* dtable = to_device(table);
  auto* dlens = to_device(c.lens);
  void* dout = nullptr;
  const size_t out_elems = ref.size();
  CUDA_CHECK(cudaMalloc(&dout, out_elems * 4));
  void* ws = nullptr;
  CUDA_CHECK(cudaMalloc(&ws, ms::cuda::mla_decode_workspace_bytes(batch, c.heads, sms)));
  ms::cuda::MlaDecodeParams p;
  p.q = reinterpret_cast<const __nv_bfloat16*>(dq);
  p.q_batch_stride = static_cast<int64_t>(c.heads) * kMlaHeadDim;
  p.kv = dpool;
  p.kv_scale = kv_scale;
  p.block_table = dtable;
  p.block_table_stride = max_pages;
  p.seq_lens = dlens;
  p.out = dout;
  p.out_batch_stride = static_cast<int64_t>(c.heads) * kMlaLatentDim;
  p.out_bf16 = c.out_bf16;
  p.batch = batch;
  p.heads = c.heads;
  p.num_pages = num_pages;
  p.softmax_scale = softmax_scale;
  p.split_target = sms;
  p.workspace = ws;
  ms::cuda::mla_decode_plan(p, nullptr);
  ms::cuda::mla_decode(p, nullptr);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(out_elems);
  if (c.out_bf16) {
    std::vector<uint16_t> raw(out_elems);
    CUDA_CHECK(cudaMemcpy(raw.data(), dout, out_elems * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < out_elems; ++i) got[i] = ms::quant::bf16_to_f32(raw[i]);
  } else {
    CUDA_CHECK(cudaMemcpy(got.data(), dout, out_elems * 4, cudaMemcpyDeviceToHost));
  }
  // P enters the value product as bf16 (relative error 2^-9 per weight); the output is a convex combination
  // of values of size ~kv_scale, so errors are judged against the row's largest |value|, 1e-2 of it.
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < c.heads; ++h) {
      const size_t base = (static_cast<size_t>(b) * c.heads + h) * kMlaLatentDim;
      double scale = 1e-6, worst = 0;
      for (int d = 0; d < kMlaLatentDim; ++d) scale = std::max(scale, std::fabs(ref[base + d]));
      for (int d = 0; d < kMlaLatentDim; ++d) {
        ASSERT_TRUE(std::isfinite(got[base + d])) << "b=" << b << " h=" << h << " d=" << d;
        worst = std::max(worst, std::fabs(got[base + d] - ref[base + d]) / scale);
      }
      ASSERT_LT(worst, 1e-2) << "len=" << c.lens[b] << " b=" << b << " h=" << h << " heads=" << c.heads;
    }
  cudaFree(dq);
  cudaFree(dpool);
  cudaFree(dtable);
  cudaFree(dlens);
  cudaFree(dout);
  cudaFree(ws);
}

}  // namespace

TEST(MlaDecode, MatchesCpuReference64Heads) {
  if (ms::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  run_case({64, {1, 63, 64, 65, 1000, 5000}, false, 0}, 1);
  run_case({64, {5000}, false, 0}, 2);  // batch 1, long: many splits of one sequence
}

TEST(MlaDecode, MatchesCpuReference128HeadsBf16Out) {
  if (ms::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  run_case({128, {5000, 1, 65, 64, 1000, 63, 2048, 300}, true, 0}, 3);
  run_case({128, {1}, false, 0}, 4);
}

TEST(MlaDecode, FewSplitsAndPartialHeadGroup) {
  if (ms::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  run_case({16, {5000, 700}, false, 2},
           5);  // 16 heads (a tensor-parallel shard), two blocks' worth of splits
  run_case({96, {129, 4000, 0}, false, 0}, 6);  // an empty sequence gives zeros
}

TEST(MlaDecode, RefusesBadParams) {
  if (ms::cuda::device_count() == 0) GTEST_SKIP() << "no CUDA device";
  ms::cuda::MlaDecodeParams p;
  EXPECT_THROW(ms::cuda::mla_decode(p, nullptr), ms::Error);
  EXPECT_THROW(ms::cuda::mla_decode_plan(p, nullptr), ms::Error);
}
