// What `moeserve serve` and `moeserve echo-server` share: the HTTP options and the run of a server over a
// backend until SIGINT/SIGTERM, then a drain.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>

#include "server/backend.h"
#include "server/http_server.h"

namespace ms::cli {

struct HttpServeOptions {
  server::ServerConfig server;
  std::string reasoning_parser;  // "", "glm45" or "deepseek-r1"
  std::string tool_call_parser;  // "", "glm" or "deepseek_v3"
  double drain_timeout_s = 30;
};

// --host --port --api-key --served-model-name --reasoning-parser --tool-call-parser --max-body-bytes
// --http-threads
// --drain-timeout.
void add_http_serve_options(CLI::App& sub, HttpServeOptions& o);

// Serves `backend` (its engine loop on a thread of its own) until SIGINT or SIGTERM, then drains. Prints
// "<what> listening on http://HOST:PORT" as the first line of stdout, then what `banner_extra(port)` says.
// Block the shutdown signals (server::block_shutdown_signals) before any thread starts, i.e. before the
// backend is built.
int serve_until_signal(server::Backend& backend, const HttpServeOptions& o, const std::string& what,
                       const std::function<std::string(int port)>& banner_extra = {});

}  // namespace ms::cli
