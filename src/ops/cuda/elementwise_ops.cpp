#if MOESERVE_HAVE_CUDA
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/elementwise/embedding.h"
#include "kernels/cuda/elementwise/norm.h"
#include "kernels/cuda/elementwise/pointwise.h"
#include "kernels/cuda/elementwise/rope.h"
#include "ops/cuda/backend_impl.h"
#include "ops/cuda/cuda_ops.h"

namespace ms::ops::cuda_ops {

cuda::DeviceWeight device_weight(const LinearWeight& w);

void embedding(const Ctx& ctx, const Tensor& ids, const LinearWeight& table, const Tensor& out) {
  MS_CHECK(table.format == WeightFormat::F32 || table.format == WeightFormat::BF16,
           "embedding {}: the GPU reads f32 or bf16 tables, the checkpoint stores {}", table.name,
           weight_format_name(table.format));
  cuda::EmbeddingParams p;
  p.ids = ids.data<int32_t>();
  p.table = device_weight(table);
  p.out = out.data<float>();
  p.out_stride = out.stride(0);
  p.m = ids.size(0);
  cuda::embedding(p, cuda_stream(ctx));
}

void rms_norm(const Ctx& ctx, const Tensor& x, const Tensor& weight, float eps, const Tensor& out) {
  cuda::RmsNormParams p;
  p.x = x.data<float>();
  p.x_stride = x.stride(0);
  p.weight = weight.data<float>();
  p.out = out.data<float>();
  p.out_stride = out.stride(0);
  p.m = x.size(0);
  p.n = x.size(1);
  p.eps = eps;
  cuda::rms_norm(p, cuda_stream(ctx));
}

void add_rms_norm(const Ctx& ctx, const Tensor& h, const Tensor& delta, const Tensor& weight, float eps,
                  const Tensor& xn) {
  cuda::AddRmsNormParams p;
  p.h = h.data<float>();
  p.h_stride = h.stride(0);
  p.delta = delta.data<float>();
  p.delta_stride = delta.stride(0);
  p.weight = weight.data<float>();
  p.out = xn.data<float>();
  p.out_stride = xn.stride(0);
  p.m = h.size(0);
  p.n = h.size(1);
  p.eps = eps;
  cuda::add_rms_norm(p, cuda_stream(ctx));
}

void layer_norm(const Ctx& ctx, const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                const Tensor& out) {
  cuda::LayerNormParams p;
  p.x = x.data<float>();
  p.x_stride = x.stride(0);
  p.weight = weight.data<float>();
  p.bias = (bias.defined() && bias.numel() > 0) ? bias.data<float>() : nullptr;
  p.out = out.data<float>();
  p.out_stride = out.stride(0);
  p.m = x.size(0);
  p.n = x.size(1);
  p.eps = eps;
  cuda::layer_norm(p, cuda_stream(ctx));
}

void rope(const Ctx& ctx, const Tensor& x, int64_t offset, const Tensor& positions, const RopeTable& table) {
  cuda::RopeParams p;
  p.x = x.data<float>();
  p.row_stride = x.stride(0);
  p.head_stride = x.stride(1);
  p.offset = offset;
  p.m = x.size(0);
  p.heads = x.size(1);
  p.dim = table.dim();
  p.positions = positions.data<int32_t>();
  MS_CHECK(table.inv_freq.device() == Device::CUDA, "rope: the frequency table is not on the GPU");
  p.inv_freq = table.inv_freq.data<float>();
  p.attention_scaling = table.attention_scaling;
  p.interleaved = table.interleaved;
  cuda::rope(p, cuda_stream(ctx));
}

void silu_mul(const Ctx& ctx, const Tensor& x, const Tensor& out) {
  cuda::SiluMulParams p;
  p.x = x.data<float>();
  p.x_stride = x.stride(0);
  p.out = out.data<float>();
  p.out_stride = out.stride(0);
  p.m = out.size(0);
  p.n = out.size(1);
  cuda::silu_mul(p, cuda_stream(ctx));
}

// Contiguous tensors as [rows, cols] for the row-wise kernels.
static void as_rows(const Tensor& t, int64_t& rows, int64_t& cols) {
  cols = t.dim() >= 1 ? t.size(t.dim() - 1) : 1;
  rows = cols > 0 ? t.numel() / cols : 0;
}

void add_inplace(const Ctx& ctx, const Tensor& y, const Tensor& x) {
  cuda::AddInplaceParams p;
  as_rows(y, p.m, p.n);
  p.y = y.data<float>();
  p.y_stride = p.n;
  p.x = x.data<float>();
  p.x_stride = p.n;
  cuda::add_inplace(p, cuda_stream(ctx));
}

void scale(const Ctx& ctx, const Tensor& x, float s) {
  cuda::ScaleInplaceParams p;
  as_rows(x, p.m, p.n);
  p.y = x.data<float>();
  p.y_stride = p.n;
  p.scale = s;
  cuda::scale_inplace(p, cuda_stream(ctx));
}

void fill_zero(const Ctx& ctx, const Tensor& x) {
  if (x.nbytes()) CUDA_CHECK(cudaMemsetAsync(x.raw(), 0, x.nbytes(), cuda_stream(ctx)));
}

void gather_rows(const Ctx& ctx, const Tensor& x, const Tensor& rows, const Tensor& out) {
  cuda::GatherRowsParams p;
  p.src = x.data<float>();
  p.src_stride = x.stride(0);
  p.src_rows = x.size(0);
  p.index = rows.data<int32_t>();
  p.dst = out.data<float>();
  p.dst_stride = out.stride(0);
  p.k = rows.numel();
  p.n = x.size(1);
  cuda::gather_rows(p, cuda_stream(ctx));
}

void remap_ids(const Ctx& ctx, const Tensor& ids, const Tensor& map, const Tensor& out) {
  cuda::RemapIdsParams p;
  p.ids = ids.data<int32_t>();
  p.map = map.data<int32_t>();
  p.out = out.data<int32_t>();
  p.n = ids.numel();
  p.n_map = map.size(0);
  cuda::remap_ids(p, cuda_stream(ctx));
}

void append_expert_slot(const Ctx& ctx, const Tensor& ids, const Tensor& wts, int32_t id, float weight,
                        const Tensor& ids_out, const Tensor& wts_out) {
  cuda::AppendExpertSlotParams p;
  p.ids = ids.data<int32_t>();
  p.wts = wts.data<float>();
  p.ids_out = ids_out.data<int32_t>();
  p.wts_out = wts_out.data<float>();
  p.m = ids.size(0);
  p.k = static_cast<int>(ids.size(1));
  p.id = id;
  p.weight = weight;
  cuda::append_expert_slot(p, cuda_stream(ctx));
}

void remap_ids_replicated(const Ctx& ctx, const Tensor& ids, const Tensor& copies, const Tensor& slots,
                          const Tensor& out) {
  cuda::RemapIdsReplicatedParams p;
  p.ids = ids.data<int32_t>();
  p.copies = copies.data<int32_t>();
  p.slots = slots.data<int32_t>();
  p.out = out.data<int32_t>();
  p.m = ids.size(0);
  p.k = ids.size(1);
  p.n_experts = copies.size(0);
  p.max_copies = slots.size(1);
  cuda::remap_ids_replicated(p, cuda_stream(ctx));
}

void copy_from_host(const Ctx& ctx, const void* src, const Tensor& dst, size_t bytes) {
  if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src, bytes, cudaMemcpyHostToDevice, cuda_stream(ctx)));
}

void copy_rows_from_host(const Ctx& ctx, const void* src, size_t row_bytes, int64_t rows, const Tensor& dst,
                         size_t dst_pitch) {
  if (row_bytes && rows)
    CUDA_CHECK(cudaMemcpy2DAsync(dst.raw(), dst_pitch, src, row_bytes, row_bytes, static_cast<size_t>(rows),
                                 cudaMemcpyHostToDevice, cuda_stream(ctx)));
}

void copy_to_host(const Ctx& ctx, const Tensor& src, void* dst, size_t bytes) {
  if (!bytes) return;
  CUDA_CHECK(cudaMemcpyAsync(dst, src.raw(), bytes, cudaMemcpyDeviceToHost, cuda_stream(ctx)));
  CUDA_CHECK(cudaStreamSynchronize(cuda_stream(ctx)));
}

}  // namespace ms::ops::cuda_ops
#endif
