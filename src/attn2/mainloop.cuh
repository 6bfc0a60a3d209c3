// The interface attn2's two key loops share (mainloop_sm90.cuh: TMA and
// wgmma; mainloop_mma.cuh: cp.async.bulk and mma.sync), which the kernel
// composes without knowing which one it holds. The compiler checks it
// (is_mainloop below).
//
// A Mainloop is built from a MainloopSetup, in every thread; then:
//   M::init_barriers(setup) (thread 0, before the CTA's first barrier) the stages' barriers
//   start(in, rows, d, split, head_y, rank, req, trace) -> bool
//                          L, the schedule, the first copies around
//                          griddepcontrol.wait, this thread's Q and gate (in);
//                          false where the cluster has no keys (it leaves)
//   stage_q(q)             this thread's Q chunks into the Q tile
//   publish_q()            the Q tile made visible to the loop's readers
//   run(state, trace)      every tile of this thread's half into state
//   bad_page() -> bool     a page id of this thread's copies was outside the cache
//   broken() -> bool       L breaks the contract (outside [8, max_model_len])
//   early_push() -> bool   every loop of the cluster is short: its rows may be pushed before the loop
//   active() -> int        slices in use for this L
//   slice() -> int         this cluster's slice
//   kv_head() -> int       this cluster's KV head
#pragma once

#include <cuda.h>

#include <type_traits>
#include <utility>

#include "../common/trace.cuh"
#include "config.cuh"
#include "params.h"
#include "rows.cuh"
#include "schedule.cuh"
#include "softmax.cuh"

namespace muse_decode::attn2_impl {

// What a key loop is built from.
struct MainloopSetup {
  const CUtensorMap* kv_map;  // the cache's 5-D tensor map (the TMA loop's copies)
  const Params& p;
  uint8_t* smem;              // the dynamic shared memory: the stages, then the Q tile
  uint64_t* full;             // [kBarriers]: a stage's copies landed
  uint64_t* empty;            // [kBarriers]: a stage's consumers are done with it
  uint64_t* tail;             // [kKeyHalves]: (the TMA loop's) a half's warps zeroed a tile's V rows past L
  int window;                 // the launch's window (0 in kernels built without one)
  int req;                    // this CTA's request
};

template <typename M, int kCluster, typename = void>
struct is_mainloop : std::false_type {};

template <typename M, int kCluster>
struct is_mainloop<
    M, kCluster,
    std::void_t<decltype(M(std::declval<const MainloopSetup&>())), decltype(M::init_barriers(std::declval<const MainloopSetup&>())),
                decltype(std::declval<M&>().start(std::declval<RowInputs<kCluster>&>(),
                                                  std::declval<const RowOwner<kCluster>&>(),
                                                  std::declval<const Deployment&>(), 0, 0, 0, 0,
                                                  std::declval<trace::Recorder<Phase>&>())),
                decltype(std::declval<const M&>().stage_q(std::declval<const uint4 (&)[2]>())),
                decltype(std::declval<const M&>().publish_q()),
                decltype(std::declval<M&>().run(std::declval<SoftmaxState&>(),
                                                std::declval<trace::Recorder<Phase>&>())),
                decltype(std::declval<const M&>().bad_page()), decltype(std::declval<const M&>().broken()),
                decltype(std::declval<const M&>().early_push()), decltype(std::declval<const M&>().active()),
                decltype(std::declval<const M&>().slice()), decltype(std::declval<const M&>().kv_head())>>
    : std::bool_constant<
          std::is_same_v<decltype(std::declval<M&>().start(std::declval<RowInputs<kCluster>&>(),
                                                           std::declval<const RowOwner<kCluster>&>(),
                                                           std::declval<const Deployment&>(), 0, 0, 0, 0,
                                                           std::declval<trace::Recorder<Phase>&>())),
                         bool> &&
          std::is_same_v<decltype(std::declval<const M&>().bad_page()), bool> &&
          std::is_same_v<decltype(std::declval<const M&>().broken()), bool> &&
          std::is_same_v<decltype(std::declval<const M&>().early_push()), bool> &&
          std::is_same_v<decltype(std::declval<const M&>().active()), int> &&
          std::is_same_v<decltype(std::declval<const M&>().slice()), int> &&
          std::is_same_v<decltype(std::declval<const M&>().kv_head()), int>> {};

}  // namespace muse_decode::attn2_impl
