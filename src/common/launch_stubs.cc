// A build without CUDA keeps the whole host API (checks, sizing, references)
// and answers every launch with "not supported".
#ifndef MUSE_DECODE_WITH_CUDA
#include "muse_decode/route.h"

namespace muse_decode {

constexpr int kNotSupported = 801;  // cudaErrorNotSupported

int launch_route(const RouteParams&, Stream) { return kNotSupported; }

}  // namespace muse_decode
#endif
