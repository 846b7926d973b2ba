// A deliberately naive forward pass written the way Hugging Face's modeling code reads (full K/V expansion
// through kv_b_proj, rotate_half RoPE with the interleave permutation, dense masked attention, the indexer as
// an additive mask), in double precision, for one prompt. The engine's absorbed, paged path is tested against
// it.
#pragma once

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "io/model_config.h"
#include "model/rope_setup.h"
#include "model/tensor_source.h"
#include "quant/float_formats.h"
#include "quant/fp8_block.h"
#include "quant/nvfp4.h"

namespace ms::test {

using Mat = std::vector<double>;  // row-major

inline Mat load_mat(const model::TensorSource& src, const std::string& name, int64_t rows, int64_t cols) {
  Tensor t = src.tensor(name);
  Mat m(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i)
    m[i] = t.dtype() == DType::F32 ? t.data<float>()[i] : quant::bf16_to_f32(t.data<uint16_t>()[i]);
  return m;
}

// y [n, out] = x [n, in] W^T, W [out, in].
inline Mat matmul_t(const Mat& x, const Mat& w, int64_t n, int64_t in, int64_t out) {
  Mat y(static_cast<size_t>(n * out), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = 0;
      for (int64_t k = 0; k < in; ++k) s += x[i * in + k] * w[o * in + k];
      y[i * out + o] = s;
    }
  return y;
}

inline void rmsnorm(Mat& x, const Mat& w, int64_t n, int64_t d, double eps, int64_t stride = -1,
                    int64_t off = 0) {
  if (stride < 0) stride = d;
  for (int64_t i = 0; i < n; ++i) {
    double ss = 0;
    for (int64_t k = 0; k < d; ++k) ss += x[i * stride + off + k] * x[i * stride + off + k];
    const double inv = 1.0 / std::sqrt(ss / d + eps);
    for (int64_t k = 0; k < d; ++k) x[i * stride + off + k] = w[k] * x[i * stride + off + k] * inv;
  }
}

// HF rotation of v[0..d) at position pos; interleaved de-interleaves first (so output channels are permuted).
inline void hf_rope(double* v, int64_t d, int pos, const float* inv_freq, double scaling, bool interleaved) {
  std::vector<double> x(v, v + d), o(static_cast<size_t>(d));
  if (interleaved) {
    for (int64_t i = 0; i < d / 2; ++i) x[i] = v[2 * i], x[i + d / 2] = v[2 * i + 1];
  }
  for (int64_t i = 0; i < d / 2; ++i) {
    const float ang = static_cast<float>(pos) * inv_freq[i];
    const double c = std::cos(ang) * scaling, s = std::sin(ang) * scaling;
    o[i] = x[i] * c - x[i + d / 2] * s;
    o[i + d / 2] = x[i + d / 2] * c + x[i] * s;
  }
  std::copy(o.begin(), o.end(), v);
}

inline double round_bf16(double v) {
  return quant::bf16_to_f32(quant::f32_to_bf16(static_cast<float>(v)));
}
inline double round_fp8(double v) {
  return quant::fp8_e4m3_to_f32(quant::f32_to_fp8_e4m3(static_cast<float>(v), true));
}

inline double silu(double g) {
  return g / (1.0 + std::exp(-g));
}

// HF routing (sigmoid, correction bias for choice, group-limited, normalised, scaled).
inline void hf_route(const io::ModelConfig& c, const double* logits, const Mat& bias, std::vector<int>& ids,
                     std::vector<double>& wts) {
  const int E = c.n_routed_experts, G = c.n_group, per = E / G, K = c.num_experts_per_tok;
  std::vector<double> sc(E), ch(E), gs(G);
  for (int e = 0; e < E; ++e) {
    sc[e] = c.scoring_func == "softmax" ? 0 : 1.0 / (1.0 + std::exp(-logits[e]));
    ch[e] = sc[e] + (bias.empty() ? 0.0 : bias[e]);
  }
  for (int g = 0; g < G; ++g) {
    std::vector<double> v(ch.begin() + g * per, ch.begin() + (g + 1) * per);
    std::sort(v.rbegin(), v.rend());
    gs[g] = v[0] + (per > 1 ? v[1] : 0);
  }
  std::vector<int> gi(G);
  for (int g = 0; g < G; ++g) gi[g] = g;
  std::stable_sort(gi.begin(), gi.end(), [&](int a, int b) { return gs[a] > gs[b]; });
  for (int g = c.topk_group; g < G; ++g)
    for (int e = gi[g] * per; e < (gi[g] + 1) * per; ++e)
      ch[e] = c.arch == io::ModelArch::GlmMoeDsa ? -INFINITY : 0.0;  // DeepseekV3MoE fills with 0.0
  std::vector<int> ei(E);
  for (int e = 0; e < E; ++e) ei[e] = e;
  std::stable_sort(ei.begin(), ei.end(), [&](int a, int b) { return ch[a] > ch[b]; });
  ids.assign(ei.begin(), ei.begin() + K);
  double sum = 0;
  for (int k = 0; k < K; ++k) sum += sc[ids[k]];
  wts.resize(K);
  for (int k = 0; k < K; ++k)
    wts[k] = (c.norm_topk_prob ? sc[ids[k]] / (sum + 1e-20) : sc[ids[k]]) * c.routed_scaling_factor;
}

inline Mat mlp(const model::TensorSource& src, const std::string& p, const Mat& x, int64_t n, int64_t H,
               int64_t I) {
  Mat g = matmul_t(x, load_mat(src, p + ".gate_proj.weight", I, H), n, H, I);
  Mat u = matmul_t(x, load_mat(src, p + ".up_proj.weight", I, H), n, H, I);
  for (size_t i = 0; i < g.size(); ++i) g[i] = silu(g[i]) * u[i];
  return matmul_t(g, load_mat(src, p + ".down_proj.weight", H, I), n, I, H);
}

// Logits [T, vocab] of the full forward over `ids`.
inline Mat reference_forward(const io::ModelConfig& c, const model::TensorSource& src,
                             const std::vector<int32_t>& ids, int indexer_interleaved = -1,
                             double (*kv_round)(double) = nullptr,
                             double (*index_key_round)(double) = nullptr) {
  const int64_t T = static_cast<int64_t>(ids.size()), H = c.hidden_size, Hn = c.num_attention_heads;
  const int64_t dn = c.qk_nope_head_dim, dr = c.qk_rope_head_dim, dv = c.v_head_dim, r = c.kv_lora_rank;
  const int64_t qr = *c.q_lora_rank, qd = dn + dr;
  if (indexer_interleaved < 0) indexer_interleaved = model::default_indexer_interleaved(c);
  const auto sc = model::make_attention_scales(c, indexer_interleaved != 0);
  Mat emb = load_mat(src, "model.embed_tokens.weight", c.vocab_size, H);
  Mat x(static_cast<size_t>(T * H));
  for (int64_t t = 0; t < T; ++t)
    std::copy(emb.begin() + ids[t] * H, emb.begin() + (ids[t] + 1) * H, x.begin() + t * H);
  std::vector<std::vector<char>> prev_sel;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = fmt::format("model.layers.{}", l), a = p + ".self_attn";
    Mat xn = x;
    rmsnorm(xn, load_mat(src, p + ".input_layernorm.weight", 1, H), T, H, c.rms_norm_eps);
    Mat qa = matmul_t(xn, load_mat(src, a + ".q_a_proj.weight", qr, H), T, H, qr);
    rmsnorm(qa, load_mat(src, a + ".q_a_layernorm.weight", 1, qr), T, qr, 1e-6);
    Mat q = matmul_t(qa, load_mat(src, a + ".q_b_proj.weight", Hn * qd, qr), T, qr, Hn * qd);
    Mat ckv = matmul_t(xn, load_mat(src, a + ".kv_a_proj_with_mqa.weight", r + dr, H), T, H, r + dr);
    rmsnorm(ckv, load_mat(src, a + ".kv_a_layernorm.weight", 1, r), T, r, 1e-6, r + dr, 0);
    if (kv_round)  // the cache stores the normalised latent (the rotated k_pe is rounded below)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t k = 0; k < r; ++k) ckv[t * (r + dr) + k] = kv_round(ckv[t * (r + dr) + k]);
    Mat lat(static_cast<size_t>(T * r));
    for (int64_t t = 0; t < T; ++t)
      std::copy(ckv.begin() + t * (r + dr), ckv.begin() + t * (r + dr) + r, lat.begin() + t * r);
    Mat kvb = matmul_t(lat, load_mat(src, a + ".kv_b_proj.weight", Hn * (dn + dv), r), T, r, Hn * (dn + dv));
    const float* invf = sc.rope.inv_freq.data<float>();
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < Hn; ++h)
        hf_rope(&q[(t * Hn + h) * qd + dn], dr, static_cast<int>(t), invf, sc.rope.attention_scaling,
                c.rope.interleaved);
      hf_rope(&ckv[t * (r + dr) + r], dr, static_cast<int>(t), invf, sc.rope.attention_scaling,
              c.rope.interleaved);
      if (kv_round)
        for (int64_t k = 0; k < dr; ++k) ckv[t * (r + dr) + r + k] = kv_round(ckv[t * (r + dr) + r + k]);
    }
    // DSA selection as a mask [T, T].
    std::vector<std::vector<char>> sel(static_cast<size_t>(T), std::vector<char>(static_cast<size_t>(T), 1));
    if (c.has_indexer) {
      const bool full = c.indexer_types.empty() || c.indexer_types[l] == io::IndexerKind::Full;
      if (!full && !prev_sel.empty()) {
        sel = prev_sel;
      } else {
        const int64_t Hi = c.index_n_heads, Di = c.index_head_dim;
        const std::string ip = a + ".indexer";
        Mat iq = matmul_t(qa, load_mat(src, ip + ".wq_b.weight", Hi * Di, qr), T, qr, Hi * Di);
        Mat ik = matmul_t(xn, load_mat(src, ip + ".wk.weight", Di, H), T, H, Di);
        Mat kw = load_mat(src, ip + ".k_norm.weight", 1, Di), kb = load_mat(src, ip + ".k_norm.bias", 1, Di);
        for (int64_t t = 0; t < T; ++t) {
          double mean = 0, var = 0;
          for (int64_t k = 0; k < Di; ++k) mean += ik[t * Di + k];
          mean /= Di;
          for (int64_t k = 0; k < Di; ++k) var += (ik[t * Di + k] - mean) * (ik[t * Di + k] - mean);
          var /= Di;
          for (int64_t k = 0; k < Di; ++k)
            ik[t * Di + k] = (ik[t * Di + k] - mean) / std::sqrt(var + 1e-6) * kw[k] + kb[k];
        }
        Mat wts = matmul_t(xn, load_mat(src, ip + ".weights_proj.weight", Hi, H), T, H, Hi);
        const float* ifr = sc.indexer_rope.inv_freq.data<float>();
        for (int64_t t = 0; t < T; ++t) {
          for (int64_t h = 0; h < Hi; ++h)
            hf_rope(&iq[(t * Hi + h) * Di], dr, static_cast<int>(t), ifr, sc.indexer_rope.attention_scaling,
                    indexer_interleaved);
          hf_rope(&ik[t * Di], dr, static_cast<int>(t), ifr, sc.indexer_rope.attention_scaling,
                  indexer_interleaved);
          if (index_key_round)
            for (int64_t k = 0; k < Di; ++k) ik[t * Di + k] = index_key_round(ik[t * Di + k]);
        }
        for (int64_t s = 0; s < T; ++s) {
          std::vector<double> score(static_cast<size_t>(s + 1));
          for (int64_t t = 0; t <= s; ++t) {
            double tot = 0;
            for (int64_t h = 0; h < Hi; ++h) {
              double d = 0;
              for (int64_t k = 0; k < Di; ++k) d += iq[(s * Hi + h) * Di + k] * ik[t * Di + k];
              d /= std::sqrt(static_cast<double>(Di));
              tot += std::max(d, 0.0) * wts[s * Hi + h] / std::sqrt(static_cast<double>(Hi));
            }
            score[t] = tot;
          }
          std::vector<int64_t> order(static_cast<size_t>(s + 1));
          for (int64_t t = 0; t <= s; ++t) order[t] = t;
          std::stable_sort(order.begin(), order.end(),
                           [&](int64_t u, int64_t v) { return score[u] > score[v]; });
          std::fill(sel[s].begin(), sel[s].end(), 0);
          for (int64_t k = 0; k < std::min<int64_t>(c.index_topk, s + 1); ++k) sel[s][order[k]] = 1;
        }
        prev_sel = sel;
      }
    }
    Mat attn(static_cast<size_t>(T * Hn * dv), 0.0);
    for (int64_t h = 0; h < Hn; ++h)
      for (int64_t s = 0; s < T; ++s) {
        std::vector<double> w(static_cast<size_t>(s + 1), -INFINITY);
        double mx = -INFINITY;
        for (int64_t t = 0; t <= s; ++t) {
          if (!sel[s][t]) continue;
          double d = 0;
          for (int64_t k = 0; k < dn; ++k) d += q[(s * Hn + h) * qd + k] * kvb[(t * Hn + h) * (dn + dv) + k];
          for (int64_t k = 0; k < dr; ++k) d += q[(s * Hn + h) * qd + dn + k] * ckv[t * (r + dr) + r + k];
          w[t] = d * sc.softmax_scale;
          mx = std::max(mx, w[t]);
        }
        double sum = 0;
        for (int64_t t = 0; t <= s; ++t) sum += (w[t] = w[t] == -INFINITY ? 0 : std::exp(w[t] - mx));
        for (int64_t t = 0; t <= s; ++t)
          for (int64_t k = 0; k < dv; ++k)
            attn[(s * Hn + h) * dv + k] += w[t] / sum * kvb[(t * Hn + h) * (dn + dv) + dn + k];
      }
    Mat o = matmul_t(attn, load_mat(src, a + ".o_proj.weight", H, Hn * dv), T, Hn * dv, H);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];
    xn = x;
    rmsnorm(xn, load_mat(src, p + ".post_attention_layernorm.weight", 1, H), T, H, c.rms_norm_eps);
    Mat f;
    if (c.layer_is_moe[l]) {
      const std::string mp = p + ".mlp";
      const int E = c.n_routed_experts;
      Mat lg = matmul_t(xn, load_mat(src, mp + ".gate.weight", E, H), T, H, E);
      Mat bias = src.contains(mp + ".gate.e_score_correction_bias")
                     ? load_mat(src, mp + ".gate.e_score_correction_bias", 1, E)
                     : Mat{};
      f = mlp(src, mp + ".shared_experts", xn, T, H, c.moe_intermediate_size * c.n_shared_experts);
      for (int64_t t = 0; t < T; ++t) {
        std::vector<int> eid;
        std::vector<double> ew;
        hf_route(c, &lg[t * E], bias, eid, ew);
        Mat xt(xn.begin() + t * H, xn.begin() + (t + 1) * H);
        for (size_t k = 0; k < eid.size(); ++k) {
          Mat y = mlp(src, fmt::format("{}.experts.{}", mp, eid[k]), xt, 1, H, c.moe_intermediate_size);
          for (int64_t j = 0; j < H; ++j) f[t * H + j] += ew[k] * y[j];
        }
      }
    } else {
      f = mlp(src, p + ".mlp", xn, T, H, c.intermediate_size);
    }
    for (size_t i = 0; i < x.size(); ++i) x[i] += f[i];
  }
  rmsnorm(x, load_mat(src, "model.norm.weight", 1, H), T, H, c.rms_norm_eps);
  return matmul_t(x, load_mat(src, "lm_head.weight", c.vocab_size, H), T, H, c.vocab_size);
}

}  // namespace ms::test
