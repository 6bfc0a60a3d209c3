// o_proj host layer: the supported widths, the output-projection check, the
// per-call argument checks that guard the launch, the device setup, the
// launch and the bound form.
#include <cstdint>
#include <stdexcept>
#include <utility>

#include "../common/checks.h"
#include "../common/hardware.h"
#include "muse_decode/arch.h"
#include "muse_decode/o_proj.h"
#include "params.h"

namespace muse_decode {

using detail::cat;
using detail::fail;
using detail::fail_expected;
using detail::require_contiguous;
using detail::require_rows16;
using detail::require_tensor;

namespace {

// Prepared devices (nothing to remember beyond that they are).
struct OProjDevice {
  bool ready = false;
};
detail::PerDevice<OProjDevice> g_prepared;

constexpr const char* kWidths = "one of 512, 1024, 2048, 4096, 8192 (8 * num_kv_heads * 64)";

}  // namespace

// The layer's weight (what OProj binds), for input width k (k < 0: any
// supported width) on `device` (< 0: the weight decides it); attention_block
// checks its own with it (params.h).
void o_proj_impl::check_weight(const TensorRef& w, std::string_view name, int64_t k, std::string_view k_source,
                               int device) {
  require_tensor(w, name, DType::kBFloat16, device);
  if (k >= 0) {
    if (w.ndim != 2 || w.shape[0] != kOProjOutWidth || w.shape[1] != k)
      fail_expected(name, cat("[", kOProjOutWidth, ", ", k, "] ", k_source), w.shape_str());
  } else if (w.ndim != 2 || w.shape[0] != kOProjOutWidth || !o_proj_supports_in_width(w.shape[1])) {
    fail_expected(name, cat("[", kOProjOutWidth, ", K] with K ", kWidths), w.shape_str());
  }
  require_contiguous(w, name);
  detail::require_aligned(w.data, name, 16);
}

namespace {

// Every check of a call, in the order of the arguments; out only where given
// unless `complete` (check_o_proj).
o_proj_impl::Params check_call(const OProjArgs& a, bool complete) {
  // x decides the device, the number of tokens and K.
  const TensorRef& x = a.x;
  require_tensor(x, "x", DType::kBFloat16, -1);
  const int dev = x.device;
  if (x.ndim != 2 || x.shape[0] < 1 || x.shape[0] > kOProjMaxTokens || !o_proj_supports_in_width(x.shape[1]))
    fail_expected("x", cat("[T, K] with 1 <= T <= ", kOProjMaxTokens, " and K ", kWidths), x.shape_str());
  const int64_t T = x.shape[0], K = x.shape[1];
  require_rows16(x, "x", K);
  o_proj_impl::check_weight(a.weight, "weight", K, "(x's width)", dev);

  const TensorRef& out = a.out;
  const bool with_out = complete || out.present();
  if (with_out) {
    require_tensor(out, "out", DType::kBFloat16, dev);
    if (out.ndim != 2 || out.shape[0] != T || out.shape[1] != kOProjOutWidth)
      fail_expected("out", cat("[", T, ", ", kOProjOutWidth, "] (tokens of x, hidden size)"), out.shape_str());
    require_rows16(out, "out", kOProjOutWidth);
    detail::require_disjoint(out, "out", x, "x");
    detail::require_disjoint(out, "out", a.weight, "weight");
  }

  o_proj_impl::Params p;
  p.x = x.data;
  p.x_stride = T > 1 ? x.stride[0] : K;
  p.weight = a.weight.data;
  if (with_out) {
    p.out = out.data;
    p.out_stride = T > 1 ? out.stride[0] : kOProjOutWidth;
  }
  p.num_tokens = static_cast<int>(T);
  p.in_width = static_cast<int>(K);
  p.pdl = a.pdl;
  return p;
}

}  // namespace

bool o_proj_supports_in_width(int64_t k) {
  for (int kvh : {1, 2, 4, 8, 16})
    if (k == o_proj_in_width(kvh)) return true;
  return false;
}

std::optional<std::string> unsupported_o_proj(const OutProjectionDesc& a) {
  if (a.quantized) return std::string("a quantized output projection (o_proj reads an unquantized bf16 weight)");
  if (a.has_bias) return std::string("an output projection with a bias (o_proj adds none)");
  if (!a.input_is_parallel && a.tp_size > 1)
    return cat("an output projection whose input is not parallel over TP ", a.tp_size,
               " (o_proj reads this rank's attention output as it is)");
  if (a.head_dim != kHeadDim) return cat("head_dim ", a.head_dim, " (o_proj is built for ", kHeadDim, ")");
  const int64_t k = int64_t{a.num_heads} * a.head_dim;
  if (!o_proj_supports_in_width(k))
    return cat(a.num_heads, " query heads per rank (o_proj serves 8, 16, 32, 64 or 128: K ", kWidths, ")");
  const TensorRef& w = a.weight;
  if (!w.present() || w.data == nullptr) return std::string("no output-projection weight");
  if (w.dtype != DType::kBFloat16)
    return cat("a ", dtype_name(w.dtype), " output-projection weight (o_proj reads bfloat16)");
  if (w.ndim != 2 || w.shape[0] != kOProjOutWidth || w.shape[1] != k)
    return cat("an output-projection weight of shape ", w.shape_str(), " (o_proj reads [", kOProjOutWidth, ", ", k,
               "] for ", a.num_heads, " query heads)");
  if (!w.contiguous()) return std::string("a non-contiguous output-projection weight");
  if (reinterpret_cast<uintptr_t>(w.data) % 16)
    return std::string("an output-projection weight not 16-byte aligned (o_proj reads it with TMA)");
  if (w.device < 0) return std::string("an output-projection weight in host memory");
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// Per-call checks.
std::optional<std::string> unsupported_o_proj_call(const OProjArgs& args) {
  return detail::reason_of([&] { check_call(args, false); });
}

bool o_proj_supports_call(const OProjArgs& args) { return !unsupported_o_proj_call(args); }

void check_o_proj(const OProjArgs& args) { check_call(args, true); }

o_proj_impl::Params o_proj_impl::params_of(const OProjArgs& args) { return check_call(args, true); }

// ---------------------------------------------------------------------------
// Device setup and launch.
void prepare_o_proj(int device) {
  detail::prepare_device(g_prepared, "o_proj", device, [](int) {
    detail::throw_if_cuda_error(o_proj_impl::set_kernel_attributes(),
                                "prepare_o_proj: setting the kernel attributes");
    return OProjDevice{true};
  });
}

void o_proj(const OProjArgs& args, Stream stream) {
  const o_proj_impl::Params p = o_proj_impl::params_of(args);
  detail::require_prepared(g_prepared, "o_proj", args.x.device);
  detail::throw_if_cuda_error(o_proj_impl::launch(p, stream), "o_proj: kernel launch");
}

// ---------------------------------------------------------------------------
// The bound form: the weight is checked here, once, and decides the device.
OProj::OProj(const TensorRef& weight) : weight_(weight) {
  o_proj_impl::check_weight(weight, "weight", -1, "", -1);
  prepare_o_proj(weight.device);
}

OProjArgs OProj::args(const TensorRef& x, const TensorRef& out, bool pdl) const {
  OProjArgs a;
  a.x = x;
  a.weight = weight_;
  a.out = out;
  a.pdl = pdl;
  return a;
}

void OProj::operator()(const TensorRef& x, const TensorRef& out, Stream stream, bool pdl) const {
  o_proj(args(x, out, pdl), stream);
}

}  // namespace muse_decode

#ifndef MUSE_DECODE_WITH_CUDA
// A build without CUDA keeps the host API and answers the kernels' entries
// with cudaErrorNotSupported.
namespace muse_decode::o_proj_impl {
int launch(const Params&, Stream) { return detail::kCudaErrorNotSupported; }
int set_kernel_attributes() { return detail::kCudaErrorNotSupported; }
}  // namespace muse_decode::o_proj_impl
#endif
