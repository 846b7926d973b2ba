// The sweep plot: output token throughput (y) against per-user output tokens/s (x), one point per
// concurrency, drawn by gnuplot into a PNG.
#pragma once

#include <string>
#include <vector>

#include "loadgen/load_generator.h"

namespace ms::loadgen {

// The gnuplot script for the points (data inline). Pure, for tests.
std::string plot_script(const std::vector<BenchSummary>& sweep, const std::string& png_path);
// Runs gnuplot; throws ms::Error naming --plot when gnuplot is missing or fails.
void plot_sweep(const std::vector<BenchSummary>& sweep, const std::string& png_path);

}  // namespace ms::loadgen
