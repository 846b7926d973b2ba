// The tensor-core MLA decode kernel (kernels/cuda/mla_decode/mla_decode_sm90.h) against a reference written
// here in double: ragged sequences over shuffled pages whose unused rows hold NaN bytes, every head count of
// the issue (8..128), 1-4 query tokens per sequence, pages of 64 and 32, fp8 (with a layer scale) and bf16
// pages, dense and DSA selections (with -1 entries, entries past the token and repeats), f32 / bf16 q and
// outputs, with the split plan the chooser makes and with one split forced (the direct-write path).
// Outputs are NaN-poisoned before each run; every element must be written and finite.
//
// Tolerance: q and P enter the tensor cores as bf16 (relative 2^-9 each), scores and sums are f32; the output
// is a convex combination of rows, so each output row is judged against its largest |reference| value:
// max error < 1e-2 of it (the older fp8 kernel's bound), mean error < 2e-3 of it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/mla_decode/mla_decode_sm90.h"
#include "kernels/cuda/mla_decode/mla_decode_wgmma.h"
#include "quant/float_formats.h"

namespace {

namespace gpu = ms::cuda;
constexpr int kDim = gpu::mla_sm90::kDim, kLat = gpu::mla_sm90::kLatent;

template <typename T>
struct Dev {
  T* ptr = nullptr;
  size_t n = 0;
  explicit Dev(const std::vector<T>& h) : n(h.size()) {
    CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(1, n) * sizeof(T)));
    if (n) CUDA_CHECK(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  explicit Dev(size_t count) : n(count) { CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(1, n) * sizeof(T))); }
  ~Dev() { cudaFree(ptr); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

struct Case {
  int heads;
  std::vector<int> lens;  // keys of each sequence after this step (its query tokens are the last ones)
  int q_per_seq = 1;
  int page_size = 64;
  bool fp8 = true;
  int topk = 0;  // DSA selection width; 0 = dense
  bool q_bf16 = false, out_bf16 = false;
  // The selection as the DSA indexer writes it (ascending distinct positions, -1 only at the tail) and
  // declared compact to the kernel, which then stops at each token's first positions + 1 entries.
  bool compact = false;
  bool wgmma = false;     // run mla_decode_wgmma (sm_90a warpgroup MMA, dense fp8) instead of mla_decode_sm90
  int forced_splits = 0;  // > 0: also run with max_splits = this
  int min_tiles = 0;      // > 0: the wgmma kernel's min_tiles_per_split (splits of 1-2 tiles)
  bool wide = false;      // fp8 with at most 32 rows: the whole-tile widening kernel, not the narrow one
  bool ws = false;        // the narrow kernel's warp-specialised schedule
};

std::string describe(const Case& c) {
  // Appended piece by piece: GCC 12 misreports a chain of string + literal as an overlapping memcpy.
  std::string s = "heads ";
  s += std::to_string(c.heads);
  s += " q/seq ";
  s += std::to_string(c.q_per_seq);
  s += " page ";
  s += std::to_string(c.page_size);
  s += c.fp8 ? " fp8" : " bf16";
  s += " topk ";
  s += std::to_string(c.topk);
  s += c.q_bf16 ? " q bf16" : " q f32";
  s += c.out_bf16 ? " out bf16" : " out f32";
  if (c.compact) s += " compact";
  if (c.wgmma) s += " wgmma";
  if (c.wide) s += " wide";
  if (c.ws) s += " warp-specialised";
  s += " lens";
  for (int l : c.lens) {
    s += ' ';
    s += std::to_string(l);
  }
  return s;
}

void run_case(const Case& c, uint32_t seed) {
  SCOPED_TRACE(describe(c));
  const int n_seqs = static_cast<int>(c.lens.size()), Q = c.q_per_seq, H = c.heads, ps = c.page_size;
  const int tokens = n_seqs * Q;
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.f, 1.f);
  const float kv_scale = c.fp8 ? 0.5f : 1.f, softmax_scale = 1.f / std::sqrt(192.f);

  // Pages: every sequence's pages in a shuffled order, plus spare pages; the pool starts as NaN bytes and
  // only the rows of existing tokens are written, so page tails and spare pages stay NaN.
  int max_pages = 1, used = 0;
  for (int l : c.lens) {
    max_pages = std::max(max_pages, (l + ps - 1) / ps);
    used += (l + ps - 1) / ps;
  }
  const int num_pages = used + 3;
  const int eb = c.fp8 ? 1 : 2;
  std::vector<uint8_t> pool(static_cast<size_t>(num_pages) * ps * kDim * eb, c.fp8 ? 0x7f : 0xff);
  std::vector<int> perm(num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> table(static_cast<size_t>(n_seqs) * max_pages, -1);
  std::vector<std::vector<double>> keys(n_seqs);  // [seq][pos * 576 + d] as the kernel should see them
  int next = 0;
  for (int b = 0; b < n_seqs; ++b) {
    keys[b].resize(static_cast<size_t>(c.lens[b]) * kDim);
    for (int pg = 0; pg * ps < c.lens[b]; ++pg) table[static_cast<size_t>(b) * max_pages + pg] = perm[next++];
    for (int t = 0; t < c.lens[b]; ++t) {
      const size_t row =
          static_cast<size_t>(table[static_cast<size_t>(b) * max_pages + t / ps]) * ps + t % ps;
      for (int d = 0; d < kDim; ++d) {
        const float v = dist(rng);
        double x;
        if (c.fp8) {
          const uint8_t e = ms::quant::f32_to_fp8_e4m3(v);
          pool[row * kDim + d] = e;
          x = static_cast<double>(ms::quant::fp8_e4m3_to_f32(e)) * kv_scale;
        } else {
          const uint16_t h = ms::quant::f32_to_bf16(v);
          std::memcpy(&pool[(row * kDim + d) * 2], &h, 2);
          x = ms::quant::bf16_to_f32(h);
        }
        keys[b][static_cast<size_t>(t) * kDim + d] = x;
      }
    }
  }
  // Queries: token b * Q + j at position len_b - Q + j (negative: it sees nothing, output zeros).
  std::vector<int32_t> positions(tokens), seq_lens(c.lens.begin(), c.lens.end());
  for (int b = 0; b < n_seqs; ++b)
    for (int j = 0; j < Q; ++j) positions[b * Q + j] = c.lens[b] - Q + j;
  std::vector<float> qf(static_cast<size_t>(tokens) * H * kDim);
  std::vector<uint16_t> qb(qf.size());
  for (size_t i = 0; i < qf.size(); ++i) {
    qb[i] = ms::quant::f32_to_bf16(2.f * dist(rng));
    qf[i] = c.q_bf16 ? ms::quant::bf16_to_f32(qb[i]) : 2.f * dist(rng);
  }
  // Selection: visible positions, -1, positions past the token (ignored) and repeats.
  std::vector<int32_t> topk(static_cast<size_t>(tokens) * c.topk);
  for (int i = 0; c.compact && i < tokens; ++i) {
    const int pos = positions[i];
    std::vector<int32_t> all;
    for (int t = 0; t <= pos; ++t) all.push_back(t);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(std::min<size_t>(all.size(), static_cast<size_t>(c.topk)));
    std::sort(all.begin(), all.end());
    for (int k = 0; k < c.topk; ++k)
      topk[static_cast<size_t>(i) * c.topk + k] = k < static_cast<int>(all.size()) ? all[k] : -1;
  }
  for (int i = 0; !c.compact && i < tokens; ++i) {
    const int b = i / Q, pos = positions[i];
    for (int k = 0; k < c.topk; ++k) {
      const int kind = static_cast<int>(rng() % 10);
      int32_t e = pos >= 0 ? static_cast<int32_t>(rng() % static_cast<uint32_t>(pos + 1)) : -1;
      if (kind == 0) e = -1;
      if (kind == 1) e = static_cast<int32_t>(rng() % static_cast<uint32_t>(c.lens[b] + ps));  // may be > pos
      if (kind == 2 && k > 0) e = topk[static_cast<size_t>(i) * c.topk + k - 1];
      topk[static_cast<size_t>(i) * c.topk + k] = e;
    }
  }

  // Reference: q rounded to bf16 as the kernel reads it.
  std::vector<double> q_ref(qf.size());
  for (size_t i = 0; i < qf.size(); ++i) q_ref[i] = ms::quant::bf16_to_f32(ms::quant::f32_to_bf16(qf[i]));
  std::vector<double> ref(static_cast<size_t>(tokens) * H * kLat, 0.0);
  std::vector<int> sel;
  std::vector<double> s;
  for (int i = 0; i < tokens; ++i) {
    const int b = i / Q, pos = positions[i];
    sel.clear();
    if (c.topk) {
      for (int k = 0; k < c.topk; ++k) {
        const int e = topk[static_cast<size_t>(i) * c.topk + k];
        if (e >= 0 && e <= pos) sel.push_back(e);
      }
    } else {
      for (int t = 0; t <= pos && t < c.lens[b]; ++t) sel.push_back(t);
    }
    if (sel.empty()) continue;
    s.resize(sel.size());
    for (int h = 0; h < H; ++h) {
      const size_t qo = (static_cast<size_t>(i) * H + h) * kDim;
      double mx = -1e300;
      for (size_t k = 0; k < sel.size(); ++k) {
        const double* kr = &keys[b][static_cast<size_t>(sel[k]) * kDim];
        double acc = 0;
        for (int d = 0; d < kDim; ++d) acc += q_ref[qo + d] * kr[d];
        s[k] = acc * softmax_scale;
        mx = std::max(mx, s[k]);
      }
      double sum = 0;
      for (double& v : s) sum += (v = std::exp(v - mx));
      double* out = &ref[(static_cast<size_t>(i) * H + h) * kLat];
      for (size_t k = 0; k < sel.size(); ++k) {
        const double* kr = &keys[b][static_cast<size_t>(sel[k]) * kDim];
        const double w = s[k] / sum;
        for (int d = 0; d < kLat; ++d) out[d] += w * kr[d];
      }
    }
  }

  Dev<uint8_t> dpool(pool);
  Dev<int32_t> dtable(table), dlens(seq_lens), dpos(positions), dtopk(topk);
  Dev<float> dqf(qf);
  Dev<uint16_t> dqb(qb);
  const size_t out_elems = ref.size();
  Dev<uint8_t> dout(out_elems * (c.out_bf16 ? 2 : 4));
  gpu::MlaDecodeSm90Params p;
  p.q = c.q_bf16 ? static_cast<const void*>(dqb.ptr) : static_cast<const void*>(dqf.ptr);
  p.q_bf16 = c.q_bf16;
  p.q_token_stride = static_cast<int64_t>(H) * kDim;
  p.kv = dpool.ptr;
  p.kv_fp8 = c.fp8;
  p.kv_scale = kv_scale;
  p.num_pages = num_pages;
  p.page_size = ps;
  p.block_table = dtable.ptr;
  p.block_table_stride = max_pages;
  p.seq_lens = dlens.ptr;
  p.positions = dpos.ptr;
  p.topk = c.topk ? dtopk.ptr : nullptr;
  p.topk_width = c.topk;
  p.topk_compact = c.compact;
  p.out = dout.ptr;
  p.out_bf16 = c.out_bf16;
  p.out_token_stride = static_cast<int64_t>(H) * kLat;
  p.n_seqs = n_seqs;
  p.q_per_seq = Q;
  p.heads = H;
  p.softmax_scale = softmax_scale;
  p.no_narrow = c.wide;

  const auto caps = gpu::query_device(0);
  // Runs the chosen kernel with max_splits = splits, NaN-poisoned workspace.
  std::vector<int> split_counts;
  std::function<void(int)> launch;
  gpu::mla_wgmma::Config wcfg;
  gpu::mla_sm90::Config scfg;
  std::unique_ptr<Dev<uint8_t>> ws;
  if (c.wgmma) {
    wcfg = gpu::mla_decode_wgmma_choose(p, gpu::limits_of(caps));
    ASSERT_GT(wcfg.heads_per_block, 0);
    if (c.min_tiles > 0) wcfg.min_tiles_per_split = c.min_tiles;
    split_counts = {wcfg.max_splits, wcfg.max_splits > 1 ? 1 : 3};
    if (c.forced_splits > 0) split_counts.push_back(c.forced_splits);
    launch = [&](int splits) {
      gpu::mla_wgmma::Config cfg = wcfg;
      cfg.max_splits = splits;
      cfg.workspace = splits > 1 ? gpu::mla_sm90::workspace_bytes(cfg.units, splits, Q * H) : 0;
      ws = std::make_unique<Dev<uint8_t>>(cfg.workspace);
      p.workspace = cfg.workspace ? ws->ptr : nullptr;
      if (cfg.workspace) CUDA_CHECK(cudaMemset(ws->ptr, 0xff, cfg.workspace));
      gpu::mla_decode_wgmma(cfg, p, nullptr);
    };
  } else {
    scfg = gpu::mla_decode_sm90_choose(p, gpu::limits_of(caps));
    ASSERT_GT(scfg.heads_per_block, 0);
    // fp8 pages with at most 32 rows a block on sm_89+ take the narrow kernel unless told not to.
    const bool narrow = c.fp8 && !c.wide && caps.arch() >= 89 && scfg.heads_per_block * scfg.q_per_unit <= 32;
    EXPECT_EQ(scfg.narrow_nt > 0, narrow) << "heads per block " << scfg.heads_per_block;
    if (c.ws) {
      scfg = gpu::mla_sm90::narrow_ws_of(scfg, H, gpu::limits_of(caps));
      ASSERT_GT(scfg.narrow_nt, 0);
      ASSERT_TRUE(scfg.narrow_ws);
    }
    split_counts = {scfg.max_splits, scfg.max_splits > 1 ? 1 : 3};
    if (c.forced_splits > 0) split_counts.push_back(c.forced_splits);
    launch = [&](int splits) {
      gpu::mla_sm90::Config cfg = scfg;
      cfg.max_splits = splits;
      cfg.workspace = splits > 1 ? gpu::mla_sm90::workspace_bytes(cfg.units, splits, cfg.q_per_unit * H) : 0;
      ws = std::make_unique<Dev<uint8_t>>(cfg.workspace);
      p.workspace = cfg.workspace ? ws->ptr : nullptr;
      if (cfg.workspace) CUDA_CHECK(cudaMemset(ws->ptr, 0xff, cfg.workspace));
      gpu::mla_decode_sm90(cfg, p, nullptr);
    };
  }
  for (const int splits :
       split_counts) {  // the chooser's plan, and the direct-write or split-and-combine path
    SCOPED_TRACE("max_splits " + std::to_string(splits));
    CUDA_CHECK(cudaMemset(dout.ptr, 0xff, dout.n));  // NaN in f32 and in bf16
    launch(splits);
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> got(out_elems);
    if (c.out_bf16) {
      std::vector<uint16_t> raw(out_elems);
      CUDA_CHECK(cudaMemcpy(raw.data(), dout.ptr, out_elems * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < out_elems; ++i) got[i] = ms::quant::bf16_to_f32(raw[i]);
    } else {
      CUDA_CHECK(cudaMemcpy(got.data(), dout.ptr, out_elems * 4, cudaMemcpyDeviceToHost));
    }
    for (int i = 0; i < tokens; ++i)
      for (int h = 0; h < H; ++h) {
        const size_t base = (static_cast<size_t>(i) * H + h) * kLat;
        double scale = 0, worst = 0, mean = 0;
        for (int d = 0; d < kLat; ++d) scale = std::max(scale, std::fabs(ref[base + d]));
        for (int d = 0; d < kLat; ++d) {
          ASSERT_TRUE(std::isfinite(got[base + d]))
              << "unwritten or NaN at token " << i << " head " << h << " dim " << d;
          const double e = std::fabs(got[base + d] - ref[base + d]);
          worst = std::max(worst, e);
          mean += e / kLat;
        }
        if (scale == 0) {
          ASSERT_EQ(worst, 0.0) << "token " << i << " sees no key: zeros expected, head " << h;
          continue;
        }
        ASSERT_LT(worst, 1e-2 * scale) << "token " << i << " (pos " << positions[i] << ") head " << h;
        // The wgmma kernel rounds Q, K, V and P to f16 for its tensor-core products: over a full 64-key tile
        // of 4 query tokens its mean error reached 1.003e-3 of the row's largest output on an H200 (both
        // schedules, identical outputs), so its mean bound is 3e-3; the worst-element bound stays 1e-2.
        const double mean_tol = c.wgmma ? 3e-3 : 2e-3;
        ASSERT_LT(mean, mean_tol * scale) << "token " << i << " (pos " << positions[i] << ") head " << h;
      }
  }
}

bool skip() {
  return gpu::device_count() == 0 || gpu::query_device(0).arch() < 80;
}

const std::vector<int> kRagged = {1, 31, 32, 33, 64, 65, 200, 1500};

}  // namespace

TEST(MlaDecodeSm90, DenseEveryHeadCountFp8Page64) {
  if (skip()) GTEST_SKIP() << "no sm_80+ CUDA device";
  uint32_t seed = 1;
  for (int heads : {8, 16, 32, 64, 128}) run_case({heads, kRagged, 1, 64, true, 0}, seed++);
}

// fp8 pages with 8-32 heads run the narrow kernel through the chooser above; the whole-tile widening kernel
// they ran before is still there (asked for) and still right.
TEST(MlaDecodeSm90, Fp8FewHeadsOnTheWholeTileKernel) {
  if (skip()) GTEST_SKIP() << "no sm_80+ CUDA device";
  uint32_t seed = 10;
  for (int heads : {8, 16, 32}) {
    Case c{heads, kRagged, 1, 64, true, 0};
    c.wide = true;
    run_case(c, seed++);
  }
}

// The narrow kernel's 64-key steps against split ends that fall inside a step (splits of 32-key tiles), pages
// of 32, empty sequences, 8-32 rows (8 heads with 1 and 4 query tokens, 16 and 32 heads), forced 3-way
// splits.
TEST(MlaDecodeSm90, NarrowStepEdges) {
  if (skip()) GTEST_SKIP() << "no sm_80+ CUDA device";
  uint32_t seed = 140;
  for (bool ws : {false, true}) {
    for (int heads : {8, 16, 32})
      for (int page : {64, 32}) {
        Case c{heads, {1, 63, 64, 65, 127, 129, 192, 0}, 1, page, true, 0};
        c.forced_splits = 3;
        c.ws = ws;
        run_case(c, seed++);
      }
    Case q4{8, {4, 63, 64, 65, 130, 0}, 4, 32, true, 0};
    q4.forced_splits = 3;
    q4.ws = ws;
    run_case(q4, seed++);
    Case one{8, {9000}, 1, 64, true, 0, true, true};  // batch 1: many splits, bf16 q and out
    one.ws = ws;
    run_case(one, seed++);
    Case dsa{16, {1, 40, 300, 2100}, 1, 64, true, 100};
    dsa.ws = ws;
    run_case(dsa, seed++);
    Case dsa8{8, {3000, 50}, 1, 32, true, 2048};
    dsa8.compact = true;
    dsa8.ws = ws;
    run_case(dsa8, seed++);
  }
}

TEST(MlaDecodeSm90, DenseEveryHeadCountBf16Page32) {
  if (skip()) GTEST_SKIP() << "no sm_80+ CUDA device";
  uint32_t seed = 20;
  for (int heads : {8, 16, 32, 64, 128}) run_case({heads, kRagged, 1, 32, false, 0}, seed++);
}

TEST(MlaDecodeSm90, SeveralQueryTokensPerSequence) {
  if (skip()) GTEST_SKIP() << "no sm_80+ CUDA device";
  uint32_t seed = 40;
  for (int q : {2, 3, 4})
    for (int heads : {8, 16, 64, 128})
      for (bool fp8 : {true, false}) run_case({heads, {2, 4, 33, 97, 700}, q, fp8 ? 32 : 64, fp8, 0}, seed++);
  run_case({8, {1, 2, 50}, 3, 64, true, 0}, seed++);  // a sequence shorter than its query tokens
}

TEST(MlaDecodeSm90, DsaSelections) {
  if (skip()) GTEST_SKIP() << "no sm_80+ CUDA device";
  uint32_t seed = 80;
  for (int heads : {8, 16, 32, 64, 128})
    for (bool fp8 : {true, false}) run_case({heads, {1, 40, 300, 2100}, 1, fp8 ? 64 : 32, fp8, 100}, seed++);
  run_case({64, {3000}, 1, 64, true, 2048}, seed++);        // GLM-5's index_topk at batch 1: splits
  run_case({16, {90, 2500, 7}, 2, 32, false, 64}, seed++);  // two tokens per sequence, own selections
  run_case({32, {5, 6}, 1, 64, true, 33}, seed++);          // width not a multiple of the tile
}

TEST(MlaDecodeSm90, DsaCompactSelectionsStopAtThePosition) {
  if (skip()) GTEST_SKIP() << "no sm_80+ CUDA device";
  uint32_t seed = 120;
  for (int heads : {16, 64, 128})
    for (bool fp8 : {true, false}) {
      Case c{heads, {1, 40, 300, 2100}, 1, fp8 ? 64 : 32, fp8, 100};
      c.compact = true;
      run_case(c, seed++);
    }
  for (int len : {1, 512, 3000}) {  // GLM-5's index_topk at batch 1: contexts below and above the width
    Case c{64, {len}, 1, 64, true, 2048};
    c.compact = true;
    run_case(c, seed++);
  }
}

TEST(MlaDecodeSm90, LongSequencesSplitAndMixedDtypes) {
  if (skip()) GTEST_SKIP() << "no sm_80+ CUDA device";
  run_case({64, {9000}, 1, 64, true, 0, true, true}, 100);  // batch 1: many splits, bf16 q and out
  run_case({16, {6000, 10}, 1, 32, false, 0, false, true}, 101);
  run_case({128, {4100, 0, 4096}, 1, 64, true, 0, true, false}, 102);  // an empty sequence: zeros
}

TEST(MlaDecodeSm90, RefusesBadParams) {
  if (skip()) GTEST_SKIP() << "no sm_80+ CUDA device";
  gpu::MlaDecodeSm90Params p;
  gpu::mla_sm90::Config c;
  EXPECT_THROW(gpu::mla_decode_sm90(c, p, nullptr), ms::Error);
}

// The warpgroup-MMA kernel (sm_90a, dense fp8 pages): 64 and 128 heads, 1-4 query tokens, pages of 64 (one
// bulk copy a tile) and 32 (one a row), ragged lengths with NaN page tails, its plan and forced splits.
namespace {

bool skip_wgmma() {
  return gpu::device_count() == 0 || gpu::query_device(0).arch() != 90;
}

Case wgmma_case(int heads, std::vector<int> lens, int q, int page) {
  Case c{heads, std::move(lens), q, page, true, 0};
  c.wgmma = true;
  return c;
}

void run_wgmma(const Case& c, uint32_t seed) {
  run_case(c, seed);
}

}  // namespace

TEST(MlaDecodeWgmma, DenseFp8Pages64And32) {
  if (skip_wgmma()) GTEST_SKIP() << "needs an sm_90 device";
  uint32_t seed = 200;
  for (int heads : {64, 128})
    for (int page : {64, 32}) run_wgmma(wgmma_case(heads, kRagged, 1, page), seed++);
}

TEST(MlaDecodeWgmma, SeveralQueryTokensPerSequence) {
  if (skip_wgmma()) GTEST_SKIP() << "needs an sm_90 device";
  uint32_t seed = 220;
  for (int q : {2, 3, 4})
    for (int heads : {64, 128})
      run_wgmma(wgmma_case(heads, {2, 4, 33, 97, 700}, q, q == 3 ? 32 : 64), seed++);
  run_wgmma(wgmma_case(64, {1, 2, 50}, 3, 64), seed++);  // a sequence shorter than its query tokens
}

TEST(MlaDecodeWgmma, LongSequencesSplitAndMixedDtypes) {
  if (skip_wgmma()) GTEST_SKIP() << "needs an sm_90 device";
  Case a = wgmma_case(64, {9000}, 1, 64);  // batch 1: many splits, bf16 q and out
  a.q_bf16 = a.out_bf16 = true;
  run_wgmma(a, 240);
  Case b = wgmma_case(128, {4100, 0, 4096}, 1, 64);  // an empty sequence: zeros
  b.q_bf16 = true;
  run_wgmma(b, 241);
  run_wgmma(wgmma_case(64, {5000, 70, 3000, 64}, 2, 32), 242);
}

// Tile counts of a split (the seesaw schedule's warpgroups take alternate tiles; an odd count leaves the
// second one a round without its own tile): one key, one short of a tile, exactly one, one over, two tiles
// less one, two tiles plus one, three tiles and an empty sequence; with the chooser's plan, one split, and
// splits of 1-2 tiles (min_tiles 1, 2 splits: 129 keys = tiles {0, 1} and {2}, a split whose only tile has
// one key); then 4 query tokens, whose causal rows cross tile edges.
TEST(MlaDecodeWgmma, TileCountsAndEdges) {
  if (skip_wgmma()) GTEST_SKIP() << "needs an sm_90 device";
  uint32_t seed = 260;
  for (int heads : {64, 128})
    for (int page : {64, 32}) {
      Case c = wgmma_case(heads, {1, 63, 64, 65, 127, 129, 192, 0}, 1, page);
      c.min_tiles = 1;
      c.forced_splits = 2;
      run_wgmma(c, seed++);
    }
  Case q = wgmma_case(64, {2, 64, 65, 129, 200}, 4, 64);
  q.min_tiles = 1;
  q.forced_splits = 3;
  run_wgmma(q, seed++);
}

// A batch-1 sequence split 128 ways, one tile a split (as at batch 1 x 32k on 132 multiprocessors), the last
// one short; then two sequences in splits of 3 tiles.
TEST(MlaDecodeWgmma, ManySplits) {
  if (skip_wgmma()) GTEST_SKIP() << "needs an sm_90 device";
  Case c = wgmma_case(64, {64 * 128 - 3}, 1, 64);
  c.min_tiles = 1;
  c.forced_splits = 128;
  run_wgmma(c, 270);
  Case d = wgmma_case(64, {64 * 200 + 5, 64 * 37}, 2, 32);
  d.min_tiles = 3;
  d.forced_splits = 100;
  run_wgmma(d, 271);
}

TEST(MlaDecodeWgmma, RefusesWhatItDoesNotRun) {
  if (skip_wgmma()) GTEST_SKIP() << "needs an sm_90 device";
  gpu::MlaDecodeSm90Params p;
  EXPECT_THROW(gpu::mla_decode_wgmma(gpu::mla_wgmma::Config{}, p, nullptr), ms::Error);
  p.kv_fp8 = false;
  EXPECT_EQ(gpu::mla_decode_wgmma_choose(p, gpu::limits_of(gpu::query_device(0))).heads_per_block, 0);
}
