#include "dist/local_group.h"

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "core/error.h"
#include "dist/bf16.h"

namespace ms::dist {

struct LocalGroupState {
  struct Slot {
    int op = -1;
    const void* in = nullptr;
    int64_t count = 0;
    DType dtype = DType::F32;
    int root = 0;
  };
  int n = 0;
  std::chrono::milliseconds timeout{0};
  std::mutex mu;
  std::condition_variable cv;
  uint64_t generation = 0;
  int arrived = 0;
  std::vector<bool> here;  // [n] arrived at the current meeting
  std::vector<Slot> slots;
  bool failed = false;
  std::string reason;

  // One meeting of the barrier; throws when the group failed or the others do not come in time.
  void meet(int rank, const char* what) {
    std::unique_lock lk(mu);
    if (failed) MS_THROW("local group: {}", reason);
    const uint64_t gen = generation;
    here[static_cast<size_t>(rank)] = true;
    if (++arrived == n) {
      arrived = 0;
      std::fill(here.begin(), here.end(), false);
      ++generation;
      cv.notify_all();
      return;
    }
    const bool met = cv.wait_for(lk, timeout, [&] { return generation != gen || failed; });
    if (generation != gen) return;  // everyone came (a failure after that shows at the next call)
    if (!met && !failed) {
      std::string missing;
      for (int r = 0; r < n; ++r)
        if (!here[static_cast<size_t>(r)]) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", r);
      failed = true;
      reason = fmt::format("rank {} did not reach {} within {} ms (rank {} waited)", missing, what,
                           timeout.count(), rank);
      cv.notify_all();
    }
    MS_THROW("local group: {}", reason);
  }
};

LocalComm::LocalComm(std::shared_ptr<LocalGroupState> group, int rank) : g_(std::move(group)), rank_(rank) {}

int LocalComm::size() const {
  return g_->n;
}

std::string LocalComm::describe() const {
  return fmt::format("local group of {} threads", g_->n);
}

const char* LocalComm::op_name(Op op) {
  switch (op) {
    case Op::AllReduceSum:
      return "all_reduce_sum";
    case Op::AllGather:
      return "all_gather";
    case Op::ReduceScatterSum:
      return "reduce_scatter_sum";
    case Op::Broadcast:
      return "broadcast";
    case Op::AllReduceMax:
      return "all_reduce_max";
    case Op::Barrier:
      return "barrier";
  }
  return "?";
}

void LocalComm::abort(const std::string& reason) {
  std::lock_guard lk(g_->mu);
  if (g_->failed) return;
  g_->failed = true;
  g_->reason = fmt::format("rank {} failed: {}", rank_, reason);
  g_->cv.notify_all();
}

void LocalComm::enter(Op op, const void* in, int64_t count, DType dtype, int root) {
  MS_CHECK(count >= 0, "{}: negative count {}", op_name(op), count);
  {
    std::lock_guard lk(g_->mu);
    g_->slots[static_cast<size_t>(rank_)] = {static_cast<int>(op), in, count, dtype, root};
  }
  g_->meet(rank_, op_name(op));
  // Every rank sees every slot: all detect a mismatch alike and throw without a further meeting.
  const LocalGroupState::Slot& me = g_->slots[static_cast<size_t>(rank_)];
  for (int r = 0; r < g_->n; ++r) {
    const LocalGroupState::Slot& s = g_->slots[static_cast<size_t>(r)];
    if (s.op == me.op && s.count == me.count && s.dtype == me.dtype && s.root == me.root) continue;
    const std::string why =
        fmt::format("rank {} called {}(count {}, {}, root {}) while rank {} called {}(count {}, {}, root {})",
                    r, op_name(static_cast<Op>(s.op)), s.count, dtype_name(s.dtype), s.root, rank_,
                    op_name(op), count, dtype_name(dtype), root);
    {
      std::lock_guard lk(g_->mu);
      if (!g_->failed) {
        g_->failed = true;
        g_->reason = why;
      }
    }
    MS_THROW("local group: {}", why);
  }
}

void LocalComm::leave(Op op) {
  g_->meet(rank_, op_name(op));
}

void LocalComm::all_reduce_sum(void* data, int64_t count, DType dtype, void*) {
  MS_CHECK(dtype == DType::F32 || dtype == DType::BF16, "all_reduce_sum: dtype {} (f32 or bf16)",
           dtype_name(dtype));
  enter(Op::AllReduceSum, data, count, dtype, 0);
  const size_t n = static_cast<size_t>(count);
  acc_.resize(n);
  for (int r = 0; r < g_->n; ++r) {
    const void* in = g_->slots[static_cast<size_t>(r)].in;
    if (dtype == DType::F32) {
      const float* x = static_cast<const float*>(in);
      if (r == 0)
        std::copy(x, x + n, acc_.begin());
      else
        for (size_t i = 0; i < n; ++i) acc_[i] += x[i];
    } else {
      const uint16_t* x = static_cast<const uint16_t*>(in);
      for (size_t i = 0; i < n; ++i) acc_[i] = r == 0 ? bf16_to_f32(x[i]) : acc_[i] + bf16_to_f32(x[i]);
    }
  }
  leave(Op::AllReduceSum);
  if (dtype == DType::F32) {
    if (n) std::memcpy(data, acc_.data(), n * sizeof(float));
  } else {
    uint16_t* out = static_cast<uint16_t*>(data);
    for (size_t i = 0; i < n; ++i) out[i] = f32_to_bf16(acc_[i]);
  }
}

void LocalComm::all_gather(const void* in, void* out, int64_t count, DType dtype, void*) {
  MS_CHECK(dtype != DType::NVFP4, "all_gather: nvfp4 is not a per-element dtype");
  enter(Op::AllGather, in, count, dtype, 0);
  const size_t piece = dtype_bytes(dtype, static_cast<size_t>(count));
  bytes_.resize(piece * static_cast<size_t>(g_->n));
  for (int r = 0; r < g_->n; ++r)
    if (piece)
      std::memcpy(bytes_.data() + piece * static_cast<size_t>(r), g_->slots[static_cast<size_t>(r)].in,
                  piece);
  leave(Op::AllGather);
  if (!bytes_.empty()) std::memcpy(out, bytes_.data(), bytes_.size());
}

void LocalComm::reduce_scatter_sum(const void* in, void* out, int64_t count, DType dtype, void*) {
  MS_CHECK(dtype == DType::F32 || dtype == DType::BF16, "reduce_scatter_sum: dtype {} (f32 or bf16)",
           dtype_name(dtype));
  enter(Op::ReduceScatterSum, in, count, dtype, 0);
  const size_t n = static_cast<size_t>(count), off = n * static_cast<size_t>(rank_);
  acc_.resize(n);
  for (int r = 0; r < g_->n; ++r) {
    const void* src = g_->slots[static_cast<size_t>(r)].in;
    if (dtype == DType::F32) {
      const float* x = static_cast<const float*>(src) + off;
      if (r == 0)
        std::copy(x, x + n, acc_.begin());
      else
        for (size_t i = 0; i < n; ++i) acc_[i] += x[i];
    } else {
      const uint16_t* x = static_cast<const uint16_t*>(src) + off;
      for (size_t i = 0; i < n; ++i) acc_[i] = r == 0 ? bf16_to_f32(x[i]) : acc_[i] + bf16_to_f32(x[i]);
    }
  }
  leave(Op::ReduceScatterSum);
  if (dtype == DType::F32) {
    if (n) std::memcpy(out, acc_.data(), n * sizeof(float));
  } else {
    uint16_t* o = static_cast<uint16_t*>(out);
    for (size_t i = 0; i < n; ++i) o[i] = f32_to_bf16(acc_[i]);
  }
}

void LocalComm::broadcast(void* data, int64_t count, DType dtype, int root, void*) {
  MS_CHECK(root >= 0 && root < g_->n, "broadcast: root {} outside {} ranks", root, g_->n);
  MS_CHECK(dtype != DType::NVFP4, "broadcast: nvfp4 is not a per-element dtype");
  enter(Op::Broadcast, data, count, dtype, root);
  const size_t nb = dtype_bytes(dtype, static_cast<size_t>(count));
  if (rank_ != root) {
    bytes_.resize(nb);
    if (nb) std::memcpy(bytes_.data(), g_->slots[static_cast<size_t>(root)].in, nb);
  }
  leave(Op::Broadcast);
  if (rank_ != root && nb) std::memcpy(data, bytes_.data(), nb);
}

void LocalComm::all_reduce_max(void* data, int64_t count, DType dtype, void*) {
  MS_CHECK(dtype == DType::F32 || dtype == DType::I32, "all_reduce_max: dtype {} (i32 or f32)",
           dtype_name(dtype));
  enter(Op::AllReduceMax, data, count, dtype, 0);
  const size_t n = static_cast<size_t>(count), nb = n * 4;
  bytes_.resize(nb);
  if (nb) std::memcpy(bytes_.data(), g_->slots[0].in, nb);
  for (int r = 1; r < g_->n; ++r) {
    const void* src = g_->slots[static_cast<size_t>(r)].in;
    if (dtype == DType::F32) {
      float* a = reinterpret_cast<float*>(bytes_.data());
      const float* x = static_cast<const float*>(src);
      for (size_t i = 0; i < n; ++i) a[i] = std::max(a[i], x[i]);
    } else {
      int32_t* a = reinterpret_cast<int32_t*>(bytes_.data());
      const int32_t* x = static_cast<const int32_t*>(src);
      for (size_t i = 0; i < n; ++i) a[i] = std::max(a[i], x[i]);
    }
  }
  leave(Op::AllReduceMax);
  if (nb) std::memcpy(data, bytes_.data(), nb);
}

void LocalComm::barrier() {
  enter(Op::Barrier, nullptr, 0, DType::F32, 0);
  leave(Op::Barrier);  // nobody publishes its next call while another still checks this one's slots
}

std::vector<std::unique_ptr<LocalComm>> LocalGroup::create(int n, std::chrono::milliseconds timeout) {
  MS_CHECK(n >= 1, "local group: {} ranks", n);
  MS_CHECK(timeout.count() > 0, "local group: timeout must be positive");
  auto g = std::make_shared<LocalGroupState>();
  g->n = n;
  g->timeout = timeout;
  g->here.assign(static_cast<size_t>(n), false);
  g->slots.resize(static_cast<size_t>(n));
  std::vector<std::unique_ptr<LocalComm>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<LocalComm>(g, r));
  return out;
}

}  // namespace ms::dist
