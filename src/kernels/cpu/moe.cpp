#include "kernels/cpu/moe.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/linear.h"

namespace ms::kernels::cpu {

namespace {

// One unit of a phase: tile t of the expert's gate and up (phase 1) or down (phase 2).
struct Item {
  const LinearParams* lp;
  int64_t tile;
};

// Below this many weight bytes in a pass the region runs on the calling thread (as linear does).
constexpr double kParallelBytes = 96.0 * 1024;

// Items [begin, end) of thread tid of n: contiguous ranges of about equal cost (cost[i] = prefix sum through
// item i), so one thread streams neighbouring tiles of one expert.
void my_range(const std::vector<double>& cost, int tid, int n, size_t* begin, size_t* end) {
  const double total = cost.empty() ? 0.0 : cost.back();
  const auto at = [&](int t) {
    if (t >= n) return cost.size();
    const double cut = total * t / n;
    return static_cast<size_t>(std::upper_bound(cost.begin(), cost.end(), cut) - cost.begin());
  };
  *begin = tid == 0 ? 0 : at(tid);
  *end = at(tid + 1);
}

}  // namespace

void moe_experts(const MoeExpertsParams& p) {
  const int64_t hidden = p.hidden, inter = p.inter;
  // The calling thread's lists, grown only; the region's threads reach them through these references (a
  // thread_local named inside the region would be each thread's own).
  static thread_local std::vector<Item> tl_items_gu, tl_items_dn;
  static thread_local std::vector<double> tl_cost_gu, tl_cost_dn;
  static thread_local std::vector<LinearParams> tl_gate, tl_up, tl_down;
  static thread_local std::vector<int32_t> tl_slot_row;
  std::vector<Item>& items_gu = tl_items_gu;
  std::vector<Item>& items_dn = tl_items_dn;
  std::vector<double>& cost_gu = tl_cost_gu;
  std::vector<double>& cost_dn = tl_cost_dn;
  std::vector<LinearParams>& lp_gate = tl_gate;
  std::vector<LinearParams>& lp_up = tl_up;
  std::vector<LinearParams>& lp_down = tl_down;
  std::vector<int32_t>& slot_row = tl_slot_row;  // [m * top_k] a slot's scratch row in its pass
  if (static_cast<int64_t>(slot_row.size()) < p.m * p.top_k)
    slot_row.resize(static_cast<size_t>(p.m * p.top_k));
  lp_gate.resize(static_cast<size_t>(p.n_experts));
  lp_up.resize(static_cast<size_t>(p.n_experts));
  lp_down.resize(static_cast<size_t>(p.n_experts));
  int e_begin = 0;
  while (e_begin < p.n_experts) {
    // One pass: experts [e_begin, e_end) whose groups fit the scratch together (one group alone always fits:
    // an expert serves each token at most once and scratch_rows >= m).
    const int32_t base = p.offsets[e_begin];
    int e_end = e_begin + 1;
    while (e_end < p.n_experts && p.offsets[e_end + 1] - base <= p.scratch_rows) ++e_end;
    const int64_t rows = p.offsets[e_end] - base;
    if (rows == 0) {
      e_begin = e_end;
      continue;
    }
    // With one token every slot reads x itself; otherwise each expert's rows are gathered.
    const bool gather = p.m > 1;
    items_gu.clear();
    items_dn.clear();
    cost_gu.clear();
    cost_dn.clear();
    double bytes = 0.0;
    for (int e = e_begin; e < e_end; ++e) {
      const int64_t r0 = p.offsets[e] - base, cnt = p.offsets[e + 1] - p.offsets[e];
      if (cnt == 0) continue;
      const auto ue = static_cast<size_t>(e);
      LinearParams& g = lp_gate[ue];
      g.x = gather ? p.xs + r0 * hidden : p.x;
      g.x_stride = hidden;
      g.w = p.gate[ue];
      g.row0 = 0;
      g.n = inter;
      g.y = p.gate_up + r0 * 2 * inter;
      g.y_stride = 2 * inter;
      g.m = cnt;
      LinearParams& u = lp_up[ue];
      u = g;
      u.w = p.up[ue];
      u.y = g.y + inter;
      LinearParams& d = lp_down[ue];
      d.x = p.act + r0 * inter;
      d.x_stride = inter;
      d.w = p.down[ue];
      d.row0 = 0;
      d.n = hidden;
      d.y = p.ys + r0 * hidden;
      d.y_stride = hidden;
      d.m = cnt;
      // Cost of a tile: its weight bytes, read once per 4 tokens.
      const double reuse = static_cast<double>((cnt + 3) / 4);
      const int64_t tg = linear_tiles(g);
      const double cg = weight_bytes(g.w) / static_cast<double>(tg) * reuse;
      // All of gate, then all of up: each matrix read as one sequential stream.
      for (const LinearParams* lp : {&g, &u})
        for (int64_t t = 0; t < tg; ++t) {
          items_gu.push_back({lp, t});
          cost_gu.push_back((cost_gu.empty() ? 0.0 : cost_gu.back()) + cg);
        }
      const int64_t td = linear_tiles(d);
      const double cd = weight_bytes(d.w) / static_cast<double>(td) * reuse;
      for (int64_t t = 0; t < td; ++t) {
        items_dn.push_back({&d, t});
        cost_dn.push_back((cost_dn.empty() ? 0.0 : cost_dn.back()) + cd);
      }
      bytes += weight_bytes(g.w) + weight_bytes(u.w) + weight_bytes(d.w);
      for (int64_t i = 0; i < cnt; ++i) slot_row[p.order[p.offsets[e] + i]] = static_cast<int32_t>(r0 + i);
    }
    const int32_t* order = p.order + base;
#pragma omp parallel if (bytes >= kParallelBytes)
    {
      const int nt = omp_get_num_threads(), tid = omp_get_thread_num();
      if (gather) {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; ++r) {
          const float* src = p.x + (order[r] / p.top_k) * hidden;
          std::copy(src, src + hidden, p.xs + r * hidden);
        }
      }
      size_t b = 0, end = 0;
      my_range(cost_gu, tid, nt, &b, &end);
      for (size_t i = b; i < end; ++i) {
        // The next matrix's first tile requested while this matrix's last one runs.
        if (i + 1 < end && items_gu[i + 1].lp != items_gu[i].lp)
          linear_prefetch_tile(*items_gu[i + 1].lp, items_gu[i + 1].tile);
        linear_tile(*items_gu[i].lp, items_gu[i].tile);
      }
#pragma omp barrier
      // SiLU-and-mul, as kernels/cpu silu_mul computes it.
#pragma omp for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        const float* gr = p.gate_up + r * 2 * inter;
        const float* ur = gr + inter;
        float* o = p.act + r * inter;
        for (int64_t j = 0; j < inter; ++j) o[j] = gr[j] / (1.0f + std::exp(-gr[j])) * ur[j];
      }
      my_range(cost_dn, tid, nt, &b, &end);
      for (size_t i = b; i < end; ++i) {
        if (i + 1 < end && items_dn[i + 1].lp != items_dn[i].lp)
          linear_prefetch_tile(*items_dn[i + 1].lp, items_dn[i + 1].tile);
        linear_tile(*items_dn[i].lp, items_dn[i].tile);
      }
#pragma omp barrier
      // Each token adds its slots of this pass in ascending expert order (the order the experts' groups
      // come in), whatever order the router listed them in.
#pragma omp for schedule(static)
      for (int64_t tok = 0; tok < p.m; ++tok) {
        int32_t slots[kMoeMaxTopK];
        int n = 0;
        for (int k = 0; k < p.top_k && n < kMoeMaxTopK; ++k) {
          const int32_t e = p.topk_ids[tok * p.top_k + k];
          if (e < e_begin || e >= e_end) continue;
          int32_t s = static_cast<int32_t>(tok * p.top_k + k);
          int j = n++;
          for (; j > 0 && p.topk_ids[slots[j - 1]] > e; --j) slots[j] = slots[j - 1];
          slots[j] = s;
        }
        float* o = p.out + tok * hidden;
        for (int j = 0; j < n; ++j) {
          const float wt = p.topk_weights[slots[j]];
          const float* y = p.ys + static_cast<int64_t>(slot_row[slots[j]]) * hidden;
          for (int64_t c = 0; c < hidden; ++c) o[c] += wt * y[c];
        }
      }
    }
    e_begin = e_end;
  }
}

}  // namespace ms::kernels::cpu
