// The OpenAI-compatible HTTP server on cpp-httplib: routes, authentication, body limits, SSE streaming,
// metrics, and a graceful drain (no new requests, running ones finish within a timeout, then stop).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "server/engine_loop.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "server/reasoning_parser.h"
#include "server/tool_call_parser.h"

namespace httplib {
class Server;
}

namespace ms::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 30000;               // 0: any free port (see HttpServer::port)
  std::string api_key;            // empty: no authentication
  std::string served_model_name;  // empty: the backend's model name
  size_t max_body_bytes = 32u << 20;
  int http_threads = 512;  // each streaming client holds one
  std::optional<ReasoningFormat> reasoning_parser;
  std::optional<ToolCallFormat> tool_call_parser;  // none: answers are text, tool markup included
  // max_tokens of a chat request that gives none (bounded by what is left of the context); 0: the context.
  int default_max_tokens = 4096;
  ProtocolLimits limits;
};

class HttpServer {
 public:
  HttpServer(ServerConfig config, EngineLoop& loop);
  ~HttpServer();

  // Binds the socket (so the port is known and clients can connect) and serves on a background thread.
  void start();
  int port() const { return port_; }
  // Refuses new completions (503), waits up to `timeout` for running ones, cancels the rest, stops serving.
  void drain(std::chrono::milliseconds timeout);
  void stop();
  bool draining() const { return draining_.load(); }
  // Blocks until the server stopped (after drain() or stop() from another thread).
  void wait();
  Metrics& metrics() { return metrics_; }

 private:
  void routes();
  void profile_routes();  // POST /start_profile, /stop_profile (profile_routes.cpp)
  std::string model_name() const;

  ServerConfig config_;
  EngineLoop& loop_;
  Metrics metrics_;
  std::unique_ptr<httplib::Server> http_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<bool> draining_{false};
  std::atomic<int> completions_in_flight_{0};  // handlers (and their streams) not yet done
};

}  // namespace ms::server
