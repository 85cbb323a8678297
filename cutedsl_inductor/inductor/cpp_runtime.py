"""The C++ that Inductor's C++ wrapper gets once, before our kernels' definitions: how it
loads and launches an exported kernel (``compile/exported.py``) without Python.

Loading (once a process per kernel, at its first launch, under ``std::call_once``): each
runtime library is taken by its SONAME where the process has it already (the Python
process that compiled the graph: CuTe DSL and TVM-FFI loaded), else from the file shipped
beside the kernels; the kernel library is then opened (``RTLD_LOCAL``) and its
``DT_NEEDED`` entries, those SONAMEs, bind to them. Files are named by their absolute path
(cpp_wrapper, a bare AOTInductor library) or, under a package, by their name in the
folder the package was extracted to (the model's ``cubin_dir_``, as Triton's cubins are).
TVM-FFI's stream and error functions are looked up through the kernel's handle, so they
are the copy the kernel's own calls bind to.

Launching: every tensor becomes a ``DLTensor`` over the tensor's own data pointer, sizes
and strides (so dynamic shapes need nothing more), with the dtype the kernel was compiled
for; every size an int64. The wrapper's stream is set as TVM-FFI's current stream for
the device around the call and restored after it. A failure to load, or a kernel that
raises (its argument checks: dtype, rank, static sizes and strides, device, alignment),
throws ``std::runtime_error`` with TVM-FFI's error kind and message, which AOTInductor
turns into its run's error code. The declarations below are the parts of TVM-FFI's C ABI
(apache-tvm-ffi's ``tvm/ffi/c_api.h``, ABI-stable) and DLPack's ``DLTensor`` a launch
uses, so the wrapper needs neither project's headers.

Tracing: with ``CUTEDSL_AOT_TRACE`` set (to anything but ``0``) in the process that
loads the package, each load step and each launch writes one line to stderr (flushed),
so a process that dies inside one shows which (docs/aot.md). Read once per process.
"""

CPP_RUNTIME = r"""
// CuteDSL kernels (cutedsl_inductor/inductor/cpp_runtime.py)
#include <dlfcn.h>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

namespace cutedsl_aot {

struct DLDevice_ { int32_t device_type; int32_t device_id; };
struct DLDataType_ { uint8_t code; uint8_t bits; uint16_t lanes; };
struct DLTensor_ {
  void* data; DLDevice_ device; int32_t ndim; DLDataType_ dtype;
  int64_t* shape; int64_t* strides; uint64_t byte_offset;
};
struct FFIAny {
  int32_t type_index;
  uint32_t zero_padding;
  union { int64_t v_int64; void* v_ptr; };
};
struct FFIByteArray { const char* data; size_t size; };
static_assert(sizeof(DLTensor_) == 48, "DLPack's DLTensor");
static_assert(sizeof(FFIAny) == 16, "TVM-FFI's TVMFFIAny");
constexpr int32_t kFFINone = 0, kFFIInt = 1, kFFIDLTensorPtr = 7;
constexpr int32_t kDLCPU = 1, kDLCUDA = 2;
// an error object's cell (kind, message, ...) follows TVM-FFI's 24-byte object header
constexpr size_t kFFIObjectHeader = 24;

using SafeCall = int (*)(void*, const FFIAny*, int32_t, FFIAny*);
using SetStream = int (*)(int32_t, int32_t, void*, void**);
using MoveFromRaised = void (*)(void**);
using DecRef = int (*)(void*);

struct Library { const char* soname; const char* file; };

inline bool tracing() {
  static const bool on = [] {
    const char* value = std::getenv("CUTEDSL_AOT_TRACE");
    return value != nullptr && std::strcmp(value, "0") != 0;
  }();
  return on;
}

// no allocation: a launch, on every call of the model, pays one test of a static flag
inline void trace(const char* what, const char* detail) {
  if (tracing()) {
    std::fprintf(stderr, "[cutedsl_aot] %s %s\n", what, detail);
    std::fflush(stderr);
  }
}

struct Kernel {
  const char* file;
  const char* symbol;
  std::once_flag loaded;
  SafeCall call = nullptr;
  SetStream set_stream = nullptr;
  MoveFromRaised move_error = nullptr;
  DecRef dec_ref = nullptr;
};

struct Arg { AtenTensorHandle tensor; DLDataType_ dtype; int64_t value; };
inline Arg tensor(AtenTensorHandle handle, uint8_t code, uint8_t bits) {
  return {handle, {code, bits, 1}, 0};
}
inline Arg scalar(int64_t value) { return {nullptr, {0, 0, 0}, value}; }

inline std::string located(const char* file, const std::optional<std::string>& folder) {
  if (!folder) return file;
  return (std::filesystem::path(*folder) / std::filesystem::path(file).filename()).string();
}

inline void* symbol(void* handle, const char* name, const std::string& path) {
  void* address = dlsym(handle, name);
  if (address == nullptr) {
    throw std::runtime_error("CuteDSL kernel library " + path + " lacks " + name);
  }
  return address;
}

template <size_t R>
void load(Kernel& kernel, const Library (&runtime)[R], const std::optional<std::string>& folder) {
  for (const Library& library : runtime) {
    if (dlopen(library.soname, RTLD_NOW | RTLD_NOLOAD) != nullptr) {
      trace("already loaded:", library.soname);
      continue;
    }
    std::string path = located(library.file, folder);
    trace("loading", path.c_str());
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL) == nullptr) {
      throw std::runtime_error("cannot load " + std::string(library.soname) + " for CuteDSL "
                               "kernels from " + path + ": " + dlerror());
    }
  }
  std::string path = located(kernel.file, folder);
  trace("loading", path.c_str());
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    throw std::runtime_error("cannot load CuteDSL kernel " + path + ": " + dlerror());
  }
  kernel.call = reinterpret_cast<SafeCall>(symbol(handle, kernel.symbol, path));
  kernel.set_stream = reinterpret_cast<SetStream>(symbol(handle, "TVMFFIEnvSetStream", path));
  kernel.move_error = reinterpret_cast<MoveFromRaised>(
      symbol(handle, "TVMFFIErrorMoveFromRaised", path));
  kernel.dec_ref = reinterpret_cast<DecRef>(symbol(handle, "TVMFFIObjectDecRef", path));
}

[[noreturn]] inline void raise(const Kernel& kernel, const std::string& what) {
  void* error = nullptr;
  kernel.move_error(&error);
  std::string message = "CuteDSL kernel " + std::string(kernel.symbol) + " " + what;
  if (error != nullptr) {
    auto* cell = reinterpret_cast<const FFIByteArray*>(
        static_cast<const char*>(error) + kFFIObjectHeader);
    message += ": " + std::string(cell[0].data, cell[0].size) + ": " +
        std::string(cell[1].data, cell[1].size);
    kernel.dec_ref(error);
  }
  throw std::runtime_error(message);
}

inline void check(AOTITorchError status, const char* what) {
  if (status != AOTI_TORCH_SUCCESS) {
    throw std::runtime_error(std::string("CuteDSL launch: ") + what + " failed");
  }
}

inline void describe(const Arg& arg, DLTensor_& out) {
  int64_t ndim = 0;
  int32_t device_type = 0;
  check(aoti_torch_get_data_ptr(arg.tensor, &out.data), "aoti_torch_get_data_ptr");
  check(aoti_torch_get_dim(arg.tensor, &ndim), "aoti_torch_get_dim");
  check(aoti_torch_get_sizes(arg.tensor, &out.shape), "aoti_torch_get_sizes");
  check(aoti_torch_get_strides(arg.tensor, &out.strides), "aoti_torch_get_strides");
  check(aoti_torch_get_device_type(arg.tensor, &device_type), "aoti_torch_get_device_type");
  check(aoti_torch_get_device_index(arg.tensor, &out.device.device_id),
        "aoti_torch_get_device_index");
  // torch's device types: 0 CPU (index -1), 1 CUDA
  out.device.device_type = device_type == 1 ? kDLCUDA : device_type == 0 ? kDLCPU : -1;
  if (out.device.device_id < 0) out.device.device_id = 0;
  out.ndim = static_cast<int32_t>(ndim);
  out.dtype = arg.dtype;
  out.byte_offset = 0;
}

template <size_t R, size_t N>
void launch(Kernel& kernel, const Library (&runtime)[R],
            const std::optional<std::string>& folder, void* stream, const Arg (&args)[N]) {
  std::call_once(kernel.loaded, [&] { load(kernel, runtime, folder); });
  DLTensor_ tensors[N];
  FFIAny packed[N];
  DLDevice_ device{kDLCUDA, 0};
  bool found = false;
  for (size_t i = 0; i < N; ++i) {
    packed[i].zero_padding = 0;
    if (args[i].tensor == nullptr) {
      packed[i].type_index = kFFIInt;
      packed[i].v_int64 = args[i].value;
      continue;
    }
    describe(args[i], tensors[i]);
    packed[i].type_index = kFFIDLTensorPtr;
    packed[i].v_ptr = &tensors[i];
    if (!found) device = tensors[i].device;
    found = true;
  }
  void* previous = nullptr;
  if (kernel.set_stream(device.device_type, device.device_id, stream, &previous) != 0) {
    raise(kernel, "could not set the stream");
  }
  FFIAny result{};
  result.type_index = kFFINone;
  trace("calling", kernel.symbol);
  int status = kernel.call(nullptr, packed, static_cast<int32_t>(N), &result);
  if (tracing()) trace("returned", std::to_string(status).c_str());
  kernel.set_stream(device.device_type, device.device_id, previous, nullptr);
  if (status != 0) raise(kernel, "failed");
}

}  // namespace cutedsl_aot
"""
