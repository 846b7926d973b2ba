// Profiling live traffic: POST /start_profile arms the backend's ProfileController (the profile begins at the
// engine's next step), POST /stop_profile ends it and answers the op table, the JSON summary and the path of
// the trace written.
#include <httplib.h>

#include <fmt/format.h>

#include "core/error.h"
#include "profiler/profile_controller.h"
#include "server/http_server.h"

namespace ms::server {

namespace {

using nlohmann::json;

// An optional non-negative integer field of the body.
int int_field(const json& body, const char* name, int fallback) {
  if (!body.contains(name) || body[name].is_null()) return fallback;
  const json& v = body[name];
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1000000)
    throw ApiError(400, fmt::format("{}: expected an integer in [0, 1000000]", name), name);
  return v.get<int>();
}

json body_of(const httplib::Request& req) {
  if (req.body.empty()) return json::object();
  json body = parse_json_body(req.body);
  if (!body.is_object()) throw ApiError(400, "expected a JSON object as the request body");
  return body;
}

profiler::ProfileController& controller_of(Backend& b) {
  profiler::ProfileController* c = b.profile_controller();
  if (!c)
    throw ApiError(400, "this server's backend has no profiler (it runs no model)", "", "not_supported");
  return *c;
}

}  // namespace

void HttpServer::profile_routes() {
  auto reply = [this](httplib::Response& res, int status, const json& j) {
    if (status >= 400 && status < 500) metrics_.http_client_errors++;
    res.status = status;
    res.set_content(dump_json(j), "application/json");
  };

  http_->Post("/start_profile", [this, reply](const httplib::Request& req, httplib::Response& res) {
    try {
      profiler::ProfileController& ctl = controller_of(loop_.backend());
      const json body = body_of(req);
      profiler::ProfileRequest pr;
      pr.steps = int_field(body, "num_steps", 0);
      pr.warmup_steps = int_field(body, "warmup_steps", 0);
      if (body.contains("output_path") && !body["output_path"].is_null()) {
        if (!body["output_path"].is_string() || body["output_path"].get<std::string>().empty())
          throw ApiError(400, "output_path: expected a non-empty file path", "output_path");
        pr.trace_path = body["output_path"].get<std::string>();
      }
      if (body.contains("group_by") && !body["group_by"].is_null()) {
        const json& g = body["group_by"];
        if (g != "kind" && g != "name")
          throw ApiError(400,
                         "group_by: expected \"kind\" (op kinds over all layers) or \"name\" (per layer)",
                         "group_by");
        pr.group = g == "name" ? profiler::GroupBy::Name : profiler::GroupBy::Kind;
      }
      if (ctl.started())
        throw ApiError(409, "a profile is already running: POST /stop_profile first", "", "conflict");
      try {
        ctl.start(pr);
      } catch (const ms::Error& e) {
        throw ApiError(ctl.started() ? 409 : 400, e.message(), "", "profile_error");
      }
      reply(res, 200,
            {{"status", "started"},
             {"num_steps", pr.steps},
             {"warmup_steps", pr.warmup_steps},
             {"output_path", pr.trace_path.empty() ? json() : json(pr.trace_path)}});
    } catch (const ApiError& e) {
      reply(res, e.status, e.to_json());
    }
  });

  http_->Post("/stop_profile", [this, reply](const httplib::Request& req, httplib::Response& res) {
    try {
      profiler::ProfileController& ctl = controller_of(loop_.backend());
      const json body = body_of(req);
      // Seconds to wait for the steps asked for at start (they come only with traffic).
      const int wait_s = int_field(body, "timeout_s", 0);
      if (!ctl.started())
        throw ApiError(400, "no profile is running: POST /start_profile first", "", "profile_error");
      if (wait_s > 0) ctl.wait_done(std::chrono::seconds(wait_s));
      profiler::ProfileResult r;
      try {
        r = ctl.stop();
      } catch (const ms::Error& e) {
        throw ApiError(400, e.message(), "", "profile_error");
      }
      json out = {{"steps", r.summary.steps},
                  {"table", r.table},
                  {"summary", r.summary_json},
                  {"trace_path", r.trace_path.empty() ? json() : json(r.trace_path)}};
      if (!r.step_error.empty()) out["step_error"] = r.step_error;
      reply(res, 200, out);
    } catch (const ApiError& e) {
      reply(res, e.status, e.to_json());
    }
  });
}

}  // namespace ms::server
