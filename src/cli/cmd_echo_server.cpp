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
      auto script = std::make_shared<std::string>();
      auto chat_template = std::make_shared<std::string>();
      ms::cli::add_http_serve_options(sub, *o);
      sub.add_option("--max-running-requests", bc->max_running_requests, "Requests decoded together")
          ->capture_default_str();
      sub.add_option("--max-prefill-tokens", bc->max_prefill_tokens, "Prompt tokens per step")
          ->capture_default_str();
      sub.add_option("--page-size", bc->page_size, "Tokens per KV page")->capture_default_str();
      sub.add_option("--num-pages", bc->num_pages, "KV pages in the pool")->capture_default_str();
      sub.add_option("--context-length", bc->max_context, "Prompt + completion tokens")
          ->capture_default_str();
      sub.add_option("--step-time-us", *step_us, "Microseconds each engine step takes")
          ->capture_default_str();
      sub.add_option(
          "--script", *script,
          "JSON file {\"trigger\": \"reply\", ...}: a prompt containing a trigger is answered with "
          "its reply (the trigger that occurs last wins), others are echoed");
      sub.add_option("--chat-template", *chat_template,
                     "Jinja chat template file to render chats with (default: contents joined by newlines)");
      sub.add_option("--fail-at-step", bc->fail_at_step,
                     "Make engine step N throw (0: never), to test failure handling")
          ->capture_default_str();
      return [=]() -> int {
        bc->step_time = std::chrono::microseconds(*step_us);
        if (!script->empty()) bc->script = ms::server::load_echo_script(*script);
        if (!chat_template->empty())
          bc->chat_template = ms::tokenizer::ChatTemplate::from_file(*chat_template);
        if (!o->server.served_model_name.empty()) bc->model_name = o->server.served_model_name;
        ms::server::block_shutdown_signals();
        ms::server::EchoBackend backend(*bc);
        return ms::cli::serve_until_signal(backend, *o, "moeserve echo-server");
      };
    });

}  // namespace
