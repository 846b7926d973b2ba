// Programmatic dependent launch (PDL, sm_90 and newer), the device side. A kernel launched through
// launch_kernel (kernels/cuda/common/pdl.h) with PDL on is a programmatic dependent of the kernel before it
// in the stream: its blocks may start while that kernel still runs (its launch and prologue overlap the
// other's tail), so the rules for every kernel launched that way are:
//
// 1. grid_dep_wait() before the first global memory read of anything an earlier kernel wrote, AND before the
//    first global write (the previous kernel may still read what this one would overwrite). Only work that
//    touches no global memory written by earlier kernels may go before it: shared memory set-up (lookup
//    tables), index arithmetic, reading kernel parameters, reading weights that no kernel writes. When in
//    doubt, put the wait first.
// 2. Every block reaches grid_dep_wait() on every path, early returns included: a dependent of this kernel
//    waits only for this kernel, so this kernel may finish only after its own predecessor did (the order
//    stays transitive along the chain).
// 3. grid_dep_launch_dependents() (optional) lets the next kernel's blocks be scheduled before this one ends;
//    it changes no result, since the next kernel's grid_dep_wait() still waits for this whole grid to finish
//    and its writes to be visible. Called after the wait, it keeps at most two kernels resident at once.
//
// Both are no-ops when the kernel was launched plainly (without the attribute) and compile to nothing below
// sm_90. A plain launch after or before a PDL one is an ordinary stream edge, so PDL kernels and plain ones
// (cuBLASLt, memsets, kernels not converted) interleave freely.
#pragma once

#include <cuda_runtime.h>

namespace ms::cuda::dev {

// Waits until the grids this one depends on have finished and their memory is visible (griddepcontrol.wait).
__device__ __forceinline__ void grid_dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Lets dependents be scheduled once every block of this grid has called it or exited
// (griddepcontrol.launch_dependents); a hint, never a completion.
__device__ __forceinline__ void grid_dep_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// The usual prologue of a kernel with nothing to do before the wait. It does not trigger the dependents
// early: with the trigger right after the wait, the next kernel's blocks took multiprocessor slots while this
// grid still had blocks to run, and the GLM-5 slice decode step got slower on an H200 (batch 1 1.524 ms with
// PDL, 1.484 ms without; batch 8 2.223 against 2.166). The dependents are scheduled as this grid's blocks
// exit.
__device__ __forceinline__ void grid_dep_enter() {
  grid_dep_wait();
}

}  // namespace ms::cuda::dev
