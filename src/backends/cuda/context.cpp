// Device enumeration, per-device contexts and the checked-call failure paths.
#include "backends/cuda/context.h"

#include <array>
#include <mutex>
#include <sstream>

#include "backends/cuda/api.h"
#include "backends/cuda/check.h"
#include "hetrain/base/error.h"

namespace hetrain::cuda {

void fail_cuda(cudaError_t e, const char* call, const char* file, int line) {
  (void)cudaGetLastError();  // clear a non-sticky error so later calls are not blamed for it
  fail("[cuda] ", call, " failed at ", file, ":", line, ": ", cudaGetErrorName(e), " (",
       cudaGetErrorString(e), ")");
}

void fail_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  fail("[cublas] ", call, " failed at ", file, ":", line, ": ", cublasGetStatusName(s), " (",
       cublasGetStatusString(s), ")");
}

namespace {
struct Enumeration {
  int count = 0;
  std::string why_none;  // the runtime's reason when count is 0
};

const Enumeration& enumeration() {
  static const Enumeration e = [] {
    Enumeration r;
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) {
      // No driver or no device: zero devices, not a failure.
      (void)cudaGetLastError();
      r.why_none = std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
      return r;
    }
    r.count = std::min(n, kMaxDevices);
    if (n == 0) r.why_none = "the driver reports no device";
    return r;
  }();
  return e;
}

std::string format_gib(size_t bytes) {
  std::ostringstream os;
  os.precision(1);
  os << std::fixed << static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0) << " GiB";
  return os.str();
}

/// "cpu, cuda:0, cuda:1": the devices a caller without its own list can name.
std::string devices_found() {
  std::string s = "cpu";
  for (int i = 0; i < enumeration().count; ++i) s += ", cuda:" + std::to_string(i);
  return s;
}

std::string version_str(int v) {
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}
}  // namespace

int device_count() { return enumeration().count; }

void fail_no_device(int index, const std::string& found) {
  const Enumeration& e = enumeration();
  if (e.count == 0)
    fail("[device] cuda:", index, " requested but no CUDA device is present (", e.why_none,
         "); devices found: ", found);
  fail("[device] cuda:", index, " requested but this machine has ", e.count, " CUDA device",
       e.count == 1 ? "" : "s", " (cuda:0 .. cuda:", e.count - 1, "); devices found: ", found);
}

void check_device(int index) {
  if (index < 0 || index >= device_count()) fail_no_device(index, devices_found());
}

std::string device_name(int index) {
  check_device(index);
  cudaDeviceProp p{};
  HT_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
  std::ostringstream os;
  os << p.name << " (sm_" << p.major << p.minor << ", " << p.multiProcessorCount << " SMs, "
     << format_gib(p.totalGlobalMem) << ")";
  return os.str();
}

std::string device_model(int index) {
  check_device(index);
  // Asked per eval() while kernel times are recorded: looked up once per device.
  static std::mutex mu;
  static std::array<std::string, kMaxDevices> names;
  std::lock_guard<std::mutex> lk(mu);
  std::string& name = names[static_cast<size_t>(index)];
  if (name.empty()) {
    cudaDeviceProp p{};
    HT_CUDA_CHECK(cudaGetDeviceProperties(&p, index));
    name = p.name;
  }
  return name;
}

std::string describe() {
  int rt = 0, drv = 0;
  (void)cudaRuntimeGetVersion(&rt);
  if (cudaDriverGetVersion(&drv) != cudaSuccess) drv = 0;
  (void)cudaGetLastError();
  std::ostringstream os;
  os << "cuda (runtime " << version_str(rt) << ", cuBLASLt " << cublasLtGetVersion() << ", driver "
     << (drv ? version_str(drv) : std::string("none")) << "): ";
  const Enumeration& e = enumeration();
  if (e.count == 0) {
    os << "0 devices (" << e.why_none << ")";
  } else {
    os << e.count << " device" << (e.count == 1 ? "" : "s");
    for (int i = 0; i < e.count; ++i)
      os << (i ? "; " : ": ") << "cuda:" << i << " " << device_name(i);
  }
  return os.str();
}

DeviceContext& context(int index) {
  check_device(index);
  static std::mutex mu;
  static std::array<DeviceContext*, kMaxDevices> contexts{};
  std::lock_guard<std::mutex> lk(mu);
  DeviceContext*& c = contexts[static_cast<size_t>(index)];
  if (!c) {
    DeviceGuard guard(index);
    auto* ctx = new DeviceContext();
    ctx->index = index;
    HT_CUDA_CHECK(cudaGetDeviceProperties(&ctx->props, index));
    HT_CUDA_CHECK(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
    HT_CUBLAS_CHECK(cublasLtCreate(&ctx->lt));
    // 32 MiB: what cuBLAS recommends for Hopper; plenty for Ampere.
    ctx->lt_workspace_bytes = size_t{32} << 20;
    HT_CUDA_CHECK(cudaMalloc(&ctx->lt_workspace, ctx->lt_workspace_bytes));
    c = ctx;
  }
  return *c;
}

DeviceContext& current_context() {
  int d = 0;
  HT_CUDA_CHECK(cudaGetDevice(&d));
  return context(d);
}

DeviceGuard::DeviceGuard(int index) {
  HT_CUDA_CHECK(cudaGetDevice(&prev_));
  if (prev_ != index) HT_CUDA_CHECK(cudaSetDevice(index));
}
DeviceGuard::~DeviceGuard() {
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur != prev_) (void)cudaSetDevice(prev_);
}

void bind_thread(int index) {
  check_device(index);
  HT_CUDA_CHECK(cudaSetDevice(index));
}

void synchronize(int index) {
  DeviceContext& c = context(index);
  HT_CUDA_CHECK(cudaStreamSynchronize(c.stream));
}

}  // namespace hetrain::cuda
