// Python binding of route: translation only (tensors to views, integers to
// ints, errors to ValueError / RuntimeError); the checks live in
// src/route/route_host.cc.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "muse_decode/route.h"
#include "tensor_args.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace muse_decode::python {

namespace {
// The router's attributes, named as vLLM's router carries them (the caller,
// muse_decode._route, reads them off the router object in this order).
RouterDesc router_desc(nb::handle normalization, nb::handle top_k, nb::handle num_experts, nb::handle multiplier,
                       nb::handle eps, nb::handle bias, nb::handle scale) {
  RouterDesc r;
  // Any object reads as its text, as the stock path compares it.
  nb::object text = nb::steal(PyObject_Str(normalization.ptr()));
  if (!text.is_valid()) {
    PyErr_Clear();
    throw std::invalid_argument("router.router_score_normalization must be a string, got an object without one");
  }
  r.score_normalization = str_arg(text, "router.router_score_normalization");
  r.top_k = int_arg(top_k, "router.top_k");
  r.num_experts = int_arg(num_experts, "router.global_num_experts");
  r.output_multiplier = optional_float_arg(multiplier, "router.router_output_multiplier");
  r.division_eps = float_arg(eps, "router.router_score_division_eps");
  r.expert_bias = tensor_ref(bias, "router.expert_bias");
  r.route_scale = float_arg(scale, "router.route_scale");
  return r;
}

// A RoutingMetadata (buffer, local_expert_offset, num_local_experts, tile_n),
// or None.
std::optional<RoutingMetadata> routing_metadata(nb::handle metadata) {
  if (metadata.is_none()) return std::nullopt;
  PyObject* m = metadata.ptr();
  if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) != 4)
    throw std::invalid_argument(
        "metadata must be a RoutingMetadata (buffer, local_expert_offset, "
        "num_local_experts, tile_n) or None");
  return RoutingMetadata{tensor_ref(PyTuple_GET_ITEM(m, 0), "metadata.buffer"),
                         int_arg(PyTuple_GET_ITEM(m, 1), "metadata.local_expert_offset"),
                         int_arg(PyTuple_GET_ITEM(m, 2), "metadata.num_local_experts"),
                         int_arg(PyTuple_GET_ITEM(m, 3), "metadata.tile_n")};
}

RouteArgs route_args(nb::handle logits, nb::handle expert_bias, nb::handle route_scale, nb::handle ids,
                     nb::handle weights, nb::handle metadata, nb::handle pdl) {
  RouteArgs a;
  a.logits = tensor_ref(logits, "logits");
  a.expert_bias = tensor_ref(expert_bias, "expert_bias");
  a.route_scale = float_arg(route_scale, "route_scale");
  a.ids = tensor_ref(ids, "ids");
  a.weights = tensor_ref(weights, "weights");
  a.metadata = routing_metadata(metadata);
  a.pdl = bool_arg(pdl, "pdl");
  return a;
}
}  // namespace

void bind_route(nb::module_& m) {
  m.def(
      "metadata_size", [](nb::handle tile_n) { return metadata_size(int_arg(tile_n, "tile_n")); },
      nb::sig("def metadata_size(tile_n: int) -> int"), "tile_n"_a.none());
  m.def(
      "metadata_fields",
      [](nb::handle num_tokens, nb::handle tile_n) {
        std::vector<std::tuple<std::string, int64_t, int64_t>> out;
        for (const auto& f : metadata_fields(int_arg(num_tokens, "num_tokens"), int_arg(tile_n, "tile_n")).field)
          out.emplace_back(f.name, f.offset, f.length);
        return out;
      },
      nb::sig("def metadata_fields(num_tokens: int, tile_n: int) -> list[tuple[str, int, int]]"), "num_tokens"_a.none(),
      "tile_n"_a.none());
  m.def(
      "unsupported_router",
      [](nb::handle normalization, nb::handle top_k, nb::handle num_experts, nb::handle multiplier, nb::handle eps,
         nb::handle bias, nb::handle scale) {
        return reason_or_check(
            [&] { return router_desc(normalization, top_k, num_experts, multiplier, eps, bias, scale); },
            [](const RouterDesc& r) { return unsupported_router(r); });
      },
      nb::sig("def unsupported_router(router_score_normalization: str, top_k: int, global_num_experts: int, "
              "router_output_multiplier: float | None, router_score_division_eps: float, expert_bias: torch.Tensor "
              "| None, route_scale: float) -> str | None"),
      "router_score_normalization"_a.none(), "top_k"_a.none(), "global_num_experts"_a.none(),
      "router_output_multiplier"_a.none(), "router_score_division_eps"_a.none(), "expert_bias"_a.none(),
      "route_scale"_a.none());
  m.def(
      "prepare_route", [](nb::handle device) { prepare_route(int_arg(device, "device")); },
      nb::sig("def prepare_route(device: int = -1) -> None"), "device"_a.none() = -1,
      "One-time setup of CUDA device `device` (-1: the current one) for route, outside graph capture.\n"
      "ValueError on a GPU the kernels were not built for.");
  m.def(
      "route",
      [](nb::handle logits, nb::handle expert_bias, nb::handle route_scale, nb::handle ids, nb::handle weights,
         nb::handle metadata, nb::handle pdl) {
        const RouteArgs a = route_args(logits, expert_bias, route_scale, ids, weights, metadata, pdl);
        route(a, current_stream(a.expert_bias.device));
        return nb::make_tuple(ids, weights);
      },
      nb::sig("def route(logits: torch.Tensor, expert_bias: torch.Tensor, route_scale: float, ids: torch.Tensor, "
              "weights: torch.Tensor, metadata: RoutingMetadata | None = None, pdl: bool = True) -> "
              "tuple[torch.Tensor, torch.Tensor]"),
      "logits"_a.none(), "expert_bias"_a.none(), "route_scale"_a.none(), "ids"_a.none(), "weights"_a.none(),
      "metadata"_a.none() = nb::none(), "pdl"_a.none() = true,
      "Route fp32 logits [b, 256] (1 <= b <= 8, 16-byte aligned rows) with the fp32 expert_bias [256] into\n"
      "ids (int32 [b, 8], global expert ids) and weights (fp32 [b, 8]), and with metadata (a\n"
      "RoutingMetadata) the routing metadata of the local experts, on torch's current stream\n"
      "(programmatic dependent launch unless pdl=False). ValueError naming the argument on bad input, or\n"
      "before prepare_route on the device, before any launch. Returns (ids, weights).");
  m.def(
      "unsupported_route_call",
      [](nb::handle logits, nb::handle expert_bias, nb::handle route_scale, nb::handle ids, nb::handle weights,
         nb::handle metadata, nb::handle pdl) {
        return reason_or_check(
            [&] { return route_args(logits, expert_bias, route_scale, ids, weights, metadata, pdl); },
            [](const RouteArgs& a) { return unsupported_route_call(a); });
      },
      nb::sig("def unsupported_route_call(logits: torch.Tensor, expert_bias: torch.Tensor, route_scale: float, ids: "
              "torch.Tensor, weights: torch.Tensor, metadata: RoutingMetadata | None = None, pdl: bool = True) -> str "
              "| None"),
      "logits"_a.none(), "expert_bias"_a.none(), "route_scale"_a.none(), "ids"_a.none(), "weights"_a.none(),
      "metadata"_a.none() = nb::none(), "pdl"_a.none() = true,
      "Why route does not take this call (the argument, the expected and the actual value: the text route\n"
      "raises), or None; an argument of any type gets a reason, never an exception.");

  // Subclassed in Python by muse_decode.MuseRouting, whose __call__ is this
  // one: no Python frame between the user and the launch (host cost).
  nb::class_<MuseRouting>(m, "MuseRouting")
      .def(
          "__init__",
          [](MuseRouting* self, nb::handle normalization, nb::handle top_k, nb::handle num_experts,
             nb::handle multiplier, nb::handle eps, nb::handle bias, nb::handle scale) {
            new (self) MuseRouting(router_desc(normalization, top_k, num_experts, multiplier, eps, bias, scale));
          },
          nb::sig("def __init__(self, router_score_normalization: str, top_k: int, global_num_experts: int, "
                  "router_output_multiplier: float | None, router_score_division_eps: float, expert_bias: "
                  "torch.Tensor, route_scale: float) -> None"),
          "router_score_normalization"_a.none(), "top_k"_a.none(), "global_num_experts"_a.none(),
          "router_output_multiplier"_a.none(), "router_score_division_eps"_a.none(), "expert_bias"_a.none(),
          "route_scale"_a.none())
      .def(
          "__call__",
          [](const MuseRouting& self, nb::handle logits, nb::handle ids, nb::handle weights, nb::handle metadata,
             nb::handle pdl) {
            self(tensor_ref(logits, "logits"), tensor_ref(ids, "ids"), tensor_ref(weights, "weights"),
                 routing_metadata(metadata), current_stream(self.expert_bias().device), bool_arg(pdl, "pdl"));
            return nb::make_tuple(ids, weights);
          },
          nb::sig("def __call__(self, logits: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor, metadata: "
                  "RoutingMetadata | None = None, pdl: bool = True) -> tuple[torch.Tensor, torch.Tensor]"),
          "logits"_a.none(), "ids"_a.none(), "weights"_a.none(), "metadata"_a.none() = nb::none(),
          "pdl"_a.none() = true);
}

}  // namespace muse_decode::python
