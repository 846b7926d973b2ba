// The CUDA elementwise and KV-store kernels against the CPU reference kernels (kernels/cpu) on random inputs
// of several shapes, odd sizes and padded row strides. Outputs are poisoned with NaN before each run, so an
// unwritten element fails; padding between rows must stay poisoned.
// Tolerances: exact (bits) for copies, casts, adds, scales and the KV codecs; f32 reductions and
// transcendental functions 1e-5 relative (plus a small absolute term for values near zero).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <random>
#include <vector>

#include "cuda_test_util.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/paged_cache.h"
#include "kernels/cuda/elementwise/embedding.h"
#include "kernels/cuda/elementwise/norm.h"
#include "kernels/cuda/elementwise/pointwise.h"
#include "kernels/cuda/elementwise/rope.h"
#include "kernels/cuda/kv_store/kv_store.h"
#include "ops/ctx.h"
#include "ops/ops.h"
#include "quant/float_formats.h"

namespace {

using ms::test::DeviceBuffer;
using ms::test::expect_rows_close;
using ms::test::random_floats;
namespace cpu = ms::kernels::cpu;

constexpr double kF32Rtol = 1e-5, kF32Atol = 1e-6;

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = ms::quant::f32_to_bf16(v[i]);
  return out;
}

TEST(CudaEmbedding, MatchesCpu) {
  MS_REQUIRE_GPU();
  struct Case {
    int64_t vocab, hidden, m;
  };
  for (const Case c : {Case{50, 99, 7}, Case{1000, 256, 33}, Case{13, 1, 3}}) {
    for (bool bf16 : {false, true}) {
      const auto table = random_floats(static_cast<size_t>(c.vocab * c.hidden), 1);
      const auto table_bf16 = to_bf16(table);
      std::vector<int32_t> ids(static_cast<size_t>(c.m));
      std::mt19937 rng(2);
      for (auto& id : ids) id = static_cast<int32_t>(rng() % c.vocab);
      cpu::WeightView view;
      view.format = bf16 ? cpu::WeightFormat::BF16 : cpu::WeightFormat::F32;
      view.rows = c.vocab;
      view.cols = c.hidden;
      view.data = bf16 ? static_cast<const void*>(table_bf16.data()) : table.data();
      std::vector<float> ref(static_cast<size_t>(c.m * c.hidden));
      cpu::EmbeddingParams cp;
      cp.ids = ids.data();
      cp.table = view;
      cp.out = ref.data();
      cp.m = c.m;
      cpu::embedding(cp);

      DeviceBuffer<float> d_table(table);
      DeviceBuffer<uint16_t> d_table_bf16(table_bf16);
      DeviceBuffer<int32_t> d_ids(ids);
      const int64_t stride = c.hidden + 3;
      DeviceBuffer<float> d_out(static_cast<size_t>(c.m * stride));
      ms::cuda::EmbeddingParams p;
      p.ids = d_ids.get();
      p.table.format = bf16 ? ms::cuda::WeightFormat::BF16 : ms::cuda::WeightFormat::F32;
      p.table.rows = c.vocab;
      p.table.cols = c.hidden;
      p.table.data = bf16 ? static_cast<const void*>(d_table_bf16.get()) : d_table.get();
      p.out = d_out.get();
      p.out_stride = stride;
      p.m = c.m;
      ms::cuda::embedding(p, nullptr);
      expect_rows_close(d_out.download(), stride, ref, c.hidden, c.m, c.hidden, 0, 0, "embedding");
    }
  }
}

TEST(CudaEmbedding, OutOfRangeIdWritesNanAndReadsNothing) {
  MS_REQUIRE_GPU();
  const int64_t vocab = 10, hidden = 40;
  const auto table = random_floats(static_cast<size_t>(vocab * hidden), 3);
  const std::vector<int32_t> ids = {-1, 4, 10, 9, 1 << 30};
  DeviceBuffer<float> d_table(table);
  DeviceBuffer<int32_t> d_ids(ids);
  DeviceBuffer<float> d_out(ids.size() * hidden);
  CUDA_CHECK(cudaMemset(d_out.get(), 0, ids.size() * hidden * sizeof(float)));
  ms::cuda::EmbeddingParams p;
  p.ids = d_ids.get();
  p.table.format = ms::cuda::WeightFormat::F32;
  p.table.rows = vocab;
  p.table.cols = hidden;
  p.table.data = d_table.get();
  p.out = d_out.get();
  p.out_stride = hidden;
  p.m = static_cast<int64_t>(ids.size());
  ms::cuda::embedding(p, nullptr);
  const auto out = d_out.download();
  for (size_t i = 0; i < ids.size(); ++i) {
    const bool valid = ids[i] >= 0 && ids[i] < vocab;
    for (int64_t c = 0; c < hidden; ++c) {
      const float g = out[i * hidden + static_cast<size_t>(c)];
      if (valid)
        ASSERT_EQ(g, table[static_cast<size_t>(ids[i] * hidden + c)]) << "row " << i;
      else
        ASSERT_TRUE(std::isnan(g)) << "row " << i << " col " << c;
    }
  }
}

struct NormCase {
  int64_t m, n;
};
// Rows with n % 4 == 0 and strides of whole float4s take the register kernels (up to 16384 elements); the
// padded strides below (n + 1 .. n + 5) keep the looped kernels covered on the same rows.
const NormCase kNormCases[] = {{1, 7},    {5, 129},  {33, 1024}, {3, 7168},  {2, 1},
                               {1, 6144}, {4, 2048}, {3, 512},   {2, 16384}, {1, 20000}};

TEST(CudaNorm, RmsNormMatchesCpu) {
  MS_REQUIRE_GPU();
  for (const NormCase c : kNormCases) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool in_place = variant & 1, vec = variant & 2;  // vec: strides of whole float4s
      const int64_t xs = vec ? c.n + 4 : c.n + 3, os = in_place ? xs : (vec ? c.n + 8 : c.n + 5);
      const auto x = random_floats(static_cast<size_t>(c.m * xs), 10, 0.3f, 2.0f);
      const auto w = random_floats(static_cast<size_t>(c.n), 11);
      std::vector<float> ref(static_cast<size_t>(c.m * c.n));
      cpu::NormParams cp;
      cp.x = x.data();
      cp.x_stride = xs;
      cp.weight = w.data();
      cp.out = ref.data();
      cp.out_stride = c.n;
      cp.m = c.m;
      cp.n = c.n;
      cp.eps = 1e-5f;
      cpu::rms_norm(cp);
      DeviceBuffer<float> d_x(x), d_w(w);
      DeviceBuffer<float> d_out(static_cast<size_t>(c.m * os));
      if (in_place) {
        // Padding of an in-place buffer is the input's (not poison): re-poison it to check nothing writes it.
        std::vector<float> xp = x;
        for (int64_t r = 0; r < c.m; ++r)
          for (int64_t i = c.n; i < xs; ++i) xp[static_cast<size_t>(r * xs + i)] = NAN;
        d_x.upload(xp);
      }
      ms::cuda::RmsNormParams p;
      p.x = d_x.get();
      p.x_stride = xs;
      p.weight = d_w.get();
      p.out = in_place ? d_x.get() : d_out.get();
      p.out_stride = os;
      p.m = c.m;
      p.n = c.n;
      p.eps = 1e-5f;
      ms::cuda::rms_norm(p, nullptr);
      expect_rows_close(in_place ? d_x.download() : d_out.download(), os, ref, c.n, c.m, c.n, kF32Rtol,
                        kF32Atol, "rms_norm n=" + std::to_string(c.n));
    }
  }
}

TEST(CudaNorm, AddRmsNormMatchesCpuAddThenNorm) {
  MS_REQUIRE_GPU();
  for (const NormCase c : kNormCases) {
    for (int variant = 0; variant < 4; ++variant) {
      const bool out_is_delta = variant & 1, vec = variant & 2;  // vec: strides of whole float4s
      const int64_t hs = vec ? c.n + 4 : c.n + 1, ds = vec ? c.n + 8 : c.n + 2,
                    os = out_is_delta ? ds : c.n + 4;
      const auto h = random_floats(static_cast<size_t>(c.m * hs), 20);
      const auto d = random_floats(static_cast<size_t>(c.m * ds), 21, 0.0f, 0.5f);
      const auto w = random_floats(static_cast<size_t>(c.n), 22);
      std::vector<float> h_ref(static_cast<size_t>(c.m * c.n)), ref(h_ref.size());
      for (int64_t r = 0; r < c.m; ++r) {
        for (int64_t i = 0; i < c.n; ++i) h_ref[r * c.n + i] = h[r * hs + i];
        cpu::add_inplace(h_ref.data() + r * c.n, d.data() + r * ds, c.n);
      }
      cpu::NormParams cp;
      cp.x = h_ref.data();
      cp.x_stride = c.n;
      cp.weight = w.data();
      cp.out = ref.data();
      cp.out_stride = c.n;
      cp.m = c.m;
      cp.n = c.n;
      cp.eps = 1e-6f;
      cpu::rms_norm(cp);
      std::vector<float> hp = h, dp = d;  // padding poisoned: must stay untouched
      for (int64_t r = 0; r < c.m; ++r) {
        for (int64_t i = c.n; i < hs; ++i) hp[r * hs + i] = NAN;
        for (int64_t i = c.n; i < ds; ++i) dp[r * ds + i] = NAN;
      }
      DeviceBuffer<float> d_h(hp), d_d(dp), d_w(w);
      DeviceBuffer<float> d_out(static_cast<size_t>(c.m * os));
      ms::cuda::AddRmsNormParams p;
      p.h = d_h.get();
      p.h_stride = hs;
      p.delta = d_d.get();
      p.delta_stride = ds;
      p.weight = d_w.get();
      p.out = out_is_delta ? d_d.get() : d_out.get();
      p.out_stride = os;
      p.m = c.m;
      p.n = c.n;
      p.eps = 1e-6f;
      ms::cuda::add_rms_norm(p, nullptr);
      // The residual sum is one f32 add per element: exact.
      expect_rows_close(d_h.download(), hs, h_ref, c.n, c.m, c.n, 0, 0, "add_rms_norm h");
      expect_rows_close(out_is_delta ? d_d.download() : d_out.download(), os, ref, c.n, c.m, c.n, kF32Rtol,
                        kF32Atol, "add_rms_norm out n=" + std::to_string(c.n));
    }
  }
}

TEST(CudaNorm, LayerNormMatchesCpu) {
  MS_REQUIRE_GPU();
  for (const NormCase c : kNormCases) {
    for (bool with_bias : {true, false}) {
      const int64_t xs = c.n + 2, os = c.n + 1;
      const auto x = random_floats(static_cast<size_t>(c.m * xs), 30, 0.5f, 1.5f);
      const auto w = random_floats(static_cast<size_t>(c.n), 31);
      const auto b = random_floats(static_cast<size_t>(c.n), 32);
      std::vector<float> ref(static_cast<size_t>(c.m * c.n));
      cpu::NormParams cp;
      cp.x = x.data();
      cp.x_stride = xs;
      cp.weight = w.data();
      cp.bias = with_bias ? b.data() : nullptr;
      cp.out = ref.data();
      cp.out_stride = c.n;
      cp.m = c.m;
      cp.n = c.n;
      cp.eps = 1e-5f;
      cpu::layer_norm(cp);
      DeviceBuffer<float> d_x(x), d_w(w), d_b(b);
      DeviceBuffer<float> d_out(static_cast<size_t>(c.m * os));
      ms::cuda::LayerNormParams p;
      p.x = d_x.get();
      p.x_stride = xs;
      p.weight = d_w.get();
      p.bias = with_bias ? d_b.get() : nullptr;
      p.out = d_out.get();
      p.out_stride = os;
      p.m = c.m;
      p.n = c.n;
      p.eps = 1e-5f;
      ms::cuda::layer_norm(p, nullptr);
      // (x - mean) loses the mean's relative error: absolute term scaled to the inputs.
      expect_rows_close(d_out.download(), os, ref, c.n, c.m, c.n, kF32Rtol, 1e-5,
                        "layer_norm n=" + std::to_string(c.n));
    }
  }
}

TEST(CudaRope, MatchesCpuBothLayouts) {
  MS_REQUIRE_GPU();
  struct Case {
    int64_t m, heads, head_dim, head_stride, offset, dim;
  };
  for (const Case c : {Case{5, 3, 40, 44, 8, 32}, Case{70, 1, 64, 64, 0, 64}, Case{3, 16, 192, 192, 128, 64},
                       Case{2, 2, 6, 7, 4, 2}}) {
    for (bool interleaved : {false, true}) {
      for (float scaling : {1.0f, 1.2f}) {
        const int64_t row_stride = c.heads * c.head_stride + 4;
        auto x = random_floats(static_cast<size_t>(c.m * row_stride), 40);
        std::vector<int32_t> pos(static_cast<size_t>(c.m));
        std::mt19937 rng(41);
        for (auto& q : pos) q = static_cast<int32_t>(rng() % 100000);
        pos[0] = 0;
        std::vector<float> inv_freq(static_cast<size_t>(c.dim / 2));
        for (size_t i = 0; i < inv_freq.size(); ++i)
          inv_freq[i] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(c.dim));
        std::vector<float> ref = x;
        cpu::RopeParams cp;
        cp.x = ref.data();
        cp.row_stride = row_stride;
        cp.head_stride = c.head_stride;
        cp.offset = c.offset;
        cp.m = c.m;
        cp.heads = c.heads;
        cp.dim = c.dim;
        cp.positions = pos.data();
        cp.inv_freq = inv_freq.data();
        cp.attention_scaling = scaling;
        cp.interleaved = interleaved;
        cpu::rope(cp);
        DeviceBuffer<float> d_x(x), d_f(inv_freq);
        DeviceBuffer<int32_t> d_pos(pos);
        ms::cuda::RopeParams p;
        p.x = d_x.get();
        p.row_stride = row_stride;
        p.head_stride = c.head_stride;
        p.offset = c.offset;
        p.m = c.m;
        p.heads = c.heads;
        p.dim = c.dim;
        p.positions = d_pos.get();
        p.inv_freq = d_f.get();
        p.attention_scaling = scaling;
        p.interleaved = interleaved;
        ms::cuda::rope(p, nullptr);
        const auto got = d_x.download();
        // Channels outside the rotation (and the padding) keep their bits; rotated ones agree to f32
        // rounding of cos/sin (same f32 angle on both sides).
        int bad = 0;
        for (size_t i = 0; i < got.size() && bad < 5; ++i) {
          const bool same = ms::test::same_float(got[i], ref[i]);
          const bool close = std::fabs(got[i] - ref[i]) <= 1e-5 * (1.0 + std::fabs(ref[i]));
          const bool changed = !ms::test::same_float(x[i], ref[i]);
          if (!(same || (changed && close))) {
            ADD_FAILURE() << "rope m=" << c.m << " heads=" << c.heads << " interleaved=" << interleaved
                          << " at " << i << ": got " << got[i] << " want " << ref[i];
            ++bad;
          }
        }
      }
    }
  }
}

TEST(CudaPointwise, SiluMulMatchesCpu) {
  MS_REQUIRE_GPU();
  for (const NormCase c : {NormCase{1, 5}, NormCase{17, 300}, NormCase{64, 1536}}) {
    const int64_t xs = 2 * c.n + 1, os = c.n + 2;
    const auto x = random_floats(static_cast<size_t>(c.m * xs), 50, 0.0f, 3.0f);
    std::vector<float> ref(static_cast<size_t>(c.m * c.n));
    cpu::SiluMulParams cp;
    cp.x = x.data();
    cp.x_stride = xs;
    cp.out = ref.data();
    cp.out_stride = c.n;
    cp.m = c.m;
    cp.n = c.n;
    cpu::silu_mul(cp);
    DeviceBuffer<float> d_x(x), d_out(static_cast<size_t>(c.m * os));
    ms::cuda::SiluMulParams p;
    p.x = d_x.get();
    p.x_stride = xs;
    p.out = d_out.get();
    p.out_stride = os;
    p.m = c.m;
    p.n = c.n;
    ms::cuda::silu_mul(p, nullptr);
    expect_rows_close(d_out.download(), os, ref, c.n, c.m, c.n, kF32Rtol, kF32Atol, "silu_mul");
  }
}

TEST(CudaPointwise, AddAndScaleAreExact) {
  MS_REQUIRE_GPU();
  for (const NormCase c : {NormCase{1, 5}, NormCase{9, 333}, NormCase{70000, 3}}) {
    const int64_t ys = c.n + 1, xs = c.n + 3;
    const auto y = random_floats(static_cast<size_t>(c.m * ys), 60);
    const auto x = random_floats(static_cast<size_t>(c.m * xs), 61);
    std::vector<float> ref_add(static_cast<size_t>(c.m * c.n)), ref_scale(ref_add.size());
    for (int64_t r = 0; r < c.m; ++r) {
      for (int64_t i = 0; i < c.n; ++i) ref_add[r * c.n + i] = y[r * ys + i];
      cpu::add_inplace(ref_add.data() + r * c.n, x.data() + r * xs, c.n);
      for (int64_t i = 0; i < c.n; ++i) ref_scale[r * c.n + i] = ref_add[r * c.n + i] * 0.37f;
    }
    std::vector<float> yp = y;
    for (int64_t r = 0; r < c.m; ++r) yp[r * ys + c.n] = NAN;
    DeviceBuffer<float> d_y(yp), d_x(x);
    ms::cuda::AddInplaceParams a;
    a.y = d_y.get();
    a.y_stride = ys;
    a.x = d_x.get();
    a.x_stride = xs;
    a.m = c.m;
    a.n = c.n;
    ms::cuda::add_inplace(a, nullptr);
    expect_rows_close(d_y.download(), ys, ref_add, c.n, c.m, c.n, 0, 0, "add_inplace");
    ms::cuda::ScaleInplaceParams s;
    s.y = d_y.get();
    s.y_stride = ys;
    s.m = c.m;
    s.n = c.n;
    s.scale = 0.37f;
    ms::cuda::scale_inplace(s, nullptr);
    expect_rows_close(d_y.download(), ys, ref_scale, c.n, c.m, c.n, 0, 0, "scale_inplace");
  }
}

TEST(CudaPointwise, GatherRowsCopiesAndMarksBadIndices) {
  MS_REQUIRE_GPU();
  const int64_t rows = 20, n = 33, ss = 40, ds = 35;
  const auto src = random_floats(static_cast<size_t>(rows * ss), 70);
  const std::vector<int32_t> index = {3, 19, 0, -1, 20, 7, 7, 12, 1};
  const int64_t k = static_cast<int64_t>(index.size());
  std::vector<float> ref(static_cast<size_t>(k * n));
  for (int64_t i = 0; i < k; ++i)
    for (int64_t c = 0; c < n; ++c)
      ref[i * n + c] = (index[i] >= 0 && index[i] < rows) ? src[index[i] * ss + c] : NAN;
  DeviceBuffer<float> d_src(src), d_dst(static_cast<size_t>(k * ds));
  DeviceBuffer<int32_t> d_idx(index);
  CUDA_CHECK(cudaMemset(d_dst.get(), 0, static_cast<size_t>(k * ds) * sizeof(float)));  // NaN must be written
  for (int64_t i = 0; i < k; ++i)
    CUDA_CHECK(cudaMemset(d_dst.get() + i * ds + n, 0xff, static_cast<size_t>(ds - n) * sizeof(float)));
  ms::cuda::GatherRowsParams p;
  p.src = d_src.get();
  p.src_stride = ss;
  p.src_rows = rows;
  p.index = d_idx.get();
  p.dst = d_dst.get();
  p.dst_stride = ds;
  p.k = k;
  p.n = n;
  ms::cuda::gather_rows(p, nullptr);
  const auto got = d_dst.download();
  for (int64_t i = 0; i < k; ++i)
    for (int64_t c = 0; c < ds; ++c) {
      const float want = c < n ? ref[i * n + c] : NAN;
      ASSERT_TRUE(ms::test::same_float(got[i * ds + c], want)) << "row " << i << " col " << c;
    }
}

// An expert-parallel rank's router ids to its local slots: against the CPU op's rule (negative id -> -1),
// with ids past the map giving -1, and more ids than one pass of the capped grid covers.
TEST(CudaPointwise, RemapIdsMatchesTheMap) {
  MS_REQUIRE_GPU();
  const int64_t n_map = 257, n = 1500007;
  std::mt19937 rng(91);
  std::vector<int32_t> map(static_cast<size_t>(n_map)), ids(static_cast<size_t>(n));
  for (auto& m : map) m = static_cast<int32_t>(rng() % 5) == 0 ? -1 : static_cast<int32_t>(rng() % 64);
  for (auto& v : ids) v = static_cast<int32_t>(rng() % (n_map + 20)) - 10;  // negatives and past the map
  DeviceBuffer<int32_t> d_ids(ids), d_map(map), d_out(static_cast<size_t>(n));
  // Poison that no output takes (0xff bytes would be -1, a legitimate answer).
  CUDA_CHECK(cudaMemset(d_out.get(), 0x7b, static_cast<size_t>(n) * sizeof(int32_t)));
  ms::cuda::RemapIdsParams p;
  p.ids = d_ids.get();
  p.map = d_map.get();
  p.out = d_out.get();
  p.n = n;
  p.n_map = n_map;
  ms::cuda::remap_ids(p, nullptr);
  const auto got = d_out.download();
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = ids[static_cast<size_t>(i)];
    const int32_t want = id < 0 || id >= n_map ? -1 : map[static_cast<size_t>(id)];
    ASSERT_EQ(got[static_cast<size_t>(i)], want) << "id " << id << " at " << i;
  }
}

// Router ids to local slots with replicated experts: against the CPU op on random tables (copies 1 to R,
// some slots elsewhere), with negative ids and bad entries giving -1, and more assignments than one pass of
// the capped grid covers.
TEST(CudaPointwise, RemapIdsReplicatedMatchesTheCpuOp) {
  MS_REQUIRE_GPU();
  const int64_t E = 96, R = 4, m = 150001, k = 8;
  std::mt19937 rng(17);
  std::vector<int32_t> copies(static_cast<size_t>(E)), slots(static_cast<size_t>(E * R));
  for (auto& c : copies) c = 1 + static_cast<int32_t>(rng() % R);
  for (auto& s : slots) s = rng() % 3 == 0 ? -1 : static_cast<int32_t>(rng() % 40);
  std::vector<int32_t> ids(static_cast<size_t>(m * k));
  for (auto& v : ids) v = static_cast<int32_t>(rng() % (E + 1)) - 1;  // -1 .. E-1
  std::vector<int32_t> want(ids.size());
  {
    const ms::Tensor t_ids = ms::Tensor::borrow(ids.data(), {m, k}, ms::DType::I32);
    const ms::Tensor t_copies = ms::Tensor::borrow(copies.data(), {E}, ms::DType::I32);
    const ms::Tensor t_slots = ms::Tensor::borrow(slots.data(), {E, R}, ms::DType::I32);
    const ms::Tensor t_out = ms::Tensor::borrow(want.data(), {m, k}, ms::DType::I32);
    ms::ops::remap_ids_replicated(ms::ops::Ctx::cpu(), t_ids, t_copies, t_slots, t_out);
  }
  // Bad entries the kernel must map to -1 (the CPU op would throw): an id past the table, a copy count of 0.
  std::vector<int32_t> gpu_ids = ids, gpu_copies = copies;
  gpu_ids[3] = static_cast<int32_t>(E + 5);
  gpu_copies[static_cast<size_t>(gpu_ids[11] < 0 ? 0 : gpu_ids[11])] = 0;
  DeviceBuffer<int32_t> d_ids(gpu_ids), d_copies(gpu_copies), d_slots(slots), d_out(ids.size());
  CUDA_CHECK(cudaMemset(d_out.get(), 0x7b, ids.size() * sizeof(int32_t)));
  ms::cuda::RemapIdsReplicatedParams p;
  p.ids = d_ids.get();
  p.copies = d_copies.get();
  p.slots = d_slots.get();
  p.out = d_out.get();
  p.m = m;
  p.k = k;
  p.n_experts = E;
  p.max_copies = R;
  ms::cuda::remap_ids_replicated(p, nullptr);
  const auto got = d_out.download();
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t e = gpu_ids[i];
    const bool bad = e >= E || (e >= 0 && gpu_copies[static_cast<size_t>(e)] == 0);
    ASSERT_EQ(got[i], bad ? -1 : want[i]) << "assignment " << i << " expert " << e;
  }
}

// The router's choice widened by the shared expert: against the CPU op, more rows than one pass of the
// capped grid covers, outputs poisoned first.
TEST(CudaPointwise, AppendExpertSlotMatchesTheCpuOp) {
  MS_REQUIRE_GPU();
  const int64_t m = 120001, k = 8;
  std::mt19937 rng(19);
  std::vector<int32_t> ids(static_cast<size_t>(m * k));
  std::vector<float> wts(ids.size());
  for (auto& v : ids) v = static_cast<int32_t>(rng() % 257) - 1;
  for (auto& w : wts) w = static_cast<float>(rng() % 1000) / 997.0f;
  std::vector<int32_t> want_ids(static_cast<size_t>(m * (k + 1)));
  std::vector<float> want_wts(want_ids.size());
  ms::ops::append_expert_slot(ms::ops::Ctx::cpu(), ms::Tensor::borrow(ids.data(), {m, k}, ms::DType::I32),
                              ms::Tensor::borrow(wts.data(), {m, k}, ms::DType::F32), 256, 1.0f,
                              ms::Tensor::borrow(want_ids.data(), {m, k + 1}, ms::DType::I32),
                              ms::Tensor::borrow(want_wts.data(), {m, k + 1}, ms::DType::F32));
  DeviceBuffer<int32_t> d_ids(ids), d_ids_out(want_ids.size());
  DeviceBuffer<float> d_wts(wts), d_wts_out(want_wts.size());
  CUDA_CHECK(cudaMemset(d_ids_out.get(), 0x7b, want_ids.size() * sizeof(int32_t)));
  CUDA_CHECK(cudaMemset(d_wts_out.get(), 0xff, want_wts.size() * sizeof(float)));  // NaN
  ms::cuda::AppendExpertSlotParams p;
  p.ids = d_ids.get();
  p.wts = d_wts.get();
  p.ids_out = d_ids_out.get();
  p.wts_out = d_wts_out.get();
  p.m = m;
  p.k = static_cast<int>(k);
  p.id = 256;
  p.weight = 1.0f;
  ms::cuda::append_expert_slot(p, nullptr);
  const auto got_ids = d_ids_out.download();
  const auto got_wts = d_wts_out.download();
  for (size_t i = 0; i < want_ids.size(); ++i) {
    ASSERT_EQ(got_ids[i], want_ids[i]) << "slot " << i;
    ASSERT_EQ(got_wts[i], want_wts[i]) << "slot " << i;
  }
}

// n = 301: one column a thread; n = 300 with strides multiples of 4: four columns a thread (16-byte loads).
TEST(CudaPointwise, CastBf16IsBitExact) {
  MS_REQUIRE_GPU();
  for (const auto& [m, n, xs, os] :
       {std::array<int64_t, 4>{7, 301, 305, 304}, std::array<int64_t, 4>{5, 300, 304, 308}}) {
    SCOPED_TRACE("n " + std::to_string(n));
    auto x = random_floats(static_cast<size_t>(m * xs), 80, 0.0f, 100.0f);
    const float special[] = {
        0.0f,     -0.0f,  NAN,     -NAN,        INFINITY,    -INFINITY, 3.4e38f,
        -3.4e38f, 1e-40f, -1e-45f, 1.00390625f, 1.01171875f, 65504.0f,  1.0f + 1.0f / 256};
    for (size_t i = 0; i < std::size(special); ++i) x[i] = special[i];
    DeviceBuffer<float> d_x(x);
    DeviceBuffer<uint16_t> d_out(static_cast<size_t>(m * os));
    ms::cuda::CastBf16Params p;
    p.x = d_x.get();
    p.x_stride = xs;
    p.out = reinterpret_cast<__nv_bfloat16*>(d_out.get());
    p.out_stride = os;
    p.m = m;
    p.n = n;
    ms::cuda::cast_f32_to_bf16(p, nullptr);
    const auto got = d_out.download();
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < os; ++c) {
        const uint16_t want = c < n ? ms::quant::f32_to_bf16(x[r * xs + c]) : uint16_t{0xffff};
        ASSERT_EQ(got[r * os + c], want) << "row " << r << " col " << c << " x " << x[r * xs + c];
      }
  }
}

// The whole cache (poisoned with 0xff bytes) must equal the CPU reference's after writing the valid rows.
void kv_store_case(cpu::CacheFormat cf, int64_t num_pages, int64_t page_size, int64_t width, float scale,
                   uint32_t seed) {
  const int64_t m = 23, xs = width + 5, total = num_pages * page_size;
  auto x = random_floats(static_cast<size_t>(m * xs), seed, 0.0f, 3.0f * scale * 40.0f);
  // Codec edges: saturation, NaN, infinities, f32 subnormals, exact fp8 ties (scale a power of two).
  const float special[] = {1e6f,
                           -1e6f,
                           NAN,
                           INFINITY,
                           -INFINITY,
                           1e-40f,
                           -0.0f,
                           464.0f * scale,
                           480.0f * scale,
                           1.0625f * scale,
                           1.1875f * scale,
                           0x1p-10f * scale,
                           0x3p-10f * scale};
  for (size_t i = 0; i < std::size(special); ++i) x[i] = special[i];
  std::vector<int64_t> slots(static_cast<size_t>(m));
  std::vector<int64_t> perm(static_cast<size_t>(total));
  for (int64_t i = 0; i < total; ++i) perm[i] = i;
  std::mt19937 rng(seed + 1);
  std::shuffle(perm.begin(), perm.end(), rng);
  // Distinct slots (a slot written twice would race), the cache's last slot among them.
  std::swap(*std::find(perm.begin(), perm.end(), total - 1), perm[static_cast<size_t>(m - 1)]);
  for (int64_t r = 0; r < m; ++r) slots[r] = perm[r];
  slots[3] = -1;
  slots[10] = total;  // past the cache: skipped too
  const size_t esize = cf == cpu::CacheFormat::F32 ? 4 : cf == cpu::CacheFormat::BF16 ? 2 : 1;
  const size_t bytes = static_cast<size_t>(total * width) * esize;
  std::vector<uint8_t> ref(bytes, 0xff);
  cpu::PagedCacheView view;
  view.data = ref.data();
  view.format = cf;
  view.scale = scale;
  view.num_pages = num_pages;
  view.page_size = page_size;
  view.width = width;
  for (int64_t r = 0; r < m; ++r) {
    if (slots[r] < 0 || slots[r] >= total) continue;
    cpu::CacheWriteParams cp;
    cp.cache = view;
    cp.x = x.data() + r * xs;
    cp.x_stride = xs;
    cp.slots = &slots[r];
    cp.m = 1;
    cpu::cache_write(cp);
  }
  DeviceBuffer<float> d_x(x);
  DeviceBuffer<int64_t> d_slots(slots);
  DeviceBuffer<uint8_t> d_cache(bytes);
  ms::cuda::KvStoreParams p;
  p.x = d_x.get();
  p.x_stride = xs;
  p.slots = d_slots.get();
  p.m = m;
  p.cache = d_cache.get();
  p.format = cf == cpu::CacheFormat::F32    ? ms::cuda::KvCacheFormat::F32
             : cf == cpu::CacheFormat::BF16 ? ms::cuda::KvCacheFormat::BF16
                                            : ms::cuda::KvCacheFormat::FP8E4M3;
  p.scale = scale;
  p.num_pages = num_pages;
  p.page_size = page_size;
  p.width = width;
  ms::cuda::kv_store(p, nullptr);
  const auto got = d_cache.download();
  for (size_t i = 0; i < bytes; ++i) {
    ASSERT_EQ(got[i], ref[i]) << "format " << static_cast<int>(cf) << " byte " << i << " (slot "
                              << i / esize / width << ", channel " << (i / esize) % width << ")";
  }
}

TEST(CudaKvStore, MatchesCpuCacheWriteByteForByte) {
  MS_REQUIRE_GPU();
  for (auto cf : {cpu::CacheFormat::F32, cpu::CacheFormat::BF16, cpu::CacheFormat::FP8E4M3}) {
    kv_store_case(cf, 5, 16, 576, 0.5f, 90);
    kv_store_case(cf, 2, 64, 75, 0.37f, 91);
    kv_store_case(cf, 40, 1, 1, 1.0f, 92);
  }
}

TEST(CudaChecks, LaunchersRefuseBadFields) {
  // Host checks throw before anything touches the device.
  float dummy[8] = {};
  ms::cuda::RmsNormParams r;
  r.x = dummy;
  r.out = dummy;
  r.weight = dummy;
  r.m = 2;
  r.n = 4;
  r.x_stride = 3;  // smaller than n
  r.out_stride = 4;
  EXPECT_THROW(ms::cuda::rms_norm(r, nullptr), ms::Error);
  ms::cuda::KvStoreParams k;
  k.x = dummy;
  k.x_stride = 4;
  k.m = 1;
  k.slots = reinterpret_cast<const int64_t*>(dummy);
  k.cache = dummy;
  k.format = ms::cuda::KvCacheFormat::FP8E4M3;
  k.scale = 0.0f;
  k.num_pages = 1;
  k.page_size = 1;
  k.width = 4;
  EXPECT_THROW(ms::cuda::kv_store(k, nullptr), ms::Error);
  ms::cuda::RopeParams q;
  q.x = dummy;
  q.m = 1;
  q.heads = 1;
  q.dim = 3;  // odd
  EXPECT_THROW(ms::cuda::rope(q, nullptr), ms::Error);
  ms::cuda::AddRmsNormParams a;
  a.h = dummy;
  a.delta = dummy;
  a.out = dummy + 4;
  a.weight = dummy;
  a.h_stride = a.delta_stride = a.out_stride = 4;
  a.m = 1;
  a.n = 4;
  EXPECT_THROW(ms::cuda::add_rms_norm(a, nullptr), ms::Error);  // delta aliases h
}

}  // namespace
