#include "tensor_args.h"

#include <climits>
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
  // First sight of this dtype object: by name, then remembered by identity
  // when it is one of torch's (they live as long as the interpreter).
  nb::str s = nb::str(nb::handle(dtype));
  std::string name = s.c_str();
  const bool is_torch = name.rfind("torch.", 0) == 0;
  if (is_torch) name = name.substr(6);
  DType code = DType::kOther;
  if (name == "float32") code = DType::kFloat32;
  else if (name == "bfloat16") code = DType::kBFloat16;
  else if (name == "float16") code = DType::kFloat16;
  else if (name == "int32") code = DType::kInt32;
  else if (name == "int64") code = DType::kInt64;
  else if (name == "uint8") code = DType::kUInt8;
  if (is_torch && code != DType::kOther) register_dtype(dtype, static_cast<int>(code));
  return code;
}

namespace {
void* data_ptr_of(PyObject* obj, const char* name) {
  nb::object ptr = nb::steal(attr(obj, names().data_ptr, true, name));
  return reinterpret_cast<void*>(static_cast<uintptr_t>(as_int(ptr.ptr())));
}

TensorRef read_tensor(PyObject* obj, const char* name) {
  TensorRef t;
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
  t.data = data_ptr_of(obj, name);
  nb::object dev = nb::steal(attr(obj, n.get_device, true, name));
  t.device = static_cast<int>(as_int(dev.ptr()));
  return t;
}

// The memo: the attributes last read from a tensor object, found by the
// object's address and trusted while a weak reference says that same object
// is alive (an address reused by a new object fails that test). Direct-mapped,
// so a layer's persistent tensors (weights, caches, workspaces, output
// buffers) cost one data_ptr() call per call instead of five attribute reads.
// Every check still runs on every call; only the reads are saved. The GIL
// guards it.
struct MemoEntry {
  PyObject* obj = nullptr;   // borrowed: identity only
  PyObject* weak = nullptr;  // owned weak reference to obj
  TensorRef ref;
};
constexpr int kMemoBits = 10;
MemoEntry& memo_entry(PyObject* obj) {
  static MemoEntry table[1 << kMemoBits];
  const uint64_t h = (static_cast<uint64_t>(reinterpret_cast<uintptr_t>(obj)) >> 4) * 0x9E3779B97F4A7C15ull;
  return table[h >> (64 - kMemoBits)];
}

bool alive(PyObject* weak, PyObject* obj) {
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* target = nullptr;
  if (PyWeakref_GetRef(weak, &target) < 0) {
    PyErr_Clear();
    return false;
  }
  Py_XDECREF(target);  // identity compare only: obj is alive (the caller holds it)
  return target == obj;
#else
  return PyWeakref_GetObject(weak) == obj;
#endif
}
}  // namespace

TensorRef tensor_ref(nb::handle h, const char* name) {
  PyObject* obj = h.ptr();
  if (obj == Py_None) return TensorRef{};
  MemoEntry& e = memo_entry(obj);
  if (e.obj == obj && e.weak && alive(e.weak, obj)) {
    // Same live object: its storage may have been swapped (set_, .data =),
    // which changes the data pointer; then read everything again.
    if (data_ptr_of(obj, name) == e.ref.data) return e.ref;
  }
  const TensorRef t = read_tensor(obj, name);
  PyObject* weak = PyWeakref_NewRef(obj, nullptr);
  if (!weak) {  // not weak-referenceable: never memoised
    PyErr_Clear();
    return t;
  }
  Py_XDECREF(e.weak);
  e.obj = obj;
  e.weak = weak;
  e.ref = t;
  return t;
}

namespace {
// True and False are integers to Python; as an argument they are a mistake.
[[noreturn]] void refuse_bool(nb::handle h, const char* name, const char* expected) {
  throw std::invalid_argument(std::string(name) + " must be " + expected + ", got " +
                              (h.ptr() == Py_True ? "True" : "False"));
}
}  // namespace

int int_arg(nb::handle h, const char* name) {
  PyObject* obj = h.ptr();
  if (PyBool_Check(obj)) refuse_bool(h, name, "an integer");
  int overflow = 0;
  const long long v = PyLong_Check(obj) ? PyLong_AsLongLongAndOverflow(obj, &overflow) : -1;
  if (!PyLong_Check(obj) || (v == -1 && PyErr_Occurred())) {
    PyErr_Clear();
    // Anything with __index__ (numpy integers, say) converts; floats do not.
    nb::object index = nb::steal(PyNumber_Index(obj));
    if (!index.is_valid()) {
      PyErr_Clear();
      throw std::invalid_argument(std::string(name) + " must be an integer, got " +
                                  nb::type_name(h.type()).c_str());
    }
    return int_arg(index, name);
  }
  if (overflow != 0 || v < INT32_MIN || v > INT32_MAX)
    throw std::invalid_argument(std::string(name) + " must fit in int32 [-2147483648, 2147483647], got " +
                                nb::str(h).c_str());
  return static_cast<int>(v);
}

std::optional<int> optional_int_arg(nb::handle h, const char* name) {
  if (h.is_none()) return std::nullopt;
  return int_arg(h, name);
}

double float_arg(nb::handle h, const char* name) {
  PyObject* obj = h.ptr();
  if (PyFloat_CheckExact(obj)) return PyFloat_AS_DOUBLE(obj);
  if (PyBool_Check(obj)) refuse_bool(h, name, "a number");
  // PyFloat_AsDouble takes __float__ or __index__; a str has neither.
  const double v = PyFloat_AsDouble(obj);
  if (v == -1.0 && PyErr_Occurred()) {
    const bool overflow = PyErr_ExceptionMatches(PyExc_OverflowError);
    PyErr_Clear();
    if (overflow)
      throw std::invalid_argument(std::string(name) + " must be a number within the range of a double, got " +
                                  nb::str(h).c_str());
    throw std::invalid_argument(std::string(name) + " must be a number, got " + nb::type_name(h.type()).c_str());
  }
  return v;
}

std::optional<double> optional_float_arg(nb::handle h, const char* name) {
  if (h.is_none()) return std::nullopt;
  return float_arg(h, name);
}

bool bool_arg(nb::handle h, const char* name) {
  PyObject* obj = h.ptr();
  if (obj == Py_True) return true;
  if (obj == Py_False) return false;
  if (PyLong_Check(obj)) {
    int overflow = 0;
    const long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow == 0 && (v == 0 || v == 1)) return v == 1;
  }
  PyErr_Clear();
  throw std::invalid_argument(std::string(name) + " must be True or False, got " +
                              (PyLong_Check(obj) ? std::string(nb::str(h).c_str())
                                                 : std::string(nb::type_name(h.type()).c_str())));
}

bool truth_arg(nb::handle h, const char* name) {
  const int v = PyObject_IsTrue(h.ptr());
  if (v < 0) {
    PyErr_Clear();
    throw std::invalid_argument(std::string(name) + " must have a truth value (True or False), got " +
                                nb::type_name(h.type()).c_str());
  }
  return v == 1;
}

std::string str_arg(nb::handle h, const char* name) {
  PyObject* obj = h.ptr();
  Py_ssize_t size = 0;
  const char* text = PyUnicode_Check(obj) ? PyUnicode_AsUTF8AndSize(obj, &size) : nullptr;
  if (!text) {
    PyErr_Clear();
    throw std::invalid_argument(std::string(name) + " must be a string, got " + nb::type_name(h.type()).c_str());
  }
  return std::string(text, static_cast<size_t>(size));
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
    // A torch without CUDA has no current CUDA stream: the default stream.
    // The call's checks then refuse tensors that are not on a GPU, and a
    // launch on a machine without a usable GPU fails with the CUDA error.
    PyErr_Clear();
    return nullptr;
  }
  return reinterpret_cast<Stream>(static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(s.ptr())));
}

}  // namespace muse_decode::python
