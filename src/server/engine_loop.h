// The one thread that drives the backend: it takes submissions and cancellations from HTTP threads between
// steps, runs steps while there is work, and hands each request's outputs to its RequestStream.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/engine_types.h"
#include "server/backend.h"

namespace ms::server {

// Outputs of one request, filled by the engine loop, drained by the HTTP thread that serves it.
class RequestStream {
 public:
  explicit RequestStream(uint64_t id) : id_(id) {}
  uint64_t id() const { return id_; }
  // Moves what arrived into `out`; waits up to `timeout` when nothing has. Returns false once the stream is
  // finished and empty.
  bool pop(std::vector<runtime::RequestOutput>& out, std::chrono::milliseconds timeout);
  void push(runtime::RequestOutput o);

 private:
  uint64_t id_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<runtime::RequestOutput> queue_;
  bool finished_ = false;
};

class EngineLoop {
 public:
  explicit EngineLoop(Backend& backend);
  ~EngineLoop();  // stops the thread; requests still running are cancelled
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // The stream gets a finish == Error output when the backend refuses the request.
  std::shared_ptr<RequestStream> submit(runtime::Request request);
  void cancel(uint64_t id);
  void cancel_all();                                // every request submitted so far
  size_t active() const { return active_.load(); }  // submitted and not yet finished
  runtime::EngineStats stats() const;               // as of the latest step
  Backend& backend() { return backend_; }

 private:
  void run();
  Backend& backend_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::pair<std::shared_ptr<RequestStream>, runtime::Request>> inbox_;
  std::vector<uint64_t> cancels_;
  bool cancel_all_ = false;
  std::unordered_map<uint64_t, std::shared_ptr<RequestStream>> streams_;  // loop thread only
  runtime::EngineStats stats_;
  uint64_t next_id_ = 1;
  std::atomic<size_t> active_{0};
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ms::server
