// Compiled with NCCL only (MOESERVE_HAVE_NCCL); nccl_missing.cpp stands in for it otherwise.
#if MOESERVE_HAVE_NCCL
#include "dist/nccl_comm.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "dist/id_exchange.h"

namespace ms::dist {
namespace {

using Clock = std::chrono::steady_clock;

#define MS_DIST_CUDA(call)                               \
  do {                                                   \
    cudaError_t e_ = (call);                             \
    if (e_ != cudaSuccess) [[unlikely]]                  \
      MS_THROW("{}: {}", #call, cudaGetErrorString(e_)); \
  } while (0)

ncclDataType_t nccl_type(DType t, bool allow_i32, const char* what) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::BF16:
      if (!allow_i32) return ncclBfloat16;
      break;
    case DType::I32:
      if (allow_i32) return ncclInt32;
      break;
    default:
      break;
  }
  MS_THROW("{}: dtype {} is not supported ({})", what, dtype_name(t),
           allow_i32 ? "i32 or f32" : "f32 or bf16");
}

double secs(std::chrono::milliseconds t) {
  return t.count() / 1000.0;
}

// What a collective was, formatted only for a message: "all_reduce_sum of 6144 bf16".
struct Op {
  const char* name = "";
  int64_t count = -1;  // -1: not a collective (watched work)
  DType dtype = DType::F32;
  std::string str() const {
    return count < 0 ? name : fmt::format("{} of {} {}", name, count, dtype_name(dtype));
  }
};

struct Pending {
  cudaEvent_t event;
  Clock::time_point queued;
  Op op;
};

}  // namespace

struct NcclComm::Impl {
  ncclComm_t comm = nullptr;
  int rank = 0, size = 1, device = 0;
  NcclOptions opt;

  std::mutex call_mu;  // NCCL calls on comm, and abort; the watchdog only try-locks it to poll
  bool aborted = false;
  std::atomic<bool> failed{false};

  mutable std::mutex mu;  // error, pending, free_events, stop
  std::string error;
  std::deque<Pending> pending;
  std::vector<cudaEvent_t> free_events;
  bool stop = false;
  std::condition_variable cv;
  std::thread watchdog;

  int32_t* barrier_buf = nullptr;  // [1]
  cudaStream_t barrier_stream = nullptr;

  std::string who() const { return fmt::format("NCCL rank {} of {} (cuda:{})", rank, size, device); }
  std::string nccl_message(ncclResult_t r) const {
    const char* last = ncclGetLastError(aborted ? nullptr : comm);
    return fmt::format("{}{}{}", ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "");
  }

  // Records the first error; true when this call recorded it.
  bool set_error(const std::string& msg) {
    std::lock_guard lk(mu);
    if (!error.empty()) return false;
    error = msg;
    failed = true;
    return true;
  }
  void abort_locked() {  // call_mu held
    if (aborted || !comm) return;
    ncclCommAbort(comm);
    aborted = true;
  }
  [[noreturn]] void fail_locked(const std::string& msg) {  // call_mu held
    if (set_error(msg)) MS_LOG_ERROR("{}; aborting the communicator", msg);
    abort_locked();
    throw_failed();
  }
  [[noreturn]] void throw_failed() const {
    std::lock_guard lk(mu);
    throw Error(error, __FILE__, __LINE__);
  }
  void throw_if_failed() const {
    if (failed) throw_failed();
  }

  // After an NCCL call on the non-blocking communicator: wait until it has left ncclInProgress.
  void settle(const Op& op, ncclResult_t r) {
    if (r == ncclSuccess) return;
    if (r != ncclInProgress) fail_locked(fmt::format("{}: {} failed: {}", who(), op.str(), nccl_message(r)));
    auto deadline = Clock::now() + opt.op_timeout;
    for (;;) {
      ncclResult_t st = ncclSuccess;
      ncclResult_t q = ncclCommGetAsyncError(comm, &st);
      if (q != ncclSuccess) st = q;
      if (st == ncclSuccess) return;
      if (st != ncclInProgress)
        fail_locked(fmt::format("{}: {} failed: {}", who(), op.str(), nccl_message(st)));
      throw_if_failed();
      if (Clock::now() > deadline)
        fail_locked(fmt::format("{}: {} still in progress after {} s: a rank died or hung", who(), op.str(),
                                secs(opt.op_timeout)));
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }

  // An event after the collective on `stream`, for the watchdog; none while the stream is capturing.
  void track(cudaStream_t stream, const Op& op) {
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess) {
      cudaGetLastError();
      return;
    }
    if (cs != cudaStreamCaptureStatusNone) return;
    cudaEvent_t ev = nullptr;
    {
      std::lock_guard lk(mu);
      if (!free_events.empty()) ev = free_events.back(), free_events.pop_back();
    }
    if (!ev) MS_DIST_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    MS_DIST_CUDA(cudaEventRecord(ev, stream));
    std::lock_guard lk(mu);
    pending.push_back({ev, Clock::now(), op});
  }

  template <class Call>
  void run(const char* what, int64_t count, DType dtype, void* stream, Call&& call) {
    MS_CHECK(count >= 0, "{}: count {}", what, count);
    std::lock_guard lk(call_mu);
    throw_if_failed();
    Op op{what, count, dtype};
    settle(op, call());
    track(static_cast<cudaStream_t>(stream), op);
  }

  void watch_loop() {
    cudaSetDevice(device);
    // Another thread's graph capture must not be disturbed by this thread's event queries.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    std::unique_lock lk(mu);
    while (!stop) {
      cv.wait_for(lk, opt.poll_interval, [&] { return stop; });
      if (stop || failed) continue;
      std::string problem;
      while (!pending.empty()) {
        cudaError_t q = cudaEventQuery(pending.front().event);
        if (q == cudaSuccess) {
          free_events.push_back(pending.front().event);
          pending.pop_front();
          continue;
        }
        if (q != cudaErrorNotReady) {
          problem = fmt::format("{}: CUDA error while {} ran: {}", who(), pending.front().op.str(),
                                cudaGetErrorString(q));
        } else if (Clock::now() - pending.front().queued > opt.op_timeout) {
          problem = fmt::format("{}: {} has not finished after {} s: a rank died or hung", who(),
                                pending.front().op.str(), secs(opt.op_timeout));
        }
        break;
      }
      lk.unlock();
      std::unique_lock call(call_mu, std::defer_lock);
      if (problem.empty() && call.try_lock() && !aborted) {
        ncclResult_t st = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(comm, &st);
        if (q != ncclSuccess) st = q;
        if (st != ncclSuccess && st != ncclInProgress)
          problem = fmt::format("{}: NCCL reported an error: {}", who(), nccl_message(st));
      }
      if (!problem.empty()) {
        if (set_error(problem)) MS_LOG_ERROR("{}; aborting the communicator", problem);
        if (!call.owns_lock()) call.lock();  // the caller's own wait is bounded by op_timeout
        abort_locked();
      }
      if (call.owns_lock()) call.unlock();
      lk.lock();
    }
  }
};

bool nccl_available() {
  return true;
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  return fmt::format("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
}

std::vector<uint8_t> nccl_unique_id() {
  set_nccl_env_defaults();
  ncclUniqueId id;
  ncclResult_t r = ncclGetUniqueId(&id);
  if (r != ncclSuccess)
    MS_THROW("ncclGetUniqueId failed: {}: {}", ncclGetErrorString(r), ncclGetLastError(nullptr));
  auto* p = reinterpret_cast<const uint8_t*>(&id);
  return {p, p + sizeof(id)};
}

NcclComm::NcclComm(std::span<const uint8_t> unique_id, int rank, int size, NcclOptions options)
    : impl_(std::make_unique<Impl>()) {
  MS_CHECK(unique_id.size() == sizeof(ncclUniqueId), "the NCCL unique id has {} bytes, not {}",
           unique_id.size(), sizeof(ncclUniqueId));
  MS_CHECK(size >= 1 && rank >= 0 && rank < size, "NCCL rank {} of {}", rank, size);
  set_nccl_env_defaults();
  Impl& m = *impl_;
  m.rank = rank, m.size = size, m.opt = options;
  MS_DIST_CUDA(cudaGetDevice(&m.device));
  MS_DIST_CUDA(cudaFree(nullptr));  // the context, before NCCL's threads use it
  ncclUniqueId id;
  std::memcpy(&id, unique_id.data(), sizeof(id));
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&m.comm, size, id, rank, &cfg);
  {
    std::lock_guard lk(m.call_mu);
    if (r != ncclSuccess && r != ncclInProgress) {
      std::string msg = fmt::format("{}: ncclCommInitRankConfig failed: {}", m.who(), m.nccl_message(r));
      m.abort_locked();
      throw Error(msg, __FILE__, __LINE__);
    }
    auto deadline = Clock::now() + m.opt.init_timeout;
    for (;;) {
      ncclResult_t st = ncclSuccess;
      ncclResult_t q = ncclCommGetAsyncError(m.comm, &st);
      if (q != ncclSuccess) st = q;
      if (st == ncclSuccess) break;
      if (st != ncclInProgress) {
        std::string msg = fmt::format("{}: joining the group failed: {}", m.who(), m.nccl_message(st));
        m.abort_locked();
        throw Error(msg, __FILE__, __LINE__);
      }
      if (Clock::now() > deadline) {
        std::string msg =
            fmt::format("{}: the group of {} did not form within {} s (a rank is missing or stuck)", m.who(),
                        size, secs(m.opt.init_timeout));
        m.abort_locked();
        throw Error(msg, __FILE__, __LINE__);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  MS_DIST_CUDA(cudaMalloc(&m.barrier_buf, sizeof(int32_t)));
  MS_DIST_CUDA(cudaStreamCreateWithFlags(&m.barrier_stream, cudaStreamNonBlocking));
  m.watchdog = std::thread([&m] { m.watch_loop(); });
  MS_LOG_INFO("{}", describe());
}

NcclComm::~NcclComm() {
  Impl& m = *impl_;
  {
    std::lock_guard lk(m.mu);
    m.stop = true;
  }
  m.cv.notify_all();
  if (m.watchdog.joinable()) m.watchdog.join();
  {
    std::lock_guard lk(m.call_mu);
    if (!m.aborted && m.comm) {
      // Flush queued work (bounded), then free; abort when the peers do not finish.
      ncclResult_t fr = ncclCommFinalize(m.comm);
      bool clean = fr == ncclSuccess || fr == ncclInProgress;
      auto deadline = Clock::now() + m.opt.op_timeout;
      while (clean) {
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(m.comm, &st) != ncclSuccess) st = ncclInternalError;
        if (st == ncclSuccess) break;
        if (st != ncclInProgress || Clock::now() > deadline) {
          clean = false;
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (clean) {
        ncclCommDestroy(m.comm);
      } else {
        MS_LOG_WARN("{}: the communicator did not finish cleanly; aborting it", m.who());
        ncclCommAbort(m.comm);
      }
      m.aborted = true;
    }
  }
  for (auto& p : m.pending) cudaEventDestroy(p.event);
  for (auto ev : m.free_events) cudaEventDestroy(ev);
  if (m.barrier_stream) cudaStreamDestroy(m.barrier_stream);
  if (m.barrier_buf) cudaFree(m.barrier_buf);
}

int NcclComm::rank() const {
  return impl_->rank;
}
int NcclComm::size() const {
  return impl_->size;
}
int NcclComm::device() const {
  return impl_->device;
}
std::string NcclComm::describe() const {
  return fmt::format("NCCL {}, rank {} of {} on cuda:{}", nccl_version(), impl_->rank, impl_->size,
                     impl_->device);
}

void NcclComm::all_reduce_sum(void* data, int64_t count, DType dtype, void* stream) {
  auto t = nccl_type(dtype, false, "all_reduce_sum");
  impl_->run("all_reduce_sum", count, dtype, stream, [&] {
    return ncclAllReduce(data, data, static_cast<size_t>(count), t, ncclSum, impl_->comm,
                         static_cast<cudaStream_t>(stream));
  });
}

void NcclComm::all_gather(const void* in, void* out, int64_t count, DType dtype, void* stream) {
  auto t = nccl_type(dtype, false, "all_gather");
  impl_->run("all_gather", count, dtype, stream, [&] {
    return ncclAllGather(in, out, static_cast<size_t>(count), t, impl_->comm,
                         static_cast<cudaStream_t>(stream));
  });
}

void NcclComm::reduce_scatter_sum(const void* in, void* out, int64_t count, DType dtype, void* stream) {
  auto t = nccl_type(dtype, false, "reduce_scatter_sum");
  impl_->run("reduce_scatter_sum", count, dtype, stream, [&] {
    return ncclReduceScatter(in, out, static_cast<size_t>(count), t, ncclSum, impl_->comm,
                             static_cast<cudaStream_t>(stream));
  });
}

void NcclComm::broadcast(void* data, int64_t count, DType dtype, int root, void* stream) {
  MS_CHECK(root >= 0 && root < impl_->size, "broadcast: root {} of {} ranks", root, impl_->size);
  ncclDataType_t t = dtype == DType::I32 ? ncclInt32 : nccl_type(dtype, false, "broadcast");
  impl_->run("broadcast", count, dtype, stream, [&] {
    return ncclBroadcast(data, data, static_cast<size_t>(count), t, root, impl_->comm,
                         static_cast<cudaStream_t>(stream));
  });
}

void NcclComm::all_reduce_max(void* data, int64_t count, DType dtype, void* stream) {
  auto t = nccl_type(dtype, true, "all_reduce_max");
  impl_->run("all_reduce_max", count, dtype, stream, [&] {
    return ncclAllReduce(data, data, static_cast<size_t>(count), t, ncclMax, impl_->comm,
                         static_cast<cudaStream_t>(stream));
  });
}

void NcclComm::barrier() {
  Impl& m = *impl_;
  {
    std::lock_guard lk(m.call_mu);
    m.throw_if_failed();
    m.settle(Op{"barrier"},
             ncclAllReduce(m.barrier_buf, m.barrier_buf, 1, ncclInt32, ncclSum, m.comm, m.barrier_stream));
  }
  auto deadline = Clock::now() + m.opt.op_timeout;
  for (;;) {
    cudaError_t q = cudaStreamQuery(m.barrier_stream);
    if (q == cudaSuccess) break;
    m.throw_if_failed();
    if (q != cudaErrorNotReady) {
      std::lock_guard lk(m.call_mu);
      m.fail_locked(fmt::format("{}: barrier: {}", m.who(), cudaGetErrorString(q)));
    }
    if (Clock::now() > deadline) {
      std::lock_guard lk(m.call_mu);
      m.fail_locked(
          fmt::format("{}: barrier not reached by every rank within {} s", m.who(), secs(m.opt.op_timeout)));
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  m.throw_if_failed();
}

void NcclComm::watch(void* stream) {
  std::lock_guard lk(impl_->call_mu);
  impl_->throw_if_failed();
  impl_->track(static_cast<cudaStream_t>(stream), Op{"work watched on the stream"});
}

void NcclComm::check() const {
  impl_->throw_if_failed();
}

void NcclComm::abort(const std::string& reason) {
  std::lock_guard lk(impl_->call_mu);
  impl_->set_error(fmt::format("{}: {}", impl_->who(), reason));
  impl_->abort_locked();
}

std::unique_ptr<Communicator> connect_nccl(const RankInfo& info, NcclOptions options) {
  int n = 0;
  MS_DIST_CUDA(cudaGetDeviceCount(&n));
  if (info.local_rank >= n)
    MS_THROW("{} needs cuda:{}, but this node has {} GPU(s): start at most {} ranks per node",
             info.describe(), info.local_rank, n, n);
  MS_DIST_CUDA(cudaSetDevice(info.local_rank));
  std::vector<uint8_t> id;
  if (info.rank == 0) id = nccl_unique_id();
  auto got = exchange_unique_id(info, id, options.init_timeout);
  return std::make_unique<NcclComm>(got, info.rank, info.world_size, options);
}

}  // namespace ms::dist
#endif  // MOESERVE_HAVE_NCCL
