// Parsed form of a template: expression and statement trees.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace ms::tokenizer::jinja {

struct Expr;
using ExprP = std::shared_ptr<Expr>;

struct Expr {
  enum class Type {
    Literal,
    Name,
    Attr,
    Item,
    Slice,
    Call,
    Filter,
    Test,
    Unary,
    Binary,
    Cond,
    ListLit,
    DictLit
  };
  Type type;
  Value lit;                // Literal
  std::string name;         // Name, Attr (attribute), Filter/Test (name), Unary/Binary (operator)
  bool negate = false;      // Test: "is not"
  std::vector<ExprP> kids;  // operands / call target + positional args / list items / dict k,v pairs
  std::vector<std::pair<std::string, ExprP>> kwargs;
};

struct Node;
using NodeP = std::shared_ptr<Node>;
using Body = std::vector<NodeP>;

struct Node {
  enum class Type { Text, Output, If, For, Set, SetBlock, Macro, Break, Continue, Block };
  Type type;
  std::string text;                              // Text; Set/SetBlock/Macro: target name
  std::string attr;                              // Set on a namespace attribute: ns.attr
  std::vector<std::string> targets;              // For / Set unpacking targets; Macro parameter names
  std::vector<ExprP> defaults;                   // Macro parameter defaults (nullptr when none)
  ExprP expr;                                    // Output, Set value, For iterable
  ExprP cond;                                    // For filter ("for x in xs if cond")
  std::vector<std::pair<ExprP, Body>> branches;  // If / elif
  Body body, else_body;
};

}  // namespace ms::tokenizer::jinja
