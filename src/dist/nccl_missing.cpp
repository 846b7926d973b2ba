// Stands in for nccl_comm.cpp in a build without NCCL: parallel runs fail with a message saying so.
#if !MOESERVE_HAVE_NCCL
#include "core/error.h"
#include "dist/nccl_comm.h"

namespace ms::dist {
namespace {
[[noreturn]] void missing(const char* what) {
  MS_THROW(
      "{}: NCCL is missing: this moeserve was built without CUDA or without NCCL (nccl.h and libnccl were "
      "not found at configure time; point NCCL_ROOT at them and rebuild): --tp-size/--ep-size above 1 need "
      "it",
      what);
}
}  // namespace

bool nccl_available() {
  return false;
}
std::string nccl_version() {
  return "missing";
}
std::vector<uint8_t> nccl_unique_id() {
  missing("nccl_unique_id");
}
std::unique_ptr<Communicator> connect_nccl(const RankInfo& info, NcclOptions) {
  missing(info.describe().c_str());
}

}  // namespace ms::dist
#endif  // !MOESERVE_HAVE_NCCL
