// Translation of Python arguments: tensors (torch.Tensor or any object with
// the same attributes) into TensorRef views, reading only what the checks
// need, and integers, numbers, flags and strings into C++ values. Every
// argument that does not translate raises ValueError naming it (nanobind's
// own casters would answer with a TypeError about the whole signature).
//
// Cost matters: Muse Spark runs eagerly and the kernels take 1-10 us, so the
// whole per-call path has a 5 us budget. DLPack import of 8 tensors costs 27 us
// (measured on the H200 host); reading data_ptr(), dtype, shape, stride() and
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
// an integer (or has no __index__), is True or False (an int to Python, a
// slip as a count or a size: "got True"), or lies outside int32 (nanobind's
// own int caster would answer with a TypeError about the signature).
int int_arg(nb::handle obj, const char* name);
// The same, None giving nullopt.
std::optional<int> optional_int_arg(nb::handle obj, const char* name);

// A real number (float, int or anything with __float__; not a string, not
// True or False) as a double: ValueError naming `name` otherwise.
double float_arg(nb::handle obj, const char* name);
// The same, None giving nullopt.
std::optional<double> optional_float_arg(nb::handle obj, const char* name);

// A switch such as pdl: True, False, 1 or 0; ValueError naming `name` for
// anything else (a string such as "no" is true to Python, so truthiness would
// turn a typo into the opposite setting).
bool bool_arg(nb::handle obj, const char* name);

// The truth value of a layer attribute, as Python's `if` reads it; ValueError
// naming `name` when the object has none (its __bool__ raises).
bool truth_arg(nb::handle obj, const char* name);

// A str as std::string; ValueError naming `name` otherwise.
std::string str_arg(nb::handle obj, const char* name);

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
