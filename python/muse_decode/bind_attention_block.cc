// Python binding of attention_block: translation only (tensors to views,
// integers to ints, errors to ValueError / RuntimeError); the checks and
// sizing live in src/attention_block/attention_block_host.cc.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <array>
#include <string>
#include <tuple>

#include "muse_decode/attention_block.h"
#include "layer_descs.h"
#include "tensor_args.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace muse_decode::python {

namespace {
AttentionBlockArgs attention_block_args(nb::handle x, nb::handle qkv_weight, nb::handle positions, nb::handle cos_sin,
                                        nb::handle slot_mapping, nb::handle kv_cache, nb::handle num_kv_heads,
                                        nb::handle block_table, nb::handle seq_lens, nb::handle max_model_len,
                                        nb::handle window, nb::handle o_proj_weight, nb::handle out,
                                        nb::handle workspace) {
  AttentionBlockArgs a;
  a.x = tensor_ref(x, "x");
  a.qkv_weight = tensor_ref(qkv_weight, "qkv_weight");
  a.positions = tensor_ref(positions, "positions");
  a.cos_sin = tensor_ref(cos_sin, "cos_sin");
  a.slot_mapping = tensor_ref(slot_mapping, "slot_mapping");
  a.kv_cache = tensor_ref(kv_cache, "kv_cache");
  a.num_kv_heads = int_arg(num_kv_heads, "num_kv_heads");
  a.block_table = tensor_ref(block_table, "block_table");
  a.seq_lens = tensor_ref(seq_lens, "seq_lens");
  a.max_model_len = int_arg(max_model_len, "max_model_len");
  a.window = int_arg(window, "window");
  a.o_proj_weight = tensor_ref(o_proj_weight, "o_proj_weight");
  a.out = tensor_ref(out, "out");
  a.workspace = tensor_ref(workspace, "workspace");
  return a;
}

// The N values of one op's layer description, as the package's wrapper
// (muse_decode._attention_block) passes them: a tuple, in that op's order.
template <size_t N>
std::array<nb::handle, N> values_of(nb::handle values, const char* name) {
  PyObject* t = values.ptr();
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != static_cast<Py_ssize_t>(N))
    throw std::invalid_argument(std::string(name) + " must be a tuple of " + std::to_string(N) +
                                " attribute values, got " + nb::type_name(values.type()).c_str());
  std::array<nb::handle, N> v;
  for (size_t i = 0; i < N; ++i) v[i] = PyTuple_GET_ITEM(t, static_cast<Py_ssize_t>(i));
  return v;
}

AttentionBlockLayer attention_block_layer(nb::handle projection, nb::handle attention, nb::handle output,
                                          nb::handle num_kv_heads, nb::handle max_model_len, nb::handle max_reqs,
                                          nb::handle sliding_window) {
  AttentionBlockLayer l;
  l.projection = std::apply(projection_desc, values_of<kProjectionValues>(projection, "projection"));
  l.attention = std::apply(attn2_layer, values_of<kAttn2LayerValues>(attention, "attention"));
  l.output = std::apply(out_projection_desc, values_of<kOutProjectionValues>(output, "output"));
  l.num_kv_heads = int_arg(num_kv_heads, "layer.num_kv_heads");
  l.max_model_len = int_arg(max_model_len, "max_model_len");
  l.max_reqs = int_arg(max_reqs, "max_reqs");
  l.sliding_window = optional_int_arg(sliding_window, "layer.sliding_window");
  return l;
}

// The C++ bound form and the Python objects it views, kept alive with it.
struct BoundAttentionBlock {
  nb::object qkv_weight_obj, cos_sin_obj, kv_cache_obj, o_proj_weight_obj, workspace_obj;
  AttentionBlock op;
};
}  // namespace

void bind_attention_block(nb::module_& m) {
  m.def(
      "attention_block_supports_kv_heads",
      [](nb::handle num_kv_heads) { return attention_block_supports_kv_heads(int_arg(num_kv_heads, "num_kv_heads")); },
      nb::sig("def attention_block_supports_kv_heads(num_kv_heads: int) -> bool"), "num_kv_heads"_a.none(),
      "Whether attention_block serves a rank of num_kv_heads KV heads (2: TP8, 4: TP4); False for any other\n"
      "integer, ValueError naming an argument that is not an integer in int32.");
  m.def(
      "attention_block_splits",
      [](nb::handle num_reqs, nb::handle num_kv_heads, nb::handle max_model_len, nb::handle window) {
        return attention_block_splits(int_arg(num_reqs, "num_reqs"), int_arg(num_kv_heads, "num_kv_heads"),
                                      int_arg(max_model_len, "max_model_len"), int_arg(window, "window"));
      },
      nb::sig("def attention_block_splits(num_reqs: int, num_kv_heads: int, max_model_len: int, window: int) -> int"),
      "num_reqs"_a.none(), "num_kv_heads"_a.none(), "max_model_len"_a.none(), "window"_a.none());
  m.def(
      "attention_block_workspace_bytes",
      [](nb::handle num_reqs, nb::handle num_kv_heads, nb::handle max_model_len, nb::handle window) {
        return attention_block_workspace_bytes(int_arg(num_reqs, "num_reqs"), int_arg(num_kv_heads, "num_kv_heads"),
                                               int_arg(max_model_len, "max_model_len"), int_arg(window, "window"));
      },
      nb::sig("def attention_block_workspace_bytes(num_reqs: int, num_kv_heads: int, max_model_len: int, window: "
              "int) -> int"),
      "num_reqs"_a.none(), "num_kv_heads"_a.none(), "max_model_len"_a.none(), "window"_a.none());
  m.def(
      "prepare_attention_block", [](nb::handle device) { prepare_attention_block(int_arg(device, "device")); },
      nb::sig("def prepare_attention_block(device: int = -1) -> None"), "device"_a.none() = -1,
      "One-time setup of CUDA device `device` (-1: the current one) for attention_block (the kernel's\n"
      "shared-memory limit, the tensor-map encoder, one CTA per SM co-resident), outside graph capture.\n"
      "ValueError on a GPU the kernel was not built for, RuntimeError when the CUDA runtime refuses the\n"
      "setup.");
  m.def(
      "unsupported_attention_block",
      [](nb::handle projection, nb::handle attention, nb::handle output, nb::handle num_kv_heads,
         nb::handle max_model_len, nb::handle max_reqs, nb::handle sliding_window) {
        return reason_or_check(
            [&] {
              return attention_block_layer(projection, attention, output, num_kv_heads, max_model_len, max_reqs,
                                           sliding_window);
            },
            [](const AttentionBlockLayer& l) { return unsupported_attention_block(l); });
      },
      nb::sig("def unsupported_attention_block(projection: tuple, attention: tuple, output: tuple, num_kv_heads: int, "
              "max_model_len: int, max_reqs: int, sliding_window: int | None) -> str | None"),
      "projection"_a.none(), "attention"_a.none(), "output"_a.none(), "num_kv_heads"_a.none(),
      "max_model_len"_a.none(), "max_reqs"_a.none(), "sliding_window"_a.none());
  m.def(
      "attention_block",
      [](nb::handle x, nb::handle qkv_weight, nb::handle positions, nb::handle cos_sin, nb::handle slot_mapping,
         nb::handle kv_cache, nb::handle num_kv_heads, nb::handle block_table, nb::handle seq_lens,
         nb::handle max_model_len, nb::handle window, nb::handle o_proj_weight, nb::handle out, nb::handle workspace) {
        const AttentionBlockArgs a =
            attention_block_args(x, qkv_weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads, block_table,
                                 seq_lens, max_model_len, window, o_proj_weight, out, workspace);
        attention_block(a, current_stream(a.x.device));
        return nb::borrow(out);
      },
      nb::sig("def attention_block(x: torch.Tensor, qkv_weight: torch.Tensor, positions: torch.Tensor, cos_sin: "
              "torch.Tensor | None, slot_mapping: torch.Tensor, kv_cache: torch.Tensor, num_kv_heads: int, "
              "block_table: torch.Tensor, seq_lens: torch.Tensor, max_model_len: int, window: int, o_proj_weight: "
              "torch.Tensor, out: torch.Tensor, workspace: torch.Tensor) -> torch.Tensor"),
      "x"_a.none(), "qkv_weight"_a.none(), "positions"_a.none(), "cos_sin"_a.none(), "slot_mapping"_a.none(),
      "kv_cache"_a.none(), "num_kv_heads"_a.none(), "block_table"_a.none(), "seq_lens"_a.none(),
      "max_model_len"_a.none(), "window"_a.none(), "o_proj_weight"_a.none(), "out"_a.none(), "workspace"_a.none(),
      "One layer's attention of the verify step in one launch on torch's current stream: qkv_front (x\n"
      "qkv_weight^T, q/k RMS norm, RoPE when cos_sin is given, k and v inserted into kv_cache at\n"
      "slot_mapping), attn2 (the 8 rows of each request over its pages, o-norm, sigmoid gate) and o_proj\n"
      "(out = this rank's partial sum of the output projection, bf16 [R*8, 8192]). The same bits on every\n"
      "run. seq_lens, block_table, positions and slot_mapping are read on the GPU, so the call is\n"
      "graph-capturable after prepare_attention_block. ValueError naming the argument on bad input, or\n"
      "before prepare_attention_block on the device, before any launch. Returns out.");
  m.def(
      "unsupported_attention_block_call",
      [](nb::handle x, nb::handle qkv_weight, nb::handle positions, nb::handle cos_sin, nb::handle slot_mapping,
         nb::handle kv_cache, nb::handle num_kv_heads, nb::handle block_table, nb::handle seq_lens,
         nb::handle max_model_len, nb::handle window, nb::handle o_proj_weight, nb::handle out, nb::handle workspace) {
        return reason_or_check(
            [&] {
              return attention_block_args(x, qkv_weight, positions, cos_sin, slot_mapping, kv_cache, num_kv_heads,
                                          block_table, seq_lens, max_model_len, window, o_proj_weight, out, workspace);
            },
            [](const AttentionBlockArgs& a) { return unsupported_attention_block_call(a); });
      },
      nb::sig("def unsupported_attention_block_call(x: torch.Tensor, qkv_weight: torch.Tensor, positions: "
              "torch.Tensor, cos_sin: torch.Tensor | None, slot_mapping: torch.Tensor, kv_cache: torch.Tensor, "
              "num_kv_heads: int, block_table: torch.Tensor, seq_lens: torch.Tensor, max_model_len: int, window: int, "
              "o_proj_weight: torch.Tensor, out: torch.Tensor | None = None, workspace: torch.Tensor | None = None) "
              "-> str | None"),
      "x"_a.none(), "qkv_weight"_a.none(), "positions"_a.none(), "cos_sin"_a.none(), "slot_mapping"_a.none(),
      "kv_cache"_a.none(), "num_kv_heads"_a.none(), "block_table"_a.none(), "seq_lens"_a.none(),
      "max_model_len"_a.none(), "window"_a.none(), "o_proj_weight"_a.none(), "out"_a.none() = nb::none(),
      "workspace"_a.none() = nb::none(),
      "Why attention_block does not take this call (the argument, the expected and the actual value: the\n"
      "text attention_block raises), or None; the caller then keeps qkv_front, attn2 and o_proj. An\n"
      "argument of any type gets a reason, never an exception. Without out and workspace, the check of\n"
      "everything else.");
  nb::class_<BoundAttentionBlock>(
      m, "AttentionBlock",
      "attention_block bound to a layer's QKV weight, rotary table (or None), KV cache, KV-head count,\n"
      "output-projection weight, the deployment's max_model_len and window, and a workspace, checked once\n"
      "here, where the weight's device is prepared (prepare_attention_block). A call reads only x,\n"
      "positions, slot_mapping, block_table, seq_lens and out. Keep the bound tensors' storage in place (as\n"
      "a CUDA graph would); bind again after replacing one.")
      .def(
          "__init__",
          [](BoundAttentionBlock* self, nb::handle qkv_weight, nb::handle cos_sin, nb::handle kv_cache,
             nb::handle num_kv_heads, nb::handle o_proj_weight, nb::handle max_model_len, nb::handle window,
             nb::handle workspace) {
            // Translated in the order of the arguments, so that the first bad one is the one named.
            const TensorRef w = tensor_ref(qkv_weight, "qkv_weight");
            const TensorRef cs = tensor_ref(cos_sin, "cos_sin");
            const TensorRef cache = tensor_ref(kv_cache, "kv_cache");
            const int kvh = int_arg(num_kv_heads, "num_kv_heads");
            const TensorRef ow = tensor_ref(o_proj_weight, "o_proj_weight");
            const int len = int_arg(max_model_len, "max_model_len");
            const int win = int_arg(window, "window");
            const TensorRef ws = tensor_ref(workspace, "workspace");
            new (self) BoundAttentionBlock{nb::borrow(qkv_weight),    nb::borrow(cos_sin),   nb::borrow(kv_cache),
                                           nb::borrow(o_proj_weight), nb::borrow(workspace),
                                           AttentionBlock(w, cs, cache, kvh, ow, len, win, ws)};
          },
          nb::sig("def __init__(self, qkv_weight: torch.Tensor, cos_sin: torch.Tensor | None, kv_cache: torch.Tensor, "
                  "num_kv_heads: int, o_proj_weight: torch.Tensor, max_model_len: int, window: int, workspace: "
                  "torch.Tensor) -> None"),
          "qkv_weight"_a.none(), "cos_sin"_a.none(), "kv_cache"_a.none(), "num_kv_heads"_a.none(),
          "o_proj_weight"_a.none(), "max_model_len"_a.none(), "window"_a.none(), "workspace"_a.none())
      .def(
          "__call__",
          [](const BoundAttentionBlock& b, nb::handle x, nb::handle positions, nb::handle slot_mapping,
             nb::handle block_table, nb::handle seq_lens, nb::handle out) {
            const TensorRef xs = tensor_ref(x, "x");
            const TensorRef pos = tensor_ref(positions, "positions");
            const TensorRef slots = tensor_ref(slot_mapping, "slot_mapping");
            const TensorRef table = tensor_ref(block_table, "block_table");
            const TensorRef lens = tensor_ref(seq_lens, "seq_lens");
            const TensorRef o = tensor_ref(out, "out");
            const AttentionBlockArgs a = b.op.args(xs, pos, slots, table, lens, o);
            attention_block(a, current_stream(a.x.device));
            return nb::borrow(out);
          },
          nb::sig("def __call__(self, x: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor, "
                  "block_table: torch.Tensor, seq_lens: torch.Tensor, out: torch.Tensor) -> torch.Tensor"),
          "x"_a.none(), "positions"_a.none(), "slot_mapping"_a.none(), "block_table"_a.none(), "seq_lens"_a.none(),
          "out"_a.none(), "attention_block with the bound tensors and sizes, on torch's current stream. Returns out.");
}

}  // namespace muse_decode::python
