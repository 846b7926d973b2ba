// The CUDA branch of each op entry point (ops.h, attention.h, moe_experts.h): the entry point checks shapes,
// dtypes and devices, then calls the function of the same name here, which fills the kernel's Params from the
// tensors and launches on ctx's stream. Defined only in a CUDA build; entry points call them only there.
#pragma once

#include <cstdint>
#include <span>

#include "core/tensor.h"
#include "ops/attention.h"
#include "ops/ctx.h"
#include "ops/linear_weight.h"
#include "ops/moe_experts.h"
#include "ops/ops.h"

namespace ms::ops::cuda_ops {

void linear_rows(const Ctx& ctx, const Tensor& x, const LinearWeight& w, int64_t row0, const Tensor& y);
void embedding(const Ctx& ctx, const Tensor& ids, const LinearWeight& table, const Tensor& out);
void rms_norm(const Ctx& ctx, const Tensor& x, const Tensor& weight, float eps, const Tensor& out);
void add_rms_norm(const Ctx& ctx, const Tensor& h, const Tensor& delta, const Tensor& weight, float eps,
                  const Tensor& xn);
void layer_norm(const Ctx& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                const Tensor& out);
void rope(const Ctx& ctx, const Tensor& x, int64_t offset, const Tensor& positions, const RopeTable& table);
void silu_mul(const Ctx& ctx, const Tensor& x, const Tensor& out);
void add_inplace(const Ctx& ctx, const Tensor& y, const Tensor& x);
void scale(const Ctx& ctx, const Tensor& x, float s);
void fill_zero(const Ctx& ctx, const Tensor& x);
void gather_rows(const Ctx& ctx, const Tensor& x, const Tensor& rows, const Tensor& out);
void remap_ids(const Ctx& ctx, const Tensor& ids, const Tensor& map, const Tensor& out);
void append_expert_slot(const Ctx& ctx, const Tensor& ids, const Tensor& wts, int32_t id, float weight,
                        const Tensor& ids_out, const Tensor& wts_out);
void remap_ids_replicated(const Ctx& ctx, const Tensor& ids, const Tensor& copies, const Tensor& slots,
                          const Tensor& out);
void copy_from_host(const Ctx& ctx, const void* src, const Tensor& dst, size_t bytes);
void copy_rows_from_host(const Ctx& ctx, const void* src, size_t row_bytes, int64_t rows, const Tensor& dst,
                         size_t dst_pitch);
void copy_to_host(const Ctx& ctx, const Tensor& src, void* dst, size_t bytes);

void cache_write(const Ctx& ctx, const Tensor& x, const PagedCacheLayer& cache, const AttentionMeta& meta);
void mla_absorb_q(const Ctx& ctx, const Tensor& q, const LinearWeight& kv_b, int64_t nope, int64_t v,
                  const Tensor& q_cat);
void mla_attention(const Ctx& ctx, const Tensor& q_cat, const PagedCacheLayer& cache,
                   const AttentionMeta& meta, const Tensor& topk, float softmax_scale, const Tensor& lat,
                   bool topk_compact = false);
void mla_out_v(const Ctx& ctx, const Tensor& lat, const LinearWeight& kv_b, int64_t nope, int64_t v,
               const Tensor& out);
int64_t dsa_indexer_scratch_floats(int64_t max_keys);
void dsa_indexer(const Ctx& ctx, const Tensor& q, const Tensor& w, const PagedCacheLayer& keys,
                 const AttentionMeta& meta, float softmax_scale, const Tensor& topk, const Tensor& scratch);

void moe_experts(const Ctx& ctx, const Tensor& x, const Tensor& topk_ids, const Tensor& topk_weights,
                 std::span<const ExpertWeights> experts, const Tensor& out);

}  // namespace ms::ops::cuda_ops
