// The 128-byte swizzle every op's tiles are in (TMA's
// CU_TENSOR_MAP_SWIZZLE_128B, wgmma's 128B layout), and where each lane of a
// warp points ldmatrix in such a tile for the m16n8k16 fragments.
//
// A tile is rows of 128 bytes (64 bf16) in atoms of 8 rows: 16-byte chunk c
// of row r lies at r * 128 + (c ^ r % 8) * 16, so the 8 rows an ldmatrix
// matrix reads hit 8 different bank groups. An atom spans 1024 bytes, the
// alignment TMA and wgmma need of such a tile.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace muse_decode::swizzle {

inline constexpr int kRowBytes = 128;                // one row of 64 bf16: the swizzle's span
inline constexpr int kAtomRows = 8;
inline constexpr int kAtomBytes = kAtomRows * kRowBytes;  // 1024

// Byte offset of 16-byte chunk `chunk` of row `row`.
__device__ __forceinline__ uint32_t offset(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row % kAtomRows)) << 4));
}

// ldmatrix.x4 of an A fragment (16 rows x 16 k, row-major: the matrices rows
// 0-7 | 8-15 by k 0-7 | 8-15): lane l reads row (l % 8) + 8 ((l / 8) % 2) of
// the 16 and chunk l / 16 of the k-step's two.
__device__ __forceinline__ int a_row(int lane) { return (lane & 7) + ((lane >> 3) & 1) * 8; }
__device__ __forceinline__ int a_chunk(int lane) { return lane >> 4; }
// ldmatrix.x4 of the B fragments of two n-tiles stored n-major (rows = n:
// the matrices k 0-7 | 8-15 by n 0-7 | 8-15): lane l reads row (l % 8) +
// 8 (l / 16) and chunk (l / 8) % 2. ldmatrix.x2 (one n-tile) takes lanes 0-15.
__device__ __forceinline__ int b_row(int lane) { return (lane & 7) + (lane >> 4) * 8; }
__device__ __forceinline__ int b_chunk(int lane) { return (lane >> 3) & 1; }

}  // namespace muse_decode::swizzle
