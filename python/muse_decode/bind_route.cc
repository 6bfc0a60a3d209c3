// Python binding of route: translation only (tensors to views, errors to
// ValueError); the checks live in src/route/route_host.cc.
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
RouterDesc router_desc(const std::string& normalization, int top_k, int num_experts,
                       std::optional<double> multiplier, double eps, nb::handle bias, double scale) {
  RouterDesc r;
  r.score_normalization = normalization;
  r.top_k = top_k;
  r.num_experts = num_experts;
  r.output_multiplier = multiplier;
  r.division_eps = eps;
  r.expert_bias = tensor_ref(bias, "expert_bias");
  r.route_scale = scale;
  return r;
}

// The routing call's views; metadata only when md_buffer is not None.
struct CallViews {
  TensorRef logits, ids, weights;
  RoutingMetadata meta;
  bool with_meta;
  CallViews(nb::handle logits_, nb::handle ids_, nb::handle weights_, nb::handle md_buffer, int md_offset,
            int md_count, int tile_n)
      : logits(tensor_ref(logits_, "logits")),
        ids(tensor_ref(ids_, "ids")),
        weights(tensor_ref(weights_, "weights")),
        with_meta(!md_buffer.is_none()) {
    if (with_meta) meta = RoutingMetadata{tensor_ref(md_buffer, "metadata.buffer"), md_offset, md_count, tile_n};
  }
};
}  // namespace

void bind_route(nb::module_& m) {
  m.def("metadata_size", &metadata_size, "tile_n"_a);
  m.def(
      "metadata_fields",
      [](int num_tokens, int tile_n) {
        std::vector<std::tuple<std::string, int64_t, int64_t>> out;
        for (const auto& f : metadata_fields(num_tokens, tile_n).field) out.emplace_back(f.name, f.offset, f.length);
        return out;
      },
      "num_tokens"_a, "tile_n"_a);
  m.def(
      "unsupported_router",
      [](const std::string& normalization, int top_k, int num_experts, std::optional<double> multiplier,
         double eps, nb::handle bias, double scale) {
        return unsupported_router(router_desc(normalization, top_k, num_experts, multiplier, eps, bias, scale));
      },
      "score_normalization"_a, "top_k"_a, "num_experts"_a, "output_multiplier"_a.none(), "division_eps"_a,
      "expert_bias"_a, "route_scale"_a);

  // Subclassed in Python by muse_decode.MuseRouting, whose __call__ is this
  // one: no Python frame between the user and the launch (host cost, SPEC 7).
  nb::class_<MuseRouting>(m, "Routing")
      .def(
          "__init__",
          [](MuseRouting* self, nb::handle bias, double route_scale) {
            new (self) MuseRouting(router_desc("sigmoid", kTopK, kNumExperts, std::nullopt, kRouteDivisionEps,
                                               bias, route_scale));
          },
          "expert_bias"_a, "route_scale"_a)
      .def(
          "__call__",
          [](const MuseRouting& self, nb::handle logits, nb::handle ids, nb::handle weights, nb::handle metadata,
             bool pdl) {
            // metadata: a RoutingMetadata (buffer, local_expert_offset, num_local_experts, tile_n) or None.
            nb::handle buf = nb::none();
            int off = 0, count = kNumExperts, tile = 128;
            if (!metadata.is_none()) {
              if (!PyTuple_Check(metadata.ptr()) || PyTuple_GET_SIZE(metadata.ptr()) != 4)
                throw std::invalid_argument("metadata must be a RoutingMetadata");
              buf = PyTuple_GET_ITEM(metadata.ptr(), 0);
              off = nb::cast<int>(nb::handle(PyTuple_GET_ITEM(metadata.ptr(), 1)));
              count = nb::cast<int>(nb::handle(PyTuple_GET_ITEM(metadata.ptr(), 2)));
              tile = nb::cast<int>(nb::handle(PyTuple_GET_ITEM(metadata.ptr(), 3)));
            }
            CallViews v(logits, ids, weights, buf, off, count, tile);
            self(v.logits, v.ids, v.weights, v.with_meta ? &v.meta : nullptr, current_stream(v.logits.device), pdl);
            return nb::make_tuple(ids, weights);
          },
          "logits"_a, "ids"_a, "weights"_a, "metadata"_a.none() = nb::none(), "pdl"_a = true)
      .def(
          "check",
          [](const MuseRouting& self, nb::handle logits, nb::handle ids, nb::handle weights, nb::handle md_buffer,
             int md_offset, int md_count, int tile_n) {
            CallViews v(logits, ids, weights, md_buffer, md_offset, md_count, tile_n);
            self.check(v.logits, v.ids, v.weights, v.with_meta ? &v.meta : nullptr);
          },
          "logits"_a, "ids"_a, "weights"_a, "md_buffer"_a.none() = nb::none(), "md_offset"_a = 0,
          "md_count"_a = kNumExperts, "tile_n"_a = 128);
}

}  // namespace muse_decode::python
