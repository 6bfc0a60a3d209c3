// route's kernel as the host layer (route_host.cc) reaches it, defined in
// route.cu (in a build without CUDA, by the host layer as
// kCudaErrorNotSupported).
#pragma once

#include "muse_decode/route.h"

namespace muse_decode::detail {

// Enqueues the routing kernel (with the metadata when p.metadata is set); no
// argument checks. Returns the CUDA error as int.
int route_launch(const RouteParams& p, Stream stream);

}  // namespace muse_decode::detail
