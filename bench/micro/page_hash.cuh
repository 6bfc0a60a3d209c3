// The page picker of tma_rate.cu: a 32-bit integer hash (xorshift-multiply,
// two rounds), so that a CTA's tiles land on pages spread over the whole cache
// rather than on consecutive addresses.
#pragma once

#include <cstdint>

__device__ __forceinline__ uint32_t hash(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}
