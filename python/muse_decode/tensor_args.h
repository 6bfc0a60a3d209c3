// Translation of Python tensors (torch.Tensor or any object with the same
// attributes) into TensorRef views, reading only what the checks need.
//
// Cost matters: Muse Spark runs eagerly and the kernels take 1-10 us, so the
// whole per-call path has a 5 us budget. DLPack import of 8 tensors costs 27 us
// (SPEC section 7); reading data_ptr(), dtype, shape, stride() and
// get_device() through the C API costs a few hundred ns per tensor, so the
// attributes of a tensor object are memoised (see tensor_ref).
#pragma once

#include <Python.h>
#include <nanobind/nanobind.h>

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

// The current CUDA stream of `device` as torch sees it (0, the default
// stream, when torch is not loaded or has no CUDA), and make `device` current
// for this library's runtime.
Stream current_stream(int device);

}  // namespace muse_decode::python
