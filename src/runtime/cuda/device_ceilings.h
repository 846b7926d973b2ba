// The roofline's ceilings measured on the GPU at hand: device-to-device copy bandwidth (bytes read plus
// written over a buffer far larger than L2) and the BF16 matrix rate of cuBLASLt on a large square product of
// random data; best of several timed passes with CUDA events.
#pragma once

#include "profiler/ceilings.h"

namespace ms::runtime::cuda {

profiler::Ceilings measure_device_ceilings();

}  // namespace ms::runtime::cuda
