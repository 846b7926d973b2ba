// `moeserve echo-server`: the HTTP server over the model-free echo backend (real scheduler and KV page
// accounting, answers repeat the prompt). For testing clients, the benchmark and the HTTP layer without a
// model.
#include <fmt/format.h>

#include <chrono>
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "core/log.h"
#include "server/echo_backend.h"
#include "server/http_server.h"
#include "server/signals.h"

namespace {

ms::cli::Registration reg(
    "echo-server", "OpenAI-compatible server with a model-free echo backend (for testing)",
    [](CLI::App& sub) {
      auto sc = std::make_shared<ms::server::ServerConfig>();
      auto bc = std::make_shared<ms::server::EchoBackendConfig>();
      auto step_us = std::make_shared<int>(0);
      auto drain_s = std::make_shared<double>(30);
      auto reasoning = std::make_shared<std::string>();
      sub.add_option("--host", sc->host, "Address to bind")->capture_default_str();
      sub.add_option("--port", sc->port, "Port (0: any free one, printed at start)")->capture_default_str();
      sub.add_option("--api-key", sc->api_key, "Require 'Authorization: Bearer KEY'");
      sub.add_option("--served-model-name", bc->model_name, "Model name")->capture_default_str();
      sub.add_option("--max-running-requests", bc->max_running_requests)->capture_default_str();
      sub.add_option("--max-prefill-tokens", bc->max_prefill_tokens)->capture_default_str();
      sub.add_option("--page-size", bc->page_size)->capture_default_str();
      sub.add_option("--num-pages", bc->num_pages, "KV pages in the pool")->capture_default_str();
      sub.add_option("--context-length", bc->max_context)->capture_default_str();
      sub.add_option("--step-time-us", *step_us, "Microseconds each engine step takes")
          ->capture_default_str();
      sub.add_option("--drain-timeout", *drain_s, "Seconds running requests get to finish after SIGTERM")
          ->capture_default_str();
      sub.add_option("--reasoning-parser", *reasoning, "glm45 or deepseek-r1")
          ->check(CLI::IsMember({"", "glm45", "deepseek-r1"}));
      sub.add_option("--max-body-bytes", sc->max_body_bytes)->capture_default_str();
      sub.add_option("--http-threads", sc->http_threads,
                     "HTTP worker threads (each streaming client holds one)")
          ->capture_default_str();
      return [=]() -> int {
        bc->step_time = std::chrono::microseconds(*step_us);
        if (!reasoning->empty()) sc->reasoning_parser = ms::server::parse_reasoning_format(*reasoning);
        ms::server::block_shutdown_signals();
        ms::server::EchoBackend backend(*bc);
        ms::server::EngineLoop loop(backend);
        ms::server::HttpServer server(*sc, loop);
        server.start();
        std::printf("moeserve echo-server listening on http://%s:%d\n", sc->host.c_str(), server.port());
        std::fflush(stdout);
        const int sig = ms::server::wait_for_shutdown_signal();
        MS_LOG_INFO("signal {}: draining (up to {} s)", sig, *drain_s);
        server.drain(std::chrono::milliseconds(static_cast<int64_t>(*drain_s * 1000)));
        server.wait();
        MS_LOG_INFO("stopped");
        return 0;
      };
    });

}  // namespace
