// The NCCL unique id (or any opaque bytes) from rank 0 to every rank over TCP, before NCCL exists: rank 0
// listens on RankInfo's init address, the other ranks connect (retrying until the deadline, since rank 0 may
// start later), each says who it is, and once every rank has connected rank 0 sends the bytes to each. So a
// rank that is missing is named by rank 0, and no rank starts NCCL before all of them are alive.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <vector>

#include "dist/rank_info.h"

namespace ms::dist {

// payload: rank 0's bytes (1 byte .. 1 MiB; 128 for ncclUniqueId); ignored on the other ranks. Returns the
// bytes on every rank. World 1 returns the payload without opening a socket. Throws ms::Error naming this
// rank, the address and, on rank 0, the ranks that did not connect in time.
std::vector<uint8_t> exchange_unique_id(const RankInfo& info, std::span<const uint8_t> payload,
                                        std::chrono::milliseconds timeout = std::chrono::minutes(5));

// A TCP port that was free on this machine a moment ago (bound to port 0 and released): for the
// self-launching process, which chooses the port its children connect to.
int pick_free_port();

}  // namespace ms::dist
