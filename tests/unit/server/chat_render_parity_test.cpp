// Chat requests with tools, through the server's path (request body -> parsed parameters -> backend render ->
// tokens), against prompts rendered by a reference renderer: tests/data/tokenizer/tool_chat_cases.json, made
// by tools/golden/tokenizer/make_tool_chat_fixtures.py. The committed file is rendered by jinja2 with the
// environment transformers uses (its "renderer" field says which); the same script run with
// --renderer transformers --check confirms transformers' apply_chat_template agrees.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

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
  ASSERT_GE(doc["cases"].size(), 5u);
  auto tok =
      ms::tokenizer::Tokenizer::from_file(std::string(MS_TEST_DATA) + "/tokenizer/glm_like/tokenizer.json");
  int glm = 0;
  for (const auto& c : doc["cases"]) {
    const std::string expected = c["expected"];
    const std::string got = render(c, c["body"].get<std::string>());
    EXPECT_EQ(got, expected) << c["template"] << " " << c["body"] << " (reference: " << doc["renderer"]
                             << ")";
    if (c["template"] == "glm-4.6.jinja") {
      ++glm;
      EXPECT_EQ(tok->encode(got, false), tok->encode(expected, false)) << c["body"];
    }
  }
  EXPECT_GE(glm, 4);
}

// The same requests with their keys sorted (what a std::map-backed JSON would make of them) render
// differently: the comparison above can fail.
TEST(ChatRenderParity, SortedKeysWouldNotMatch) {
  const ordered_json doc = load_cases();
  const auto& c = doc["cases"][0];
  const std::string sorted = nlohmann::json::parse(c["body"].get<std::string>()).dump();
  EXPECT_NE(render(c, sorted), c["expected"].get<std::string>());
}
