#include "runtime/local_parallel_executor.h"

#include <omp.h>

#include <algorithm>
#include <exception>
#include <string>
#include <thread>

#include "core/error.h"

namespace ms::runtime {

LocalParallelExecutor::LocalParallelExecutor(std::vector<std::shared_ptr<const model::Model>> ranks,
                                             ExecutorConfig cfg, std::chrono::milliseconds timeout) {
  MS_CHECK(!ranks.empty(), "parallel executor: no ranks");
  const int n = static_cast<int>(ranks.size());
  for (int r = 0; r < n; ++r) {
    const dist::ShardSpec& s = ranks[static_cast<size_t>(r)]->shard();
    MS_CHECK(std::max(s.tp_size, s.ep_size) == n && (s.tp_size == 1 || s.tp_rank == r) &&
                 (s.ep_size == 1 || s.ep_rank == r),
             "parallel executor: rank {} of {} holds the shard tp {}/{} ep {}/{}", r, n, s.tp_rank, s.tp_size,
             s.ep_rank, s.ep_size);
  }
  comms_ = dist::LocalGroup::create(n, timeout);
  for (int r = 0; r < n; ++r) {
    ranks_.push_back(std::make_unique<CpuExecutor>(ranks[static_cast<size_t>(r)], cfg));
    ranks_.back()->set_comm(comms_[static_cast<size_t>(r)].get());
  }
  omp_threads_ = std::max(1, omp_get_max_threads() / n);
}

KvCapacity LocalParallelExecutor::kv_capacity() const {
  KvCapacity c = ranks_.front()->kv_capacity();
  for (const auto& r : ranks_) c.num_pages = std::min(c.num_pages, r->kv_capacity().num_pages);
  return c;
}

Tensor LocalParallelExecutor::run(const kv::ForwardBatch& b, const model::StepRouting& routing,
                                  profiler::OpSink* sink) {
  MS_CHECK(!failed_, "parallel executor: a rank failed in an earlier step; the group is down");
  // Checked once here, so a batch that cannot run throws before any rank meets the others.
  model().check_batch(b, ranks_.front()->kv_pool(), routing);
  const size_t n = ranks_.size();
  std::vector<std::exception_ptr> errs(n);
  std::vector<Tensor> out(n);
  model::StepRouting others = routing;
  others.expert_stats = nullptr;
  others.expert_distribution = nullptr;
  auto step = [&](size_t r) {
    omp_set_num_threads(omp_threads_);
    try {
      out[r] = ranks_[r]->run(b, r == 0 ? routing : others, r == 0 ? sink : nullptr);
    } catch (const std::exception& e) {
      errs[r] = std::current_exception();
      comms_[r]->abort(e.what());
    }
  };
  // Every rank on a thread of its own (the caller's OpenMP team stays as it was).
  std::vector<std::thread> th;
  for (size_t r = 0; r < n; ++r) th.emplace_back(step, r);
  for (auto& t : th) t.join();
  // The rank that failed first is the one whose error is not the group's echo of it.
  int first = -1;
  for (size_t r = 0; r < n; ++r) {
    if (!errs[r]) continue;
    try {
      std::rethrow_exception(errs[r]);
    } catch (const std::exception& e) {
      const bool echo = std::string_view(e.what()).starts_with("local group:");
      if (first < 0 || !echo) {
        if (!echo || first < 0) first = static_cast<int>(r);
        if (!echo) break;
      }
    }
  }
  if (first >= 0) {
    failed_ = true;
    try {
      std::rethrow_exception(errs[static_cast<size_t>(first)]);
    } catch (const Error& e) {
      MS_THROW("rank {} of {}: {}", first, n, e.message());
    } catch (const std::exception& e) {
      MS_THROW("rank {} of {}: {}", first, n, e.what());
    }
  }
  return out[0];
}

}  // namespace ms::runtime
