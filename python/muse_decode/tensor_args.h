// Translation of Python arguments: tensors (torch.Tensor or any object with
// the same attributes) into TensorRef views, reading only what the checks
// need, and integers into C++ ints with a ValueError naming the argument.
//
// Cost matters: Muse Spark runs eagerly and the kernels take 1-10 us, so the
// whole per-call path has a 5 us budget. DLPack import of 8 tensors costs 27 us
// (SPEC section 7); reading data_ptr(), dtype, shape, stride() and
// get_device() through the C API costs a few hundred ns per tensor, so the
// attributes of a tensor object are memoised (see tensor_ref).
#pragma once

#include <Python.h>
#include <nanobind/nanobind.h>

#include <optional>
#include <stdexcept>
#include <string>

#include "muse_decode/tensor.h"

namespace muse_decode::python {

namespace nb = nanobind;

// torch dtype objects registered at import (identity compare), by code.
void register_dtype(nb::handle dtype, int code);
DType dtype_of(PyObject* dtype);

// A TensorRef of `obj`; None gives an absent view. Throws ValueError naming
// `name` when obj is not tensor-like or has more than 4 dimensions.
// The object seen last at its memo slot and still alive (a weak reference
// tells) costs one data_ptr() call: its other attributes are reused unless
// the data pointer moved. So in-place metadata changes that keep the data
// pointer (resize_ to a smaller size, as_strided_, unsqueeze_ ...) are not
// seen: they never grow the memory the view covers, so a call stays in
// bounds. Callers re-run every check on the view each call.
TensorRef tensor_ref(nb::handle obj, const char* name);

// An integer argument as a C++ int: ValueError naming `name` when obj is not
// an integer (or has no __index__) or lies outside int32 (nanobind's own int
// caster would answer either with a TypeError about the signature).
int int_arg(nb::handle obj, const char* name);
// The same, None giving nullopt.
std::optional<int> optional_int_arg(nb::handle obj, const char* name);

// What a "why not" binding returns when its arguments do not even translate
// (not a tensor, an integer outside int32): the text the op would raise, as
// the C++ check returns its reasons. Runs translate(), then check(args).
template <typename Translate, typename Check>
std::optional<std::string> reason_or_check(Translate&& translate, Check&& check) {
  try {
    return check(translate());
  } catch (const std::invalid_argument& e) {
    return std::string(e.what());
  }
}

// The current CUDA stream of `device` as torch sees it (0, the default
// stream, when torch is not loaded or has no CUDA), and make `device` current
// for this library's runtime.
Stream current_stream(int device);

}  // namespace muse_decode::python
