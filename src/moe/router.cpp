#include "moe/router.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "moe/token_route.h"

namespace ms::moe {

void validate(const RouterConfig& cfg) {
  MS_CHECK(cfg.n_experts > 0, "router: n_routed_experts is {}", cfg.n_experts);
  MS_CHECK(cfg.top_k >= 1 && cfg.top_k <= cfg.n_experts, "router: num_experts_per_tok {} is outside [1, {}]",
           cfg.top_k, cfg.n_experts);
  MS_CHECK(cfg.n_group >= 1 && cfg.n_experts % cfg.n_group == 0,
           "router: n_group {} does not divide n_routed_experts {}", cfg.n_group, cfg.n_experts);
  MS_CHECK(cfg.topk_group >= 1 && cfg.topk_group <= cfg.n_group,
           "router: topk_group {} is outside [1, n_group {}]", cfg.topk_group, cfg.n_group);
  // With -inf masking, fewer eligible experts than top_k would leave slots with nothing to choose from.
  MS_CHECK(cfg.masked_fill == MaskedFill::Zero || cfg.topk_group * (cfg.n_experts / cfg.n_group) >= cfg.top_k,
           "router: topk_group {} groups of {} experts hold fewer than num_experts_per_tok {}",
           cfg.topk_group, cfg.n_experts / cfg.n_group, cfg.top_k);
  MS_CHECK(std::isfinite(cfg.routed_scaling_factor), "router: routed_scaling_factor is {}",
           cfg.routed_scaling_factor);
}

void validate(const RouterConfig& cfg, const OeaConfig& oea) {
  validate(cfg);
  if (!oea.enabled) return;
  MS_CHECK(oea.k0 >= 1 && oea.k0 <= cfg.top_k, "router: oea k0 {} is outside [1, top_k {}]", oea.k0,
           cfg.top_k);
  MS_CHECK(oea.kmax == 0 || (oea.kmax >= oea.k0 && oea.kmax <= cfg.top_k),
           "router: oea kmax {} is outside [k0 {}, top_k {}] (0 means top_k)", oea.kmax, oea.k0, cfg.top_k);
}

namespace {

void route_plain(const RouterConfig& cfg, const RouterParams& p) {
  const float* bias = cfg.use_correction_bias ? p.correction_bias : nullptr;
#pragma omp parallel if (p.n_tokens >= detail::kParallelMinTokens)
  {
    detail::TokenRoute tr(cfg);
    std::vector<int32_t> ids(cfg.top_k);
#pragma omp for schedule(static)
    for (int t = 0; t < p.n_tokens; ++t) {
      tr.score(p.logits + static_cast<int64_t>(t) * cfg.n_experts, bias);
      tr.order_first(cfg.top_k);
      for (int i = 0; i < cfg.top_k; ++i) ids[i] = tr.candidates()[i].id;
      const int64_t off = static_cast<int64_t>(t) * cfg.top_k;
      detail::write_slots(cfg, tr.scores(), ids.data(), cfg.top_k, p.topk_ids + off, p.topk_weights + off);
    }
  }
}

}  // namespace

void route_cpu(const RouterConfig& cfg, const OeaConfig& oea, const RouterParams& p) {
  validate(cfg, oea);
  MS_CHECK(p.n_tokens == 0 || (p.topk_ids && p.topk_weights), "router: topk_ids / topk_weights is null");
  detail::check_inputs(cfg, p);
  if (!oea.enabled) {
    route_plain(cfg, p);
    return;
  }
  std::vector<uint8_t> base_set(cfg.n_experts, 0);
  oea_base_set_cpu(cfg, oea, p, base_set.data());
  route_oea_fill_cpu(cfg, oea, p, base_set.data());
}

int count_distinct_experts(const int32_t* topk_ids, int n_tokens, int top_k, int n_experts) {
  MS_CHECK(n_tokens >= 0 && top_k >= 0 && n_experts > 0,
           "count_distinct_experts: n_tokens {} top_k {} n_experts {}", n_tokens, top_k, n_experts);
  std::vector<uint8_t> seen(n_experts, 0);
  int distinct = 0;
  const int64_t total = static_cast<int64_t>(n_tokens) * top_k;
  for (int64_t i = 0; i < total; ++i) {
    const int32_t e = topk_ids[i];
    if (e < 0) continue;
    MS_CHECK(e < n_experts, "count_distinct_experts: topk_ids[{}] = {} is not below n_experts {}", i, e,
             n_experts);
    distinct += seen[e] == 0;
    seen[e] = 1;
  }
  return distinct;
}

}  // namespace ms::moe
