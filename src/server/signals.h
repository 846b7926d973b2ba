// Shutdown signals for a serving process: block SIGTERM/SIGINT in every thread (call before starting any),
// then wait for one in the main thread and drain. SIGPIPE is ignored: a client that went away is an error on
// its socket, not the end of the process.
#pragma once

namespace ms::server {

void block_shutdown_signals();
int wait_for_shutdown_signal();  // returns the signal number

}  // namespace ms::server
