// The HTTP server end to end over a socket, with the model-free echo backend (real scheduler and KV pages).
#include <httplib.h>

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include "server/echo_backend.h"
#include "server/http_server.h"

using namespace ms::server;
using nlohmann::json;

namespace {

struct Fixture {
  explicit Fixture(ServerConfig sc = {}, EchoBackendConfig bc = {}) : backend(bc), loop(backend) {
    sc.port = 0;
    server = std::make_unique<HttpServer>(sc, loop);
    server->start();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", server->port());
    c.set_read_timeout(20, 0);
    return c;
  }
  EchoBackend backend;
  EngineLoop loop;
  std::unique_ptr<HttpServer> server;
};

struct Reply {
  int status = 0;
  json body;
};

Reply post(const Fixture& f, const std::string& path, const std::string& body,
           const httplib::Headers& headers = {}) {
  auto c = f.client();
  auto r = c.Post(path.c_str(), headers, body, "application/json");
  if (!r) return {};
  Reply out{r->status, json()};
  if (!r->body.empty() && r->body[0] == '{') out.body = json::parse(r->body);
  return out;
}

Reply post(const Fixture& f, const std::string& path, const json& body) {
  return post(f, path, body.dump());
}

// Streams a request; returns the parsed `data:` events (without [DONE]) and whether [DONE] came.
struct Stream {
  std::vector<json> events;
  bool done = false;
  int status = 0;
};
Stream stream(const Fixture& f, const std::string& path, const json& body, int stop_after_events = -1) {
  auto c = f.client();
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  Stream s;
  std::string buf;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    buf.append(data, n);
    size_t pos;
    while ((pos = buf.find("\n\n")) != std::string::npos) {
      std::string ev = buf.substr(0, pos);
      buf.erase(0, pos + 2);
      if (ev.rfind("data: ", 0) != 0) continue;
      ev = ev.substr(6);
      if (ev == "[DONE]") {
        s.done = true;
      } else {
        s.events.push_back(json::parse(ev));
      }
      if (stop_after_events >= 0 && static_cast<int>(s.events.size()) >= stop_after_events) return false;
    }
    return true;
  };
  auto r = c.send(req);
  s.status = r ? r->status : -static_cast<int>(r.error());
  return s;
}

json chat_body(const std::string& content, json extra = json::object()) {
  json b = {{"model", "echo"}, {"messages", {{{"role", "user"}, {"content", content}}}}};
  b.update(extra);
  return b;
}

// Waits until no request holds a KV page (only the prefix cache may) and the server serves nothing.
bool settles(const Fixture& f) {
  for (int i = 0; i < 500; ++i) {
    auto st = f.loop.stats();
    if (f.loop.active() == 0 && st.running == 0 && st.waiting == 0 && st.kv_pages_used == st.kv_pages_cached)
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

}  // namespace

TEST(HttpServer, HealthModelsTokenize) {
  Fixture f;
  auto c = f.client();
  auto h = c.Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c.Get("/v1/models");
  ASSERT_TRUE(m);
  auto models = json::parse(m->body);
  EXPECT_EQ(models["data"][0]["id"], "echo");
  EXPECT_EQ(models["data"][0]["max_model_len"], 4096);
  auto t = post(f, "/tokenize", json{{"prompt", "hi"}});
  EXPECT_EQ(t.body["tokens"], json({104, 105}));
  EXPECT_EQ(post(f, "/detokenize", json{{"tokens", {104, 105}}}).body["prompt"], "hi");
  EXPECT_EQ(post(f, "/detokenize", json{{"tokens", {999999}}}).status, 400);
  EXPECT_EQ(post(f, "/tokenize", json{{"messages", {{{"role", "user"}, {"content", "ab"}}}}}).body["count"],
            2);
}

TEST(HttpServer, CompletionAndChatNotStreaming) {
  Fixture f;
  auto r = post(f, "/v1/completions", json{{"model", "echo"}, {"prompt", "hello"}, {"max_tokens", 8}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body["object"], "text_completion");
  EXPECT_EQ(r.body["choices"][0]["text"], "hellohel");
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 8);
  EXPECT_EQ(r.body["usage"]["total_tokens"], 13);

  r = post(f, "/v1/chat/completions", chat_body("abc", {{"max_tokens", 4}, {"n", 3}}));
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.body["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r.body["choices"][i]["index"], i);
    EXPECT_EQ(r.body["choices"][i]["message"]["content"], "abca");
    EXPECT_EQ(r.body["choices"][i]["message"]["role"], "assistant");
  }
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 12);
  // The second request of the same prompt hits the prefix cache (3 requests of 3 tokens: no full page of 16
  // though), so use a long prompt.
  const std::string longp(40, 'x');
  post(f, "/v1/completions", json{{"model", "echo"}, {"prompt", longp}, {"max_tokens", 1}});
  r = post(f, "/v1/completions", json{{"model", "echo"}, {"prompt", longp}, {"max_tokens", 1}});
  EXPECT_EQ(r.body["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
  EXPECT_TRUE(settles(f));
}

TEST(HttpServer, StopStringsAndStopTokens) {
  Fixture f;
  auto r =
      post(f, "/v1/completions",
           json{{"model", "echo"}, {"prompt", "abcSTOPdef"}, {"max_tokens", 30}, {"stop", {"STOP", "zz"}}});
  EXPECT_EQ(r.body["choices"][0]["text"], "abc");
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");
  r = post(f, "/v1/completions",
           json{{"model", "echo"}, {"prompt", "abcdef"}, {"max_tokens", 30}, {"stop_token_ids", {'d'}}});
  EXPECT_EQ(r.body["choices"][0]["text"], "abc");
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 4);
  // Streaming: the stop string split over tokens is never sent.
  auto s = stream(f, "/v1/completions",
                  json{{"model", "echo"},
                       {"prompt", "abcSTOPdef"},
                       {"max_tokens", 30},
                       {"stop", "STOP"},
                       {"stream", true}});
  std::string text;
  for (const auto& e : s.events) text += e["choices"][0]["text"].get<std::string>();
  EXPECT_EQ(text, "abc");
  EXPECT_EQ(s.events.back()["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(s.done);
  EXPECT_TRUE(settles(f));
}

TEST(HttpServer, ChatStreamingWithUsageAndLogprobs) {
  Fixture f;
  auto s = stream(f, "/v1/chat/completions",
                  chat_body("hey", {{"max_tokens", 5},
                                    {"stream", true},
                                    {"stream_options", {{"include_usage", true}}},
                                    {"logprobs", true},
                                    {"top_logprobs", 2}}));
  EXPECT_EQ(s.status, 200);
  ASSERT_TRUE(s.done);
  ASSERT_GE(s.events.size(), 3u);
  EXPECT_EQ(s.events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(s.events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_GE(s.events.size(), 5u + 2u);  // role, one chunk per token, usage
  std::string text;
  int logprob_entries = 0;
  std::string finish;
  for (size_t i = 0; i + 1 < s.events.size(); ++i) {
    const auto& ch = s.events[i]["choices"][0];
    if (ch["delta"].contains("content")) text += ch["delta"]["content"].get<std::string>();
    if (!ch["logprobs"].is_null()) {
      for (const auto& e : ch["logprobs"]["content"]) {
        EXPECT_EQ(e["top_logprobs"].size(), 2u);
        EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]);
        ++logprob_entries;
      }
    }
    if (!ch["finish_reason"].is_null()) finish = ch["finish_reason"];
  }
  EXPECT_EQ(text, "heyhe");
  EXPECT_EQ(logprob_entries, 5);
  EXPECT_EQ(finish, "length");
  const auto& last = s.events.back();
  EXPECT_TRUE(last["choices"].empty());
  EXPECT_EQ(last["usage"]["completion_tokens"], 5);
  EXPECT_EQ(last["usage"]["prompt_tokens"], 3);
}

TEST(HttpServer, ReasoningContentSplitAlsoWhenStreaming) {
  ServerConfig sc;
  sc.reasoning_parser = ReasoningFormat::Glm45;
  Fixture f(sc);
  const std::string prompt = "<think>step by step</think>The answer.";
  const int n = static_cast<int>(prompt.size());
  auto r = post(f, "/v1/chat/completions", chat_body(prompt, {{"max_tokens", n}}));
  EXPECT_EQ(r.body["choices"][0]["message"]["reasoning_content"], "step by step");
  EXPECT_EQ(r.body["choices"][0]["message"]["content"], "The answer.");
  auto s = stream(f, "/v1/chat/completions", chat_body(prompt, {{"max_tokens", n}, {"stream", true}}));
  std::string reasoning, content;
  for (const auto& e : s.events) {
    const auto& d = e["choices"][0]["delta"];
    if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  EXPECT_EQ(reasoning, "step by step");
  EXPECT_EQ(content, "The answer.");
  // enable_thinking false: no split.
  r = post(f, "/v1/chat/completions",
           chat_body(prompt, {{"max_tokens", n}, {"chat_template_kwargs", {{"enable_thinking", false}}}}));
  EXPECT_EQ(r.body["choices"][0]["message"]["content"], prompt);
}

TEST(HttpServer, BadRequestsGetOpenAiErrorsNamingTheField) {
  ServerConfig sc;
  sc.max_body_bytes = 4096;
  EchoBackendConfig bc;
  bc.max_context = 64;
  Fixture f(sc, bc);
  auto expect_error = [&](const Reply& r, int status, const char* param) {
    EXPECT_EQ(r.status, status) << r.body;
    ASSERT_TRUE(r.body.contains("error")) << r.body;
    EXPECT_TRUE(r.body["error"]["message"].is_string());
    EXPECT_TRUE(r.body["error"]["type"].is_string());
    if (param) {
      EXPECT_EQ(r.body["error"]["param"], param) << r.body;
    } else {
      EXPECT_TRUE(r.body["error"]["param"].is_null()) << r.body;
    }
  };
  expect_error(post(f, "/v1/chat/completions", std::string("{\"model\": ")), 400, nullptr);
  expect_error(post(f, "/v1/chat/completions", chat_body("a", {{"model", "gpt-4"}})), 404, "model");
  expect_error(post(f, "/v1/chat/completions", chat_body("a", {{"messages", json::array()}})), 400,
               "messages");
  expect_error(post(f, "/v1/chat/completions", chat_body("a", {{"temperature", -1}})), 400, "temperature");
  expect_error(post(f, "/v1/chat/completions", chat_body("a", {{"n", 100}})), 400, "n");
  expect_error(post(f, "/v1/chat/completions", chat_body(std::string(70, 'a'))), 400, "messages");
  expect_error(post(f, "/v1/completions", json{{"model", "echo"}, {"prompt", "abc"}, {"max_tokens", 62}}),
               400, "max_tokens");
  expect_error(post(f, "/v1/completions", json{{"model", "echo"}, {"prompt", {1, 5000}}}), 400, "prompt");
  expect_error(post(f, "/v1/completions", chat_body(std::string(5000, 'a'))), 413, nullptr);
  expect_error(post(f, "/v1/nothing", json::object()), 404, nullptr);
  EXPECT_TRUE(settles(f));
  // max_tokens that exactly fills the context is fine.
  EXPECT_EQ(post(f, "/v1/completions", json{{"model", "echo"}, {"prompt", "abc"}, {"max_tokens", 61}}).status,
            200);
}

TEST(HttpServer, ApiKey) {
  ServerConfig sc;
  sc.api_key = "sekret";
  Fixture f(sc);
  auto body = json{{"model", "echo"}, {"prompt", "a"}, {"max_tokens", 1}}.dump();
  EXPECT_EQ(post(f, "/v1/completions", body).status, 401);
  EXPECT_EQ(post(f, "/v1/completions", body, {{"Authorization", "Bearer nope"}}).status, 401);
  EXPECT_EQ(post(f, "/v1/completions", body, {{"Authorization", "Bearer sekret"}}).status, 200);
  EXPECT_EQ(f.client().Get("/health")->status, 200);  // probes need no key
}

TEST(HttpServer, ClientThatDisconnectsMidStreamFreesItsPages) {
  EchoBackendConfig bc;
  bc.step_time = std::chrono::microseconds(2000);
  Fixture f({}, bc);
  auto s = stream(f, "/v1/completions",
                  json{{"model", "echo"},
                       {"prompt", std::string(100, 'q')},
                       {"max_tokens", 3000},
                       {"stream", true},
                       {"ignore_eos", true}},
                  3);
  EXPECT_EQ(s.events.size(), 3u);
  EXPECT_FALSE(s.done);
  EXPECT_TRUE(settles(f)) << "pages still held after the client left";
  EXPECT_GE(f.server->metrics().requests_cancelled.load(), 1);
}

TEST(HttpServer, ManyConcurrentStreamingClients) {
  EchoBackendConfig bc;
  bc.max_running_requests = 16;  // the rest queue
  bc.num_pages = 64;             // and the pool is tight: admission waits and preemption happen
  Fixture f({}, bc);
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < 64; ++i) {
    clients.emplace_back([&, i] {
      const std::string prompt = "client " + std::to_string(i) + " says hello";
      auto s = stream(f, "/v1/chat/completions", chat_body(prompt, {{"max_tokens", 40}, {"stream", true}}));
      std::string text;
      for (const auto& e : s.events)
        if (e["choices"][0]["delta"].contains("content"))
          text += e["choices"][0]["delta"]["content"].get<std::string>();
      std::string expect;
      for (size_t k = 0; k < 40; ++k) expect += prompt[k % prompt.size()];
      if (s.done && s.status == 200 && text == expect) {
        ++ok;
      } else {
        ADD_FAILURE() << "client " << i << ": done " << s.done << " status " << s.status << " text '" << text
                      << "'";
      }
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_EQ(ok.load(), 64);
  EXPECT_TRUE(settles(f));
}

TEST(HttpServer, DrainFinishesRunningRequestsAndRefusesNewOnes) {
  EchoBackendConfig bc;
  bc.step_time = std::chrono::microseconds(2000);
  Fixture f({}, bc);
  Reply running;
  std::thread t([&] {
    running = post(f, "/v1/completions", json{{"model", "echo"}, {"prompt", "abc"}, {"max_tokens", 100}});
  });
  while (f.loop.active() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::thread d([&] { f.server->drain(std::chrono::seconds(10)); });
  while (!f.server->draining()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto refused = post(f, "/v1/completions", json{{"model", "echo"}, {"prompt", "abc"}, {"max_tokens", 1}});
  EXPECT_EQ(refused.status, 503);
  t.join();
  d.join();
  EXPECT_EQ(running.status, 200);
  EXPECT_EQ(running.body["usage"]["completion_tokens"], 100);
  f.server->wait();
}

TEST(HttpServer, DrainTimeoutCancelsWhatIsLeft) {
  EchoBackendConfig bc;
  bc.step_time = std::chrono::microseconds(5000);
  Fixture f({}, bc);
  Stream s;
  std::thread t([&] {
    s = stream(f, "/v1/completions",
               json{{"model", "echo"}, {"prompt", "abc"}, {"max_tokens", 3000}, {"stream", true}});
  });
  while (f.loop.active() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  f.server->drain(std::chrono::milliseconds(100));
  t.join();
  ASSERT_FALSE(s.events.empty());
  EXPECT_EQ(s.events.back()["error"]["code"], "service_unavailable");  // told, not cut off silently
  EXPECT_EQ(f.loop.active(), 0u);
  EXPECT_TRUE(settles(f));
}

TEST(HttpServer, MetricsReportTraffic) {
  Fixture f;
  post(f, "/v1/completions", json{{"model", "echo"}, {"prompt", "hello"}, {"max_tokens", 3}});
  post(f, "/v1/completions", json{{"model", "nope"}, {"prompt", "hello"}});
  auto m = f.client().Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_NE(m->get_header_value("Content-Type").find("text/plain"), std::string::npos);
  EXPECT_NE(m->body.find("moeserve_requests_total{outcome=\"ok\"} 1\n"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("moeserve_generation_tokens_total 3\n"), std::string::npos);
  EXPECT_NE(m->body.find("moeserve_prompt_tokens_total 5\n"), std::string::npos);
  EXPECT_NE(m->body.find("moeserve_http_client_errors_total 1\n"), std::string::npos);
  EXPECT_NE(m->body.find("moeserve_time_to_first_token_seconds_count 1\n"), std::string::npos);
  EXPECT_NE(m->body.find("moeserve_inter_token_latency_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(m->body.find("moeserve_kv_pages_total 1024\n"), std::string::npos);
}

TEST(HttpServer, SeveralPromptsInOneCompletion) {
  Fixture f;
  auto r = post(f, "/v1/completions",
                json{{"model", "echo"}, {"prompt", {"ab", "cde"}}, {"max_tokens", 3}, {"n", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  ASSERT_EQ(r.body["choices"].size(), 4u);  // prompt-major: index = prompt * n + k, as OpenAI numbers them
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r.body["choices"][i]["index"], i);
    EXPECT_EQ(r.body["choices"][i]["text"], i < 2 ? "aba" : "cde");
  }
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], 5);  // each prompt once
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 12);
  r = post(f, "/v1/completions", json{{"model", "echo"}, {"prompt", {{104, 105}, {106}}}, {"max_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body["choices"][0]["text"], "hi");
  EXPECT_EQ(r.body["choices"][1]["text"], "jj");
  auto s = stream(f, "/v1/completions",
                  json{{"model", "echo"}, {"prompt", {"xy", "z"}}, {"max_tokens", 2}, {"stream", true}});
  std::map<int, std::string> text;
  for (const auto& e : s.events) text[e["choices"][0]["index"].get<int>()] += e["choices"][0]["text"];
  EXPECT_EQ(text[0], "xy");
  EXPECT_EQ(text[1], "zz");
  EXPECT_TRUE(s.done);
  EXPECT_TRUE(settles(f));
}

TEST(HttpServer, NonStreamingClientThatDisconnectsIsCancelledAndFreesItsPages) {
  EchoBackendConfig bc;
  bc.step_time = std::chrono::microseconds(2000);
  Fixture f({}, bc);
  {
    httplib::Client c("127.0.0.1", f.server->port());
    c.set_read_timeout(0, 300000);  // gives up (and closes) long before 3000 tokens at 2 ms a step
    auto r =
        c.Post("/v1/completions",
               json{{"model", "echo"}, {"prompt", "abc"}, {"max_tokens", 3000}, {"ignore_eos", true}}.dump(),
               "application/json");
    EXPECT_FALSE(r);
  }
  EXPECT_TRUE(settles(f)) << "the abandoned request still runs or holds pages";
  EXPECT_EQ(f.server->metrics().requests_cancelled.load(), 1);
  EXPECT_LT(f.loop.stats().generation_tokens_total, 1500);
}

TEST(HttpServer, LogitBiasUnimplementedFieldsAndDefaultMaxTokens) {
  ServerConfig sc;
  sc.default_max_tokens = 5;
  Fixture f(sc);
  auto r = post(f, "/v1/chat/completions", chat_body("abcdefghij", {{"ignore_eos", true}}));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 5);
  EXPECT_EQ(r.body["choices"][0]["finish_reason"], "length");
  r = post(f, "/v1/chat/completions", chat_body("a", {{"logit_bias", {{"300", 5}}}}));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["param"], "logit_bias");
  r = post(f, "/v1/chat/completions", chat_body("a", {{"logit_bias", {{"98", 5}}}, {"max_tokens", 2}}));
  EXPECT_EQ(r.status, 200) << r.body;
  r = post(f, "/v1/chat/completions", chat_body("a", {{"response_format", {{"type", "json_object"}}}}));
  EXPECT_EQ(r.status, 400);
  EXPECT_EQ(r.body["error"]["param"], "response_format");
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("response_format"), std::string::npos);
}

// A step that throws answers its requests with a 500 (streamed: an error event) and the server goes on.
TEST(HttpServer, FailedStepAnswers500AndLaterRequestsSucceed) {
  EchoBackendConfig bc;
  bc.fail_at_step = 2;
  Fixture f({}, bc);
  auto r = post(f, "/v1/completions", json{{"model", "echo"}, {"prompt", "abc"}, {"max_tokens", 5}});
  EXPECT_EQ(r.status, 500) << r.body;
  EXPECT_NE(r.body["error"]["message"].get<std::string>().find("injected step failure"), std::string::npos);
  r = post(f, "/v1/completions", json{{"model", "echo"}, {"prompt", "abc"}, {"max_tokens", 5}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body["choices"][0]["text"], "abcab");
  EXPECT_TRUE(settles(f));
}
