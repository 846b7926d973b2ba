// The flags of EPLB-style expert placement (serve, generate, bench-one-batch, profile): record the tokens
// routed to each expert per MoE layer (--expert-distribution-out), replicate the hottest experts of each
// layer from such a record (--ep-num-redundant-experts K --expert-distribution FILE), save the placement
// (--ep-placement-out) and load a saved one (--ep-placement). File formats: moe/expert_distribution.h and
// dist::LayerPlacements (dist/expert_placement.h).
#pragma once

#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "dist/expert_placement.h"
#include "io/model_config.h"
#include "runtime/engine.h"

namespace ms::cli {

struct ExpertPlacementFlags {
  int num_redundant = 0;         // --ep-num-redundant-experts
  std::string distribution;      // --expert-distribution
  std::string placement;         // --ep-placement
  std::string placement_out;     // --ep-placement-out
  std::string distribution_out;  // --expert-distribution-out
};

void add_expert_placement_flags(CLI::App& sub, ExpertPlacementFlags& f);
// Whether any flag but --expert-distribution-out is given (they need --ep-size 2 or more).
bool wants_expert_placement(const ExpertPlacementFlags& f);

// The per-layer placement the flags ask for under `ep_size` ranks, checked against the model `cfg`; none when
// they ask for none (contiguous blocks). Throws naming the flag: K without a recorded distribution or a saved
// placement, K not a multiple of ep_size, a file that does not fit the model.
std::optional<dist::LayerPlacements> expert_placement_for(const ExpertPlacementFlags& f,
                                                          const io::ModelConfig& cfg, int ep_size);
// Writes `p` to --ep-placement-out (nothing without the flag).
void save_expert_placement(const ExpertPlacementFlags& f, const dist::LayerPlacements& p);

// EngineConfig::expert_distribution for --expert-distribution-out.
void apply_expert_recording(const ExpertPlacementFlags& f, runtime::EngineConfig& ec);
// Writes what `engine` recorded to --expert-distribution-out (nothing without the flag).
void save_expert_distribution(const ExpertPlacementFlags& f, const runtime::Engine& engine);

}  // namespace ms::cli
