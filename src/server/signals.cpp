#include "server/signals.h"

#include <csignal>

#include "core/error.h"

namespace ms::server {

namespace {
sigset_t shutdown_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}
}  // namespace

void block_shutdown_signals() {
  std::signal(SIGPIPE, SIG_IGN);
  sigset_t set = shutdown_set();
  MS_CHECK(pthread_sigmask(SIG_BLOCK, &set, nullptr) == 0, "pthread_sigmask failed");
}

int wait_for_shutdown_signal() {
  sigset_t set = shutdown_set();
  int sig = 0;
  MS_CHECK(sigwait(&set, &sig) == 0, "sigwait failed");
  return sig;
}

}  // namespace ms::server
