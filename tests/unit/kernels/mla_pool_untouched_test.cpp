// MLA attention reads the paged pool in place: during the kernel no memory is allocated (a counting global
// operator new) and the pool's bytes are unchanged; FP8 pages give the result of dequantising them first.
#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <new>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/mla.h"
#include "kv/kv_pool.h"
#include "quant/float_formats.h"

namespace {
std::atomic<long> g_allocs{0};
}

void* operator new(size_t n) {
  g_allocs.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}

namespace ms {
namespace {

TEST(MlaAttention, ReadsThePoolInPlaceWithoutAllocating) {
  for (kv::KvCacheDType dt : {kv::KvCacheDType::BF16, kv::KvCacheDType::FP8E4M3}) {
    kv::KvPoolConfig pc;
    pc.num_layers = 1;
    pc.width = 80;
    pc.num_pages = 8;
    pc.page_size = 16;
    pc.dtype = dt;
    pc.scales = {0.05f};
    kv::KvPool pool(pc);
    const Tensor& data = pool.latent(0);
    uint8_t* bytes = static_cast<uint8_t*>(data.raw());
    for (size_t i = 0; i < data.nbytes(); ++i) bytes[i] = static_cast<uint8_t>((i * 131 + 7) % 251 % 120);
    const std::vector<uint8_t> before(bytes, bytes + data.nbytes());

    const int64_t m = 3, heads = 4, r = 64, w = 80;
    std::vector<int32_t> seq = {0, 0, 1}, pos = {20, 33, 5}, table = {3, 1, 6, 2, 0, 5, 7, 4};
    std::vector<float> q(static_cast<size_t>(m * heads * w)), lat(static_cast<size_t>(m * heads * r));
    for (size_t i = 0; i < q.size(); ++i) q[i] = std::sin(0.37 * static_cast<double>(i));
    kernels::cpu::MlaAttentionParams p;
    p.q_cat = q.data();
    p.kv.data = data.raw();
    p.kv.format =
        dt == kv::KvCacheDType::BF16 ? kernels::cpu::CacheFormat::BF16 : kernels::cpu::CacheFormat::FP8E4M3;
    p.kv.scale = pool.scale(0);
    p.kv.num_pages = 8;
    p.kv.page_size = 16;
    p.kv.width = w;
    p.lat = lat.data();
    p.m = m;
    p.heads = heads;
    p.kv_lora_rank = r;
    p.token_seq = seq.data();
    p.positions = pos.data();
    p.block_table = table.data();
    p.max_blocks = 4;
    p.softmax_scale = 0.1f;
    p.max_keys = 34;
    std::vector<float> scratch(static_cast<size_t>(
        kernels::cpu::mla_attention_scratch_floats(heads, p.max_keys, w, omp_get_max_threads())));
    p.scratch = scratch.data();
    kernels::cpu::mla_attention(p);  // warm-up: the OpenMP runtime may allocate its team once
    const long a0 = g_allocs.load();
    kernels::cpu::mla_attention(p);
    EXPECT_EQ(g_allocs.load() - a0, 0) << "attention allocated memory";
    EXPECT_TRUE(std::equal(before.begin(), before.end(), bytes)) << "attention changed the pool";

    // Against dequantise-then-attend, for token 1 head 2.
    const int64_t i = 1, h = 2;
    std::vector<double> s;
    std::vector<std::vector<double>> rows;
    for (int64_t j = 0; j <= pos[i]; ++j) {
      const int64_t slot = static_cast<int64_t>(table[seq[i] * 4 + j / 16]) * 16 + j % 16;
      std::vector<double> row(w);
      for (int64_t c = 0; c < w; ++c)
        row[c] = dt == kv::KvCacheDType::BF16
                     ? quant::bf16_to_f32(reinterpret_cast<const uint16_t*>(bytes)[slot * w + c])
                     : quant::fp8_e4m3_to_f32(bytes[slot * w + c]) * pool.scale(0);
      double d = 0;
      for (int64_t c = 0; c < w; ++c) d += q[(i * heads + h) * w + c] * row[c];
      s.push_back(d * 0.1);
      rows.push_back(row);
    }
    double mx = *std::max_element(s.begin(), s.end()), sum = 0;
    for (double& v : s) sum += (v = std::exp(v - mx));
    for (int64_t c = 0; c < r; ++c) {
      double o = 0;
      for (size_t j = 0; j < s.size(); ++j) o += s[j] / sum * rows[j][c];
      EXPECT_NEAR(lat[(i * heads + h) * r + c], o, 1e-4 * (1 + std::fabs(o)));
    }
  }
}

// Every token and head against dequantise-then-attend in double, on each instruction set this CPU has: 11
// heads (a block of 8 and 3 single ones on AVX-512) and a row width of 83 (a masked tail of 3 columns).
TEST(MlaAttention, AllHeadsMatchDoubleReferenceOnEveryIsa) {
  kv::KvPoolConfig pc;
  pc.num_layers = 1;
  pc.width = 83;
  pc.num_pages = 8;
  pc.page_size = 16;
  pc.dtype = kv::KvCacheDType::BF16;
  pc.scales = {1.0f};
  kv::KvPool pool(pc);
  const Tensor& data = pool.latent(0);
  auto* cache = static_cast<uint16_t*>(data.raw());
  for (int64_t i = 0; i < static_cast<int64_t>(data.nbytes() / 2); ++i)
    cache[i] = quant::f32_to_bf16(static_cast<float>(std::cos(0.91 * static_cast<double>(i))));
  // Five tokens: with up to 2 threads the kernel keeps all heads of a token in one group.
  const int64_t m = 5, heads = 11, r = 64, w = 83;
  std::vector<int32_t> seq = {0, 0, 1, 1, 0}, pos = {20, 33, 5, 9, 2}, table = {3, 1, 6, 2, 0, 5, 7, 4};
  std::vector<float> q(static_cast<size_t>(m * heads * w));
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)));
  std::vector<kernels::cpu::LinearIsa> isas{kernels::cpu::LinearIsa::Reference};
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    isas.push_back(kernels::cpu::LinearIsa::Avx512);
  for (kernels::cpu::LinearIsa isa : isas) {
    std::vector<float> lat(static_cast<size_t>(m * heads * r), std::nanf(""));
    kernels::cpu::MlaAttentionParams p;
    p.q_cat = q.data();
    p.kv.data = data.raw();
    p.kv.format = kernels::cpu::CacheFormat::BF16;
    p.kv.scale = pool.scale(0);
    p.kv.num_pages = 8;
    p.kv.page_size = 16;
    p.kv.width = w;
    p.lat = lat.data();
    p.m = m;
    p.heads = heads;
    p.kv_lora_rank = r;
    p.token_seq = seq.data();
    p.positions = pos.data();
    p.block_table = table.data();
    p.max_blocks = 4;
    p.softmax_scale = 0.1f;
    p.max_keys = 34;
    std::vector<float> scratch(static_cast<size_t>(
        kernels::cpu::mla_attention_scratch_floats(heads, p.max_keys, w, omp_get_max_threads())));
    p.scratch = scratch.data();
    kernels::cpu::force_linear_isa(isa);
    kernels::cpu::mla_attention(p);
    kernels::cpu::clear_forced_linear_isa();
    for (int64_t i = 0; i < m; ++i)
      for (int64_t h = 0; h < heads; ++h) {
        std::vector<double> s;
        std::vector<std::vector<double>> rows;
        for (int64_t j = 0; j <= pos[i]; ++j) {
          const int64_t slot = static_cast<int64_t>(table[seq[i] * 4 + j / 16]) * 16 + j % 16;
          std::vector<double> row(w);
          for (int64_t c = 0; c < w; ++c) row[c] = quant::bf16_to_f32(cache[slot * w + c]);
          double d = 0;
          for (int64_t c = 0; c < w; ++c) d += q[(i * heads + h) * w + c] * row[c];
          s.push_back(d * 0.1);
          rows.push_back(row);
        }
        double mx = *std::max_element(s.begin(), s.end()), sum = 0;
        for (double& v : s) sum += (v = std::exp(v - mx));
        for (int64_t c = 0; c < r; ++c) {
          double o = 0;
          for (size_t j = 0; j < s.size(); ++j) o += s[j] / sum * rows[j][c];
          // f32 dots of 83 terms of magnitude <= 1 and a softmax over <= 34 keys.
          ASSERT_NEAR(lat[(i * heads + h) * r + c], o, 1e-4 * (1 + std::fabs(o)))
              << kernels::cpu::linear_isa_name(isa) << " token " << i << " head " << h << " col " << c;
        }
      }
  }
}

}  // namespace
}  // namespace ms
