#include "profiler/report.h"

#include <fmt/format.h>

#include <algorithm>

namespace ms::profiler {

namespace {

// "812.3 us", "12.35 ms", "1.234 s": a time in 9 characters or fewer.
std::string fmt_time(double us) {
  if (us < 1e3) return fmt::format("{:.1f} us", us);
  if (us < 1e6) return fmt::format("{:.2f} ms", us / 1e3);
  return fmt::format("{:.3f} s", us / 1e6);
}

std::string fmt_rate(double v) {
  if (v >= 1e4) return fmt::format("{:.0f}", v);
  if (v >= 100) return fmt::format("{:.1f}", v);
  return fmt::format("{:.2f}", v);
}

std::string fmt_calls(double c) {
  return c == static_cast<double>(static_cast<long long>(c)) ? fmt::format("{}", static_cast<long long>(c))
                                                             : fmt::format("{:.2f}", c);
}

// Appends a line without its trailing spaces (rows without flags), so tables diff cleanly.
void add_line(std::string& out, std::string line) {
  line.erase(line.find_last_not_of(' ') + 1);
  out += line;
  out += '\n';
}

std::string flags_of(const OpStats& o) {
  std::string f;
  if (o.flag_bytes) f += fmt::format("bytes {:.1f}x floor", o.moved_over_floor);
  if (o.flag_time) {
    if (!f.empty()) f += ", ";
    f += o.floor_share > 0 ? fmt::format("time {:.1f}x its floor share", o.share / o.floor_share)
                           : std::string("time, no floor");
  }
  return f.empty() ? f : "!! " + f;
}

}  // namespace

std::string format_table(const Summary& s) {
  std::string out;
  out += fmt::format("ceilings: {}\n", describe(s.ceilings));
  out += fmt::format(
      "steps: {} recorded, {} warm-up ignored, timer {}; step {} mean (min {}, max {}), floor {} -> {:.1f}% "
      "of "
      "roofline\n",
      s.steps, s.warmup_steps, s.timer, fmt_time(s.step_us_mean), fmt_time(s.step_us_min),
      fmt_time(s.step_us_max), fmt_time(s.floor_us_per_step), 100 * s.roofline);
  out += fmt::format(
      "ops {} ({}); flagged: moved > {:.1f}x floor, or share > {:.1f}x floor share and > {:.0f}%\n\n",
      s.group == GroupBy::Kind ? "summed over layers" : "per layer",
      s.group == GroupBy::Kind ? "by kind" : "by name", s.rules.bytes_over_floor,
      s.rules.time_over_floor_share, 100 * s.rules.min_share);

  const std::string outside = "(outside ops)";
  size_t w = std::max<size_t>(outside.size(), 2);
  for (const auto& o : s.ops) w = std::max(w, o.key.size());
  add_line(out, fmt::format("{:<{}}  {:>7}  {:>10}  {:>6}  {:>8}  {:>8}  {:>8}  {:>11}  {}", "op", w, "calls",
                            "time/step", "share", "GB/s", "GFLOP/s", "roofline", "moved/floor", "flags"));
  for (const auto& o : s.ops) {
    std::string moved = o.bytes_floor_per_step > 0 ? fmt::format("{:.2f}x", o.moved_over_floor) : "-";
    add_line(out, fmt::format("{:<{}}  {:>7}  {:>10}  {:>5.1f}%  {:>8}  {:>8}  {:>7.1f}%  {:>11}  {}", o.key,
                              w, fmt_calls(o.calls_per_step), fmt_time(o.time_us_per_step), 100 * o.share,
                              fmt_rate(o.gbps), fmt_rate(o.gflops), 100 * o.roofline, moved, flags_of(o)));
  }
  double outside_share = s.step_us_mean > 0 ? s.outside_ops_us_per_step / s.step_us_mean : 0;
  add_line(out, fmt::format("{:<{}}  {:>7}  {:>10}  {:>5.1f}%", outside, w, "",
                            fmt_time(s.outside_ops_us_per_step), 100 * outside_share));
  return out;
}

nlohmann::json summary_json(const Summary& s) {
  using nlohmann::json;
  json ceilings = {{"mem_gbps", s.ceilings.mem_gbps},
                   {"matrix_gflops", s.ceilings.matrix_gflops},
                   {"source", s.ceilings.source}};
  if (s.ceilings.source == "measured") {
    ceilings["mem_read_gbps"] = s.ceilings.mem_read_gbps;
    ceilings["mem_copy_gbps"] = s.ceilings.mem_copy_gbps;
    ceilings["mem_buffer_bytes"] = s.ceilings.mem_buffer_bytes;
    ceilings["gemm_n"] = s.ceilings.gemm_n;
    ceilings["threads"] = s.ceilings.threads;
    ceilings["measure_seconds"] = s.ceilings.measure_seconds;
    if (!s.ceilings.matrix_kind.empty()) ceilings["matrix_kind"] = s.ceilings.matrix_kind;
    if (s.ceilings.fp8_matrix_gflops > 0) ceilings["fp8_matrix_gflops"] = s.ceilings.fp8_matrix_gflops;
  }
  json ops = json::array();
  for (const auto& o : s.ops) {
    json flags = json::array();
    if (o.flag_bytes) flags.push_back("bytes");
    if (o.flag_time) flags.push_back("time");
    ops.push_back({{"op", o.key},
                   {"shapes", o.shapes},
                   {"calls_per_step", o.calls_per_step},
                   {"time_us_per_step", o.time_us_per_step},
                   {"share", o.share},
                   {"floor_share", o.floor_share},
                   {"bytes_floor_per_step", o.bytes_floor_per_step},
                   {"bytes_moved_per_step", o.bytes_moved_per_step},
                   {"flops_per_step", o.flops_per_step},
                   {"time_floor_us_per_step", o.time_floor_us_per_step},
                   {"gbps", o.gbps},
                   {"gflops", o.gflops},
                   {"roofline", o.roofline},
                   {"moved_over_floor", o.moved_over_floor},
                   {"flags", flags}});
  }
  return {{"ceilings", ceilings},
          {"group_by", s.group == GroupBy::Kind ? "kind" : "name"},
          {"flag_rules",
           {{"bytes_over_floor", s.rules.bytes_over_floor},
            {"time_over_floor_share", s.rules.time_over_floor_share},
            {"min_share", s.rules.min_share}}},
          {"steps", s.steps},
          {"warmup_steps", s.warmup_steps},
          {"timer", s.timer},
          {"step_us", {{"mean", s.step_us_mean}, {"min", s.step_us_min}, {"max", s.step_us_max}}},
          {"ops_us_per_step", s.ops_us_per_step},
          {"outside_ops_us_per_step", s.outside_ops_us_per_step},
          {"floor_us_per_step", s.floor_us_per_step},
          {"roofline", s.roofline},
          {"ops", ops}};
}

}  // namespace ms::profiler
