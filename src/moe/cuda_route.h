// The CUDA branch of moe::route_step (route_step.h calls it on a CUDA context): the routing kernels of
// kernels/cuda/moe with the decode mask on the device, so a step routes without any host sync.
#pragma once

#include "core/tensor.h"
#include "moe/router.h"
#include "ops/ctx.h"

namespace ms::moe {

void route_step_cuda(const ops::Ctx& ctx, const RouterConfig& cfg, const OeaConfig& oea, const Tensor& logits,
                     const Tensor& correction_bias, const Tensor& decode_mask, const Tensor& topk_ids,
                     const Tensor& topk_weights, const Tensor& plain_ids, const Tensor& plain_weights_scratch,
                     const Tensor& base_set_scratch);

}  // namespace ms::moe
