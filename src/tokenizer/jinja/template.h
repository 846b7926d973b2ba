// A Jinja-subset template, parsed once and rendered many times. It covers what the published GLM and
// DeepSeek chat templates use, with Hugging Face's environment settings (trim_blocks, lstrip_blocks,
// loop controls, raise_exception, tojson). Syntax outside the subset is refused at parse time, naming it.
#pragma once

#include <memory>
#include <string>

#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace ms::tokenizer::jinja {

class Template {
 public:
  // `where` names the template's source in error messages.
  Template(const std::string& source, const std::string& where);
  // context: a Dict of top-level variables.
  std::string render(const Value& context) const;

 private:
  Body root_;
  std::string where_;
};

}  // namespace ms::tokenizer::jinja
