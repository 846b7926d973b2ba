#include "profiler/profiler.h"

#include <gtest/gtest.h>

#include <memory>

#include "core/error.h"
#include "fake_timer.h"

namespace ms::profiler {
namespace {

using testing::FakeTimer;

struct Fixture {
  explicit Fixture(ProfilerOptions opt = {}) {
    auto t = std::make_unique<FakeTimer>();
    timer = t.get();
    prof = std::make_unique<Profiler>(opt, std::move(t));
  }
  // One op that takes `us` of fake time.
  void op(std::string_view name, double us, OpCost cost = {}, std::string shapes = "x f32[4]") {
    OpScope s(prof.get(), OpInfo{name, {}, std::move(shapes), cost});
    timer->advance(us);
  }
  FakeTimer* timer = nullptr;
  std::unique_ptr<Profiler> prof;
};

TEST(OpKind, StripsLayerPrefixOnly) {
  EXPECT_EQ(op_kind_of("layer.12.attn.mla_decode"), "attn.mla_decode");
  EXPECT_EQ(op_kind_of("layer.0.moe.experts_gate_up"), "moe.experts_gate_up");
  EXPECT_EQ(op_kind_of("lm_head"), "lm_head");
  EXPECT_EQ(op_kind_of("layer.x.attn"), "layer.x.attn");
  EXPECT_EQ(op_kind_of("layer.12"), "layer.12");
  EXPECT_EQ(op_kind_of("layer.12."), "layer.12.");
  static_assert(op_kind_of("layer.3.norm") == "norm");
}

TEST(OpScope, NullSinkNeverBuildsTheInfo) {
  int built = 0;
  {
    OpScope s(nullptr, [&] {
      ++built;
      return OpInfo{"a", {}, "shapes", {}};
    });
  }
  EXPECT_EQ(built, 0);
  Fixture f;
  f.prof->begin_step();
  {
    OpScope s(f.prof.get(), [&] {
      ++built;
      return OpInfo{"a", {}, "shapes", {}};
    });
  }
  f.prof->end_step();
  EXPECT_EQ(built, 1);
  ASSERT_EQ(f.prof->ops().size(), 1u);
  EXPECT_EQ(f.prof->ops()[0].shapes, "shapes");
}

TEST(Profiler, RecordsOpsAndStepsWithTimerTimes) {
  Fixture f;
  f.prof->begin_step("decode bs=1");
  f.timer->advance(1);
  f.op("layer.0.attn", 10, {100, 0, 50});
  f.timer->advance(2);
  f.op("layer.1.attn", 20);
  f.prof->end_step();

  ASSERT_EQ(f.prof->steps_recorded(), 1);
  const StepRecord& st = f.prof->steps()[0];
  EXPECT_EQ(st.label, "decode bs=1");
  EXPECT_DOUBLE_EQ(st.dur_us(), 33);
  ASSERT_EQ(st.num_ops, 2);
  const auto& ops = f.prof->ops();
  EXPECT_DOUBLE_EQ(ops[0].begin_us, 1);
  EXPECT_DOUBLE_EQ(ops[0].dur_us(), 10);
  EXPECT_DOUBLE_EQ(ops[1].begin_us, 13);
  EXPECT_DOUBLE_EQ(ops[1].dur_us(), 20);
  EXPECT_DOUBLE_EQ(ops[0].cost.bytes_floor, 100);
  EXPECT_DOUBLE_EQ(ops[0].cost.moved(), 100);  // unset bytes_moved means the floor
  const auto& ids = f.prof->identities();
  ASSERT_EQ(ids.size(), 2u);
  EXPECT_EQ(ids[0].name, "layer.0.attn");
  EXPECT_EQ(ids[0].kind, "attn");
  EXPECT_EQ(ids[1].kind, "attn");
  EXPECT_EQ(f.timer->resolves, 1);  // times resolved once, after the step
}

TEST(Profiler, ExplicitKindWins) {
  Fixture f;
  f.prof->begin_step();
  { OpScope s(f.prof.get(), OpInfo{"layer.4.mlp.down", "dense_down", "", {}}); }
  f.prof->end_step();
  EXPECT_EQ(f.prof->identities()[0].kind, "dense_down");
}

TEST(Profiler, WarmupAndMaxStepsAreNotRecorded) {
  Fixture f({.warmup_steps = 2, .max_steps = 3});
  for (int i = 0; i < 7; ++i) {
    f.prof->begin_step();
    EXPECT_EQ(f.prof->recording(), i >= 2 && i < 5) << "step " << i;
    f.op("a", 1.0 + i);
    f.prof->end_step();
  }
  EXPECT_EQ(f.prof->steps_seen(), 7);
  EXPECT_EQ(f.prof->steps_recorded(), 3);
  EXPECT_TRUE(f.prof->done());
  EXPECT_EQ(f.timer->steps_begun, 3);  // the timer is not even touched in other steps
  ASSERT_EQ(f.prof->ops().size(), 3u);
  EXPECT_DOUBLE_EQ(f.prof->ops()[0].dur_us(), 3);  // step 2 is the first recorded
  EXPECT_DOUBLE_EQ(f.prof->ops()[2].dur_us(), 5);
}

TEST(Profiler, NestedOpsAreRefused) {
  Fixture f;
  f.prof->begin_step();
  OpScope outer(f.prof.get(), OpInfo{"layer.0.moe", {}, "", {}});
  try {
    OpScope inner(f.prof.get(), OpInfo{"layer.0.moe.experts", {}, "", {}});
    FAIL() << "nested op accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'layer.0.moe.experts' began inside op 'layer.0.moe'"),
              std::string::npos)
        << e.what();
  }
}

TEST(Profiler, UnbalancedUseIsAnErrorNotACrash) {
  Fixture f;
  EXPECT_THROW(f.op("outside", 1), Error);  // no step
  EXPECT_THROW(f.prof->end_step(), Error);

  f.prof->begin_step();
  EXPECT_THROW(f.prof->begin_step(), Error);
  f.prof->op_end();  // stray end: reported at end_step
  EXPECT_THROW(f.prof->end_step(), Error);
  EXPECT_EQ(f.prof->steps_recorded(), 0);

  f.prof->begin_step();
  f.prof->op_begin(OpInfo{"open", {}, "", {}});
  try {
    f.prof->end_step();
    FAIL() << "open op accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'open'"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(f.prof->in_step());

  // After errors the profiler records normally again.
  f.prof->begin_step();
  f.op("fine", 4);
  f.prof->end_step();
  EXPECT_EQ(f.prof->steps_recorded(), 1);
  EXPECT_EQ(f.prof->ops().size(), 1u);
}

TEST(Profiler, ExceptionInsideAnOpLeavesAnAbortableStep) {
  Fixture f;
  f.prof->begin_step();
  try {
    OpScope s(f.prof.get(), OpInfo{"layer.0.boom", {}, "", {}});
    throw std::runtime_error("kernel failed");
  } catch (const std::runtime_error&) {
  }
  f.prof->abort_step();
  EXPECT_EQ(f.prof->steps_recorded(), 0);
  f.prof->begin_step();
  f.prof->end_step();
  EXPECT_EQ(f.prof->steps_recorded(), 1);
}

TEST(Profiler, SteadyClockTimesRealWork) {
  Profiler p;  // default: steady clock
  EXPECT_EQ(p.timer_name(), "steady_clock");
  p.begin_step();
  volatile double x = 0;
  {
    OpScope s(&p, OpInfo{"spin", {}, "", {}});
    for (int i = 0; i < 200000; ++i) x = x + 1e-3 * i;
  }
  p.end_step();
  ASSERT_EQ(p.ops().size(), 1u);
  EXPECT_GT(p.ops()[0].dur_us(), 0);
  EXPECT_GE(p.steps()[0].dur_us(), p.ops()[0].dur_us());
  EXPECT_GE(p.ops()[0].begin_us, p.steps()[0].begin_us);
}

}  // namespace
}  // namespace ms::profiler
