// Tensor maps of the TMA copies, kept per host thread. Encoding one
// (cuTensorMapEncodeTiled) costs host time on every call, and the contract
// gives an op 5 us in all; a map depends only on its tensor (address, sizes,
// strides) and box, so each host thread keeps the maps it encoded in a small
// direct-mapped table: a layer's weight or KV cache, and an activation that
// the caching allocator hands back at the same address, hit it after their
// first call.
#pragma once

#include <cuda.h>

#include <cstdint>
#include <cstring>

namespace muse_decode::detail {

// What a map depends on besides the address: the sizes, strides and box
// sizes the op's encoder reads, in an order of the op's choosing.
struct TensorMapKey {
  const void* data = nullptr;
  int64_t v[6] = {};
  bool operator==(const TensorMapKey& o) const { return data == o.data && std::memcmp(v, o.v, sizeof v) == 0; }
};

// The map of `key`: from this thread's table (2^kBits entries; one table per
// call site, since Encode is its lambda), or encode(map) -> bool on a miss.
template <int kBits, typename Encode>
bool cached_tensor_map(CUtensorMap* map, const TensorMapKey& key, Encode&& encode) {
  struct Entry {
    TensorMapKey key;
    bool valid = false;
    CUtensorMap map;
  };
  thread_local Entry table[1 << kBits];
  uint64_t h = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(key.data)) >> 8;
  for (const int64_t x : key.v) h = (h ^ static_cast<uint64_t>(x)) * 0x9E3779B97F4A7C15ull;
  Entry& e = table[h >> (64 - kBits)];
  if (e.valid && e.key == key) {
    *map = e.map;
    return true;
  }
  if (!encode(map)) return false;
  e.key = key;
  e.valid = true;
  e.map = *map;
  return true;
}

}  // namespace muse_decode::detail
