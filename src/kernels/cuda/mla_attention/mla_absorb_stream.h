// The streaming absorb / out-v kernels (mla_absorb_stream.cu), called by the launchers of mla_absorb.cu after
// their general shape checks.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/common/device_caps.h"
#include "kernels/cuda/mla_attention/mla_absorb.h"

namespace ms::cuda::detail {

// "" when the streaming kernel takes `p` on a device with `caps`, else the field and what it needs.
std::string absorb_q_stream_refusal(const MlaAbsorbQParams& p, const DeviceCaps& caps);
std::string out_v_stream_refusal(const MlaOutVParams& p, const DeviceCaps& caps);
// Launch on `stream`; the refusal must be "" (m > 0).
void absorb_q_stream(const MlaAbsorbQParams& p, const DeviceCaps& caps, cudaStream_t stream);
void out_v_stream(const MlaOutVParams& p, const DeviceCaps& caps, cudaStream_t stream);

}  // namespace ms::cuda::detail
