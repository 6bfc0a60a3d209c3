// Python binding of o_proj: translation only (tensors to views, integers to
// ints, errors to ValueError / RuntimeError); the checks live in
// src/o_proj/o_proj_host.cc.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "muse_decode/o_proj.h"
#include "layer_descs.h"
#include "tensor_args.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace muse_decode::python {

namespace {
OProjArgs o_proj_args(nb::handle x, nb::handle weight, nb::handle out, nb::handle pdl) {
  OProjArgs a;
  a.x = tensor_ref(x, "x");
  a.weight = tensor_ref(weight, "weight");
  a.out = tensor_ref(out, "out");
  a.pdl = bool_arg(pdl, "pdl");
  return a;
}

// The C++ bound form and the weight it views, kept alive with it.
struct BoundOProj {
  nb::object weight_obj;
  OProj op;
};
}  // namespace

OutProjectionDesc out_projection_desc(nb::handle quantized, nb::handle has_bias, nb::handle input_is_parallel,
                                      nb::handle tp_size, nb::handle num_heads, nb::handle head_dim,
                                      nb::handle weight) {
  OutProjectionDesc d;
  d.quantized = truth_arg(quantized, "quantized");
  d.has_bias = truth_arg(has_bias, "has_bias");
  d.input_is_parallel = truth_arg(input_is_parallel, "attn.o_proj.input_is_parallel");
  d.tp_size = int_arg(tp_size, "attn.o_proj.tp_size");
  d.num_heads = int_arg(num_heads, "attn.num_heads");
  d.head_dim = int_arg(head_dim, "attn.head_dim");
  d.weight = tensor_ref(weight, "attn.o_proj.weight");
  return d;
}

void bind_o_proj(nb::module_& m) {
  m.def(
      "prepare_o_proj", [](nb::handle device) { prepare_o_proj(int_arg(device, "device")); },
      nb::sig("def prepare_o_proj(device: int = -1) -> None"), "device"_a.none() = -1,
      "One-time setup of CUDA device `device` (-1: the current one) for o_proj, outside graph capture.\n"
      "ValueError on a GPU the kernels were not built for, RuntimeError when the CUDA runtime refuses the\n"
      "setup.");
  m.def(
      "unsupported_o_proj",
      [](nb::handle quantized, nb::handle has_bias, nb::handle input_is_parallel, nb::handle tp_size,
         nb::handle num_heads, nb::handle head_dim, nb::handle weight) {
        return reason_or_check(
            [&] {
              return out_projection_desc(quantized, has_bias, input_is_parallel, tp_size, num_heads, head_dim, weight);
            },
            [](const OutProjectionDesc& d) { return unsupported_o_proj(d); });
      },
      nb::sig("def unsupported_o_proj(quantized: bool, has_bias: bool, input_is_parallel: bool, tp_size: int, "
              "num_heads: int, head_dim: int, weight: torch.Tensor | None) -> str | None"),
      "quantized"_a.none(), "has_bias"_a.none(), "input_is_parallel"_a.none(), "tp_size"_a.none(),
      "num_heads"_a.none(), "head_dim"_a.none(), "weight"_a.none());
  m.def(
      "o_proj",
      [](nb::handle x, nb::handle weight, nb::handle out, nb::handle pdl) {
        const OProjArgs a = o_proj_args(x, weight, out, pdl);
        o_proj(a, current_stream(a.x.device));
        return nb::borrow(out);
      },
      nb::sig("def o_proj(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, pdl: bool = True) -> "
              "torch.Tensor"),
      "x"_a.none(), "weight"_a.none(), "out"_a.none(), "pdl"_a.none() = true,
      "out = bf16(x weight^T) for 1..64 rows (fp32 accumulation, rounded once; the same bits on every run),\n"
      "in one launch on torch's current stream: this rank's partial sum of the attention output\n"
      "projection. With pdl (the default) the weight streams while the kernel before it still runs.\n"
      "ValueError naming the argument on bad input, or before prepare_o_proj on the device, before any\n"
      "launch. Returns out.");
  m.def(
      "unsupported_o_proj_call",
      [](nb::handle x, nb::handle weight, nb::handle out, nb::handle pdl) {
        return reason_or_check([&] { return o_proj_args(x, weight, out, pdl); },
                               [](const OProjArgs& a) { return unsupported_o_proj_call(a); });
      },
      nb::sig("def unsupported_o_proj_call(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None, "
              "pdl: bool = True) -> str | None"),
      "x"_a.none(), "weight"_a.none(), "out"_a.none() = nb::none(), "pdl"_a.none() = true,
      "Why o_proj does not take this call (the argument, the expected and the actual value: the text o_proj\n"
      "raises), or None; an argument of any type gets a reason, never an exception. Without out, the check\n"
      "of everything else.");
  nb::class_<BoundOProj>(m, "OProj",
                         "o_proj bound to a layer's weight [8192, K], checked once here, where its device is\n"
                         "prepared (prepare_o_proj). A call reads only x and out. Keep the weight's storage in\n"
                         "place (as a CUDA graph would); bind again after replacing it.")
      .def(
          "__init__",
          [](BoundOProj* self, nb::handle weight) {
            new (self) BoundOProj{nb::borrow(weight), OProj(tensor_ref(weight, "weight"))};
          },
          nb::sig("def __init__(self, weight: torch.Tensor) -> None"), "weight"_a.none())
      .def(
          "__call__",
          [](const BoundOProj& b, nb::handle x, nb::handle out, nb::handle pdl) {
            const OProjArgs a = b.op.args(tensor_ref(x, "x"), tensor_ref(out, "out"), bool_arg(pdl, "pdl"));
            o_proj(a, current_stream(a.x.device));
            return nb::borrow(out);
          },
          nb::sig("def __call__(self, x: torch.Tensor, out: torch.Tensor, pdl: bool = True) -> torch.Tensor"),
          "x"_a.none(), "out"_a.none(), "pdl"_a.none() = true,
          "o_proj with the bound weight, on torch's current stream. Returns out.");
}

}  // namespace muse_decode::python
