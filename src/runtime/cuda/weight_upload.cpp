#if MOESERVE_HAVE_CUDA
#include "runtime/cuda/weight_upload.h"

#include <cuda_runtime.h>

#include <chrono>
#include <functional>

#include "core/log.h"
#include "core/progress.h"
#include "kernels/cuda/common/cuda_check.h"
#include "model/weight_loader.h"

namespace ms::runtime::cuda {

namespace {

// Visits every tensor of the weights (const or mutable alike through the template).
template <typename W, typename F>
void for_each_tensor(W& w, F&& f) {
  auto lin = [&](auto& l) {
    f(l.weight);
    f(l.scale);
  };
  lin(w.embed);
  for (auto& L : w.layers) {
    f(L.input_norm);
    f(L.post_attn_norm);
    auto& a = L.attn;
    lin(a.q_a_proj);
    f(a.q_a_norm);
    lin(a.q_b_proj);
    lin(a.q_proj);
    lin(a.kv_a_proj);
    f(a.kv_a_norm);
    lin(a.kv_b_proj);
    lin(a.o_proj);
    if (a.has_indexer) {
      lin(a.indexer.wq_b);
      lin(a.indexer.wk);
      f(a.indexer.k_norm_weight);
      f(a.indexer.k_norm_bias);
      lin(a.indexer.weights_proj);
    }
    lin(L.mlp.gate);
    lin(L.mlp.up);
    lin(L.mlp.down);
    lin(L.moe.router);
    f(L.moe.correction_bias);
    for (auto& e : L.moe.experts) {
      lin(e.gate);
      lin(e.up);
      lin(e.down);
    }
    lin(L.moe.shared.gate);
    lin(L.moe.shared.up);
    lin(L.moe.shared.down);
  }
  f(w.final_norm);
  // lm_head may share the embedding's storage (tied): upload_weights keeps the tie.
  lin(w.lm_head);
}

bool has_data(const Tensor& t) {
  return t.raw() != nullptr && t.numel() > 0;
}

}  // namespace

double weight_bytes(const model::ModelWeights& w) {
  double total = 0;
  for_each_tensor(w, [&](const Tensor& t) {
    if (has_data(t)) total += static_cast<double>(t.nbytes());
  });
  return total;
}

model::ModelWeights upload_weights(const model::ModelWeights& host, DeviceArena& arena, UploadStats* stats) {
  const double total = weight_bytes(host);
  arena.reserve(static_cast<size_t>(total * 1.01) + (size_t{64} << 20));
  model::ModelWeights dev = host;  // same structure and metadata; tensors replaced below
  ProgressBar bar("weights to GPU", static_cast<int64_t>(total / 1048576.0), "MiB");
  const auto t0 = std::chrono::steady_clock::now();
  double done = 0;
  // Tied lm_head: the same host storage is copied once.
  const void* embed_src = host.embed.weight.raw();
  for_each_tensor(dev, [&](Tensor& t) {
    if (!has_data(t)) return;
    MS_CHECK(t.device() == Device::CPU, "upload: tensor {} is already on a device", t.desc());
    MS_CHECK(t.is_contiguous(), "upload: weight tensor {} is not contiguous", t.desc());
    if (&t == &dev.lm_head.weight && t.raw() == embed_src) {
      t = dev.embed.weight;
      return;
    }
    Tensor d = arena.tensor(t.shape(), t.dtype());
    CUDA_CHECK(cudaMemcpy(d.raw(), t.raw(), t.nbytes(), cudaMemcpyHostToDevice));
    done += static_cast<double>(t.nbytes());
    bar.set(static_cast<int64_t>(done / 1048576.0));
    t = d;
  });
  bar.finish();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MS_LOG_INFO("weights: {:.2f} GB to the GPU in {:.1f} s ({:.2f} GB/s)", done / 1e9, s,
              s > 0 ? done / 1e9 / s : 0.0);
  if (stats) *stats = {done, s};
  return dev;
}

namespace {

// Hands load_weights device copies of the matrices: each is asked of `inner`, copied into the arena and its
// host storage released when the returned Tensor's last host reference goes (the inner source's cache aside).
// Vectors and scalars stay on the host: load_weights reads them (f32 conversion, scale checks).
class DeviceStagingSource final : public model::TensorSource {
 public:
  DeviceStagingSource(const model::TensorSource& inner, DeviceArena& arena, ProgressBar& bar)
      : inner_(inner), arena_(arena), bar_(bar) {}
  bool contains(const std::string& name) const override { return inner_.contains(name); }
  std::string describe() const override { return inner_.describe(); }
  Tensor tensor(const std::string& name) const override {
    Tensor t = inner_.tensor(name);
    if (t.shape().size() < 2) return t;
    MS_CHECK(t.device() == Device::CPU && t.is_contiguous(), "upload: {} tensor '{}' is {}",
             inner_.describe(), name, t.desc());
    Tensor d = arena_.tensor(t.shape(), t.dtype());
    CUDA_CHECK(cudaMemcpy(d.raw(), t.raw(), t.nbytes(), cudaMemcpyHostToDevice));
    done += static_cast<double>(t.nbytes());
    bar_.set(static_cast<int64_t>(done / 1048576.0));
    return d;
  }
  mutable double done = 0;

 private:
  const model::TensorSource& inner_;
  DeviceArena& arena_;
  ProgressBar& bar_;
};

}  // namespace

model::ModelWeights upload_weights_from_source(const io::ModelConfig& cfg, const model::TensorSource& src,
                                               double reserve_bytes, DeviceArena& arena, UploadStats* stats) {
  arena.reserve(static_cast<size_t>(reserve_bytes * 1.01) + (size_t{64} << 20));
  ProgressBar bar("weights to GPU (" + src.describe() + ")", static_cast<int64_t>(reserve_bytes / 1048576.0),
                  "MiB");
  const auto t0 = std::chrono::steady_clock::now();
  DeviceStagingSource staging(src, arena, bar);
  model::ModelWeights w = model::load_weights(cfg, staging);
  double done = staging.done;
  // What load_weights kept on the host (norm vectors, biases; a tied lm_head is the embedding's device
  // tensor).
  const void* embed_dev = w.embed.weight.raw();
  for_each_tensor(w, [&](Tensor& t) {
    if (!has_data(t) || t.device() != Device::CPU) return;
    if (&t == &w.lm_head.weight && t.raw() == embed_dev) return;
    MS_CHECK(t.is_contiguous(), "upload: weight tensor {} is not contiguous", t.desc());
    Tensor d = arena.tensor(t.shape(), t.dtype());
    CUDA_CHECK(cudaMemcpy(d.raw(), t.raw(), t.nbytes(), cudaMemcpyHostToDevice));
    done += static_cast<double>(t.nbytes());
    t = d;
  });
  bar.finish();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MS_LOG_INFO("weights: {:.2f} GB made and copied to the GPU in {:.1f} s ({:.2f} GB/s)", done / 1e9, s,
              s > 0 ? done / 1e9 / s : 0.0);
  if (stats) *stats = {done, s};
  return w;
}

}  // namespace ms::runtime::cuda
#endif
