// Python binding of attn2: translation only (tensors to views, integers to
// ints, errors to ValueError / RuntimeError); the checks and sizing live in
// src/attn2/attn2_host.cc.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "muse_decode/attn2.h"
#include "layer_descs.h"
#include "tensor_args.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace muse_decode::python {

namespace {
Attn2Args attn2_args(nb::handle q, nb::handle gate, nb::handle kv_cache, nb::handle block_table, nb::handle seq_lens,
                     nb::handle out, nb::handle workspace, nb::handle max_model_len, nb::handle window,
                     nb::handle num_splits, nb::handle pdl) {
  Attn2Args a;
  a.q = tensor_ref(q, "q");
  a.gate = tensor_ref(gate, "gate");
  a.kv_cache = tensor_ref(kv_cache, "kv_cache");
  a.block_table = tensor_ref(block_table, "block_table");
  a.seq_lens = tensor_ref(seq_lens, "seq_lens");
  a.out = tensor_ref(out, "out");
  a.workspace = tensor_ref(workspace, "workspace");
  a.max_model_len = int_arg(max_model_len, "max_model_len");
  a.window = int_arg(window, "window");
  a.num_splits = int_arg(num_splits, "num_splits");
  a.pdl = bool_arg(pdl, "pdl");
  return a;
}

// The C++ bound form and the Python objects it views, kept alive with it.
struct BoundAttn2 {
  nb::object kv_cache_obj, workspace_obj;
  Attn2 op;
};
}  // namespace

Attn2Layer attn2_layer(nb::handle use_o_norm, nb::handle use_o_gate, nb::handle head_dim, nb::handle num_heads,
                       nb::handle num_kv_heads, nb::handle scaling, nb::handle eps) {
  Attn2Layer l;
  l.use_o_norm = truth_arg(use_o_norm, "layer.use_o_norm");
  l.use_o_gate = truth_arg(use_o_gate, "layer.use_o_gate");
  l.head_dim = int_arg(head_dim, "layer.head_dim");
  l.num_heads = int_arg(num_heads, "layer.num_heads");
  l.num_kv_heads = int_arg(num_kv_heads, "layer.num_kv_heads");
  l.scaling = float_arg(scaling, "layer.scaling");
  l.rms_norm_eps = float_arg(eps, "layer.rms_norm_eps");
  return l;
}

void bind_attn2(nb::module_& m) {
  m.def(
      "attn2_window",
      [](nb::handle sliding_window, nb::handle max_model_len) {
        return attn2_window(optional_int_arg(sliding_window, "sliding_window"),
                            int_arg(max_model_len, "max_model_len"));
      },
      nb::sig("def attn2_window(sliding_window: int | None, max_model_len: int) -> int"), "sliding_window"_a.none(),
      "max_model_len"_a.none());
  m.def(
      "attn2_splits",
      [](nb::handle max_model_len, nb::handle window, nb::handle num_kv_heads) {
        return attn2_splits(int_arg(max_model_len, "max_model_len"), int_arg(window, "window"),
                            int_arg(num_kv_heads, "num_kv_heads"));
      },
      nb::sig("def attn2_splits(max_model_len: int, window: int, num_kv_heads: int) -> int"), "max_model_len"_a.none(),
      "window"_a.none(), "num_kv_heads"_a.none());
  m.def(
      "attn2_workspace_bytes",
      [](nb::handle num_reqs, nb::handle num_kv_heads, nb::handle num_splits) {
        return attn2_workspace_bytes(int_arg(num_reqs, "num_reqs"), int_arg(num_kv_heads, "num_kv_heads"),
                                     int_arg(num_splits, "num_splits"));
      },
      nb::sig("def attn2_workspace_bytes(num_reqs: int, num_kv_heads: int, num_splits: int) -> int"),
      "num_reqs"_a.none(), "num_kv_heads"_a.none(), "num_splits"_a.none());
  m.def(
      "prepare_attn2", [](nb::handle device) { prepare_attn2(int_arg(device, "device")); },
      nb::sig("def prepare_attn2(device: int = -1) -> None"), "device"_a.none() = -1,
      "One-time setup of CUDA device `device` (-1: the current one) for attn2 (kernel attributes, cluster\n"
      "size), outside graph capture. ValueError on a GPU the kernels were not built for, RuntimeError when\n"
      "the CUDA runtime refuses the setup.");
  m.def(
      "unsupported_attn2",
      [](nb::handle use_o_norm, nb::handle use_o_gate, nb::handle head_dim, nb::handle num_heads,
         nb::handle num_kv_heads, nb::handle scaling, nb::handle eps) {
        return reason_or_check(
            [&] { return attn2_layer(use_o_norm, use_o_gate, head_dim, num_heads, num_kv_heads, scaling, eps); },
            [](const Attn2Layer& l) { return unsupported_attn2(l); });
      },
      nb::sig("def unsupported_attn2(use_o_norm: bool, use_o_gate: bool, head_dim: int, num_heads: int, num_kv_heads: "
              "int, scaling: float, rms_norm_eps: float) -> str | None"),
      "use_o_norm"_a.none(), "use_o_gate"_a.none(), "head_dim"_a.none(), "num_heads"_a.none(),
      "num_kv_heads"_a.none(), "scaling"_a.none(), "rms_norm_eps"_a.none());
  m.def(
      "attn2",
      [](nb::handle q, nb::handle gate, nb::handle kv_cache, nb::handle block_table, nb::handle seq_lens,
         nb::handle out, nb::handle workspace, nb::handle max_model_len, nb::handle window, nb::handle num_splits,
         nb::handle pdl) {
        const Attn2Args a = attn2_args(q, gate, kv_cache, block_table, seq_lens, out, workspace, max_model_len, window,
                                       num_splits, pdl);
        attn2(a, current_stream(a.kv_cache.device));
        return nb::borrow(out);
      },
      nb::sig("def attn2(q: torch.Tensor, gate: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, "
              "seq_lens: torch.Tensor, out: torch.Tensor, workspace: torch.Tensor | None, max_model_len: int, window: "
              "int, num_splits: int, pdl: bool = True) -> torch.Tensor"),
      "q"_a.none(), "gate"_a.none(), "kv_cache"_a.none(), "block_table"_a.none(), "seq_lens"_a.none(), "out"_a.none(),
      "workspace"_a.none(), "max_model_len"_a.none(), "window"_a.none(), "num_splits"_a.none(), "pdl"_a.none() = true,
      "out = bf16(sigmoid(gate) * rmsnorm(softmax(scale q K^T) V)) for the 8 query rows of every request and\n"
      "every KV head of the rank, in one launch on torch's current stream (programmatic dependent launch\n"
      "unless pdl=False). seq_lens and block_table are read on the GPU, so the call is graph-capturable\n"
      "after prepare_attn2. ValueError naming the argument on bad input, or before prepare_attn2 on the\n"
      "device, before any launch. Returns out.");
  m.def(
      "unsupported_attn2_call",
      [](nb::handle q, nb::handle gate, nb::handle kv_cache, nb::handle block_table, nb::handle seq_lens,
         nb::handle out, nb::handle workspace, nb::handle max_model_len, nb::handle window, nb::handle num_splits,
         nb::handle pdl) {
        return reason_or_check(
            [&] {
              return attn2_args(q, gate, kv_cache, block_table, seq_lens, out, workspace, max_model_len, window,
                                num_splits, pdl);
            },
            [](const Attn2Args& a) { return unsupported_attn2_call(a); });
      },
      nb::sig("def unsupported_attn2_call(q: torch.Tensor, gate: torch.Tensor, kv_cache: torch.Tensor, block_table: "
              "torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor, workspace: torch.Tensor | None, max_model_len: "
              "int, window: int, num_splits: int, pdl: bool = True) -> str | None"),
      "q"_a.none(), "gate"_a.none(), "kv_cache"_a.none(), "block_table"_a.none(), "seq_lens"_a.none(), "out"_a.none(),
      "workspace"_a.none(), "max_model_len"_a.none(), "window"_a.none(), "num_splits"_a.none(), "pdl"_a.none() = true,
      "Why attn2 does not take this call (the argument, the expected and the actual value: the text attn2\n"
      "raises), or None; an argument of any type gets a reason, never an exception.");
  nb::class_<BoundAttn2>(m, "Attn2",
                         "attn2 bound to a layer's KV cache and workspace (or None when num_splits == 1) and the\n"
                         "deployment's max_model_len, window and num_splits, checked once here, where the cache's\n"
                         "device is prepared (prepare_attn2). A call reads only q, gate, block_table, seq_lens and\n"
                         "out. Keep the bound tensors' storage in place (as a CUDA graph would); bind again after\n"
                         "replacing one.")
      .def(
          "__init__",
          [](BoundAttn2* self, nb::handle kv_cache, nb::handle workspace, nb::handle max_model_len, nb::handle window,
             nb::handle num_splits) {
            new (self) BoundAttn2{nb::borrow(kv_cache), nb::borrow(workspace),
                                  Attn2(tensor_ref(kv_cache, "kv_cache"), tensor_ref(workspace, "workspace"),
                                        int_arg(max_model_len, "max_model_len"), int_arg(window, "window"),
                                        int_arg(num_splits, "num_splits"))};
          },
          nb::sig("def __init__(self, kv_cache: torch.Tensor, workspace: torch.Tensor | None, max_model_len: int, "
                  "window: int, num_splits: int) -> None"),
          "kv_cache"_a.none(), "workspace"_a.none(), "max_model_len"_a.none(), "window"_a.none(), "num_splits"_a.none())
      .def(
          "__call__",
          [](const BoundAttn2& b, nb::handle q, nb::handle gate, nb::handle block_table, nb::handle seq_lens,
             nb::handle out, nb::handle pdl) {
            const Attn2Args a =
                b.op.args(tensor_ref(q, "q"), tensor_ref(gate, "gate"), tensor_ref(block_table, "block_table"),
                          tensor_ref(seq_lens, "seq_lens"), tensor_ref(out, "out"), bool_arg(pdl, "pdl"));
            attn2(a, current_stream(a.kv_cache.device));
            return nb::borrow(out);
          },
          nb::sig("def __call__(self, q: torch.Tensor, gate: torch.Tensor, block_table: torch.Tensor, seq_lens: "
                  "torch.Tensor, out: torch.Tensor, pdl: bool = True) -> torch.Tensor"),
          "q"_a.none(), "gate"_a.none(), "block_table"_a.none(), "seq_lens"_a.none(), "out"_a.none(),
          "pdl"_a.none() = true,
          "attn2 with the bound cache, workspace and sizes, on torch's current stream. Returns out.");
}

}  // namespace muse_decode::python
