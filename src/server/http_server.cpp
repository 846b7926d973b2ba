#include "server/http_server.h"

#include <httplib.h>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "server/chat_page.h"
#include "server/client_connection.h"
#include "server/completion_job.h"

namespace ms::server {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

void reply_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump_json(j), "application/json");
}

const char* status_code_name(int status) {
  switch (status) {
    case 401:
      return "invalid_api_key";
    case 404:
      return "not_found";
    case 405:
      return "method_not_allowed";
    case 413:
      return "request_too_large";
    case 503:
      return "service_unavailable";
    default:
      return status >= 500 ? "internal_error" : "invalid_request";
  }
}

// cpp-httplib listens with a backlog of 5 (a compile-time constant of the shared library), so a burst of
// clients overflows the accept queue and connections fail. Listening again on the same socket raises it.
void raise_listen_backlog(int port) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    int fd = -1;
    try {
      fd = std::stoi(entry.path().filename().string());
    } catch (...) {
      continue;
    }
    int listening = 0;
    socklen_t len = sizeof(listening);
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage addr{};
    socklen_t alen = sizeof(addr);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &alen) != 0) continue;
    int p = -1;
    if (addr.ss_family == AF_INET) p = ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    if (addr.ss_family == AF_INET6) p = ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
    if (p == port) ::listen(fd, 1024);
  }
}

// The prompt text of a chat. Under tool_choice "none" the tools are not offered; with a tool-call parser,
// earlier tool calls are given to the template in the form it expects.
std::string render_prompt(const Backend& b, const CompletionParams& p,
                          const std::optional<ToolCallFormat>& fmt) {
  static const ordered_json no_tools;
  const ordered_json& tools = p.tool_choice.mode == ToolChoice::Mode::None ? no_tools : p.tools;
  try {
    if (fmt) return b.render_chat(messages_for_template(*fmt, p.messages), tools, p.template_kwargs);
    return b.render_chat(p.messages, tools, p.template_kwargs);
  } catch (const ms::Error& e) {
    throw ApiError(400, e.message(), "messages");
  }
}

}  // namespace

HttpServer::HttpServer(ServerConfig config, EngineLoop& loop)
    : config_(std::move(config)), loop_(loop), http_(std::make_unique<httplib::Server>()) {
  const int threads = config_.http_threads;
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  http_->set_payload_max_length(config_.max_body_bytes);
  http_->set_keep_alive_max_count(1000);
  http_->set_tcp_nodelay(true);  // stream chunks are small: Nagle would hold them back for the peer's ACK
  routes();
}

HttpServer::~HttpServer() {
  stop();
  wait();
}

std::string HttpServer::model_name() const {
  return config_.served_model_name.empty() ? loop_.backend().model_name() : config_.served_model_name;
}

void HttpServer::start() {
  if (config_.port == 0) {
    port_ = http_->bind_to_any_port(config_.host);
    MS_CHECK(port_ > 0, "cannot bind {}: no free port", config_.host);
  } else {
    MS_CHECK(http_->bind_to_port(config_.host, config_.port), "cannot bind {}:{} (in use, or not allowed)",
             config_.host, config_.port);
    port_ = config_.port;
  }
  raise_listen_backlog(port_);
  thread_ = std::thread([this] { http_->listen_after_bind(); });
}

void HttpServer::stop() {
  loop_.cancel_all();
  // Let cancelled streams send their last event before the sockets close.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (completions_in_flight_.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  http_->stop();
}

void HttpServer::wait() {
  if (thread_.joinable()) thread_.join();
}

void HttpServer::drain(std::chrono::milliseconds timeout) {
  draining_ = true;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (loop_.active() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  if (loop_.active() > 0) MS_LOG_WARN("drain: cancelling {} requests still running", loop_.active());
  // A request leaves the engine loop before its HTTP thread has written the last bytes of its response;
  // give those threads a moment so stop() does not cut a finished answer off.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  stop();
}

void HttpServer::routes() {
  auto& h = *http_;
  auto error = [this](httplib::Response& res, const ApiError& e) {
    if (e.status >= 400 && e.status < 500) metrics_.http_client_errors++;
    reply_json(res, e.status, e.to_json());
  };

  h.set_pre_routing_handler([this, error](const httplib::Request& req, httplib::Response& res) {
    // The chat page is public (it holds no data); its API calls send the key the user types in.
    if (config_.api_key.empty() || req.path == "/health" || req.path == "/metrics" ||
        (req.path == "/" && req.method == "GET"))
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    if (auth != "Bearer " + config_.api_key) {
      error(res, ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'", "",
                          "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  h.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    std::string message;
    if (res.status == 413) {
      message = fmt::format("request body exceeds the limit of {} bytes", config_.max_body_bytes);
    } else if (res.status == 404) {
      message = fmt::format("no route for {} {}", req.method, req.path);
    } else {
      message = fmt::format("HTTP {} for {} {}", res.status, req.method, req.path);
    }
    if (res.status >= 400 && res.status < 500) metrics_.http_client_errors++;
    res.set_content(dump_json(ApiError(res.status, message, "", status_code_name(res.status)).to_json()),
                    "application/json");
  });
  h.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    MS_LOG_ERROR("request failed: {}", what);
    reply_json(res, 500, ApiError(500, what, "", "internal_error").to_json());
  });

  h.Get("/", [](const httplib::Request&, httplib::Response& res) {
    const std::string_view page = chat_page_html();
    res.set_header("Cache-Control", "no-cache");
    res.set_header(
        "Content-Security-Policy",
        "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src 'self' data:");
    res.set_content(page.data(), page.size(), "text/html; charset=utf-8");
  });

  h.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_) {
      reply_json(res, 503, {{"status", "draining"}});
    } else {
      reply_json(res, 200, {{"status", "ok"}});
    }
  });

  h.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    std::string text = metrics_.render(loop_.stats(), loop_.active(), model_name());
    const Backend& b = loop_.backend();
    Metrics::render_distinct_experts(text, b.distinct_experts_histogram(moe::RoutingKind::Baseline),
                                     b.distinct_experts_histogram(moe::RoutingKind::Oea));
    res.set_content(text, "text/plain; version=0.0.4; charset=utf-8");
  });

  h.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", model_name()},
              {"object", "model"},
              {"created", 0},
              {"owned_by", "moeserve"},
              {"max_model_len", loop_.backend().max_context()},
              {"vocab_size", loop_.backend().vocab_size()}};
    reply_json(res, 200, {{"object", "list"}, {"data", json::array({m})}});
  });

  h.Post("/tokenize", [this, error](const httplib::Request& req, httplib::Response& res) {
    try {
      ordered_json body = parse_json_body(req.body);
      Backend& b = loop_.backend();
      std::string text;
      bool chat = false;
      if (body.contains("messages")) {
        chat = true;
        CompletionParams p;
        ordered_json probe = {{"model", model_name()}, {"messages", body["messages"]}};
        for (const char* k : {"tools", "chat_template_kwargs"})
          if (body.contains(k)) probe[k] = body[k];
        p = parse_completion_request(probe, true, config_.limits);
        text = render_prompt(b, p, config_.tool_call_parser);
      } else if (body.contains("prompt") && body["prompt"].is_string()) {
        text = body["prompt"].get<std::string>();
      } else {
        throw ApiError(400, "prompt: expected a string (or send messages)", "prompt");
      }
      auto ids = b.encode(text, !chat);
      reply_json(res, 200, {{"tokens", ids}, {"count", ids.size()}, {"max_model_len", b.max_context()}});
    } catch (const ApiError& e) {
      error(res, e);
    }
  });

  h.Post("/detokenize", [this, error](const httplib::Request& req, httplib::Response& res) {
    try {
      json body = parse_json_body(req.body);
      if (!body.contains("tokens") || !body["tokens"].is_array())
        throw ApiError(400, "tokens: expected an array of token ids", "tokens");
      std::vector<int32_t> ids;
      const int32_t vocab = loop_.backend().vocab_size();
      for (size_t i = 0; i < body["tokens"].size(); ++i) {
        const auto& t = body["tokens"][i];
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
          throw ApiError(400, fmt::format("tokens[{}]: expected a token id in [0, {})", i, vocab), "tokens");
        ids.push_back(t.get<int32_t>());
      }
      reply_json(res, 200, {{"prompt", loop_.backend().decode(ids)}});
    } catch (const ApiError& e) {
      error(res, e);
    }
  });

  auto completion = [this, error](bool chat) {
    return [this, error, chat](const httplib::Request& req, httplib::Response& res) {
      try {
        if (draining_) throw ApiError(503, "the server is shutting down", "", "service_unavailable");
        ordered_json body = parse_json_body(req.body);
        CompletionParams p = parse_completion_request(body, chat, config_.limits);
        if (p.model != model_name())
          throw ApiError(
              404, fmt::format("model '{}' does not exist; this server serves '{}'", p.model, model_name()),
              "model", "model_not_found");
        Backend& b = loop_.backend();
        std::vector<std::vector<int32_t>> prompts;
        if (chat) {
          const auto mode = p.tool_choice.mode;
          if (!config_.tool_call_parser &&
              (mode == ToolChoice::Mode::Required || mode == ToolChoice::Mode::Named))
            throw ApiError(400,
                           "tool_choice: 'required' and a named function need a server started with "
                           "--tool-call-parser",
                           "tool_choice", "unsupported_value");
          prompts.push_back(b.encode(render_prompt(b, p, config_.tool_call_parser), false));
        } else {
          for (const PromptInput& in : p.prompts)
            prompts.push_back(in.text ? b.encode(*in.text, true) : in.ids);
        }
        const int32_t vocab = b.vocab_size();
        for (int32_t t : p.stop_token_ids)
          if (t >= vocab)
            throw ApiError(
                400, fmt::format("stop_token_ids: token id {} is not below the vocabulary size {}", t, vocab),
                "stop_token_ids");
        for (const auto& [t, bias] : p.sampling.logit_bias)
          if (t >= vocab)
            throw ApiError(
                400, fmt::format("logit_bias: token id {} is not below the vocabulary size {}", t, vocab),
                "logit_bias");
        const int64_t ctx = b.max_context();
        const std::optional<int> asked = p.max_tokens;
        int64_t longest = 0;
        for (size_t k = 0; k < prompts.size(); ++k) {
          const auto& ids = prompts[k];
          const std::string prompt_field =
              chat ? "messages" : (prompts.size() > 1 ? fmt::format("prompt[{}]", k) : std::string("prompt"));
          for (size_t i = 0; i < ids.size(); ++i)
            if (ids[i] >= vocab)
              throw ApiError(400,
                             fmt::format("{}[{}]: token id {} is not below the vocabulary size {}",
                                         prompt_field, i, ids[i], vocab),
                             chat ? "messages" : "prompt");
          if (ids.empty())
            throw ApiError(400, fmt::format("{}: the prompt has no tokens", prompt_field),
                           chat ? "messages" : "prompt");
          const int64_t n_prompt = static_cast<int64_t>(ids.size());
          if (n_prompt >= ctx)
            throw ApiError(400,
                           fmt::format("{}: the prompt is {} tokens; the context length is {} tokens",
                                       prompt_field, n_prompt, ctx),
                           chat ? "messages" : "prompt", "context_length_exceeded");
          if (asked && n_prompt + *asked > ctx) {
            const char* f =
                chat && body.contains("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
            throw ApiError(
                400,
                fmt::format("{}: {} + the prompt's {} tokens exceeds the context length of {} tokens", f,
                            *asked, n_prompt, ctx),
                f, "context_length_exceeded");
          }
          longest = std::max(longest, n_prompt);
        }
        if (!asked) {  // chat without max_tokens: the server's default, within what the context leaves
          int64_t room = ctx - longest;
          if (config_.default_max_tokens > 0) room = std::min<int64_t>(room, config_.default_max_tokens);
          p.max_tokens = static_cast<int>(room);
        }
        auto job = std::make_shared<CompletionJob>(loop_, metrics_, p, std::move(prompts), model_name(),
                                                   config_.reasoning_parser, config_.tool_call_parser);
        // Counted until the answer is written: for a stream, until httplib releases the provider.
        ++completions_in_flight_;
        std::shared_ptr<void> in_flight(nullptr, [this](void*) { --completions_in_flight_; });
        job->start();
        if (!p.stream) {
          // Nothing is written while the answer is made: watch the socket, so that a client that went away
          // is cancelled and its pages freed rather than run to its end.
          const ClientConnection conn(req.remote_addr, req.remote_port, port_);
          json answer = job->collect([&conn] { return conn.closed(); });
          if (answer.is_null()) return;  // nobody to answer; counted as cancelled
          reply_json(res, 200, answer);
          return;
        }
        res.set_header("Cache-Control", "no-cache");
        auto last_write =
            std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
        res.set_chunked_content_provider(
            "text/event-stream",
            [job, last_write](size_t, httplib::DataSink& sink) {
              std::vector<json> chunks;
              const bool more = job->poll(chunks, std::chrono::milliseconds(100));
              std::string out;
              for (const auto& c : chunks) out += "data: " + dump_json(c) + "\n\n";
              const auto now = std::chrono::steady_clock::now();
              // A comment line now and then, so a client that went away is noticed even while nothing is
              // produced (e.g. waiting for admission).
              if (out.empty() && now - *last_write > std::chrono::seconds(2)) out = ": keep-alive\n\n";
              if (!more) out += "data: [DONE]\n\n";
              if (!out.empty()) {
                if (!sink.write(out.data(), out.size())) return false;
                *last_write = now;
              }
              if (!more) sink.done();
              return true;
            },
            [job, in_flight](bool success) {
              if (!success) job->cancel();  // the client went away: free its pages now
            });
      } catch (const ApiError& e) {
        error(res, e);
      }
    };
  };
  h.Post("/v1/chat/completions", completion(true));
  h.Post("/v1/completions", completion(false));
  profile_routes();
}

}  // namespace ms::server
