#include "moe/route_step.h"

#include <algorithm>

#include "core/error.h"
#include "moe/cuda_route.h"

namespace ms::moe {

RouteScratch RouteScratch::make(const ops::TensorAlloc& alloc, int64_t max_tokens, int n_experts, int top_k) {
  RouteScratch s;
  s.decode_rows = alloc({max_tokens}, DType::I32);
  s.decode_logits = alloc({max_tokens * n_experts}, DType::F32);
  s.decode_ids = alloc({max_tokens * top_k}, DType::I32);
  s.decode_weights = alloc({max_tokens * top_k}, DType::F32);
  s.base_set = alloc({n_experts}, DType::U8);
  return s;
}

void route_step(const ops::Ctx& ctx, const RouterConfig& cfg, const OeaConfig& oea, const Tensor& logits,
                const Tensor& correction_bias, const Tensor& decode_mask, const Tensor& topk_ids,
                const Tensor& topk_weights, const Tensor& plain_ids, const RouteScratch& s) {
  ops::check_device(ctx, "moe_route",
                    {&logits, &correction_bias, &decode_mask, &topk_ids, &topk_weights, &plain_ids,
                     &s.decode_rows, &s.decode_logits});
  const int E = cfg.n_experts, K = cfg.top_k;
  MS_CHECK(logits.dtype() == DType::F32 && logits.dim() == 2 && logits.size(1) == E && logits.is_contiguous(),
           "moe_route: logits must be contiguous f32 [m, {}], got {}", E, logits.desc());
  const int m = static_cast<int>(logits.size(0));
  auto check_out = [&](const Tensor& t, DType dt, std::string_view what) {
    MS_CHECK(t.dtype() == dt && t.dim() == 2 && t.size(0) == m && t.size(1) == K && t.is_contiguous(),
             "moe_route: {} must be contiguous {} [{}, {}], got {}", what, dtype_name(dt), m, K, t.desc());
  };
  check_out(topk_ids, DType::I32, "topk_ids");
  check_out(topk_weights, DType::F32, "topk_weights");
  if (plain_ids.defined() && plain_ids.numel() > 0) check_out(plain_ids, DType::I32, "plain_ids");
  const bool want_plain = plain_ids.defined() && plain_ids.numel() > 0;
  RouterConfig rc = cfg;
  rc.use_correction_bias =
      rc.use_correction_bias && (correction_bias.defined() && correction_bias.numel() > 0);
  if (rc.use_correction_bias)
    MS_CHECK(correction_bias.dtype() == DType::F32 && correction_bias.numel() == E,
             "moe_route: correction bias must be f32 [{}], got {}", E, correction_bias.desc());

#if MOESERVE_HAVE_CUDA
  if (ctx.device == Device::CUDA) {
    if ((decode_mask.defined() && decode_mask.numel() > 0))
      MS_CHECK(decode_mask.dtype() == DType::U8 && decode_mask.numel() == m && decode_mask.is_contiguous(),
               "moe_route: decode mask must be u8 [{}], got {}", m, decode_mask.desc());
    MS_CHECK(s.decode_weights.numel() >= static_cast<int64_t>(m) * K,
             "moe_route: scratch sized for fewer than {} tokens", m);
    route_step_cuda(ctx, rc, oea, logits, correction_bias, decode_mask, topk_ids, topk_weights,
                    want_plain ? plain_ids : Tensor(), s.decode_weights, s.base_set);
    return;
  }
#endif
  // The decode rows (host-side on the CPU backend; the CUDA backend routes with the mask on the device).
  int n_dec = 0;
  int32_t* rows = nullptr;
  if (decode_mask.defined() && decode_mask.numel() > 0) {
    MS_CHECK(decode_mask.dtype() == DType::U8 && decode_mask.numel() == m && decode_mask.is_contiguous(),
             "moe_route: decode mask must be u8 [{}], got {}", m, decode_mask.desc());
    MS_CHECK(s.decode_rows.numel() >= m && s.decode_logits.numel() >= static_cast<int64_t>(m) * E &&
                 s.decode_ids.numel() >= static_cast<int64_t>(m) * K &&
                 s.decode_weights.numel() >= static_cast<int64_t>(m) * K,
             "moe_route: scratch sized for fewer than {} tokens", m);
    rows = s.decode_rows.data<int32_t>();
    const uint8_t* mask = decode_mask.data<uint8_t>();
    for (int i = 0; i < m; ++i)
      if (mask[i]) rows[n_dec++] = i;
  }
  const bool use_oea = oea.enabled && n_dec > 0;
  RouterParams rp;
  rp.logits = logits.data<float>();
  rp.correction_bias = rc.use_correction_bias ? correction_bias.data<float>() : nullptr;
  rp.topk_ids = topk_ids.data<int32_t>();
  rp.topk_weights = topk_weights.data<float>();
  rp.n_tokens = m;
  if (!use_oea || n_dec < m || want_plain) route_cpu(rc, OeaConfig{}, rp);
  if (want_plain)
    std::copy_n(topk_ids.data<int32_t>(), static_cast<size_t>(m) * K, plain_ids.data<int32_t>());
  if (!use_oea) return;
  if (n_dec == m) {
    route_cpu(rc, oea, rp);
    return;
  }
  // Decode tokens are scattered among prefill chunks: route them as one contiguous block.
  float* lg = s.decode_logits.data<float>();
  int32_t* ids = s.decode_ids.data<int32_t>();
  float* wts = s.decode_weights.data<float>();
  for (int j = 0; j < n_dec; ++j)
    std::copy_n(logits.data<float>() + static_cast<int64_t>(rows[j]) * E, E,
                lg + static_cast<int64_t>(j) * E);
  RouterParams dp = rp;
  dp.logits = lg;
  dp.topk_ids = ids;
  dp.topk_weights = wts;
  dp.n_tokens = n_dec;
  route_cpu(rc, oea, dp);
  for (int j = 0; j < n_dec; ++j) {
    const int64_t dst = static_cast<int64_t>(rows[j]) * K, src = static_cast<int64_t>(j) * K;
    std::copy_n(ids + src, K, topk_ids.data<int32_t>() + dst);
    std::copy_n(wts + src, K, topk_weights.data<float>() + dst);
  }
}

}  // namespace ms::moe
