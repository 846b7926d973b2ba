// An error answered to the client as OpenAI does: status code and {"error": {message, type, param, code}}.
#pragma once

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

namespace ms::server {

struct ApiError : std::runtime_error {
  ApiError(int status, std::string message, std::string param = "", std::string code = "invalid_value",
           std::string type = "")
      : std::runtime_error(message),
        status(status),
        param(std::move(param)),
        code(std::move(code)),
        type(type.empty() ? (status >= 500 ? "server_error" : "invalid_request_error") : std::move(type)) {}
  int status;
  std::string param, code, type;

  nlohmann::json to_json() const {
    return {{"error",
             {{"message", what()},
              {"type", type},
              {"param", param.empty() ? nlohmann::json() : nlohmann::json(param)},
              {"code", code}}}};
  }
};

}  // namespace ms::server
