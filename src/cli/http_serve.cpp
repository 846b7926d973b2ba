#include "cli/http_serve.h"

#include <chrono>
#include <cstdio>

#include "core/log.h"
#include "server/engine_loop.h"
#include "server/signals.h"

namespace ms::cli {

void add_http_serve_options(CLI::App& sub, HttpServeOptions& o) {
  sub.add_option("--host", o.server.host, "Address to bind")->capture_default_str();
  sub.add_option("--port", o.server.port, "Port (0: any free one, printed at start)")->capture_default_str();
  sub.add_option("--api-key", o.server.api_key, "Require 'Authorization: Bearer KEY'");
  sub.add_option("--served-model-name", o.server.served_model_name,
                 "Model name clients send (default: the model's own)");
  sub.add_option("--reasoning-parser", o.reasoning_parser,
                 "Split <think>...</think> into reasoning_content: glm45 or deepseek-r1")
      ->check(CLI::IsMember({"", "glm45", "deepseek-r1"}));
  sub.add_option("--tool-call-parser", o.tool_call_parser,
                 "Turn the model's tool-call markup into OpenAI tool_calls: glm or deepseek_v3")
      ->check(CLI::IsMember({"", "glm", "deepseek_v3"}));
  sub.add_option("--default-max-tokens", o.server.default_max_tokens,
                 "Completion tokens of a chat request that names no max_tokens (0: up to the context)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub.add_option("--max-body-bytes", o.server.max_body_bytes, "Largest request body accepted, in bytes")
      ->capture_default_str();
  sub.add_option("--http-threads", o.server.http_threads,
                 "HTTP worker threads (each streaming client holds one)")
      ->capture_default_str();
  sub.add_option("--drain-timeout", o.drain_timeout_s, "Seconds running requests get to finish after SIGTERM")
      ->capture_default_str();
}

int serve_until_signal(server::Backend& backend, const HttpServeOptions& o, const std::string& what,
                       const std::function<std::string(int port)>& banner_extra) {
  server::ServerConfig sc = o.server;
  if (!o.reasoning_parser.empty()) sc.reasoning_parser = server::parse_reasoning_format(o.reasoning_parser);
  if (!o.tool_call_parser.empty()) sc.tool_call_parser = server::parse_tool_call_format(o.tool_call_parser);
  server::EngineLoop loop(backend);
  server::HttpServer http(sc, loop);
  http.start();
  std::printf("%s listening on http://%s:%d\n", what.c_str(), sc.host.c_str(), http.port());
  if (banner_extra) std::printf("%s", banner_extra(http.port()).c_str());
  std::fflush(stdout);
  const int sig = server::wait_for_shutdown_signal();
  MS_LOG_INFO("signal {}: draining (up to {} s)", sig, o.drain_timeout_s);
  http.drain(std::chrono::milliseconds(static_cast<int64_t>(o.drain_timeout_s * 1000)));
  http.wait();
  MS_LOG_INFO("stopped");
  return 0;
}

}  // namespace ms::cli
