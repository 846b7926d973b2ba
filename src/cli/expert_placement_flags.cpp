#include "cli/expert_placement_flags.h"

#include "core/error.h"
#include "core/log.h"
#include "moe/expert_distribution.h"

namespace ms::cli {

namespace {

std::vector<int> moe_layers_of(const io::ModelConfig& cfg) {
  std::vector<int> out;
  for (int l = 0; l < cfg.num_hidden_layers; ++l)
    if (cfg.layer_is_moe[static_cast<size_t>(l)]) out.push_back(l);
  return out;
}

}  // namespace

void add_expert_placement_flags(CLI::App& sub, ExpertPlacementFlags& f) {
  sub.add_option("--expert-distribution-out", f.distribution_out,
                 "Record the tokens routed to each expert per MoE layer over the run and write them to this "
                 "JSON file at the end ({\"n_experts\": E, \"layers\": {\"<layer>\": [counts]}}; steps run "
                 "without CUDA graphs)");
  sub.add_option("--ep-num-redundant-experts", f.num_redundant,
                 "With --ep-size: extra expert slots in every MoE layer (a multiple of --ep-size), given to "
                 "copies of that layer's hottest experts in --expert-distribution; every token's assignment "
                 "runs on exactly one copy")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--expert-distribution", f.distribution,
                 "Routing counts recorded with --expert-distribution-out, from which "
                 "--ep-num-redundant-experts places the replicas");
  sub.add_option("--ep-placement", f.placement,
                 "With --ep-size: load the per-layer expert placement saved by --ep-placement-out");
  sub.add_option("--ep-placement-out", f.placement_out,
                 "With --ep-size: save the per-layer expert placement this run uses (JSON)");
}

bool wants_expert_placement(const ExpertPlacementFlags& f) {
  return f.num_redundant > 0 || !f.distribution.empty() || !f.placement.empty() || !f.placement_out.empty();
}

std::optional<dist::LayerPlacements> expert_placement_for(const ExpertPlacementFlags& f,
                                                          const io::ModelConfig& cfg, int ep_size) {
  if (!wants_expert_placement(f)) return std::nullopt;
  MS_CHECK(ep_size > 1,
           "--ep-num-redundant-experts, --expert-distribution, --ep-placement and --ep-placement-out place "
           "experts over expert-parallel ranks: give --ep-size 2 or more");
  MS_CHECK(cfg.n_routed_experts > 0, "the model has no routed experts to place");
  MS_CHECK(f.distribution.empty() || f.placement.empty(),
           "give --expert-distribution (to build a placement) or --ep-placement (a saved one), not both");
  const std::vector<int> moe_layers = moe_layers_of(cfg);
  const int base_slots = cfg.n_routed_experts / ep_size;
  std::optional<dist::LayerPlacements> p;
  if (!f.placement.empty()) {
    p = dist::LayerPlacements::load(f.placement);
    try {
      p->check(cfg.n_routed_experts, ep_size, moe_layers);
    } catch (const Error& e) {
      MS_THROW("--ep-placement {}: {}", f.placement, e.message());
    }
    const int redundant = (p->slots_per_rank() - base_slots) * ep_size;
    MS_CHECK(f.num_redundant == 0 || f.num_redundant == redundant,
             "--ep-num-redundant-experts {} but --ep-placement {} holds {} redundant experts per layer",
             f.num_redundant, f.placement, redundant);
  } else if (f.num_redundant > 0) {
    MS_CHECK(
        !f.distribution.empty(),
        "--ep-num-redundant-experts {} replicates the hottest experts of each layer: give their routing "
        "counts with --expert-distribution FILE (record one first with --expert-distribution-out FILE on "
        "a representative run) or a saved --ep-placement",
        f.num_redundant);
    MS_CHECK(
        f.num_redundant % ep_size == 0,
        "--ep-num-redundant-experts {} must be a multiple of --ep-size {} (every rank holds as many slots)",
        f.num_redundant, ep_size);
    const moe::ExpertDistribution d = moe::ExpertDistribution::load(f.distribution);
    try {
      d.check_model(cfg.n_routed_experts, moe_layers);
    } catch (const Error& e) {
      MS_THROW("--expert-distribution {}: {}", f.distribution, e.message());
    }
    p = dist::LayerPlacements::with_redundancy(cfg.n_routed_experts, ep_size, f.num_redundant, d.counts());
  } else {
    MS_CHECK(f.distribution.empty(), "--expert-distribution needs --ep-num-redundant-experts K");
    // --ep-placement-out alone: the contiguous blocks this run uses.
    std::map<int, std::vector<uint64_t>> none;
    for (int l : moe_layers) none[l].assign(static_cast<size_t>(cfg.n_routed_experts), 0);
    p = dist::LayerPlacements::with_redundancy(cfg.n_routed_experts, ep_size, 0, none);
  }
  return p;
}

void save_expert_placement(const ExpertPlacementFlags& f, const dist::LayerPlacements& p) {
  if (f.placement_out.empty()) return;
  p.save(f.placement_out);
  MS_LOG_INFO("expert placement ({} slots per rank per layer) saved to {}", p.slots_per_rank(),
              f.placement_out);
}

void apply_expert_recording(const ExpertPlacementFlags& f, runtime::EngineConfig& ec) {
  if (!f.distribution_out.empty()) ec.expert_distribution = true;
}

void save_expert_distribution(const ExpertPlacementFlags& f, const runtime::Engine& engine) {
  if (f.distribution_out.empty()) return;
  const moe::ExpertDistribution* d = engine.expert_distribution();
  MS_CHECK(d != nullptr, "--expert-distribution-out: the model has no routed experts to count");
  d->save(f.distribution_out);
  MS_LOG_INFO("expert distribution saved to {}", f.distribution_out);
}

}  // namespace ms::cli
