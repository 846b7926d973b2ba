#include "loadgen/load_generator.h"

#include <gtest/gtest.h>

#include <cmath>

#include "core/error.h"
#include "loadgen/plot.h"
#include "server/echo_backend.h"
#include "server/http_server.h"

using namespace ms::loadgen;

TEST(BenchStats, PercentilesInterpolateLikeNumpy) {
  EXPECT_DOUBLE_EQ(percentile({1, 2, 3, 4}, 0.5), 2.5);
  EXPECT_DOUBLE_EQ(percentile({5}, 0.99), 5);
  EXPECT_DOUBLE_EQ(percentile({}, 0.5), 0);
  std::vector<double> v;
  for (int i = 0; i <= 100; ++i) v.push_back(i);
  EXPECT_DOUBLE_EQ(percentile(v, 0.99), 99);
  EXPECT_NEAR(percentile({0, 10}, 0.99), 9.9, 1e-12);
}

TEST(BenchStats, SummaryOfResults) {
  std::vector<RequestResult> rs(3);
  rs[0] = {true, "", 10, 5, 0.1, 0.5, {0.1, 0.1, 0.1, 0.1}};
  rs[1] = {true, "", 20, 3, 0.2, 0.4, {0.1, 0.1}};
  rs[2].error = "HTTP 500";
  auto s = summarize(rs, 2.0, 4, INFINITY);
  EXPECT_EQ(s.completed, 2);
  EXPECT_EQ(s.failed, 1);
  EXPECT_EQ(s.input_tokens, 30);
  EXPECT_EQ(s.output_tokens, 8);
  EXPECT_DOUBLE_EQ(s.output_throughput, 4.0);
  EXPECT_NEAR(s.ttft_ms.mean, 150, 1e-9);
  EXPECT_NEAR(s.tpot_ms.mean, 100, 1e-9);  // (0.5-0.1)/4 and (0.4-0.2)/2
  EXPECT_NEAR(s.per_user_output_tokens_per_s, 10, 1e-9);
  EXPECT_EQ(s.errors, std::vector<std::string>{"HTTP 500"});
  EXPECT_NE(csv_row(s).find("4,inf,2,1,"), std::string::npos);
  const std::string header = csv_header(), row = csv_row(s);
  EXPECT_EQ(std::count(header.begin(), header.end(), ','), std::count(row.begin(), row.end(), ','));
  EXPECT_NE(row.find(",,\n"), std::string::npos) << row;  // no engine counters: empty columns
  s.engine_steps = 12;
  s.engine_host_share = 0.0425;
  const std::string with_engine = csv_row(s);
  EXPECT_NE(with_engine.find(",12,0.0425\n"), std::string::npos) << with_engine;
  EXPECT_EQ(std::count(header.begin(), header.end(), ','),
            std::count(with_engine.begin(), with_engine.end(), ','));
  EXPECT_NE(format_summary(s).find("Host share of the busy loop (%):"), std::string::npos);
}

TEST(BenchStats, EngineCountersFromAMetricsText) {
  const std::string text =
      "# HELP moeserve_engine_steps_total x\n# TYPE moeserve_engine_steps_total counter\n"
      "moeserve_engine_steps_total 12\nmoeserve_engine_step_seconds_total 1.5\n"
      "moeserve_num_requests_running 3\nmoeserve_engine_executor_seconds_total 1.25\n"
      "moeserve_engine_gap_seconds_total 0.25\n";
  const EngineLoopCounters c = parse_engine_counters(text);
  ASSERT_TRUE(c.ok);
  EXPECT_EQ(c.steps, 12);
  EXPECT_EQ(c.step_s, 1.5);
  EXPECT_EQ(c.executor_s, 1.25);
  EXPECT_EQ(c.gap_s, 0.25);
  EXPECT_FALSE(parse_engine_counters("moeserve_engine_steps_total 12\n").ok);  // another server's metrics
  EXPECT_FALSE(parse_engine_counters(text + "moeserve_engine_gap_seconds_total x\n").ok);  // malformed
}

TEST(BenchPlot, ScriptHoldsEveryPoint) {
  BenchSummary a, b;
  a.max_concurrency = 1;
  a.per_user_output_tokens_per_s = 50;
  a.output_throughput = 50;
  b.max_concurrency = 8;
  b.per_user_output_tokens_per_s = 30;
  b.output_throughput = 240;
  const auto s = plot_script({a, b}, "out'x.png");
  EXPECT_NE(s.find("set output 'out''x.png'"), std::string::npos);
  EXPECT_NE(s.find("50 50 1\n"), std::string::npos);
  EXPECT_NE(s.find("30 240 8\n"), std::string::npos);
}

// Against the real HTTP server over the echo backend: every request completes with exactly the asked output.
TEST(BenchRun, AgainstTheEchoServer) {
  ms::server::EchoBackendConfig bc;
  bc.step_time = std::chrono::microseconds(200);
  bc.max_running_requests = 8;
  ms::server::EchoBackend backend(bc);
  ms::server::EngineLoop loop(backend);
  ms::server::ServerConfig sc;
  sc.port = 0;
  ms::server::HttpServer server(sc, loop);
  server.start();

  BenchConfig c;
  c.base_url = "http://127.0.0.1:" + std::to_string(server.port());
  c.num_prompts = 24;
  c.input_len = 40;
  c.output_len = 12;
  c.max_concurrency = 6;
  c.progress = false;
  auto s = run_bench(c);
  EXPECT_EQ(s.completed, 24);
  EXPECT_EQ(s.failed, 0) << (s.errors.empty() ? "" : s.errors[0]);
  EXPECT_EQ(s.output_tokens, 24 * 12);
  EXPECT_EQ(s.input_tokens, 24 * 40);
  EXPECT_GT(s.ttft_ms.mean, 0);
  EXPECT_GT(s.itl_ms.median, 0);
  EXPECT_GT(s.output_throughput, 0);
  EXPECT_LE(s.ttft_ms.median, s.ttft_ms.p99);
  EXPECT_EQ(s.engine_steps, 0);  // the echo backend exports the engine counters but runs no model

  // Chat endpoint, Poisson arrivals, random lengths.
  c.chat = true;
  c.request_rate = 200;
  c.max_concurrency = 0;
  c.range_ratio = 0.5;
  c.num_prompts = 10;
  s = run_bench(c);
  EXPECT_EQ(s.completed, 10);
  EXPECT_GE(s.output_tokens, 10 * 6);
  EXPECT_LE(s.output_tokens, 10 * 12);

  c.base_url = "http://127.0.0.1:1";  // nothing listens there
  EXPECT_THROW(run_bench(c), ms::Error);
}
