// The process-wide PDL switch (kernels/cuda/common/pdl_switch.h): MOESERVE_DISABLE_PDL and the engine's
// --disable-pdl, without the CUDA toolkit.
#include <gtest/gtest.h>

#include <cstdlib>
#include <optional>
#include <string>

#include "kernels/cuda/common/pdl_switch.h"

namespace {

using namespace ms::cuda;

// Sets MOESERVE_DISABLE_PDL (or unsets it) for one test and restores it and the switch afterwards.
class EnvGuard {
 public:
  explicit EnvGuard(const char* value) {
    if (const char* v = std::getenv("MOESERVE_DISABLE_PDL")) saved_ = v;
    if (value)
      setenv("MOESERVE_DISABLE_PDL", value, 1);
    else
      unsetenv("MOESERVE_DISABLE_PDL");
    reset_pdl_env_for_test();
  }
  ~EnvGuard() {
    if (saved_)
      setenv("MOESERVE_DISABLE_PDL", saved_->c_str(), 1);
    else
      unsetenv("MOESERVE_DISABLE_PDL");
    reset_pdl_env_for_test();
    set_pdl_enabled(true);
  }

 private:
  std::optional<std::string> saved_;
};

TEST(PdlSwitch, EnvValues) {
  EXPECT_FALSE(pdl_disabled_by_env_value(nullptr));
  for (const char* v : {"", "0", "false", "off", "no", "FALSE", "OFF", "NO"})
    EXPECT_FALSE(pdl_disabled_by_env_value(v)) << v;
  for (const char* v : {"1", "true", "yes", "on", "2"}) EXPECT_TRUE(pdl_disabled_by_env_value(v)) << v;
}

TEST(PdlSwitch, OnByDefault) {
  EnvGuard env(nullptr);
  set_pdl_enabled(true);
  EXPECT_TRUE(pdl_enabled());
}

TEST(PdlSwitch, EngineFlagTurnsItOffAndOn) {
  EnvGuard env(nullptr);
  set_pdl_enabled(false);
  EXPECT_FALSE(pdl_enabled());
  set_pdl_enabled(true);
  EXPECT_TRUE(pdl_enabled());
}

TEST(PdlSwitch, EnvironmentWinsOverTheEngine) {
  EnvGuard env("1");
  set_pdl_enabled(true);
  EXPECT_FALSE(pdl_enabled());
  set_pdl_enabled(false);
  EXPECT_FALSE(pdl_enabled());
}

TEST(PdlSwitch, EnvironmentZeroKeepsItOn) {
  EnvGuard env("0");
  set_pdl_enabled(true);
  EXPECT_TRUE(pdl_enabled());
}

TEST(PdlSwitch, EnvironmentReadOnce) {
  EnvGuard env(nullptr);
  EXPECT_TRUE(pdl_enabled());
  setenv("MOESERVE_DISABLE_PDL", "1", 1);  // too late: launches already decided
  EXPECT_TRUE(pdl_enabled());
  reset_pdl_env_for_test();
  EXPECT_FALSE(pdl_enabled());
}

TEST(PdlSwitch, SupportedFromSm90) {
  EXPECT_FALSE(pdl_supported_arch(80));
  EXPECT_FALSE(pdl_supported_arch(89));
  EXPECT_TRUE(pdl_supported_arch(90));
  EXPECT_TRUE(pdl_supported_arch(100));
  EXPECT_TRUE(pdl_supported_arch(120));
}

}  // namespace
