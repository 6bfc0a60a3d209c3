// The muse_decode extension module: one bind_<op>() per op, plus what all
// ops share (dtype registration, the GPU-family query).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "muse_decode/arch.h"
#include "tensor_args.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace muse_decode::python {
void bind_route(nb::module_& m);
void bind_qkv_front(nb::module_& m);
void bind_attn2(nb::module_& m);
void bind_o_proj(nb::module_& m);
void bind_attention_block(nb::module_& m);
}  // namespace muse_decode::python

NB_MODULE(_C, m) {
  using namespace muse_decode;
  m.doc() = "muse-decode: fused CUDA kernels of the Muse Spark verify step";
  m.def(
      "_register_dtype",
      [](nb::handle dtype, nb::handle code) { python::register_dtype(dtype, python::int_arg(code, "code")); },
      "dtype"_a, "code"_a);
  m.def(
      "unavailable", [](nb::handle kernel) { return unavailable(python::str_arg(kernel, "kernel")); },
      nb::sig("def unavailable(kernel: str) -> str"), "kernel"_a.none(),
      "The reason a deployment whose GPUs cannot run `kernel` (\"route\", \"attn2\", \"qkv_front\", \"o_proj\" or\n"
      "\"attention_block\") is "
      "refused. ValueError for any other name.");
  m.def("built_with_cuda", &built_with_cuda);
  m.def(
      "gpu_family",
      [](nb::handle device) { return std::string(gpu_family_name(gpu_family(python::int_arg(device, "device")))); },
      nb::sig("def gpu_family(device: int = -1) -> str"), "device"_a.none() = -1);
  m.def(
      "describe_device", [](nb::handle device) { return describe_device(python::int_arg(device, "device")); },
      nb::sig("def describe_device(device: int = -1) -> str"), "device"_a.none() = -1);
  python::bind_route(m);
  python::bind_qkv_front(m);
  python::bind_attn2(m);
  python::bind_o_proj(m);
  python::bind_attention_block(m);
}
