// Post-processors for single sequences: TemplateProcessing (BOS/prefix tokens such as GLM's
// [gMASK]<sop>), ByteLevel (offsets only, so ids are unchanged), Roberta/Bert (cls ... sep), Sequence.
#include "core/error.h"
#include "tokenizer/components.h"

namespace ms::tokenizer {

namespace {

class Template : public PostProcessor {
 public:
  Template(const nlohmann::json& j, const std::string& where) {
    const auto& specials = j.contains("special_tokens") ? j.at("special_tokens") : nlohmann::json::object();
    const auto& single = j.at("single");
    for (size_t i = 0; i < single.size(); ++i) {
      const auto& item = single[i];
      if (item.contains("Sequence")) {
        items_.push_back({true, {}});
        continue;
      }
      MS_CHECK(item.contains("SpecialToken"), "{}.single[{}]: expected Sequence or SpecialToken", where, i);
      std::string name = item.at("SpecialToken").at("id").get<std::string>();
      MS_CHECK(specials.contains(name), "{}.single[{}]: special token \"{}\" missing from special_tokens",
               where, i, name);
      items_.push_back({false, specials.at(name).at("ids").get<std::vector<int32_t>>()});
    }
  }
  void process(std::vector<int32_t>& ids) const override {
    std::vector<int32_t> out;
    out.reserve(ids.size() + 4);
    for (const auto& it : items_) {
      if (it.sequence)
        out.insert(out.end(), ids.begin(), ids.end());
      else
        out.insert(out.end(), it.ids.begin(), it.ids.end());
    }
    ids.swap(out);
  }

 private:
  struct Item {
    bool sequence;
    std::vector<int32_t> ids;
  };
  std::vector<Item> items_;
};

class Passthrough : public PostProcessor {
 public:
  void process(std::vector<int32_t>&) const override {}
};

class ClsSep : public PostProcessor {
 public:
  ClsSep(int32_t cls, int32_t sep) : cls_(cls), sep_(sep) {}
  void process(std::vector<int32_t>& ids) const override {
    ids.insert(ids.begin(), cls_);
    ids.push_back(sep_);
  }

 private:
  int32_t cls_, sep_;
};

class Sequence : public PostProcessor {
 public:
  explicit Sequence(std::vector<std::unique_ptr<PostProcessor>> parts) : parts_(std::move(parts)) {}
  void process(std::vector<int32_t>& ids) const override {
    for (const auto& p : parts_) p->process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

}  // namespace

std::unique_ptr<PostProcessor> make_post_processor(const nlohmann::json& j, const std::string& where,
                                                   const TokenIdFn& token_id) {
  if (j.is_null()) return nullptr;
  MS_CHECK(j.is_object() && j.contains("type"), "{}: expected an object with a \"type\"", where);
  const std::string type = j.at("type").get<std::string>();
  try {
    if (type == "TemplateProcessing") return std::make_unique<Template>(j, where);
    if (type == "ByteLevel") return std::make_unique<Passthrough>();
    if (type == "RobertaProcessing" || type == "BertProcessing") {
      // "cls": [token, id], "sep": [token, id]
      return std::make_unique<ClsSep>(j.at("cls").at(1).get<int32_t>(), j.at("sep").at(1).get<int32_t>());
    }
    if (type == "Sequence")
      return std::make_unique<Sequence>(make_sequence_stages<PostProcessor>(
          j, "processors", where, [&](const nlohmann::json& e, const std::string& w) {
            return make_post_processor(e, w, token_id);
          }));
  } catch (const nlohmann::json::exception& e) {
    MS_THROW("{} ({}): {}", where, type, e.what());
  }
  MS_THROW("{}: unsupported post_processor type \"{}\"", where, type);
}

}  // namespace ms::tokenizer
