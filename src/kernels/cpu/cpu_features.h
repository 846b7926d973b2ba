// Which instruction set the CPU linear kernels use, decided once from the running CPU (the binary may be
// built for a wider target than it runs on, or the other way round).
#pragma once

namespace ms::kernels::cpu {

enum class LinearIsa { Reference, Avx2, Avx512 };

// The widest set the CPU has (AVX-512 F/BW/VL/DQ, else AVX2 + FMA, else the portable reference), unless
// force_linear_isa chose one.
LinearIsa linear_isa();
const char* linear_isa_name(LinearIsa isa);

// Tests and benchmarks: run every later linear with `isa` (it must be one the CPU has); Reference always
// works. Not thread-safe against linears running at the same time.
void force_linear_isa(LinearIsa isa);
void clear_forced_linear_isa();

}  // namespace ms::kernels::cpu
