#include "loadgen/plot.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>

#include "core/error.h"

namespace ms::loadgen {

std::string plot_script(const std::vector<BenchSummary>& sweep, const std::string& png_path) {
  std::string quoted;
  for (char ch : png_path) {
    if (ch == '\'') {
      quoted += "''";  // gnuplot single-quoted strings double their quotes
    } else {
      quoted += ch;
    }
  }
  std::string s;
  s += "set terminal pngcairo size 900,600 noenhanced\n";
  s += fmt::format("set output '{}'\n", quoted);
  s += "set title 'moeserve bench: throughput against per-user speed'\n";
  s += "set xlabel 'per-user output tokens/s'\nset ylabel 'output tokens/s (all users)'\n";
  s += "set grid\nset key off\n";
  s += "$data << EOD\n";
  for (const auto& r : sweep)
    s += fmt::format("{} {} {}\n", r.per_user_output_tokens_per_s, r.output_throughput,
                     r.max_concurrency ? std::to_string(r.max_concurrency) : std::string("inf"));
  s += "EOD\n";
  s += "plot $data using 1:2 with linespoints pt 7, '' using 1:2:3 with labels offset 1,1\n";
  return s;
}

void plot_sweep(const std::vector<BenchSummary>& sweep, const std::string& png_path) {
  const std::string script = plot_script(sweep, png_path);
  FILE* p = popen("gnuplot 2>&1", "w");
  if (!p) MS_THROW("--plot: cannot start gnuplot (install it: apt-get install gnuplot-nox)");
  std::fwrite(script.data(), 1, script.size(), p);
  const int rc = pclose(p);
  if (rc != 0)
    MS_THROW("--plot: gnuplot failed with status {} (is gnuplot installed? apt-get install gnuplot-nox)", rc);
}

}  // namespace ms::loadgen
