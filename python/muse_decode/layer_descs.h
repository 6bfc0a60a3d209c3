// The layer descriptions of the "why not" checks of layers, translated from
// the attributes the package's wrappers read off a vLLM layer, in the order
// each wrapper passes them. One translation per op, defined in that op's
// binding and shared by its own check and by attention_block's, which
// composes the three. Each throws ValueError naming the attribute that does
// not translate.
#pragma once

#include <nanobind/nanobind.h>

#include "muse_decode/attn2.h"
#include "muse_decode/o_proj.h"
#include "muse_decode/qkv_front.h"

namespace muse_decode::python {

namespace nb = nanobind;

// qkv_front's (bind_qkv_front.cc): _qkv_front._projection_values.
ProjectionDesc projection_desc(nb::handle quantized, nb::handle has_bias, nb::handle gather_output, nb::handle tp_size,
                               nb::handle weight, nb::handle num_heads, nb::handle num_kv_heads, nb::handle head_dim,
                               nb::handle use_rope, nb::handle rotary_present, nb::handle rotary_dim,
                               nb::handle is_neox_style, nb::handle cos_sin);
inline constexpr size_t kProjectionValues = 13;

// attn2's (bind_attn2.cc): _attn2._layer_values.
Attn2Layer attn2_layer(nb::handle use_o_norm, nb::handle use_o_gate, nb::handle head_dim, nb::handle num_heads,
                       nb::handle num_kv_heads, nb::handle scaling, nb::handle eps);
inline constexpr size_t kAttn2LayerValues = 7;

// o_proj's (bind_o_proj.cc): _o_proj._output_values.
OutProjectionDesc out_projection_desc(nb::handle quantized, nb::handle has_bias, nb::handle input_is_parallel,
                                      nb::handle tp_size, nb::handle num_heads, nb::handle head_dim,
                                      nb::handle weight);
inline constexpr size_t kOutProjectionValues = 7;

}  // namespace muse_decode::python
