// Errors are values at the boundary: MS_CHECK throws ms::Error carrying the file and line of the check.
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace ms {

class Error : public std::runtime_error {
 public:
  Error(std::string message, const char* file, int line)
      : std::runtime_error(fmt::format("{} ({}:{})", message, short_file(file), line)),
        message_(std::move(message)) {}
  // The message without the source location, for users of the server and the CLI.
  const std::string& message() const { return message_; }

 private:
  static const char* short_file(const char* file) {
    std::string_view f(file);
    auto pos = f.rfind("src/");
    return pos == std::string_view::npos ? file : file + pos;
  }
  std::string message_;
};

}  // namespace ms

#define MS_THROW(...) throw ::ms::Error(::fmt::format(__VA_ARGS__), __FILE__, __LINE__)
// MS_CHECK(cond, "format {}", args...): throws ms::Error with file and line when cond is false.
#define MS_CHECK(cond, ...)                              \
  do {                                                   \
    if (!(cond)) [[unlikely]] {                          \
      MS_THROW("check failed: " #cond ": " __VA_ARGS__); \
    }                                                    \
  } while (0)
