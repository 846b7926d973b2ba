// The local group (ranks as threads) against the communicator conformance suite, and its failure modes.
#include "dist/local_group.h"

#include <gtest/gtest.h>

#include "unit/dist/communicator_conformance.h"

namespace ms::dist {
namespace {

test::CommHarness local_harness() {
  test::CommHarness h;
  h.make = [](int n, std::chrono::milliseconds timeout) {
    std::vector<std::unique_ptr<Communicator>> out;
    for (auto& c : LocalGroup::create(n, timeout)) out.push_back(std::move(c));
    return out;
  };
  return h;
}

TEST(LocalGroup, Conformance) {
  for (int n : {1, 2, 3, 4}) {
    SCOPED_TRACE(n);
    test::check_communicator_conformance(local_harness(), n);
  }
}

TEST(LocalGroup, ARankThatThrowsIsNamedAndNobodyHangs) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(n);
    test::check_communicator_failure(local_harness(), n);
  }
}

TEST(LocalGroup, AbortWakesTheOthersAtOnceAndTheGroupStaysFailed) {
  auto comms = LocalGroup::create(3, std::chrono::milliseconds(60000));
  std::vector<std::unique_ptr<Communicator>> cs;
  LocalComm* two = comms[2].get();
  for (auto& c : comms) cs.push_back(std::move(c));
  const auto t0 = std::chrono::steady_clock::now();
  auto errs = test::conformance::run_ranks(cs, [&](int rank, Communicator& c) {
    if (rank == 2) {
      two->abort("out of memory in layer 3");
      return;
    }
    float x = 1;
    c.all_reduce_sum(&x, 1, DType::F32, nullptr);
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 5.0);
  for (int r : {0, 1})
    EXPECT_NE(errs[static_cast<size_t>(r)].find("rank 2 failed: out of memory in layer 3"), std::string::npos)
        << errs[static_cast<size_t>(r)];
  EXPECT_THROW(cs[0]->barrier(), Error);
}

TEST(LocalGroup, MismatchedCallsAreNamed) {
  auto comms = LocalGroup::create(2, std::chrono::milliseconds(5000));
  std::vector<std::unique_ptr<Communicator>> cs;
  for (auto& c : comms) cs.push_back(std::move(c));
  auto errs = test::conformance::run_ranks(cs, [&](int rank, Communicator& c) {
    float x[4] = {1, 2, 3, 4};
    c.all_reduce_sum(x, rank == 0 ? 4 : 3, DType::F32, nullptr);
  });
  for (const auto& e : errs) EXPECT_NE(e.find("all_reduce_sum(count 3"), std::string::npos) << e;
}

TEST(LocalGroup, RejectsWhatItCannotSum) {
  auto comms = LocalGroup::create(1);
  int32_t x = 1;
  EXPECT_THROW(comms[0]->all_reduce_sum(&x, 1, DType::I32, nullptr), Error);
  uint16_t y = 0;
  EXPECT_THROW(comms[0]->all_reduce_max(&y, 1, DType::BF16, nullptr), Error);
  EXPECT_THROW(LocalGroup::create(0), Error);
}

}  // namespace
}  // namespace ms::dist
