#include "server/engine_loop.h"

#include "core/error.h"
#include "core/log.h"

namespace ms::server {

bool RequestStream::pop(std::vector<runtime::RequestOutput>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  if (queue_.empty() && !finished_) cv_.wait_for(lock, timeout, [&] { return !queue_.empty() || finished_; });
  while (!queue_.empty()) {
    out.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  return !(finished_ && out.empty());
}

void RequestStream::push(runtime::RequestOutput o) {
  {
    std::lock_guard lock(mu_);
    if (o.finish != runtime::FinishReason::None) finished_ = true;
    queue_.push_back(std::move(o));
  }
  cv_.notify_all();
}

EngineLoop::EngineLoop(Backend& backend) : backend_(backend) {
  stats_ = backend_.stats();
  thread_ = std::thread([this] { run(); });
}

EngineLoop::~EngineLoop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<RequestStream> EngineLoop::submit(runtime::Request request) {
  std::shared_ptr<RequestStream> s;
  {
    std::lock_guard lock(mu_);
    s = std::make_shared<RequestStream>(next_id_++);
    inbox_.emplace_back(s, std::move(request));
    ++active_;
  }
  cv_.notify_all();
  return s;
}

void EngineLoop::cancel(uint64_t id) {
  {
    std::lock_guard lock(mu_);
    cancels_.push_back(id);
  }
  cv_.notify_all();
}

void EngineLoop::cancel_all() {
  {
    std::lock_guard lock(mu_);
    cancel_all_ = true;
  }
  cv_.notify_all();
}

runtime::EngineStats EngineLoop::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

void EngineLoop::run() {
  auto finish = [&](const std::shared_ptr<RequestStream>& s, runtime::FinishReason why, std::string error,
                    bool refused = false) {
    runtime::RequestOutput o;
    o.request_id = s->id();
    o.finish = why;
    o.error = std::move(error);
    o.refused = refused;
    s->push(std::move(o));
    --active_;
  };
  for (;;) {
    decltype(inbox_) inbox;
    std::vector<uint64_t> cancels;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] {
        return stop_ || cancel_all_ || !inbox_.empty() || !cancels_.empty() || backend_.has_work();
      });
      if (stop_) break;
      inbox.swap(inbox_);
      cancels.swap(cancels_);
      if (cancel_all_) {
        cancel_all_ = false;
        for (auto& [id, s] : streams_) cancels.push_back(id);
        for (auto& [s, req] : inbox) cancels.push_back(s->id());
      }
    }
    for (auto& [s, req] : inbox) {
      try {
        backend_.submit(s->id(), req);
        streams_[s->id()] = s;
      } catch (const ms::Error& e) {
        finish(s, runtime::FinishReason::Error, e.message(), /*refused=*/true);
      } catch (const std::exception& e) {
        finish(s, runtime::FinishReason::Error, e.what());
      }
    }
    for (uint64_t id : cancels) {
      auto it = streams_.find(id);
      if (it == streams_.end()) continue;
      backend_.cancel(id);
      finish(it->second, runtime::FinishReason::Cancelled, "");
      streams_.erase(it);
    }
    if (backend_.has_work()) {
      std::vector<runtime::RequestOutput> outs;
      try {
        outs = backend_.step();
      } catch (const std::exception& e) {
        // A failed step fails the requests in flight, never the process.
        MS_LOG_ERROR("engine step failed: {}", e.what());
        for (auto& [id, s] : streams_) {
          backend_.cancel(id);
          finish(s, runtime::FinishReason::Error, std::string("engine step failed: ") + e.what());
        }
        streams_.clear();
      }
      for (auto& o : outs) {
        auto it = streams_.find(o.request_id);
        if (it == streams_.end()) continue;
        const bool done = o.finish != runtime::FinishReason::None;
        it->second->push(std::move(o));
        if (done) {
          streams_.erase(it);
          --active_;
        }
      }
    }
    std::lock_guard lock(mu_);
    stats_ = backend_.stats();
  }
  for (auto& [id, s] : streams_) {
    backend_.cancel(id);
    finish(s, runtime::FinishReason::Cancelled, "server stopped");
  }
}

}  // namespace ms::server
