// `moeserve echo-server`: the HTTP server over the model-free echo backend (real scheduler and KV page
// accounting, answers repeat the prompt). For testing clients, the benchmark and the HTTP layer without a
// model.
#include <chrono>

#include "cli/command.h"
#include "cli/http_serve.h"
#include "server/echo_backend.h"
#include "server/signals.h"

namespace {

ms::cli::Registration reg(
    "echo-server", "OpenAI-compatible server with a model-free echo backend (for testing)",
    [](CLI::App& sub) {
      auto o = std::make_shared<ms::cli::HttpServeOptions>();
      auto bc = std::make_shared<ms::server::EchoBackendConfig>();
      auto step_us = std::make_shared<int>(0);
      ms::cli::add_http_serve_options(sub, *o);
      sub.add_option("--max-running-requests", bc->max_running_requests)->capture_default_str();
      sub.add_option("--max-prefill-tokens", bc->max_prefill_tokens)->capture_default_str();
      sub.add_option("--page-size", bc->page_size)->capture_default_str();
      sub.add_option("--num-pages", bc->num_pages, "KV pages in the pool")->capture_default_str();
      sub.add_option("--context-length", bc->max_context)->capture_default_str();
      sub.add_option("--step-time-us", *step_us, "Microseconds each engine step takes")
          ->capture_default_str();
      return [=]() -> int {
        bc->step_time = std::chrono::microseconds(*step_us);
        if (!o->server.served_model_name.empty()) bc->model_name = o->server.served_model_name;
        ms::server::block_shutdown_signals();
        ms::server::EchoBackend backend(*bc);
        return ms::cli::serve_until_signal(backend, *o, "moeserve echo-server");
      };
    });

}  // namespace
