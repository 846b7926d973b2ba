// MLA absorb / out-v, paged MLA attention (general kernel and the fp8 decode dispatch) and the DSA indexer on
// the GPU against the CPU kernels (kernels/cpu/mla.h, dsa_indexer.h) on the same random ragged batches:
// prefill chunks and decode tokens mixed, several page sizes and widths, f32 / bf16 / fp8 pages whose unused
// tails hold NaN, with and without a DSA selection. Outputs are poisoned before each run and every element
// is checked. Tolerances:
//   absorb / out-v: |gpu - cpu| <= 1e-5 * sum_k |a_k w_k| (f32 accumulation either side);
//   general attention: |gpu - cpu| <= 1e-5 * (|cpu| + max |cpu| of the row) (both read the same pages);
//   fp8 decode dispatch: 1e-2 of the row's largest |value| (q and P in bf16 on the tensor cores);
//   indexer: identical selections on exactly representable data (integer-valued q, keys, weights: every
//   score is exact, so ties are frequent and must go to the lower position); on continuous data the GPU's
//   selection must be a true top-k of the double-precision scores within 1e-5 of their scale.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/dsa_indexer.h"
#include "kernels/cpu/mla.h"
#include "kernels/cpu/paged_cache.h"
#include "kernels/cpu/weight_view.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/dsa_indexer/dsa_indexer.h"
#include "kernels/cuda/mla_attention/mla_absorb.h"
#include "kernels/cuda/mla_attention/mla_attention.h"
#include "quant/float_formats.h"

namespace {

namespace cpu = ms::kernels::cpu;
namespace gpu = ms::cuda;

// A device buffer that frees itself; `poison` fills it with 0xff bytes (NaN as f32, -1 as i32) or `byte`.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)));
  }
  explicit DeviceBuffer(const std::vector<T>& h) : DeviceBuffer(h.size()) {
    if (n) CUDA_CHECK(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  ~DeviceBuffer() { cudaFree(ptr); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void poison(int byte = 0xff) { CUDA_CHECK(cudaMemset(ptr, byte, std::max<size_t>(n, 1) * sizeof(T))); }
  std::vector<T> host() const {
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<T> h(n);
    if (n) CUDA_CHECK(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

bool have_gpu() {
  return gpu::device_count() > 0;
}

std::vector<float> normal(std::mt19937& rng, size_t n, float sigma) {
  std::normal_distribution<float> d(0.f, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// ---- weights -----------------------------------------------------------------------------------------

struct Weight {
  cpu::WeightFormat cpu_format;
  gpu::DenseWeightFormat gpu_format;
  std::vector<uint8_t> data;  // stored bytes
  std::vector<float> scale;   // FP8Block
};

Weight make_weight(std::mt19937& rng, int rows, int cols, gpu::DenseWeightFormat f) {
  const auto w = normal(rng, static_cast<size_t>(rows) * cols, 0.1f);
  Weight out;
  out.gpu_format = f;
  switch (f) {
    case gpu::DenseWeightFormat::F32:
      out.cpu_format = cpu::WeightFormat::F32;
      out.data.resize(w.size() * 4);
      std::memcpy(out.data.data(), w.data(), out.data.size());
      break;
    case gpu::DenseWeightFormat::BF16: {
      out.cpu_format = cpu::WeightFormat::BF16;
      out.data.resize(w.size() * 2);
      auto* d = reinterpret_cast<uint16_t*>(out.data.data());
      for (size_t i = 0; i < w.size(); ++i) d[i] = ms::quant::f32_to_bf16(w[i]);
      break;
    }
    case gpu::DenseWeightFormat::FP8Block: {
      out.cpu_format = cpu::WeightFormat::FP8Block;
      const int sr = (rows + 127) / 128, sc = (cols + 127) / 128;
      out.scale.resize(static_cast<size_t>(sr) * sc);
      for (auto& s : out.scale) s = std::uniform_real_distribution<float>(0.5f, 2.f)(rng) / 448.f;
      out.data.resize(w.size());
      for (int r = 0; r < rows; ++r)
        for (int c = 0; c < cols; ++c) {
          const float s = out.scale[static_cast<size_t>(r / 128) * sc + c / 128];
          out.data[static_cast<size_t>(r) * cols + c] =
              ms::quant::f32_to_fp8_e4m3(w[static_cast<size_t>(r) * cols + c] * 3000.f * s, true);
        }
      break;
    }
  }
  return out;
}

struct AbsorbCase {
  int m, heads, nope, rope, v, r;
  gpu::DenseWeightFormat format;
};

// kv_b_proj of one absorb shape on both sides, and |W| dequantised (for the error bounds).
struct AbsorbWeights {
  Weight w;
  cpu::WeightView cv;
  DeviceBuffer<uint8_t> dw;
  DeviceBuffer<float> dscale;
  gpu::DenseWeightView gv;
  std::vector<float> wabs;
  AbsorbWeights(std::mt19937& rng, const AbsorbCase& c)
      : w(make_weight(rng, c.heads * (c.nope + c.v), c.r, c.format)), dw(w.data), dscale(w.scale) {
    const int rows = c.heads * (c.nope + c.v);
    cv.format = w.cpu_format;
    cv.rows = rows;
    cv.cols = c.r;
    cv.data = w.data.data();
    cv.scale = w.scale.data();
    gv.format = w.gpu_format;
    gv.rows = rows;
    gv.cols = c.r;
    gv.data = dw.ptr;
    gv.scale = w.scale.empty() ? nullptr : dscale.ptr;
    wabs.resize(static_cast<size_t>(rows) * c.r);
#pragma omp parallel for
    for (int r = 0; r < rows; ++r) cpu::dequantize_row(cv, r, wabs.data() + static_cast<size_t>(r) * c.r);
    for (auto& x : wabs) x = std::fabs(x);
  }
  // |W| as an f32 view: the CPU kernels on |a| and |W| give the bound sum_k |a_k w_k| of every output.
  cpu::WeightView abs_view() const {
    cpu::WeightView v = cv;
    v.format = cpu::WeightFormat::F32;
    v.data = wabs.data();
    v.scale = nullptr;
    return v;
  }
};

std::vector<float> absolute(std::vector<float> v) {
  for (auto& x : v) x = std::fabs(x);
  return v;
}

// absorb_q and out_v of case `c` on the GPU (implementation `kernel`) against the CPU kernels, outputs
// poisoned first. With `twice`, a second run must give the same bits (no run-to-run differences).
void run_absorb_on(const AbsorbCase& c, const AbsorbWeights& aw, std::mt19937& rng,
                   gpu::MlaAbsorbKernel kernel, bool twice = false) {
  SCOPED_TRACE(::testing::Message() << "m " << c.m << " heads " << c.heads << " nope " << c.nope << " rope "
                                    << c.rope << " v " << c.v << " r " << c.r << " format "
                                    << static_cast<int>(c.format) << " kernel " << static_cast<int>(kernel));
  // absorb_q
  const int qd = c.nope + c.rope, width = c.r + c.rope;
  const auto q = normal(rng, static_cast<size_t>(c.m) * c.heads * qd, 1.f);
  std::vector<float> ref(static_cast<size_t>(c.m) * c.heads * width), bound(ref.size());
  cpu::MlaAbsorbQParams cp;
  cp.q = q.data();
  cp.kv_b = aw.cv;
  cp.q_cat = ref.data();
  cp.m = c.m;
  cp.heads = c.heads;
  cp.nope = c.nope;
  cp.rope = c.rope;
  cp.v = c.v;
  cp.kv_lora_rank = c.r;
  cpu::mla_absorb_q(cp);
  const auto qabs = absolute(q);
  cp.q = qabs.data();
  cp.kv_b = aw.abs_view();
  cp.q_cat = bound.data();
  cpu::mla_absorb_q(cp);
  DeviceBuffer<float> dq(q), dqcat(ref.size());
  dqcat.poison();
  gpu::MlaAbsorbQParams gp;
  gp.q = dq.ptr;
  gp.kv_b = aw.gv;
  gp.q_cat = dqcat.ptr;
  gp.m = c.m;
  gp.heads = c.heads;
  gp.nope = c.nope;
  gp.rope = c.rope;
  gp.v = c.v;
  gp.kv_lora_rank = c.r;
  gp.kernel = kernel;
  gpu::mla_absorb_q(gp, nullptr);
  const auto got = dqcat.host();
  for (int i = 0; i < c.m; ++i)
    for (int h = 0; h < c.heads; ++h)
      for (int e = 0; e < width; ++e) {
        const size_t o = (static_cast<size_t>(i) * c.heads + h) * width + e;
        const double b = e < c.r ? bound[o] : 0.0;  // the rope part is a copy
        ASSERT_TRUE(std::isfinite(got[o])) << "absorb_q unwritten at i=" << i << " h=" << h << " e=" << e;
        ASSERT_LE(std::fabs(got[o] - ref[o]), 1e-5 * b) << "absorb_q i=" << i << " h=" << h << " e=" << e;
      }
  if (twice) {
    dqcat.poison();
    gpu::mla_absorb_q(gp, nullptr);
    const auto again = dqcat.host();
    ASSERT_EQ(0, std::memcmp(got.data(), again.data(), got.size() * sizeof(float)))
        << "absorb_q not repeatable";
  }

  // out_v
  const auto lat = normal(rng, static_cast<size_t>(c.m) * c.heads * c.r, 1.f);
  std::vector<float> oref(static_cast<size_t>(c.m) * c.heads * c.v), obound(oref.size());
  cpu::MlaOutVParams co;
  co.lat = lat.data();
  co.kv_b = aw.cv;
  co.out = oref.data();
  co.m = c.m;
  co.heads = c.heads;
  co.nope = c.nope;
  co.v = c.v;
  co.kv_lora_rank = c.r;
  cpu::mla_out_v(co);
  const auto labs = absolute(lat);
  co.lat = labs.data();
  co.kv_b = aw.abs_view();
  co.out = obound.data();
  cpu::mla_out_v(co);
  DeviceBuffer<float> dlat(lat), dout(oref.size());
  dout.poison();
  gpu::MlaOutVParams go;
  go.lat = dlat.ptr;
  go.kv_b = aw.gv;
  go.out = dout.ptr;
  go.m = c.m;
  go.heads = c.heads;
  go.nope = c.nope;
  go.v = c.v;
  go.kv_lora_rank = c.r;
  go.kernel = kernel;
  gpu::mla_out_v(go, nullptr);
  const auto ogot = dout.host();
  for (int i = 0; i < c.m; ++i)
    for (int h = 0; h < c.heads; ++h)
      for (int e = 0; e < c.v; ++e) {
        const size_t o = static_cast<size_t>(i) * c.heads * c.v + static_cast<size_t>(h) * c.v + e;
        ASSERT_TRUE(std::isfinite(ogot[o])) << "out_v unwritten at i=" << i << " h=" << h << " e=" << e;
        ASSERT_LE(std::fabs(ogot[o] - oref[o]), 1e-5 * obound[o])
            << "out_v i=" << i << " h=" << h << " e=" << e;
      }
  if (twice) {
    dout.poison();
    gpu::mla_out_v(go, nullptr);
    const auto again = dout.host();
    ASSERT_EQ(0, std::memcmp(ogot.data(), again.data(), ogot.size() * sizeof(float)))
        << "out_v not repeatable";
  }
}

void run_absorb(const AbsorbCase& c, uint32_t seed,
                gpu::MlaAbsorbKernel kernel = gpu::MlaAbsorbKernel::Auto) {
  std::mt19937 rng(seed);
  AbsorbWeights aw(rng, c);
  run_absorb_on(c, aw, rng, kernel);
}

// ---- paged batches -----------------------------------------------------------------------------------

struct Seq {
  int start, n;  // cached tokens before this step, new tokens this step (1 = decode)
};

struct Batch {
  int page_size = 0, num_pages = 0, max_blocks = 0, width = 0;
  std::vector<int32_t> token_seq, positions, seq_lens, block_table;
  std::vector<uint8_t> pool;  // [num_pages, page_size, width] in the cache format
  gpu::KvFormat format = gpu::KvFormat::F32;
  float scale = 1.f;
  int max_position() const { return *std::max_element(positions.begin(), positions.end()); }
};

// Rows of written slots hold `value(rng)`; every other slot (page tails, pages nobody owns) holds NaN.
template <typename ValueFn>
Batch make_batch(std::mt19937& rng, const std::vector<Seq>& seqs, int page_size, int width,
                 gpu::KvFormat format, float scale, ValueFn value) {
  Batch b;
  b.page_size = page_size;
  b.width = width;
  b.format = format;
  b.scale = scale;
  int used = 0, most = 1;
  for (const auto& s : seqs) {
    const int pages = (s.start + s.n + page_size - 1) / page_size;
    used += pages;
    most = std::max(most, pages);
  }
  b.num_pages = used + 3;
  b.max_blocks = most + 1;
  std::vector<int> perm(b.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  b.block_table.assign(static_cast<size_t>(seqs.size()) * b.max_blocks, -1);
  const size_t elem = static_cast<size_t>(gpu::kv_format_bytes(format));
  b.pool.resize(static_cast<size_t>(b.num_pages) * page_size * width * elem);
  for (size_t k = 0; k < b.pool.size() / elem; ++k) {  // NaN everywhere first
    if (format == gpu::KvFormat::F32) {
      const float nan = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(b.pool.data() + k * 4, &nan, 4);
    } else if (format == gpu::KvFormat::BF16) {
      const uint16_t nan = 0x7fc0;
      std::memcpy(b.pool.data() + k * 2, &nan, 2);
    } else {
      b.pool[k] = 0x7f;
    }
  }
  int next = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int len = seqs[s].start + seqs[s].n;
    b.seq_lens.push_back(len);
    for (int pg = 0; pg * page_size < len; ++pg) b.block_table[s * b.max_blocks + pg] = perm[next++];
    for (int pos = 0; pos < len; ++pos) {
      const size_t slot = static_cast<size_t>(b.block_table[s * b.max_blocks + pos / page_size]) * page_size +
                          pos % page_size;
      for (int c = 0; c < width; ++c) {
        const float x = value(rng);
        const size_t k = slot * width + c;
        if (format == gpu::KvFormat::F32) {
          std::memcpy(b.pool.data() + k * 4, &x, 4);
        } else if (format == gpu::KvFormat::BF16) {
          const uint16_t h = ms::quant::f32_to_bf16(x);
          std::memcpy(b.pool.data() + k * 2, &h, 2);
        } else {
          b.pool[k] = ms::quant::f32_to_fp8_e4m3(x / scale, true);
        }
      }
    }
    for (int t = 0; t < seqs[s].n; ++t) {
      b.token_seq.push_back(static_cast<int32_t>(s));
      b.positions.push_back(seqs[s].start + t);
    }
  }
  return b;
}

cpu::PagedCacheView cpu_view(Batch& b) {
  cpu::PagedCacheView v;
  v.data = b.pool.data();
  v.format = b.format == gpu::KvFormat::F32    ? cpu::CacheFormat::F32
             : b.format == gpu::KvFormat::BF16 ? cpu::CacheFormat::BF16
                                               : cpu::CacheFormat::FP8E4M3;
  v.scale = b.scale;
  v.num_pages = b.num_pages;
  v.page_size = b.page_size;
  v.width = b.width;
  return v;
}

struct DeviceBatch {
  DeviceBuffer<uint8_t> pool;
  DeviceBuffer<int32_t> token_seq, positions, seq_lens, block_table;
  explicit DeviceBatch(const Batch& b)
      : pool(b.pool),
        token_seq(b.token_seq),
        positions(b.positions),
        seq_lens(b.seq_lens),
        block_table(b.block_table) {}
  gpu::PagedKvLayer layer(const Batch& b) const {
    gpu::PagedKvLayer l;
    l.data = pool.ptr;
    l.format = b.format;
    l.scale = b.scale;
    l.num_pages = b.num_pages;
    l.page_size = b.page_size;
    l.width = b.width;
    return l;
  }
  gpu::AttentionMetaDevice meta(const Batch& b) const {
    gpu::AttentionMetaDevice m;
    m.token_seq = token_seq.ptr;
    m.positions = positions.ptr;
    m.block_table = block_table.ptr;
    m.max_blocks = b.max_blocks;
    m.seq_lens = seq_lens.ptr;
    m.n_seqs = static_cast<int>(b.seq_lens.size());
    return m;
  }
};

// ---- MLA attention -----------------------------------------------------------------------------------

struct AttnCase {
  std::vector<Seq> seqs;
  int heads, r, rope, page_size;
  gpu::KvFormat format;
  int topk_width;  // 0: dense causal
  bool expect_fast = false;
};

void run_attention(const AttnCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const int width = c.r + c.rope;
  std::normal_distribution<float> vd(0.f, 1.f);
  Batch b =
      make_batch(rng, c.seqs, c.page_size, width, c.format, c.format == gpu::KvFormat::FP8E4M3 ? 0.5f : 1.f,
                 [&](std::mt19937& g) { return vd(g); });
  const int m = static_cast<int>(b.positions.size());
  const auto q = normal(rng, static_cast<size_t>(m) * c.heads * width, 2.f);
  const float softmax_scale = 1.f / std::sqrt(static_cast<float>(width));
  // Selection: visible positions, positions past the token (ignored), -1 entries and repeats.
  std::vector<int32_t> topk(static_cast<size_t>(m) * c.topk_width);
  for (int i = 0; i < m; ++i) {
    const int len = b.seq_lens[b.token_seq[i]];
    for (int k = 0; k < c.topk_width; ++k) {
      const int kind = static_cast<int>(rng() % 8);
      int32_t j = static_cast<int32_t>(rng() % static_cast<uint32_t>(b.positions[i] + 1));
      if (kind == 0) j = -1;
      if (kind == 1)
        j = static_cast<int32_t>(rng() % static_cast<uint32_t>(len + c.page_size));  // may be > pos
      topk[static_cast<size_t>(i) * c.topk_width + k] = j;
    }
  }
  // The dispatcher's choice: the tensor-core kernels (bf16 q) where expected.
  const auto caps = gpu::query_device(0);
  gpu::MlaAttentionShape s;
  s.m = m;
  s.heads = c.heads;
  s.kv_lora_rank = c.r;
  s.rope = c.rope;
  s.page_size = c.page_size;
  s.format = c.format;
  s.has_topk = c.topk_width > 0;
  s.n_seqs = static_cast<int>(c.seqs.size());
  s.decode_only = std::all_of(c.seqs.begin(), c.seqs.end(), [](const Seq& x) { return x.n == 1; });
  const auto cfg = gpu::mla_attention_choose(s, caps);
  const bool fast = cfg.kernel != gpu::MlaAttentionKernel::General;
  // Expected fast: a tensor-core kernel. 512 + 64 wide fp8 / bf16 pages over a selection or in a decode-only
  // batch go to the sm90 decode kernel where it fits, so a case not expected fast may still get it.
  if (c.expect_fast) {
    ASSERT_TRUE(fast) << cfg.why;
  }
  ASSERT_LE(cfg.smem_bytes, caps.smem_per_block_optin);
  // CPU. The tensor-core kernels take q in bf16 (documented): its reference sees the same rounded q, so
  // the tolerance below covers only the kernel's own bf16 products (P and the page values on tensor cores).
  std::vector<float> q_ref = q;
  if (fast)
    for (float& v : q_ref) v = ms::quant::bf16_to_f32(ms::quant::f32_to_bf16(v));
  std::vector<float> ref(static_cast<size_t>(m) * c.heads * c.r);
  cpu::MlaAttentionParams cp;
  cp.q_cat = q_ref.data();
  cp.kv = cpu_view(b);
  cp.lat = ref.data();
  cp.m = m;
  cp.heads = c.heads;
  cp.kv_lora_rank = c.r;
  cp.token_seq = b.token_seq.data();
  cp.positions = b.positions.data();
  cp.block_table = b.block_table.data();
  cp.max_blocks = b.max_blocks;
  cp.softmax_scale = softmax_scale;
  cp.max_keys = b.max_position() + 1;
  if (c.topk_width) {
    cp.topk = topk.data();
    cp.topk_width = c.topk_width;
    cp.max_keys = c.topk_width;
  }
  std::vector<float> scratch(static_cast<size_t>(
      cpu::mla_attention_scratch_floats(c.heads, cp.max_keys, width, omp_get_max_threads())));
  cp.scratch = scratch.data();
  cpu::mla_attention(cp);

  DeviceBatch db(b);
  DeviceBuffer<float> dq(q), dlat(ref.size());
  DeviceBuffer<int32_t> dtopk(topk);
  DeviceBuffer<uint8_t> ws(cfg.workspace_bytes);
  dlat.poison();
  gpu::MlaAttentionParams p;
  p.q_cat = dq.ptr;
  p.kv = db.layer(b);
  p.meta = db.meta(b);
  p.topk = c.topk_width ? dtopk.ptr : nullptr;
  p.topk_width = c.topk_width;
  p.lat = dlat.ptr;
  p.m = m;
  p.heads = c.heads;
  p.kv_lora_rank = c.r;
  p.softmax_scale = softmax_scale;
  p.workspace = cfg.workspace_bytes ? ws.ptr : nullptr;
  gpu::mla_attention_plan(cfg, p, nullptr);
  gpu::mla_attention(cfg, p, nullptr);
  const auto got = dlat.host();
  for (int i = 0; i < m; ++i)
    for (int h = 0; h < c.heads; ++h) {
      const size_t base = (static_cast<size_t>(i) * c.heads + h) * c.r;
      double row = 0;
      for (int e = 0; e < c.r; ++e) row = std::max(row, std::fabs(static_cast<double>(ref[base + e])));
      for (int e = 0; e < c.r; ++e) {
        ASSERT_TRUE(std::isfinite(got[base + e]))
            << "unwritten or NaN at i=" << i << " h=" << h << " e=" << e;
        const double tol = fast ? 1e-2 * row : 1e-5 * (std::fabs(ref[base + e]) + row);
        ASSERT_LE(std::fabs(got[base + e] - ref[base + e]), tol)
            << "i=" << i << " pos=" << b.positions[i] << " h=" << h << " e=" << e << " kernel "
            << gpu::mla_attention_kernel_name(cfg.kernel);
      }
    }
}

// ---- DSA indexer -------------------------------------------------------------------------------------

struct IndexerCase {
  std::vector<Seq> seqs;
  int heads, dim, page_size, topk;
  gpu::KvFormat format;
  bool exact;             // integer-valued data: identical selections required
  int rows_per_pass = 0;  // 0: all tokens in one pass
};

void run_indexer(const IndexerCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> small(-3, 3);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto value = [&](std::mt19937& g) { return c.exact ? static_cast<float>(small(g)) : nd(g); };
  Batch b = make_batch(rng, c.seqs, c.page_size, c.dim, c.format,
                       c.format == gpu::KvFormat::FP8E4M3 ? 0.5f : 1.f, value);
  const int m = static_cast<int>(b.positions.size());
  std::vector<float> q(static_cast<size_t>(m) * c.heads * c.dim), w(static_cast<size_t>(m) * c.heads);
  for (auto& x : q) x = value(rng);
  for (auto& x : w) x = c.exact ? 0.25f * static_cast<float>(small(rng)) : nd(rng);
  const float softmax_scale = c.exact ? 0.125f : 1.f / std::sqrt(static_cast<float>(c.dim));
  const int max_keys = b.max_position() + 1 + 5;

  std::vector<int32_t> ref(static_cast<size_t>(m) * c.topk);
  cpu::DsaIndexerParams cp;
  cp.q = q.data();
  cp.w = w.data();
  cp.keys = cpu_view(b);
  cp.m = m;
  cp.heads = c.heads;
  cp.dim = c.dim;
  cp.softmax_scale = softmax_scale;
  cp.token_seq = b.token_seq.data();
  cp.positions = b.positions.data();
  cp.block_table = b.block_table.data();
  cp.max_blocks = b.max_blocks;
  cp.topk = c.topk;
  cp.out = ref.data();
  cp.max_keys = max_keys;
  std::vector<float> scratch(
      static_cast<size_t>(cpu::dsa_indexer_scratch_floats(max_keys, c.dim, omp_get_max_threads())));
  cp.scratch = scratch.data();
  cpu::dsa_indexer(cp);

  DeviceBatch db(b);
  DeviceBuffer<float> dq(q), dw(w);
  DeviceBuffer<int32_t> dout(ref.size());
  const int rows = c.rows_per_pass > 0 ? c.rows_per_pass : m;
  const size_t ws_bytes = gpu::dsa_indexer_workspace_bytes(rows, max_keys);
  DeviceBuffer<uint8_t> ws(ws_bytes);
  ws.poison();
  dout.poison(0x7f);
  gpu::DsaIndexerParams p;
  p.q = dq.ptr;
  p.w = dw.ptr;
  p.keys = db.layer(b);
  p.meta = db.meta(b);
  p.m = m;
  p.heads = c.heads;
  p.dim = c.dim;
  p.softmax_scale = softmax_scale;
  p.topk = c.topk;
  p.out = dout.ptr;
  p.max_keys = max_keys;
  p.workspace = ws.ptr;
  p.workspace_bytes = ws_bytes;
  gpu::dsa_indexer(p, nullptr);
  const auto got = dout.host();

  for (int i = 0; i < m; ++i) {
    const int pos = b.positions[i];
    const int32_t* g = got.data() + static_cast<size_t>(i) * c.topk;
    const int32_t* r = ref.data() + static_cast<size_t>(i) * c.topk;
    const int expect_n = std::min(pos + 1, c.topk);
    for (int k = 0; k < c.topk; ++k) {
      ASSERT_TRUE(k < expect_n ? (g[k] >= 0 && g[k] <= pos) : g[k] == -1)
          << "token " << i << " pos " << pos << " entry " << k << " = " << g[k];
      if (k > 0 && k < expect_n) {
        ASSERT_LT(g[k - 1], g[k]) << "not ascending at token " << i << " entry " << k;
      }
    }
    if (c.exact || pos + 1 <= c.topk) {
      for (int k = 0; k < c.topk; ++k)
        ASSERT_EQ(g[k], r[k]) << "token " << i << " pos " << pos << " entry " << k;
      continue;
    }
    // Continuous data: a true top-k of the double-precision scores.
    std::vector<float> row(c.dim);
    std::vector<double> score(pos + 1);
    double scale = 0;
    for (int j = 0; j <= pos; ++j) {
      const int64_t slot =
          cpu::cache_slot(b.block_table.data(), b.max_blocks, b.token_seq[i], j, b.page_size);
      cpu::cache_read_row(cp.keys, slot, row.data());
      double total = 0;
      for (int h = 0; h < c.heads; ++h) {
        double s = 0;
        for (int d = 0; d < c.dim; ++d)
          s += static_cast<double>(q[(static_cast<size_t>(i) * c.heads + h) * c.dim + d]) * row[d];
        s *= softmax_scale;
        total += w[static_cast<size_t>(i) * c.heads + h] * std::max(s, 0.0);
      }
      score[j] = total;
      scale = std::max(scale, std::fabs(total));
    }
    std::vector<char> chosen(pos + 1, 0);
    double lowest_in = 1e300, highest_out = -1e300;
    for (int k = 0; k < c.topk; ++k) chosen[g[k]] = 1;
    for (int j = 0; j <= pos; ++j) {
      if (chosen[j])
        lowest_in = std::min(lowest_in, score[j]);
      else
        highest_out = std::max(highest_out, score[j]);
    }
    ASSERT_GE(lowest_in, highest_out - 1e-5 * scale) << "token " << i << ": not a top-" << c.topk;
  }
}

}  // namespace

TEST(CudaMlaAbsorb, MatchesCpuEveryWeightFormat) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 1;
  for (auto k : {gpu::MlaAbsorbKernel::Auto, gpu::MlaAbsorbKernel::Simple})
    for (auto f :
         {gpu::DenseWeightFormat::F32, gpu::DenseWeightFormat::BF16, gpu::DenseWeightFormat::FP8Block}) {
      run_absorb({1, 4, 32, 8, 16, 64, f}, seed++, k);
      run_absorb({5, 3, 40, 6, 24, 200, f}, seed++,
                 k);  // ragged 128-blocks of the fp8 scales, r not a tile multiple (fp8: simple kernel)
      run_absorb({37, 2, 48, 16, 40, 160, f}, seed++, k);  // several token tiles
    }
  run_absorb({3, 8, 192, 64, 256, 512, gpu::DenseWeightFormat::BF16}, seed++);  // GLM-5's per-head shapes
}

// The streaming kernels (forced: no silent fallback) on the published shapes, every weight format, batch
// sizes across the token groups and tiles (1, 3: small groups; 16, 64: one tile; 65, 200: several tiles, a
// ragged last one), each repeated once to prove the bits do not change between runs.
TEST(CudaMlaAbsorb, StreamingMatchesCpuOnGlm5AndDeepSeekShapes) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 500;
  const AbsorbCase shapes[] = {
      {0, 64, 192, 64, 256, 512, gpu::DenseWeightFormat::BF16},   // GLM-5
      {0, 128, 128, 64, 128, 512, gpu::DenseWeightFormat::BF16},  // DeepSeek-V3 / R1 / V3.2
  };
  for (const auto& shape : shapes)
    for (auto f :
         {gpu::DenseWeightFormat::F32, gpu::DenseWeightFormat::BF16, gpu::DenseWeightFormat::FP8Block}) {
      std::mt19937 rng(seed++);
      AbsorbCase c = shape;
      c.format = f;
      AbsorbWeights aw(rng, c);
      for (int m : {1, 3, 16, 64, 65, 200}) {
        c.m = m;
        run_absorb_on(c, aw, rng, gpu::MlaAbsorbKernel::Streaming, m == 64 || m == 3);
        if (HasFatalFailure()) return;
      }
    }
}

TEST(CudaMlaAbsorb, StreamingRefusesMisalignedShapesByField) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  DeviceBuffer<uint8_t> w(static_cast<size_t>(2) * (8 + 8) * 200);
  DeviceBuffer<float> scale(16), x(static_cast<size_t>(2) * 200 + 64), y(static_cast<size_t>(2) * 264);
  gpu::MlaOutVParams p;
  p.kv_b.format = gpu::DenseWeightFormat::FP8Block;
  p.kv_b.rows = 2 * 16;
  p.kv_b.cols = 200;
  p.kv_b.data = w.ptr;
  p.kv_b.scale = scale.ptr;
  p.lat = x.ptr;
  p.out = y.ptr;
  p.m = 1;
  p.heads = 2;
  p.nope = 8;
  p.v = 8;
  p.kv_lora_rank = 200;  // not a multiple of 16 fp8 weights
  EXPECT_NE(gpu::mla_out_v_streaming_refusal(p).find("kv_lora_rank"), std::string::npos);
  p.kernel = gpu::MlaAbsorbKernel::Streaming;
  try {
    gpu::mla_out_v(p, nullptr);
    ADD_FAILURE() << "misaligned kv_lora_rank accepted";
  } catch (const ms::Error& e) {
    EXPECT_NE(std::string(e.what()).find("kv_lora_rank"), std::string::npos) << e.what();
  }
  gpu::MlaAbsorbQParams q;
  q.kv_b = p.kv_b;
  q.kv_b.data = w.ptr + 2;  // not 16-byte aligned
  q.q = x.ptr;
  q.q_cat = y.ptr;
  q.m = 1;
  q.heads = 2;
  q.nope = 8;
  q.rope = 0;
  q.v = 8;
  q.kv_lora_rank = 200;
  EXPECT_NE(gpu::mla_absorb_q_streaming_refusal(q).find("kv_b.data"), std::string::npos);
}

TEST(CudaMlaAttention, GeneralKernelMatchesCpuDenseAndSelected) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Seq> mixed = {{0, 7}, {12, 1}, {3, 5}, {40, 1}, {0, 1}, {63, 2}};
  uint32_t seed = 100;
  for (auto f : {gpu::KvFormat::F32, gpu::KvFormat::BF16, gpu::KvFormat::FP8E4M3})
    for (int topk : {0, 6}) {
      run_attention({mixed, 3, 16, 8, 1, f, topk}, seed++);   // page of one token
      run_attention({mixed, 20, 20, 6, 7, f, topk}, seed++);  // odd width, a partial head group
      run_attention({mixed, 16, 64, 16, 16, f, topk}, seed++);
      run_attention({{{0, 70}, {130, 1}, {5, 3}}, 17, 512, 64, 64, f, topk},
                    seed++);  // GLM-5 widths, prefill
    }
}

TEST(CudaMlaAttention, LongContextsAndEmptySelections) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  run_attention({{{1500, 1}, {700, 30}}, 16, 64, 16, 64, gpu::KvFormat::BF16, 0}, 200);
  // A selection of only -1 and positions past the token: zeros, as the CPU.
  run_attention({{{0, 2}}, 4, 16, 8, 4, gpu::KvFormat::F32, 1}, 201);
  run_attention({{{900, 2}, {10, 1}}, 8, 32, 8, 32, gpu::KvFormat::FP8E4M3, 300}, 202);
}

TEST(CudaMlaAttention, DispatchesDecodeOnlyFp8ToTheFastKernel) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const auto caps = gpu::query_device(0);
  if (caps.arch() < 80) GTEST_SKIP() << "fp8 decode kernel needs sm_80+";
  run_attention(
      {{{0, 1}, {63, 1}, {64, 1}, {700, 1}, {2000, 1}}, 64, 512, 64, 64, gpu::KvFormat::FP8E4M3, 0, true},
      300);
  run_attention({{{100, 1}, {5, 1}}, 16, 512, 64, 64, gpu::KvFormat::FP8E4M3, 0, true}, 301);
  // A prefill token goes to the general kernel; a selection to the sm90 decode kernel.
  run_attention({{{100, 1}, {5, 2}}, 16, 512, 64, 64, gpu::KvFormat::FP8E4M3, 0, false}, 302);
  run_attention({{{100, 1}, {5, 1}}, 16, 512, 64, 64, gpu::KvFormat::FP8E4M3, 8, true}, 303);
  run_attention({{{100, 1}, {5, 1}}, 16, 512, 64, 32, gpu::KvFormat::BF16, 0, true}, 304);
}

TEST(CudaMlaAttention, ChooserFitsEveryDeviceOrRefuses) {
  // Pure host logic: limits of sm_90 / sm_100 (227 KB per block) and sm_120 (99 KB).
  gpu::DeviceCaps big, small, tiny;
  big.sm_major = 9;
  big.multiprocessors = 132;
  big.smem_per_block_optin = 232448;
  small = big;
  small.sm_major = 12;
  small.smem_per_block_optin = 101376;
  tiny = big;
  tiny.smem_per_block_optin = 16 * 1024;
  for (const auto* caps : {&big, &small})
    for (int r : {16, 128, 512})
      for (bool decode : {true, false})
        for (bool sel : {false, true}) {
          gpu::MlaAttentionShape s;
          s.m = decode ? 8 : 100;
          s.n_seqs = 8;
          s.decode_only = decode;
          s.heads = 64;
          s.kv_lora_rank = r;
          s.rope = r == 512 ? 64 : 16;
          s.page_size = 64;
          s.format = gpu::KvFormat::FP8E4M3;
          s.has_topk = sel;
          const auto c = gpu::mla_attention_choose(s, *caps);
          EXPECT_LE(c.smem_bytes, caps->smem_per_block_optin) << c.why;
          // Tensor cores where they fit: the warpgroup-MMA kernel for a dense decode batch with 64 heads on
          // sm_90, the sm90 kernel over a selection.
          const bool tensor = (decode || sel) && r == 512 && caps == &big;
          EXPECT_EQ(c.kernel != gpu::MlaAttentionKernel::General, tensor) << c.why;
          if (tensor) {
            EXPECT_EQ(c.kernel,
                      sel ? gpu::MlaAttentionKernel::Sm90Decode : gpu::MlaAttentionKernel::WgmmaDecode)
                << c.why;
          }
        }
  gpu::MlaAttentionShape s;
  s.m = 1;
  s.n_seqs = 1;
  s.heads = 64;
  s.kv_lora_rank = 512;
  s.rope = 64;
  s.page_size = 16;
  s.format = gpu::KvFormat::BF16;
  EXPECT_THROW(gpu::mla_attention_choose(s, tiny), ms::Error);
}

TEST(CudaDsaIndexer, IdenticalSelectionsOnExactData) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Seq> mixed = {{0, 5}, {40, 1}, {100, 3}, {7, 1}, {250, 1}, {15, 1}, {0, 1}};
  uint32_t seed = 400;
  for (auto f : {gpu::KvFormat::F32, gpu::KvFormat::BF16, gpu::KvFormat::FP8E4M3}) {
    run_indexer({mixed, 4, 16, 7, 16, f, true}, seed++);
    run_indexer({mixed, 8, 32, 64, 40, f, true, 3}, seed++);  // three tokens per scoring pass
    run_indexer({mixed, 3, 20, 1, 8, f, true}, seed++);
  }
  run_indexer({{{3000, 2}, {2047, 1}, {100, 1}}, 32, 128, 64, 2048, gpu::KvFormat::BF16, true}, seed++);
  // 16 tokens of long contexts: each scoring block walks several chunks of its token's keys.
  run_indexer({{{3000, 12}, {2500, 4}}, 8, 32, 64, 64, gpu::KvFormat::BF16, true}, seed++);
}

TEST(CudaDsaIndexer, TrueTopKOnContinuousData) {
  if (!have_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::vector<Seq> mixed = {{0, 5}, {40, 1}, {300, 4}, {7, 1}, {1000, 1}};
  uint32_t seed = 500;
  for (auto f : {gpu::KvFormat::F32, gpu::KvFormat::BF16})
    for (int topk : {16, 64}) run_indexer({mixed, 8, 64, 16, topk, f, false}, seed++);
}
