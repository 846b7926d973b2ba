// The weight loader refuses a checkpoint with a missing tensor, a wrong shape or a wrong dtype, naming it.
#include <gtest/gtest.h>

#include "core/error.h"
#include "model/builtin_model.h"
#include "model/weight_loader.h"

namespace ms {
namespace {

void expect_load_error(model::MemorySource& src, const std::string& needle) {
  try {
    model::load_weights(model::builtin_model_config(), src);
    ADD_FAILURE() << "loaded; expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find(needle), std::string::npos) << e.message();
  }
}

TEST(WeightLoader, MissingTensorIsNamed) {
  auto src = model::builtin_model_weights(model::builtin_model_config());
  src->erase("model.layers.1.mlp.experts.3.down_proj.weight");
  expect_load_error(*src, "tensor 'model.layers.1.mlp.experts.3.down_proj.weight' is missing");
}

TEST(WeightLoader, WrongShapeIsNamed) {
  auto src = model::builtin_model_weights(model::builtin_model_config());
  src->put("model.layers.0.self_attn.kv_b_proj.weight", Tensor::zeros({7, 64}, DType::BF16));
  expect_load_error(
      *src, "tensor 'model.layers.0.self_attn.kv_b_proj.weight' has shape [7, 64], expected [256, 64]");
}

TEST(WeightLoader, WrongDtypeIsNamed) {
  auto src = model::builtin_model_weights(model::builtin_model_config());
  src->put("model.layers.2.self_attn.o_proj.weight", Tensor::zeros({128, 128}, DType::I32));
  expect_load_error(*src, "tensor 'model.layers.2.self_attn.o_proj.weight' has dtype i32");
  auto src2 = model::builtin_model_weights(model::builtin_model_config());
  src2->put("model.layers.1.mlp.experts.0.up_proj.weight",
            Tensor::zeros({64, 64}, DType::U8));  // nvfp4 needs scales
  expect_load_error(*src2, "tensor 'model.layers.1.mlp.experts.0.up_proj.weight_scale' is missing");
}

// Which layers read DSA indexer weights: all of an indexer model but a `shared` layer after a full one (a
// leading shared layer has no full layer to borrow from and reads its own).
TEST(WeightLoader, LayersWithIndexerWeights) {
  io::ModelConfig c;
  c.num_hidden_layers = 5;
  EXPECT_EQ(model::layers_with_indexer_weights(c), std::vector<bool>(5, false));
  c.has_indexer = true;
  EXPECT_EQ(model::layers_with_indexer_weights(c), std::vector<bool>(5, true));
  using K = io::IndexerKind;
  c.indexer_types = {K::Full, K::Shared, K::Shared, K::Full, K::Shared};
  EXPECT_EQ(model::layers_with_indexer_weights(c), (std::vector<bool>{true, false, false, true, false}));
  c.indexer_types = {K::Shared, K::Shared, K::Full, K::Shared, K::Full};
  EXPECT_EQ(model::layers_with_indexer_weights(c), (std::vector<bool>{true, false, true, false, true}));
}

}  // namespace
}  // namespace ms
