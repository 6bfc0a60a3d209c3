// One 8-page group of keys in the mma.sync key loop (mainloop_mma.cuh) and in
// attention_block's attention phase: its copies into a stage (copy_group),
// then its step through the online softmax (group_step): S = Q K^T with
// mma.sync m16n8k16, the masks of the group's keys past a row's position or
// below its window, the state's max, sum and rescale, then O += P V.
//
// The group sits in shared memory as 8 page slots kSlotBytes apart (one per
// bank group, kSlotBytes = 4096 + 16); warps w and w + 4 (kh 0 and 1) own
// rows w * 16 .. of the 64 and take keys 0-7 and 8-15 of every page. One 8x8
// ldmatrix matrix takes key t of each of the 8 pages, so an mma's n (for S)
// or k (for P V) index is the page within the group.
#pragma once

#include <cstdint>

#include "../common/ptx.cuh"
#include "config.cuh"
#include "softmax.cuh"

namespace muse_decode::attn2_impl {

// (Warp 0) the group's copies into fill `at` of the ring: lane l < 8 copies
// the group's page l of one KV head (id: its page id) into page slot l where
// the lane wants it (the page holds visible keys) and its id lies in the
// cache; the stage's full barrier expects the copies' bytes. bad gathers the
// wanted pages whose ids lie outside the cache (a contract break).
template <typename Ring, typename Position>
__device__ __forceinline__ void copy_group(const Ring& ring, Position at, int id, bool want, int num_pages,
                                           const char* kv, int64_t page_pitch, uint64_t policy, int lane, bool& bad) {
  const bool ok = want && id >= 0 && id < num_pages;
  bad |= want && !ok;
  const uint32_t ok_mask = __ballot_sync(0xFFFFFFFFu, ok);
  if (lane == 0) ring.arm(at, __popc(ok_mask) * kPageBytes);
  __syncwarp();
  if (ok)
    ptx::bulk_copy_g2s(ring.stage_addr(at) + lane * kSlotBytes, kv + id * page_pitch, kPageBytes, ring.full_bar(at),
                       policy);
}

// q_addr: this lane's ldmatrix row of the warp's m16k16 Q fragments; slot:
// page slot lane % 8 of the group's stage; key0: the group's first key; pos:
// this thread's rows' position; slot_lo: the page slots of this thread's S
// columns (slot_lo, slot_lo + 1); masked: the group holds keys past row 0's
// position or below row 7's window (uniform per group).
__device__ __forceinline__ void group_step(SoftmaxState& st, uint32_t q_addr, uint32_t slot, int key0, bool masked,
                                           int len, int pos, int slot_lo, int window, int kh, int lane) {
  // S = Q K^T: n-tile t is key kh * kKeyTiles + t of the 8 pages; column n = page slot.
  // k-step outer: one Q fragment (4 registers) live at a time.
  float s[kKeyTiles][4];
#pragma unroll
  for (int t = 0; t < kKeyTiles; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.0f;
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    uint32_t qf[4];
    ptx::ldmatrix_x4(qf, q_addr + ks * 32);
    // Matrices: (key 2tp, dims 16ks..), (key 2tp, dims 16ks + 8..), then key 2tp + 1.
    const uint32_t krow = slot + (lane / 16) * kKeyBytes + (2 * ks + (lane / 8) % 2) * 16;
#pragma unroll
    for (int tp = 0; tp < kKeyTiles / 2; ++tp) {
      uint32_t b[4];
      ptx::ldmatrix_x4(b, krow + (kh * kKeyTiles + 2 * tp) * kKeyBytes);
      ptx::mma_m16n8k16_bf16(s[2 * tp], qf, b[0], b[1]);
      ptx::mma_m16n8k16_bf16(s[2 * tp + 1], qf, b[2], b[3]);
    }
  }
  if (masked)
    mask_tile(s, [&](int t, int e) { return key0 + (slot_lo + (e & 1)) * kPageSize + kh * kKeyTiles + t; }, pos,
              window);
  float alpha[2];
  online_softmax(s, st.m, st.l, alpha);
  rescale(st.o, alpha);
  // O += P V: k-step kk covers keys 2kk (k 0..7 = slots) and 2kk + 1 (k 8..15).
#pragma unroll
  for (int lk = 0; lk < kKeyTiles / 2; ++lk) {
    const int kk = kh * (kKeyTiles / 2) + lk;
    const uint32_t a[4] = {ptx::pack_bf16(s[2 * lk][0], s[2 * lk][1]), ptx::pack_bf16(s[2 * lk][2], s[2 * lk][3]),
                           ptx::pack_bf16(s[2 * lk + 1][0], s[2 * lk + 1][1]),
                           ptx::pack_bf16(s[2 * lk + 1][2], s[2 * lk + 1][3])};
    // Matrices: (key 2kk, dims 8c..), (key 2kk + 1, dims 8c..), then dims 8c + 8.
    const uint32_t vrow = slot + (2 * kk + (lane / 8) % 2) * kKeyBytes + kHeadDim * 2 + (lane / 16) * 16;
#pragma unroll
    for (int cp = 0; cp < 4; ++cp) {
      uint32_t v[4];
      ptx::ldmatrix_x4_trans(v, vrow + cp * 32);
      if (masked) {
        // Keys past L may hold anything (NaN): P is 0 there, but 0 * NaN is not.
        // This lane holds slots slot_lo (low half) and slot_lo + 1 (high half).
        const int j_lo = key0 + slot_lo * kPageSize + 2 * kk;
        const uint32_t keep0 = (j_lo < len ? 0x0000FFFFu : 0u) | (j_lo + kPageSize < len ? 0xFFFF0000u : 0u);
        const uint32_t keep1 = (j_lo + 1 < len ? 0x0000FFFFu : 0u) | (j_lo + 1 + kPageSize < len ? 0xFFFF0000u : 0u);
        v[0] &= keep0;
        v[2] &= keep0;
        v[1] &= keep1;
        v[3] &= keep1;
      }
      ptx::mma_m16n8k16_bf16(st.o[2 * cp], a, v[0], v[1]);
      ptx::mma_m16n8k16_bf16(st.o[2 * cp + 1], a, v[2], v[3]);
    }
  }
}

}  // namespace muse_decode::attn2_impl
