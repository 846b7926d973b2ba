// Whether the client of a request is still connected, for handlers that wait without writing (a
// non-streaming completion): the HTTP library gives a handler no socket, so the accepted socket is found by
// its two addresses. A peer that closed its side reads as end-of-file.
#pragma once

#include <string>

namespace ms::server {

class ClientConnection {
 public:
  // The accepted TCP socket whose peer is remote_addr:remote_port and whose local port is local_port. When
  // none is found, closed() is always false (the request runs to its end, as before).
  ClientConnection(const std::string& remote_addr, int remote_port, int local_port);
  bool found() const { return fd_ >= 0; }
  // True once the peer closed or reset the connection. Does not consume anything the peer sent.
  bool closed() const;

 private:
  int fd_ = -1;
};

}  // namespace ms::server
