// Python binding of attn2: translation only; the checks and sizing live in
// src/attn2/attn2_host.cc.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include "muse_decode/attn2.h"
#include "tensor_args.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace muse_decode::python {

namespace {
// What does not change between a layer's calls: its KV cache and workspace
// and the deployment's sizes.
struct Attn2Binding {
  TensorRef kv_cache, workspace;
  int max_model_len = 0, window = 0, num_splits = 1;
};

Attn2Binding attn2_binding(nb::handle kv_cache, nb::handle workspace, int max_model_len, int window,
                           int num_splits) {
  return Attn2Binding{tensor_ref(kv_cache, "kv_cache"), tensor_ref(workspace, "workspace"), max_model_len, window,
                      num_splits};
}

// One call: the step's tensors over a binding.
Attn2Args attn2_args(const Attn2Binding& b, nb::handle q, nb::handle gate, nb::handle block_table,
                     nb::handle seq_lens, nb::handle out, bool pdl) {
  Attn2Args a;
  a.q = tensor_ref(q, "q");
  a.gate = tensor_ref(gate, "gate");
  a.kv_cache = b.kv_cache;
  a.block_table = tensor_ref(block_table, "block_table");
  a.seq_lens = tensor_ref(seq_lens, "seq_lens");
  a.out = tensor_ref(out, "out");
  a.workspace = b.workspace;
  a.max_model_len = b.max_model_len;
  a.window = b.window;
  a.num_splits = b.num_splits;
  a.pdl = pdl;
  return a;
}

// attn2 bound to a layer (SPEC section 7: validate what does not change
// once): a call reads only q, gate, block_table, seq_lens and out. Every
// check still runs on every call. The bound tensors are kept alive; their
// storage must stay in place (bind again after replacing one).
struct BoundAttn2 {
  nb::object kv_cache_obj, workspace_obj;
  Attn2Binding binding;
};
}  // namespace

void bind_attn2(nb::module_& m) {
  m.def("attn2_window", &attn2_window, "sliding_window"_a.none(), "max_model_len"_a);
  m.def("attn2_splits", &attn2_splits, "max_model_len"_a, "window"_a, "num_kv_heads"_a);
  m.def("attn2_workspace_bytes", &attn2_workspace_bytes, "num_reqs"_a, "num_kv_heads"_a, "num_splits"_a);
  m.def("prepare_attn2", &prepare_attn2, "device"_a = -1);
  m.def(
      "unsupported_attn2",
      [](bool use_o_norm, bool use_o_gate, int head_dim, int num_heads, int num_kv_heads, double scaling,
         double eps) {
        Attn2Layer l;
        l.use_o_norm = use_o_norm;
        l.use_o_gate = use_o_gate;
        l.head_dim = head_dim;
        l.num_heads = num_heads;
        l.num_kv_heads = num_kv_heads;
        l.scaling = scaling;
        l.rms_norm_eps = eps;
        return unsupported_attn2(l);
      },
      "use_o_norm"_a, "use_o_gate"_a, "head_dim"_a, "num_heads"_a, "num_kv_heads"_a, "scaling"_a, "rms_norm_eps"_a);
  m.def(
      "attn2",
      [](nb::handle q, nb::handle gate, nb::handle kv_cache, nb::handle block_table, nb::handle seq_lens,
         nb::handle out, nb::handle workspace, int max_model_len, int window, int num_splits, bool pdl) {
        const Attn2Args a = attn2_args(attn2_binding(kv_cache, workspace, max_model_len, window, num_splits), q,
                                       gate, block_table, seq_lens, out, pdl);
        attn2(a, current_stream(a.q.device));
        return nb::borrow(out);
      },
      "q"_a, "gate"_a, "kv_cache"_a, "block_table"_a, "seq_lens"_a, "out"_a, "workspace"_a.none(),
      "max_model_len"_a, "window"_a, "num_splits"_a, "pdl"_a = true,
      "out = bf16(sigmoid(gate) * rmsnorm(softmax(scale q K^T) V)) for the 8 query rows of every request and\n"
      "every KV head of the rank, in one launch on torch's current stream (programmatic dependent launch\n"
      "unless pdl=False). seq_lens and block_table are read on the GPU, so the call is graph-capturable\n"
      "after prepare_attn2. ValueError naming the argument on bad input, before any launch. Returns out.");
  nb::class_<BoundAttn2>(m, "Attn2",
                         "attn2 bound to a layer's KV cache and workspace (or None when num_splits == 1) and the\n"
                         "deployment's max_model_len, window and num_splits: a call reads only q, gate,\n"
                         "block_table, seq_lens and out. Keep the bound tensors' storage in place (as a CUDA\n"
                         "graph would); bind again after replacing one.")
      .def(
          "__init__",
          [](BoundAttn2* self, nb::handle kv_cache, nb::handle workspace, int max_model_len, int window,
             int num_splits) {
            new (self) BoundAttn2{nb::borrow(kv_cache), nb::borrow(workspace),
                                  attn2_binding(kv_cache, workspace, max_model_len, window, num_splits)};
          },
          "kv_cache"_a, "workspace"_a.none(), "max_model_len"_a, "window"_a, "num_splits"_a)
      .def(
          "__call__",
          [](const BoundAttn2& b, nb::handle q, nb::handle gate, nb::handle block_table, nb::handle seq_lens,
             nb::handle out, bool pdl) {
            const Attn2Args a = attn2_args(b.binding, q, gate, block_table, seq_lens, out, pdl);
            attn2(a, current_stream(a.q.device));
            return nb::borrow(out);
          },
          "q"_a, "gate"_a, "block_table"_a, "seq_lens"_a, "out"_a, "pdl"_a = true,
          "attn2 with the bound cache, workspace and sizes, on torch's current stream. Returns out.");
  // The reads and checks of a call without its launch (host-time diagnostics).
  m.def(
      "_attn2_check",
      [](nb::handle q, nb::handle gate, nb::handle kv_cache, nb::handle block_table, nb::handle seq_lens,
         nb::handle out, nb::handle workspace, int max_model_len, int window, int num_splits) {
        check_attn2(attn2_args(attn2_binding(kv_cache, workspace, max_model_len, window, num_splits), q, gate,
                               block_table, seq_lens, out, true));
      },
      "q"_a, "gate"_a, "kv_cache"_a, "block_table"_a, "seq_lens"_a, "out"_a, "workspace"_a.none(),
      "max_model_len"_a, "window"_a, "num_splits"_a);
}

}  // namespace muse_decode::python
