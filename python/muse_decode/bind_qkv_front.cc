// Python binding of qkv_front: translation only (tensors to views, integers
// to ints, errors to ValueError / RuntimeError); the checks live in
// src/qkv_front/qkv_front_host.cc.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "muse_decode/qkv_front.h"
#include "layer_descs.h"
#include "tensor_args.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace muse_decode::python {

namespace {
QkvFrontArgs qkv_front_args(nb::handle x, nb::handle weight, nb::handle positions, nb::handle cos_sin,
                            nb::handle slot_mapping, nb::handle kv_cache, nb::handle num_kv_heads, nb::handle out,
                            nb::handle workspace, nb::handle pdl) {
  QkvFrontArgs a;
  a.x = tensor_ref(x, "x");
  a.weight = tensor_ref(weight, "weight");
  a.positions = tensor_ref(positions, "positions");
  a.cos_sin = tensor_ref(cos_sin, "cos_sin");
  a.slot_mapping = tensor_ref(slot_mapping, "slot_mapping");
  a.kv_cache = tensor_ref(kv_cache, "kv_cache");
  a.num_kv_heads = int_arg(num_kv_heads, "num_kv_heads");
  a.out = tensor_ref(out, "out");
  a.workspace = tensor_ref(workspace, "workspace");
  a.pdl = bool_arg(pdl, "pdl");
  return a;
}

// The C++ bound form and the Python objects it views, kept alive with it.
struct BoundQkvFront {
  nb::object weight_obj, cos_sin_obj, kv_cache_obj, workspace_obj;
  QkvFront op;
};
}  // namespace

ProjectionDesc projection_desc(nb::handle quantized, nb::handle has_bias, nb::handle gather_output, nb::handle tp_size,
                               nb::handle weight, nb::handle num_heads, nb::handle num_kv_heads, nb::handle head_dim,
                               nb::handle use_rope, nb::handle rotary_present, nb::handle rotary_dim,
                               nb::handle is_neox_style, nb::handle cos_sin) {
  ProjectionDesc d;
  d.quantized = truth_arg(quantized, "quantized");
  d.has_bias = truth_arg(has_bias, "has_bias");
  d.gather_output = truth_arg(gather_output, "attn.qkv_proj.gather_output");
  d.tp_size = int_arg(tp_size, "attn.qkv_proj.tp_size");
  d.weight = tensor_ref(weight, "attn.qkv_proj.weight");
  d.num_heads = int_arg(num_heads, "attn.num_heads");
  d.num_kv_heads = int_arg(num_kv_heads, "attn.num_kv_heads");
  d.head_dim = int_arg(head_dim, "attn.head_dim");
  d.use_rope = truth_arg(use_rope, "attn.use_rope");
  d.rotary.present = truth_arg(rotary_present, "rotary_present");
  d.rotary.rotary_dim = int_arg(rotary_dim, "attn.rotary_emb.rotary_dim");
  d.rotary.is_neox_style = truth_arg(is_neox_style, "attn.rotary_emb.is_neox_style");
  d.rotary.cos_sin = tensor_ref(cos_sin, "attn.rotary_emb.cos_sin_cache");
  return d;
}

void bind_qkv_front(nb::module_& m) {
  m.def(
      "qkv_front_supports_shape",
      [](nb::handle n, nb::handle num_kv_heads) {
        return qkv_front_supports_shape(int_arg(n, "n"), int_arg(num_kv_heads, "num_kv_heads"));
      },
      nb::sig("def qkv_front_supports_shape(n: int, num_kv_heads: int) -> bool"), "n"_a.none(), "num_kv_heads"_a.none(),
      "qkv_front's shape check (supports_shape, the seed's name, is this function): whether qkv_front\n"
      "serves a [q | k | v | gate] projection of width n for num_kv_heads KV heads (False for any other\n"
      "pair of integers; ValueError naming an argument that is not an integer in int32).");
  m.def(
      "qkv_front_workspace_bytes",
      [](nb::handle num_kv_heads, nb::handle sm_count) {
        return qkv_front_workspace_bytes(int_arg(num_kv_heads, "num_kv_heads"), int_arg(sm_count, "sm_count"));
      },
      nb::sig("def qkv_front_workspace_bytes(num_kv_heads: int, sm_count: int) -> int"), "num_kv_heads"_a.none(),
      "sm_count"_a.none(),
      "Bytes of the workspace a launch for num_kv_heads needs on a GPU of sm_count multiprocessors; zero it\n"
      "once when allocating it.");
  m.def(
      "qkv_front_workspace_bytes_for_device",
      [](nb::handle num_kv_heads, nb::handle device) {
        return qkv_front_workspace_bytes_for_device(int_arg(num_kv_heads, "num_kv_heads"), int_arg(device, "device"));
      },
      nb::sig("def qkv_front_workspace_bytes_for_device(num_kv_heads: int, device: int = -1) -> int"),
      "num_kv_heads"_a.none(), "device"_a.none() = -1,
      "qkv_front_workspace_bytes for CUDA device `device` (-1: the current one). ValueError without such a\n"
      "device.");
  m.def(
      "prepare_qkv_front", [](nb::handle device) { prepare_qkv_front(int_arg(device, "device")); },
      nb::sig("def prepare_qkv_front(device: int = -1) -> None"), "device"_a.none() = -1,
      "One-time setup of CUDA device `device` (-1: the current one) for qkv_front (kernel attributes, the\n"
      "tensor-map encoder), outside graph capture. ValueError on a GPU the kernels were not built for,\n"
      "RuntimeError when the CUDA runtime refuses the setup.");
  m.def(
      "unsupported_projection",
      [](nb::handle quantized, nb::handle has_bias, nb::handle gather_output, nb::handle tp_size, nb::handle weight,
         nb::handle num_heads, nb::handle num_kv_heads, nb::handle head_dim, nb::handle use_rope,
         nb::handle rotary_present, nb::handle rotary_dim, nb::handle is_neox_style, nb::handle cos_sin) {
        return reason_or_check(
            [&] {
              return projection_desc(quantized, has_bias, gather_output, tp_size, weight, num_heads, num_kv_heads,
                                     head_dim, use_rope, rotary_present, rotary_dim, is_neox_style, cos_sin);
            },
            [](const ProjectionDesc& d) { return unsupported_projection(d); });
      },
      nb::sig("def unsupported_projection(quantized: bool, has_bias: bool, gather_output: bool, tp_size: int, weight: "
              "torch.Tensor | None, num_heads: int, num_kv_heads: int, head_dim: int, use_rope: bool, rotary_present: "
              "bool, rotary_dim: int, is_neox_style: bool, cos_sin: torch.Tensor | None) -> str | None"),
      "quantized"_a.none(), "has_bias"_a.none(), "gather_output"_a.none(), "tp_size"_a.none(), "weight"_a.none(),
      "num_heads"_a.none(), "num_kv_heads"_a.none(), "head_dim"_a.none(), "use_rope"_a.none(),
      "rotary_present"_a.none(), "rotary_dim"_a.none(), "is_neox_style"_a.none(), "cos_sin"_a.none());
  m.def(
      "qkv_front_columns",
      [](nb::handle num_kv_heads) {
        const QkvColumns c = qkv_front_columns(int_arg(num_kv_heads, "num_kv_heads"));
        return nb::make_tuple(c.k, c.v, c.gate, c.width);
      },
      nb::sig("def qkv_front_columns(num_kv_heads: int) -> tuple[int, int, int, int]"), "num_kv_heads"_a.none(),
      "Where k, v and gate start in qkv_front's output rows [q | k | v | gate], and the row width, for\n"
      "num_kv_heads KV heads (1, 2, 4, 8 or 16; ValueError otherwise).");
  m.def(
      "unsupported_qkv_front_call",
      [](nb::handle x, nb::handle weight, nb::handle positions, nb::handle cos_sin, nb::handle slot_mapping,
         nb::handle kv_cache, nb::handle num_kv_heads, nb::handle out, nb::handle workspace, nb::handle pdl) {
        return reason_or_check(
            [&] {
              return qkv_front_args(x, weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads, out, workspace,
                                    pdl);
            },
            [](const QkvFrontArgs& a) { return unsupported_qkv_front_call(a); });
      },
      nb::sig("def unsupported_qkv_front_call(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, cos_sin: "
              "torch.Tensor | None, slot_mapping: torch.Tensor, kv_cache: torch.Tensor, num_kv_heads: int, out: "
              "torch.Tensor | None = None, workspace: torch.Tensor | None = None, pdl: bool = True) -> str | None"),
      "x"_a.none(), "weight"_a.none(), "positions"_a.none(), "cos_sin"_a.none(), "slot_mapping"_a.none(),
      "kv_cache"_a.none(), "num_kv_heads"_a.none(), "out"_a.none() = nb::none(), "workspace"_a.none() = nb::none(),
      "pdl"_a.none() = true,
      "Why qkv_front does not take this call (the argument, the expected and the actual value: the text\n"
      "qkv_front raises), or None; an argument of any type gets a reason, never an exception. Without out\n"
      "and workspace, the check of everything else.");
  m.def(
      "qkv_front_supports_call",
      [](nb::handle x, nb::handle weight, nb::handle positions, nb::handle cos_sin, nb::handle slot_mapping,
         nb::handle kv_cache, nb::handle num_kv_heads, nb::handle out, nb::handle workspace, nb::handle pdl) {
        return !reason_or_check(
            [&] {
              return qkv_front_args(x, weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads, out, workspace,
                                    pdl);
            },
            [](const QkvFrontArgs& a) { return unsupported_qkv_front_call(a); });
      },
      nb::sig("def qkv_front_supports_call(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, cos_sin: "
              "torch.Tensor | None, slot_mapping: torch.Tensor, kv_cache: torch.Tensor, num_kv_heads: int, out: "
              "torch.Tensor | None = None, workspace: torch.Tensor | None = None, pdl: bool = True) -> bool"),
      "x"_a.none(), "weight"_a.none(), "positions"_a.none(), "cos_sin"_a.none(), "slot_mapping"_a.none(),
      "kv_cache"_a.none(), "num_kv_heads"_a.none(), "out"_a.none() = nb::none(), "workspace"_a.none() = nb::none(),
      "pdl"_a.none() = true,
      "qkv_front's call check (supports_call, the seed's name, is this function): whether qkv_front takes\n"
      "this call of a layer with num_kv_heads (unsupported_qkv_front_call gives None); otherwise the caller\n"
      "keeps the unfused path. With out and workspace, the full check before qkv_front.");
  m.def(
      "qkv_front",
      [](nb::handle x, nb::handle weight, nb::handle positions, nb::handle cos_sin, nb::handle slot_mapping,
         nb::handle kv_cache, nb::handle num_kv_heads, nb::handle out, nb::handle workspace, nb::handle pdl) {
        const QkvFrontArgs a =
            qkv_front_args(x, weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads, out, workspace, pdl);
        qkv_front(a, current_stream(a.x.device));
        return nb::borrow(out);
      },
      nb::sig("def qkv_front(x: torch.Tensor, weight: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor | "
              "None, slot_mapping: torch.Tensor, kv_cache: torch.Tensor, num_kv_heads: int, out: torch.Tensor, "
              "workspace: torch.Tensor, pdl: bool = True) -> torch.Tensor"),
      "x"_a.none(), "weight"_a.none(), "positions"_a.none(), "cos_sin"_a.none(), "slot_mapping"_a.none(),
      "kv_cache"_a.none(), "num_kv_heads"_a.none(), "out"_a.none(), "workspace"_a.none(), "pdl"_a.none() = true,
      "out = [q | k | v | gate] of x W^T with q and k RMS-normed per head (and roped when cos_sin is given),\n"
      "k and v inserted into kv_cache at slot_mapping (-1: no insert), on torch's current stream\n"
      "(programmatic dependent launch unless pdl=False). ValueError naming the argument on bad input, or\n"
      "before prepare_qkv_front on the device, before any launch. Returns out. launch_qkv_front (the seed's\n"
      "name) is this function.");

  nb::class_<BoundQkvFront>(m, "QkvFront",
                            "qkv_front bound to a layer's weight, rotary table (or None), KV cache, KV-head count\n"
                            "and workspace, checked once here, where the weight's device is prepared\n"
                            "(prepare_qkv_front). A call reads only x, positions, slot_mapping and out. Keep the\n"
                            "bound tensors' storage in place (as a CUDA graph would); bind again after replacing\n"
                            "one.")
      .def(
          "__init__",
          [](BoundQkvFront* self, nb::handle weight, nb::handle cos_sin, nb::handle kv_cache, nb::handle num_kv_heads,
             nb::handle workspace) {
            new (self) BoundQkvFront{
                nb::borrow(weight), nb::borrow(cos_sin), nb::borrow(kv_cache), nb::borrow(workspace),
                QkvFront(tensor_ref(weight, "weight"), tensor_ref(cos_sin, "cos_sin"), tensor_ref(kv_cache, "kv_cache"),
                         int_arg(num_kv_heads, "num_kv_heads"), tensor_ref(workspace, "workspace"))};
          },
          nb::sig("def __init__(self, weight: torch.Tensor, cos_sin: torch.Tensor | None, kv_cache: torch.Tensor, "
                  "num_kv_heads: int, workspace: torch.Tensor) -> None"),
          "weight"_a.none(), "cos_sin"_a.none(), "kv_cache"_a.none(), "num_kv_heads"_a.none(), "workspace"_a.none())
      .def(
          "__call__",
          [](const BoundQkvFront& f, nb::handle x, nb::handle positions, nb::handle slot_mapping, nb::handle out,
             nb::handle pdl) {
            const QkvFrontArgs a =
                f.op.args(tensor_ref(x, "x"), tensor_ref(positions, "positions"),
                          tensor_ref(slot_mapping, "slot_mapping"), tensor_ref(out, "out"), bool_arg(pdl, "pdl"));
            qkv_front(a, current_stream(a.x.device));
            return nb::borrow(out);
          },
          nb::sig("def __call__(self, x: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor, out: "
                  "torch.Tensor, pdl: bool = True) -> torch.Tensor"),
          "x"_a.none(), "positions"_a.none(), "slot_mapping"_a.none(), "out"_a.none(), "pdl"_a.none() = true,
          "qkv_front with the bound tensors, on torch's current stream. Returns out.");
}

}  // namespace muse_decode::python
