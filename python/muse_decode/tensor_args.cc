#include "tensor_args.h"

#include <stdexcept>
#include <vector>

#ifdef MUSE_DECODE_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace muse_decode::python {

namespace {
struct Names {
  PyObject* data_ptr = PyUnicode_InternFromString("data_ptr");
  PyObject* dtype = PyUnicode_InternFromString("dtype");
  PyObject* shape = PyUnicode_InternFromString("shape");
  PyObject* stride = PyUnicode_InternFromString("stride");
  PyObject* get_device = PyUnicode_InternFromString("get_device");
};
const Names& names() {
  static const Names n;
  return n;
}
std::vector<std::pair<PyObject*, int>>& dtypes() {
  static std::vector<std::pair<PyObject*, int>> d;
  return d;
}

// A new reference or a ValueError naming the argument.
PyObject* attr(PyObject* obj, PyObject* name, bool call, const char* arg) {
  PyObject* r = call ? PyObject_CallMethodNoArgs(obj, name) : PyObject_GetAttr(obj, name);
  if (!r) {
    PyErr_Clear();
    throw std::invalid_argument(std::string(arg) + " must be a tensor (no " + PyUnicode_AsUTF8(name) + ")");
  }
  return r;
}

int64_t as_int(PyObject* o) {
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    throw std::invalid_argument("tensor attribute is not an integer");
  }
  return v;
}
}  // namespace

void register_dtype(nb::handle dtype, int code) {
  Py_INCREF(dtype.ptr());  // torch dtypes live as long as the interpreter
  dtypes().emplace_back(dtype.ptr(), code);
}

DType dtype_of(PyObject* dtype) {
  for (const auto& [obj, code] : dtypes())
    if (obj == dtype) return static_cast<DType>(code);
  // Slow path for tensor-like objects that are not torch tensors: by name.
  nb::str s = nb::str(nb::handle(dtype));
  const std::string name = s.c_str();
  if (name == "torch.float32" || name == "float32") return DType::kFloat32;
  if (name == "torch.bfloat16" || name == "bfloat16") return DType::kBFloat16;
  if (name == "torch.float16" || name == "float16") return DType::kFloat16;
  if (name == "torch.int32" || name == "int32") return DType::kInt32;
  if (name == "torch.int64" || name == "int64") return DType::kInt64;
  if (name == "torch.uint8" || name == "uint8") return DType::kUInt8;
  return DType::kOther;
}

TensorRef tensor_ref(nb::handle h, const char* name) {
  TensorRef t;
  PyObject* obj = h.ptr();
  if (obj == Py_None) return t;
  const Names& n = names();
  nb::object shape = nb::steal(attr(obj, n.shape, false, name));
  nb::object stride = nb::steal(attr(obj, n.stride, true, name));
  if (!PyTuple_Check(shape.ptr()) || !PyTuple_Check(stride.ptr()))
    throw std::invalid_argument(std::string(name) + " must be a tensor (shape and stride() tuples)");
  const Py_ssize_t ndim = PyTuple_GET_SIZE(shape.ptr());
  if (ndim > 4 || PyTuple_GET_SIZE(stride.ptr()) != ndim)
    throw std::invalid_argument(std::string(name) + " must have at most 4 dimensions, got " + std::to_string(ndim));
  t.ndim = static_cast<int>(ndim);
  for (Py_ssize_t i = 0; i < ndim; ++i) {
    t.shape[i] = as_int(PyTuple_GET_ITEM(shape.ptr(), i));
    t.stride[i] = as_int(PyTuple_GET_ITEM(stride.ptr(), i));
  }
  nb::object dtype = nb::steal(attr(obj, n.dtype, false, name));
  t.dtype = dtype_of(dtype.ptr());
  nb::object ptr = nb::steal(attr(obj, n.data_ptr, true, name));
  t.data = reinterpret_cast<void*>(static_cast<uintptr_t>(as_int(ptr.ptr())));
  nb::object dev = nb::steal(attr(obj, n.get_device, true, name));
  t.device = static_cast<int>(as_int(dev.ptr()));
  return t;
}

Stream current_stream(int device) {
  static PyObject* get_stream = [] {
    PyObject* torch_c = PyImport_ImportModule("torch._C");
    PyObject* f = torch_c ? PyObject_GetAttrString(torch_c, "_cuda_getCurrentRawStream") : nullptr;
    Py_XDECREF(torch_c);
    if (!f) PyErr_Clear();
    return f;
  }();
  if (device < 0) return nullptr;
#ifdef MUSE_DECODE_WITH_CUDA
  // This library links its own (static) CUDA runtime: follow torch's device.
  thread_local int current = -1;
  if (device != current) {
    cudaSetDevice(device);
    current = device;
  }
#endif
  if (!get_stream) return nullptr;
  nb::object arg = nb::steal(PyLong_FromLong(device));
  nb::object s = nb::steal(PyObject_CallOneArg(get_stream, arg.ptr()));
  if (!s.is_valid()) {
    PyErr_Clear();
    throw std::runtime_error("cannot read torch's current CUDA stream");
  }
  return reinterpret_cast<Stream>(static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(s.ptr())));
}

}  // namespace muse_decode::python
