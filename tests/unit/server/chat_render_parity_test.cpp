// Chat requests with tools, through the server's path (request body -> parsed parameters -> backend render ->
// tokens), against transformers: tests/data/tokenizer/tool_chat_cases.json, made by
// tools/golden/tokenizer/make_tool_chat_fixtures.py --renderer transformers (its "renderer" field names the
// version, 5.24.0 when committed) with apply_chat_template, whose token ids of the GLM cases it also records
// (tokenizer tests/data/tokenizer/glm_like). A chat transformers refuses to render ("error") is refused here
// too. The script's --renderer jinja2 --check reproduces the texts without transformers.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "server/echo_backend.h"
#include "server/openai_protocol.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace {

using nlohmann::ordered_json;

ordered_json load_cases() {
  std::ifstream f(std::string(MS_TEST_DATA) + "/tokenizer/tool_chat_cases.json");
  EXPECT_TRUE(f.good());
  std::stringstream ss;
  ss << f.rdbuf();
  return ordered_json::parse(ss.str());
}

std::string render(const ordered_json& c, const std::string& body) {
  ms::server::EchoBackendConfig bc;
  bc.chat_template = ms::tokenizer::ChatTemplate::from_file(
      std::string(MS_TEST_DATA) + "/tokenizer/templates/" + c["template"].get<std::string>(),
      c["bos_token"].get<std::string>(), c["eos_token"].get<std::string>());
  ms::server::EchoBackend backend(bc);
  auto p = ms::server::parse_completion_request(ms::server::parse_json_body(body), true, {});
  return backend.render_chat(p.messages, p.tools, p.template_kwargs);
}

}  // namespace

TEST(ChatRenderParity, ToolsRenderAsTheReferenceTokenForToken) {
  const ordered_json doc = load_cases();
  ASSERT_GE(doc["cases"].size(), 6u);
  ASSERT_EQ(doc["renderer"].get<std::string>().rfind("transformers ", 0), 0u) << doc["renderer"];
  auto tok =
      ms::tokenizer::Tokenizer::from_file(std::string(MS_TEST_DATA) + "/tokenizer/glm_like/tokenizer.json");
  int glm = 0, refused = 0;
  for (const auto& c : doc["cases"]) {
    if (c.contains("error")) {
      ++refused;
      EXPECT_THROW(render(c, c["body"].get<std::string>()), ms::Error)
          << c["body"] << " (the reference refuses it: " << c["error"] << ")";
      continue;
    }
    const std::string expected = c["expected"];
    const std::string got = render(c, c["body"].get<std::string>());
    EXPECT_EQ(got, expected) << c["template"] << " " << c["body"] << " (reference: " << doc["renderer"]
                             << ")";
    if (c.contains("ids")) {
      ++glm;
      EXPECT_EQ(tok->encode(got, false), c["ids"].get<std::vector<int32_t>>()) << c["body"];
    }
  }
  EXPECT_GE(glm, 5);
  EXPECT_GE(refused, 1);
}

// The same requests with their keys sorted (what a std::map-backed JSON would make of them) render
// differently: the comparison above can fail.
TEST(ChatRenderParity, SortedKeysWouldNotMatch) {
  const ordered_json doc = load_cases();
  const auto& c = doc["cases"][0];
  const std::string sorted = nlohmann::json::parse(c["body"].get<std::string>()).dump();
  EXPECT_NE(render(c, sorted), c["expected"].get<std::string>());
}
