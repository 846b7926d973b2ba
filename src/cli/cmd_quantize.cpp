// `moeserve quantize`: a ModelOpt NVFP4 or DeepSeek FP8-block checkpoint from a BF16 one
// (io/quantize_checkpoint.h).
#include <cstdio>

#include "cli/command.h"
#include "core/error.h"
#include "io/quantize_checkpoint.h"

namespace ms::cli {

namespace {

struct QuantizeCliOptions {
  std::string model_dir, out_dir, to;
  std::vector<std::string> exclude;
  bool no_exclude_defaults = false;
};

int run_quantize(const QuantizeCliOptions& o) {
  io::QuantizeOptions q;
  if (o.to == "nvfp4")
    q.to = io::WeightFormat::NVFP4;
  else if (o.to == "fp8")
    q.to = io::WeightFormat::FP8Block;
  else
    MS_THROW("--to {}: supported: nvfp4, fp8", o.to);
  if (!o.no_exclude_defaults) q.exclude = io::default_quantize_excludes();
  for (const auto& e : o.exclude) q.exclude.push_back(e);
  MS_CHECK(!q.exclude.empty() || o.no_exclude_defaults, "quantize: internal: no exclusions");
  if (q.exclude.empty()) q.exclude.push_back("lm_head");  // the loaders keep lm_head in BF16 regardless
  const io::QuantizeReport r = io::quantize_checkpoint(o.model_dir, o.out_dir, q);
  std::fprintf(stderr, "quantized %lld tensors to %s, copied %lld; %.2f MB -> %.2f MB; wrote %s\n",
               static_cast<long long>(r.tensors_quantized), o.to.c_str(),
               static_cast<long long>(r.tensors_copied), static_cast<double>(r.bytes_in) / 1e6,
               static_cast<double>(r.bytes_out) / 1e6, o.out_dir.c_str());
  for (const auto& s : r.skipped)
    std::fprintf(stderr, "kept %s unquantized: its input size is not a multiple of 16\n", s.c_str());
  return 0;
}

Registration reg("quantize", "Write an NVFP4 (ModelOpt) or FP8-block (DeepSeek) checkpoint from a BF16 one",
                 [](CLI::App& app) {
                   auto o = std::make_shared<QuantizeCliOptions>();
                   app.add_option("--model", o->model_dir, "BF16 checkpoint directory")->required();
                   app.add_option("--out", o->out_dir, "Output directory")->required();
                   app.add_option("--to", o->to, "nvfp4 or fp8")->required();
                   app.add_option(
                       "--exclude", o->exclude,
                       "More module wildcards to keep in BF16 (repeatable), added to the defaults: "
                       "lm_head, model.embed_tokens, *self_attn*, *.mlp.gate, *.shared_head.head, "
                       "*.eh_proj");
                   app.add_flag("--no-default-excludes", o->no_exclude_defaults,
                                "Only the --exclude patterns (lm_head stays BF16 in any case)");
                   return [o] { return run_quantize(*o); };
                 });

}  // namespace

}  // namespace ms::cli
