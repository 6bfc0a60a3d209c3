// Python binding of qkv_front: translation only; the checks live in
// src/qkv_front/qkv_front_host.cc.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "muse_decode/qkv_front.h"
#include "tensor_args.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace muse_decode::python {

namespace {
// A layer's front with its static tensors bound: their attributes are read
// once, here, and the per-call path reads only x, positions, slot_mapping and
// out (SPEC section 7: validate what does not change once). Every check still
// runs on every call, on the views. The bound tensors are kept alive; their
// storage must stay where it is (as under CUDA-graph capture): bind again
// after replacing one (weight.data = ...).
struct BoundQkvFront {
  nb::object weight_obj, cos_sin_obj, kv_cache_obj, workspace_obj;
  TensorRef weight, cos_sin, kv_cache, workspace;
  int num_kv_heads = 0;
};
}  // namespace

void bind_qkv_front(nb::module_& m) {
  m.def("supports_shape", &supports_shape, "n"_a, "num_kv_heads"_a);
  m.def("qkv_front_workspace_bytes", &qkv_front_workspace_bytes_for_device, "num_kv_heads"_a, "device"_a = -1);
  m.def("prepare_qkv_front", [] {
    if (int err = prepare_qkv_front()) throw std::runtime_error("prepare_qkv_front: CUDA error " + std::to_string(err));
  });
  m.def(
      "unsupported_projection",
      [](bool quantized, bool has_bias, bool gather_output, int tp_size, nb::handle weight, int num_heads,
         int num_kv_heads, int head_dim, bool use_rope, bool rotary_present, int rotary_dim, bool is_neox_style,
         nb::handle cos_sin) {
        ProjectionDesc d;
        d.quantized = quantized;
        d.has_bias = has_bias;
        d.gather_output = gather_output;
        d.tp_size = tp_size;
        d.weight = tensor_ref(weight, "weight");
        d.num_heads = num_heads;
        d.num_kv_heads = num_kv_heads;
        d.head_dim = head_dim;
        d.use_rope = use_rope;
        d.rotary.present = rotary_present;
        d.rotary.rotary_dim = rotary_dim;
        d.rotary.is_neox_style = is_neox_style;
        d.rotary.cos_sin = tensor_ref(cos_sin, "cos_sin_cache");
        return unsupported_projection(d);
      },
      "quantized"_a, "has_bias"_a, "gather_output"_a, "tp_size"_a, "weight"_a.none(), "num_heads"_a,
      "num_kv_heads"_a, "head_dim"_a, "use_rope"_a, "rotary_present"_a, "rotary_dim"_a, "is_neox_style"_a,
      "cos_sin"_a.none());
  m.def(
      "unsupported_call",
      [](nb::handle x, nb::handle weight, nb::handle positions, nb::handle cos_sin, nb::handle slots,
         nb::handle kv_cache, int num_kv_heads, nb::handle out) {
        return unsupported_call(tensor_ref(x, "x"), tensor_ref(weight, "weight"), tensor_ref(positions, "positions"),
                                tensor_ref(cos_sin, "cos_sin"), tensor_ref(slots, "slot_mapping"),
                                tensor_ref(kv_cache, "kv_cache"), num_kv_heads, tensor_ref(out, "out"));
      },
      "x"_a, "weight"_a, "positions"_a, "cos_sin"_a.none(), "slot_mapping"_a, "kv_cache"_a, "num_kv_heads"_a,
      "out"_a.none() = nb::none());
  m.def(
      "launch_qkv_front",
      [](nb::handle x, nb::handle weight, nb::handle positions, nb::handle cos_sin, nb::handle slots,
         nb::handle kv_cache, int num_kv_heads, nb::handle out, nb::handle workspace, bool pdl) {
        const TensorRef xr = tensor_ref(x, "x");
        qkv_front(xr, tensor_ref(weight, "weight"), tensor_ref(positions, "positions"), tensor_ref(cos_sin, "cos_sin"),
                  tensor_ref(slots, "slot_mapping"), tensor_ref(kv_cache, "kv_cache"), num_kv_heads,
                  tensor_ref(out, "out"), tensor_ref(workspace, "workspace"), current_stream(xr.device), pdl);
        return nb::borrow(out);
      },
      "x"_a, "weight"_a, "positions"_a, "cos_sin_cache"_a.none(), "slot_mapping"_a, "kv_cache"_a, "num_kv_heads"_a,
      "out"_a, "workspace"_a, "pdl"_a = true,
      "out = [q | k | v | gate] of x W^T with q and k RMS-normed per head (and roped when cos_sin_cache is\n"
      "given), k and v inserted into kv_cache at slot_mapping (-1: no insert), on torch's current stream.\n"
      "ValueError naming the argument on bad input, before any launch. Returns out.");

  nb::class_<BoundQkvFront>(m, "QkvFront",
                            "qkv_front bound to a layer's weight, rotary table (or None), KV cache and workspace:\n"
                            "their attributes are read once, so a call reads only x, positions, slot_mapping and\n"
                            "out. Keep the bound tensors' storage in place (as a CUDA graph would); bind again\n"
                            "after replacing one.")
      .def(
          "__init__",
          [](BoundQkvFront* self, nb::handle weight, nb::handle cos_sin, nb::handle kv_cache, int num_kv_heads,
             nb::handle workspace) {
            auto* f = new (self) BoundQkvFront();
            f->weight = tensor_ref(weight, "weight");
            f->cos_sin = tensor_ref(cos_sin, "cos_sin_cache");
            f->kv_cache = tensor_ref(kv_cache, "kv_cache");
            f->workspace = tensor_ref(workspace, "workspace");
            f->weight_obj = nb::borrow(weight);
            f->cos_sin_obj = nb::borrow(cos_sin);
            f->kv_cache_obj = nb::borrow(kv_cache);
            f->workspace_obj = nb::borrow(workspace);
            f->num_kv_heads = num_kv_heads;
          },
          "weight"_a, "cos_sin_cache"_a.none(), "kv_cache"_a, "num_kv_heads"_a, "workspace"_a)
      .def(
          "__call__",
          [](const BoundQkvFront& f, nb::handle x, nb::handle positions, nb::handle slots, nb::handle out, bool pdl) {
            const TensorRef xr = tensor_ref(x, "x");
            qkv_front(xr, f.weight, tensor_ref(positions, "positions"), f.cos_sin, tensor_ref(slots, "slot_mapping"),
                      f.kv_cache, f.num_kv_heads, tensor_ref(out, "out"), f.workspace, current_stream(xr.device), pdl);
            return nb::borrow(out);
          },
          "x"_a, "positions"_a, "slot_mapping"_a, "out"_a, "pdl"_a = true,
          "launch_qkv_front with the bound tensors, on torch's current stream. Returns out.");
}

}  // namespace muse_decode::python
