// Opportunistic Expert Activation on the CPU: step 1 (base set) and step 3 (fill); see moe/router.h.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "moe/router.h"
#include "moe/token_route.h"

namespace ms::moe {

namespace {

void check_oea_call(const RouterConfig& cfg, const OeaConfig& oea, const RouterParams& p) {
  MS_CHECK(oea.enabled, "router: OEA step called with oea.enabled false");
  validate(cfg, oea);
  detail::check_inputs(cfg, p);
}

}  // namespace

void oea_base_set_cpu(const RouterConfig& cfg, const OeaConfig& oea, const RouterParams& p,
                      uint8_t* base_set) {
  check_oea_call(cfg, oea, p);
  MS_CHECK(base_set != nullptr, "router: OEA base_set is null");
  const float* bias = cfg.use_correction_bias ? p.correction_bias : nullptr;
  // Each thread ORs into its own flags, merged at the end: no shared writes inside the token loop.
#pragma omp parallel if (p.n_tokens >= detail::kParallelMinTokens)
  {
    detail::TokenRoute tr(cfg);
    std::vector<uint8_t> local(cfg.n_experts, 0);
#pragma omp for schedule(static) nowait
    for (int t = 0; t < p.n_tokens; ++t) {
      tr.score(p.logits + static_cast<int64_t>(t) * cfg.n_experts, bias);
      tr.order_first(oea.k0);
      for (int i = 0; i < oea.k0; ++i) local[tr.candidates()[i].id] = 1;
    }
#pragma omp critical(ms_moe_oea_base_set)
    for (int e = 0; e < cfg.n_experts; ++e) base_set[e] |= local[e];
  }
}

void route_oea_fill_cpu(const RouterConfig& cfg, const OeaConfig& oea, const RouterParams& p,
                        const uint8_t* base_set) {
  check_oea_call(cfg, oea, p);
  MS_CHECK(base_set != nullptr, "router: OEA base_set is null");
  MS_CHECK(p.n_tokens == 0 || (p.topk_ids && p.topk_weights), "router: topk_ids / topk_weights is null");
  const float* bias = cfg.use_correction_bias ? p.correction_bias : nullptr;
  const int kmax = oea.kmax == 0 ? cfg.top_k : oea.kmax;
#pragma omp parallel if (p.n_tokens >= detail::kParallelMinTokens)
  {
    detail::TokenRoute tr(cfg);
    std::vector<int32_t> ids(cfg.top_k);
#pragma omp for schedule(static)
    for (int t = 0; t < p.n_tokens; ++t) {
      tr.score(p.logits + static_cast<int64_t>(t) * cfg.n_experts, bias);
      const auto& cand = tr.candidates();
      const int used = oea.k0 + tr.order_fill(oea.k0, kmax - oea.k0, base_set);
      for (int i = 0; i < used; ++i) ids[i] = cand[i].id;
      const int64_t off = static_cast<int64_t>(t) * cfg.top_k;
      detail::write_slots(cfg, tr.scores(), ids.data(), used, p.topk_ids + off, p.topk_weights + off);
    }
  }
}

}  // namespace ms::moe
