// Host-side checks of 2D tensor maps (cuTensorMapEncodeTiled) and of the shared-memory boxes their tensor
// copies (cp.async.bulk.tensor) fill, before anything is encoded or launched. The driver refuses some bad
// maps with a bare CUresult; others it accepts and the copy then faults on the device ("an illegal
// instruction", no hint which box). Each check throws ms::Error naming the tensor and the rule. Header-only
// and free of CUDA types, so tested without the hardware (tests/unit/kernels/tma_check_test.cpp).
#pragma once

#include <cstdint>

#include "core/error.h"

namespace ms::cuda {

// One 2D map over a row-major matrix [rows, cols] of elem_bytes-sized elements (cols innermost), copied by
// boxes of box_rows x box_cols elements. swizzle_bytes: 0 (none), 32, 64 or 128 (CU_TENSOR_MAP_SWIZZLE_*B).
struct TmaMap2d {
  const char* what = "";  // the tensor's name in messages
  uintptr_t base = 0;     // global address of element [0, 0]
  uint32_t elem_bytes = 0;
  uint64_t cols = 0, rows = 0;
  uint64_t row_bytes = 0;  // global stride between rows
  uint32_t box_cols = 0, box_rows = 0;
  uint32_t swizzle_bytes = 0;
};

// The driver API's requirements on cuTensorMapEncodeTiled (interleave NONE, element strides 1), plus
// row_bytes >= the row's own bytes.
inline void check_tma_map_2d(const TmaMap2d& m) {
  MS_CHECK(m.elem_bytes == 1 || m.elem_bytes == 2 || m.elem_bytes == 4 || m.elem_bytes == 8,
           "tensor map {}: element size {} bytes is not 1, 2, 4 or 8", m.what, m.elem_bytes);
  MS_CHECK(m.base != 0 && m.base % 16 == 0,
           "tensor map {}: global address {:#x} must be non-null and 16-byte aligned", m.what, m.base);
  constexpr uint64_t kMaxDim = uint64_t{1} << 32;
  MS_CHECK(m.cols >= 1 && m.cols <= kMaxDim && m.rows >= 1 && m.rows <= kMaxDim,
           "tensor map {}: dimensions [{}, {}] must each be in 1 .. 2^32", m.what, m.rows, m.cols);
  constexpr uint64_t kMaxStride = uint64_t{1} << 40;  // (not inside MS_CHECK: its text becomes a format)
  MS_CHECK(m.row_bytes % 16 == 0 && m.row_bytes < kMaxStride,
           "tensor map {}: row stride {} bytes must be a multiple of 16 and below 2^40", m.what, m.row_bytes);
  MS_CHECK(m.row_bytes >= m.cols * m.elem_bytes,
           "tensor map {}: row stride {} bytes is less than a row's {} bytes", m.what, m.row_bytes,
           m.cols * m.elem_bytes);
  MS_CHECK(m.box_cols >= 1 && m.box_cols <= 256 && m.box_rows >= 1 && m.box_rows <= 256,
           "tensor map {}: box {} x {} must be 1 .. 256 in each dimension", m.what, m.box_rows, m.box_cols);
  const uint64_t inner = uint64_t{m.box_cols} * m.elem_bytes;
  MS_CHECK(inner % 16 == 0, "tensor map {}: box row of {} bytes must be a multiple of 16", m.what, inner);
  MS_CHECK(m.swizzle_bytes == 0 || m.swizzle_bytes == 32 || m.swizzle_bytes == 64 || m.swizzle_bytes == 128,
           "tensor map {}: swizzle of {} bytes is not none, 32, 64 or 128", m.what, m.swizzle_bytes);
  MS_CHECK(m.swizzle_bytes == 0 || inner <= m.swizzle_bytes,
           "tensor map {}: box row of {} bytes exceeds its {}-byte swizzle", m.what, inner, m.swizzle_bytes);
}

// One tensor copy of map m's box into shared memory at byte offset smem_off of a 1024-aligned window,
// starting at inner coordinate c0 (elements): the destination 128-byte aligned, 1024 for a 128-byte swizzle
// (the pattern then matches the wgmma operand layout's), and the box's first global byte 16-byte aligned
// (c0 x elem_bytes a multiple of 16; the hardware faults on others). Returns the box's bytes, what the copy
// adds to its mbarrier's transaction count (boxes past the tensor's end count in full).
inline uint32_t check_tma_box(const TmaMap2d& m, uint64_t smem_off, int64_t c0) {
  const uint64_t align = m.swizzle_bytes == 128  ? 1024
                         : m.swizzle_bytes == 64 ? 512
                         : m.swizzle_bytes == 32 ? 256
                                                 : 128;
  MS_CHECK(smem_off % align == 0, "tensor copy of {}: shared destination at byte {} must be {}-byte aligned",
           m.what, smem_off, align);
  MS_CHECK(
      c0 >= 0 && (static_cast<uint64_t>(c0) * m.elem_bytes) % 16 == 0,
      "tensor copy of {}: box start column {} ({} bytes into the row) must be a non-negative multiple of 16 "
      "bytes",
      m.what, c0, static_cast<uint64_t>(c0 < 0 ? 0 : c0) * m.elem_bytes);
  return m.box_cols * m.elem_bytes * m.box_rows;
}

}  // namespace ms::cuda
