// The TMA layer every op's host side shares: the tensor maps of its copies
// (cuTensorMapEncodeTiled through the runtime's entry-point query, always
// with the 128-byte swizzle of swizzle.cuh), their L2 promotion, and a
// per-thread cache of encoded maps.
//
// Encoding a map costs host time on every call, and the contract gives an op
// 5 us in all; a map depends only on its description (address, sizes,
// strides, box), so each host thread keeps the maps it encoded in a small
// direct-mapped table per op: a layer's weight or KV cache, and an activation
// that the caching allocator hands back at the same address, hit it after
// their first call.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cstring>

#include "launch.cuh"

namespace muse_decode::tma {

// L2 promotion of a stream that every launch reads once, in full (a layer's
// weights, x): none (H200, qkv_front TP1 T = 1: 74.2 us against 78.4 with
// 256 B).
inline constexpr CUtensorMapL2promotion kStreamPromotion = CU_TENSOR_MAP_L2_PROMOTION_NONE;
// Of a paged KV cache's page boxes (2 KB of one page's K or V): 256 B.
inline constexpr CUtensorMapL2promotion kPagePromotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;

// What a map depends on: a bf16 tensor of `rank` dimensions (innermost
// first), its strides in bytes (of dimensions 1 ..), the box read per copy
// and the L2 promotion. Zero-initialised, so that two descriptions of one map
// compare equal byte for byte.
struct MapDesc {
  const void* data = nullptr;
  uint32_t rank = 0;
  CUtensorMapL2promotion promotion = kStreamPromotion;
  cuuint64_t dims[5] = {};
  cuuint64_t strides[4] = {};
  cuuint32_t box[5] = {};

  bool operator==(const MapDesc& o) const { return std::memcmp(this, &o, sizeof *this) == 0; }
};

// A bf16 tensor of R dimensions (innermost first): its sizes, the strides in
// bytes of dimensions 1 .. R - 1, and the box a copy reads.
template <int R>
MapDesc bf16_tiled(const void* data, const cuuint64_t (&dims)[R], const cuuint64_t (&strides)[R - 1],
                   const cuuint32_t (&box)[R], CUtensorMapL2promotion promotion) {
  static_assert(R >= 2 && R <= 5, "cuTensorMapEncodeTiled takes 1 to 5 dimensions; these maps 2 to 5");
  MapDesc d;
  d.data = data;
  d.rank = R;
  d.promotion = promotion;
  for (int i = 0; i < R; ++i) d.dims[i] = dims[i], d.box[i] = box[i];
  for (int i = 0; i < R - 1; ++i) d.strides[i] = strides[i];
  return d;
}

// A bf16 row-major matrix [rows, cols] (row_stride elements between rows)
// read in boxes of box_rows rows x 64 columns (128 bytes: the swizzle's
// span); rows past `rows` read as zeros.
inline MapDesc bf16_rows(const void* data, int64_t rows, int64_t cols, int64_t row_stride, int box_rows,
                         CUtensorMapL2promotion promotion = kStreamPromotion) {
  return bf16_tiled<2>(data, {static_cast<cuuint64_t>(cols), static_cast<cuuint64_t>(rows)},
                       {static_cast<cuuint64_t>(row_stride) * 2}, {64, static_cast<cuuint32_t>(box_rows)}, promotion);
}

// Whether the driver has the encoder (prepare_<op> refuses a device without it).
inline bool encoder_available() { return detail::encode_tiled_fn() != nullptr; }

// Encodes d into *map; false where the driver lacks the encoder or refuses d.
inline bool encode(CUtensorMap* map, const MapDesc& d) {
  const auto encode_tiled = detail::encode_tiled_fn();
  if (!encode_tiled) return false;
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  return encode_tiled(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, d.rank, const_cast<void*>(d.data), d.dims, d.strides,
                      d.box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, d.promotion,
                      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The map of d, from this host thread's table of 2^kBits entries for `Site`
// (one table per op: a tag type of its own), encoded on a miss.
template <typename Site, int kBits>
bool cached(CUtensorMap* map, const MapDesc& d) {
  struct Entry {
    MapDesc desc;
    bool valid = false;
    CUtensorMap map;
  };
  thread_local Entry table[1 << kBits];
  uint64_t h = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(d.data)) >> 8;
  for (const cuuint64_t x : d.dims) h = (h ^ x) * 0x9E3779B97F4A7C15ull;
  for (const cuuint32_t x : d.box) h = (h ^ x) * 0x9E3779B97F4A7C15ull;
  h ^= d.strides[0] * 0x9E3779B97F4A7C15ull;
  Entry& e = table[h >> (64 - kBits)];
  if (e.valid && e.desc == d) {
    *map = e.map;
    return true;
  }
  if (!encode(map, d)) return false;
  e.desc = d;
  e.valid = true;
  e.map = *map;
  return true;
}

}  // namespace muse_decode::tma
