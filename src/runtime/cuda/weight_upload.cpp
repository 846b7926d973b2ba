#if MOESERVE_HAVE_CUDA
#include "runtime/cuda/weight_upload.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

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

// The fused q_a / kv_a / indexer wk placement of one layer (model::AttentionWeights::qkv_a): the three BF16
// [rows, H] matrices as consecutive row ranges of one device tensor, so that the forward runs one product
// for the three (the GPU's small products are far from their floors: on an H200 at batch 64 the three took
// 40 us a layer with their casts and split-K reductions) without a second copy of the weights.
struct QkvPlan {
  int64_t nq = 0, nkv = 0, nik = 0;  // rows of q_a_proj, kv_a_proj_with_mqa, indexer.wk (0: none)
  int64_t in = 0;
  int64_t rows() const { return nq + nkv + nik; }
  int64_t row0(int member) const { return member == 0 ? 0 : member == 1 ? nq : nq + nkv; }
  int64_t member_rows(int member) const { return member == 0 ? nq : member == 1 ? nkv : nik; }
};

// Points the layer's three weights at their rows of `fused` and sets qkv_a.
void set_qkv_a(model::AttentionWeights& a, const Tensor& fused, const QkvPlan& q) {
  a.q_a_proj.weight = fused.slice(0, 0, q.nq);
  a.kv_a_proj.weight = fused.slice(0, q.nq, q.nq + q.nkv);
  if (q.nik) a.indexer.wk.weight = fused.slice(0, q.nq + q.nkv, q.rows());
  a.qkv_a = ops::LinearWeight{};
  a.qkv_a.name = a.q_a_proj.name + " + kv_a_proj_with_mqa" + (q.nik ? " + indexer.wk" : "");
  a.qkv_a.format = ops::WeightFormat::BF16;
  a.qkv_a.out = q.rows();
  a.qkv_a.in = q.in;
  a.qkv_a.weight = fused;
  a.qkv_a_q = q.nq;
  a.qkv_a_wk = q.nik > 0;
}

bool plain_bf16(const ops::LinearWeight& w, int64_t in) {
  return w.defined() && w.format == ops::WeightFormat::BF16 && w.in == in && has_data(w.weight) &&
         w.weight.dtype() == DType::BF16 && w.weight.is_contiguous() && w.weight.size(0) == w.out;
}

// MOESERVE_FUSE_QKV_A=0 keeps the three apart (A/B timing of a whole run); anything else, or unset, fuses.
bool fusion_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("MOESERVE_FUSE_QKV_A");
    return !(e != nullptr && std::string(e) == "0");
  }();
  return on;
}

// A layer of host weights that can be fused: q_lora, the three BF16 with the same input width.
bool fusable(const model::AttentionWeights& a, QkvPlan& q) {
  if (!fusion_enabled()) return false;
  const int64_t in = a.kv_a_proj.in;
  if (!plain_bf16(a.q_a_proj, in) || !plain_bf16(a.kv_a_proj, in)) return false;
  if (a.has_indexer && !plain_bf16(a.indexer.wk, in)) return false;
  q = {a.q_a_proj.out, a.kv_a_proj.out, a.has_indexer ? a.indexer.wk.out : 0, in};
  return true;
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
  // Fused q_a / kv_a / wk layers first (their tensors are then on the device and skipped below).
  for (auto& L : dev.layers) {
    QkvPlan q;
    if (!fusable(L.attn, q)) continue;
    Tensor fused = arena.tensor({q.rows(), q.in}, DType::BF16);
    const ops::LinearWeight* parts[3] = {&L.attn.q_a_proj, &L.attn.kv_a_proj, &L.attn.indexer.wk};
    for (int k = 0; k < 3; ++k) {
      if (q.member_rows(k) == 0) continue;
      const Tensor& t = parts[k]->weight;
      CUDA_CHECK(cudaMemcpy(fused.slice(0, q.row0(k), q.row0(k) + q.member_rows(k)).raw(), t.raw(),
                            t.nbytes(), cudaMemcpyHostToDevice));
      done += static_cast<double>(t.nbytes());
    }
    set_qkv_a(L.attn, fused, q);
  }
  // Tied lm_head: the same host storage is copied once.
  const void* embed_src = host.embed.weight.raw();
  for_each_tensor(dev, [&](Tensor& t) {
    if (!has_data(t)) return;
    if (t.device() == Device::CUDA) return;  // placed above (a fused layer)
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
// The q_a / kv_a / wk weights of q_lora layers land in one tensor per layer (QkvPlan) where all three are
// BF16 of the planned shapes; fused(l) then says whether layer l may run them as one product.
class DeviceStagingSource final : public model::TensorSource {
 public:
  DeviceStagingSource(const io::ModelConfig& cfg, const model::TensorSource& inner, DeviceArena& arena,
                      ProgressBar& bar)
      : inner_(inner), arena_(arena), bar_(bar) {
    if (!cfg.q_lora_rank || !fusion_enabled()) return;
    const std::vector<bool> indexer = model::layers_with_indexer_weights(cfg);
    const int layers = std::max(cfg.num_hidden_layers, 0);
    plans_.resize(static_cast<size_t>(layers));
    fused_.resize(plans_.size());
    placed_.assign(plans_.size(), 0);
    broken_.assign(plans_.size(), false);
    for (int l = 0; l < layers; ++l) {
      QkvPlan& q = plans_[static_cast<size_t>(l)];
      q = {*cfg.q_lora_rank, cfg.kv_lora_rank + cfg.qk_rope_head_dim,
           indexer[static_cast<size_t>(l)] ? cfg.index_head_dim : 0, cfg.hidden_size};
      const std::string ap = fmt::format("model.layers.{}.self_attn", l);
      members_[ap + ".q_a_proj.weight"] = {l, 0};
      members_[ap + ".kv_a_proj_with_mqa.weight"] = {l, 1};
      if (q.nik) members_[ap + ".indexer.wk.weight"] = {l, 2};
    }
  }
  bool contains(const std::string& name) const override { return inner_.contains(name); }
  std::string describe() const override { return inner_.describe(); }
  Tensor tensor(const std::string& name) const override {
    Tensor t = inner_.tensor(name);
    if (t.shape().size() < 2) return t;
    MS_CHECK(t.device() == Device::CPU && t.is_contiguous(), "upload: {} tensor '{}' is {}",
             inner_.describe(), name, t.desc());
    Tensor d = place(name, t);
    if (d.raw() == nullptr) d = arena_.tensor(t.shape(), t.dtype());
    CUDA_CHECK(cudaMemcpy(d.raw(), t.raw(), t.nbytes(), cudaMemcpyHostToDevice));
    done += static_cast<double>(t.nbytes());
    bar_.set(static_cast<int64_t>(done / 1048576.0));
    return d;
  }
  // Sets qkv_a on every layer whose three weights all landed in its fused tensor.
  void finish(model::ModelWeights& w) const {
    for (size_t l = 0; l < plans_.size() && l < w.layers.size(); ++l) {
      const QkvPlan& q = plans_[l];
      if (broken_[l] || placed_[l] != (q.nik ? 7 : 3)) continue;  // a bit per member placed
      set_qkv_a(w.layers[l].attn, fused_[l], q);
    }
  }
  mutable double done = 0;

 private:
  // The slice of the layer's fused tensor for a planned member of the expected BF16 shape; an empty Tensor
  // otherwise (the member then gets a tensor of its own and the layer is not fused).
  Tensor place(const std::string& name, const Tensor& t) const {
    const auto it = members_.find(name);
    if (it == members_.end()) return {};
    const auto [l, member] = it->second;
    const QkvPlan& q = plans_[static_cast<size_t>(l)];
    const int64_t rows = q.member_rows(member);
    if (broken_[static_cast<size_t>(l)] || t.dtype() != DType::BF16 || t.dim() != 2 || t.size(0) != rows ||
        t.size(1) != q.in) {
      broken_[static_cast<size_t>(l)] = true;
      return {};
    }
    Tensor& f = fused_[static_cast<size_t>(l)];
    if (f.raw() == nullptr) f = arena_.tensor({q.rows(), q.in}, DType::BF16);
    placed_[static_cast<size_t>(l)] |= 1 << member;
    return f.slice(0, q.row0(member), q.row0(member) + rows);
  }

  const model::TensorSource& inner_;
  DeviceArena& arena_;
  ProgressBar& bar_;
  std::vector<QkvPlan> plans_;
  std::unordered_map<std::string, std::pair<int, int>> members_;  // name -> (layer, member 0 / 1 / 2)
  mutable std::vector<Tensor> fused_;
  mutable std::vector<int> placed_;  // bit k: member k is in fused_
  mutable std::vector<bool> broken_;
};

}  // namespace

model::ModelWeights upload_weights_from_source(const io::ModelConfig& cfg, const model::TensorSource& src,
                                               double reserve_bytes, DeviceArena& arena, UploadStats* stats) {
  arena.reserve(static_cast<size_t>(reserve_bytes * 1.01) + (size_t{64} << 20));
  ProgressBar bar("weights to GPU (" + src.describe() + ")", static_cast<int64_t>(reserve_bytes / 1048576.0),
                  "MiB");
  const auto t0 = std::chrono::steady_clock::now();
  DeviceStagingSource staging(cfg, src, arena, bar);
  model::ModelWeights w = model::load_weights(cfg, staging);
  staging.finish(w);
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
