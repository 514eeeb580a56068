// A stand-in for the NVIDIA driver's libnvidia-ml.so.1 on machines without one: the
// NVML functions agent/gpus.cpp calls, with the C ABI of NVML's API reference, answering
// from the environment so that a test chooses the machine it pretends to be:
//   NVML_DOUBLE_DEVICES     "NAME:MIB;NAME:MIB" (e.g. "NVIDIA H200:143771"); unset = none
//   NVML_DOUBLE_INIT_ERROR  an nvmlReturn_t that nvmlInit_v2 returns (9: driver not loaded)
//   NVML_DOUBLE_BAD_DEVICE  an index whose nvmlDeviceGetMemoryInfo fails (15: GPU is lost)
// The real library is exercised by scripts/gpu-check on a GPU machine; this one lets the
// discovery, selection, registration and metrics paths run here with real dlopen.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

struct Device {
  std::string name;
  unsigned long long bytes = 0;
};

std::vector<Device> devices() {
  std::vector<Device> out;
  const char* env = std::getenv("NVML_DOUBLE_DEVICES");
  std::string s = env ? env : "";
  std::size_t start = 0;
  while (start < s.size()) {
    std::size_t end = s.find(';', start);
    if (end == std::string::npos) end = s.size();
    const std::string item = s.substr(start, end - start);
    const std::size_t colon = item.rfind(':');
    if (colon != std::string::npos) out.push_back({item.substr(0, colon), std::stoull(item.substr(colon + 1)) << 20});
    start = end + 1;
  }
  return out;
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

int g_initialised = 0;

int copy(const std::string& s, char* buf, unsigned size) {
  if (s.size() + 1 > size) return 7;  // NVML_ERROR_INSUFFICIENT_SIZE
  std::memcpy(buf, s.c_str(), s.size() + 1);
  return 0;
}

}  // namespace

extern "C" {

int nvmlInit_v2() {
  const int e = env_int("NVML_DOUBLE_INIT_ERROR", 0);
  if (e == 0) ++g_initialised;
  return e;
}

int nvmlShutdown() {
  if (g_initialised == 0) return 1;  // NVML_ERROR_UNINITIALIZED
  --g_initialised;
  return 0;
}

const char* nvmlErrorString(int r) {
  switch (r) {
    case 0: return "Success";
    case 1: return "Uninitialized";
    case 2: return "Invalid Argument";
    case 7: return "Insufficient Size";
    case 9: return "Driver Not Loaded";
    case 15: return "GPU is lost";
    default: return "Unknown Error";
  }
}

int nvmlSystemGetDriverVersion(char* buf, unsigned size) {
  if (!g_initialised) return 1;
  return copy("580.65.06", buf, size);
}

int nvmlDeviceGetCount_v2(unsigned* count) {
  if (!g_initialised) return 1;
  *count = static_cast<unsigned>(devices().size());
  return 0;
}

// A device handle is its index + 1 (never null).
int nvmlDeviceGetHandleByIndex_v2(unsigned index, void** handle) {
  if (!g_initialised) return 1;
  if (index >= devices().size()) return 2;
  *handle = reinterpret_cast<void*>(static_cast<std::uintptr_t>(index) + 1);
  return 0;
}

int nvmlDeviceGetName(void* handle, char* buf, unsigned size) {
  const auto i = reinterpret_cast<std::uintptr_t>(handle) - 1;
  const auto d = devices();
  if (!g_initialised || i >= d.size()) return 2;
  return copy(d[i].name, buf, size);
}

int nvmlDeviceGetUUID(void* handle, char* buf, unsigned size) {
  const auto i = reinterpret_cast<std::uintptr_t>(handle) - 1;
  if (!g_initialised || i >= devices().size()) return 2;
  char uuid[64];
  std::snprintf(uuid, sizeof uuid, "GPU-00000000-0000-0000-0000-%012u", static_cast<unsigned>(i));
  return copy(uuid, buf, size);
}

struct nvmlMemoryDouble {
  unsigned long long total, free, used;
};

int nvmlDeviceGetMemoryInfo(void* handle, nvmlMemoryDouble* mem) {
  const auto i = reinterpret_cast<std::uintptr_t>(handle) - 1;
  const auto d = devices();
  if (!g_initialised || i >= d.size()) return 2;
  if (static_cast<int>(i) == env_int("NVML_DOUBLE_BAD_DEVICE", -1)) return 15;
  *mem = {d[i].bytes, d[i].bytes, 0};
  return 0;
}

}  // extern "C"
