#include "server/metrics.h"

#include "loadgen/load_generator.h"

#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <sstream>

using ms::server::Histogram;
using ms::server::Metrics;

TEST(Metrics, HistogramBucketsAreCumulative) {
  Histogram h({0.1, 1.0});
  h.observe(0.05);
  h.observe(0.1);  // le is inclusive
  h.observe(0.5);
  h.observe(7);
  std::string out;
  h.render(out, "x");
  EXPECT_NE(out.find("x_bucket{le=\"0.1\"} 2\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{le=\"1\"} 3\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_bucket{le=\"+Inf\"} 4\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_sum 7.65\n"), std::string::npos) << out;
  EXPECT_NE(out.find("x_count 4\n"), std::string::npos) << out;
}

TEST(Metrics, ExpositionHasEngineGaugesAndEveryLineIsWellFormed) {
  Metrics m;
  m.ttft.observe(0.2);
  ms::runtime::EngineStats e;
  e.running = 3;
  e.waiting = 2;
  e.kv_pages_total = 100;
  e.kv_pages_used = 40;
  e.prefix_cache_queries = 10;
  e.prefix_cache_hits = 5;
  e.model_steps_total = 7;
  e.step_seconds_total = 0.5;
  e.executor_seconds_total = 0.25;
  e.gap_seconds_total = 0.125;
  const std::string out = m.render(e, 5, "echo");
  EXPECT_NE(out.find("moeserve_engine_steps_total 7\n"), std::string::npos);
  EXPECT_NE(out.find("moeserve_engine_executor_seconds_total 0.25\n"), std::string::npos);
  const ms::loadgen::EngineLoopCounters c = ms::loadgen::parse_engine_counters(out);
  EXPECT_TRUE(c.ok);
  EXPECT_EQ(c.steps, 7);
  EXPECT_EQ(c.step_s, 0.5);
  EXPECT_EQ(c.gap_s, 0.125);
  EXPECT_NE(out.find("moeserve_num_requests_running 3\n"), std::string::npos);
  EXPECT_NE(out.find("moeserve_kv_pages_free 60\n"), std::string::npos);
  EXPECT_NE(out.find("moeserve_prefix_cache_hit_rate 0.5\n"), std::string::npos);
  EXPECT_NE(out.find("# TYPE moeserve_time_to_first_token_seconds histogram\n"), std::string::npos);
  // Every sample line: name{labels} value, with a TYPE declared before it.
  std::istringstream in(out);
  std::string line;
  std::set<std::string> typed;
  while (std::getline(in, line)) {
    if (line.rfind("# TYPE ", 0) == 0) {
      typed.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    if (line.rfind("# HELP ", 0) == 0) continue;
    const size_t sp = line.rfind(' ');
    ASSERT_NE(sp, std::string::npos) << line;
    std::string name = line.substr(0, std::min(line.find('{'), sp));
    for (const char* suffix : {"_bucket", "_sum", "_count"})
      if (!typed.count(name) && name.size() > strlen(suffix) &&
          name.compare(name.size() - strlen(suffix), strlen(suffix), suffix) == 0)
        name.resize(name.size() - strlen(suffix));
    EXPECT_TRUE(typed.count(name)) << "no TYPE for " << line;
    const std::string value = line.substr(sp + 1);
    EXPECT_NO_THROW((void)std::stod(value == "+Inf" ? "inf" : value)) << line;
  }
}

TEST(Metrics, LabelValuesAreEscaped) {
  Metrics m;
  const std::string out = m.render({}, 0, "a\"b\\c\nd");
  EXPECT_NE(out.find("moeserve_model_info{model=\"a\\\"b\\\\c\\nd\"} 1\n"), std::string::npos) << out;
}
