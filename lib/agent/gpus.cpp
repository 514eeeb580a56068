#include "agent/gpus.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "common/errors.h"

namespace dltrain::agent {
namespace {

// The part of NVML's C ABI used here (nvml.h is not needed to build: the types are plain
// C). nvmlReturn_t is an int enum whose success value is 0; nvmlDevice_t is an opaque
// pointer; nvmlMemory_t is three unsigned 64-bit byte counts.
using nvmlReturn = int;
using nvmlDevice = void*;
struct nvmlMemory {
  unsigned long long total, free, used;
};
constexpr nvmlReturn kSuccess = 0;
constexpr unsigned kNameBuffer = 96;     // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kUuidBuffer = 96;     // NVML_DEVICE_UUID_V2_BUFFER_SIZE
constexpr unsigned kDriverBuffer = 80;   // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
constexpr unsigned kMaxDevices = 64;     // more than any machine holds; bounds a broken count

struct Nvml {
  void* lib = nullptr;
  nvmlReturn (*init)() = nullptr;
  nvmlReturn (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn) = nullptr;
  nvmlReturn (*driver_version)(char*, unsigned) = nullptr;
  nvmlReturn (*count)(unsigned*) = nullptr;
  nvmlReturn (*handle)(unsigned, nvmlDevice*) = nullptr;
  nvmlReturn (*name)(nvmlDevice, char*, unsigned) = nullptr;
  nvmlReturn (*uuid)(nvmlDevice, char*, unsigned) = nullptr;
  nvmlReturn (*memory)(nvmlDevice, nvmlMemory*) = nullptr;

  ~Nvml() {
    if (lib) dlclose(lib);
  }
  std::string error(nvmlReturn r) const {
    const char* s = error_string ? error_string(r) : nullptr;
    return (s ? std::string(s) : "error") + " (NVML error " + std::to_string(r) + ")";
  }
};

template <typename F>
bool bind(Nvml& n, F& f, const char* symbol, std::string& problem) {
  void* p = dlsym(n.lib, symbol);
  if (!p) {
    problem = "it has no " + std::string(symbol);
    return false;
  }
  f = reinterpret_cast<F>(p);
  return true;
}

std::string terminated(const char* buf, std::size_t size) { return std::string(buf, strnlen(buf, size)); }

}  // namespace

GpuDiscovery discover_gpus(const std::string& library) {
  GpuDiscovery out;
  Nvml n;
  n.lib = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!n.lib) {
    const char* e = dlerror();
    out.problem = "NVML could not be loaded: " + (e ? std::string(e) : library) + " (no NVIDIA driver on this machine?)";
    return out;
  }
  std::string missing;
  const bool bound = bind(n, n.init, "nvmlInit_v2", missing) && bind(n, n.shutdown, "nvmlShutdown", missing) &&
                     bind(n, n.error_string, "nvmlErrorString", missing) &&
                     bind(n, n.driver_version, "nvmlSystemGetDriverVersion", missing) &&
                     bind(n, n.count, "nvmlDeviceGetCount_v2", missing) &&
                     bind(n, n.handle, "nvmlDeviceGetHandleByIndex_v2", missing) &&
                     bind(n, n.name, "nvmlDeviceGetName", missing) && bind(n, n.uuid, "nvmlDeviceGetUUID", missing) &&
                     bind(n, n.memory, "nvmlDeviceGetMemoryInfo", missing);
  if (!bound) {
    out.problem = library + " is not a usable NVML: " + missing;
    return out;
  }
  if (const nvmlReturn r = n.init(); r != kSuccess) {
    out.problem = "nvmlInit failed: " + n.error(r);
    return out;
  }
  char driver[kDriverBuffer] = {};
  if (n.driver_version(driver, kDriverBuffer) == kSuccess) out.driver_version = terminated(driver, kDriverBuffer);
  unsigned count = 0;
  if (const nvmlReturn r = n.count(&count); r != kSuccess) {
    out.problem = "nvmlDeviceGetCount failed: " + n.error(r);
    n.shutdown();
    return out;
  }
  std::vector<std::string> failures;
  for (unsigned i = 0; i < std::min(count, kMaxDevices); ++i) {
    nvmlDevice dev = nullptr;
    char name[kNameBuffer] = {}, uuid[kUuidBuffer] = {};
    nvmlMemory mem{};
    nvmlReturn r = n.handle(i, &dev);
    if (r == kSuccess) r = n.name(dev, name, kNameBuffer);
    if (r == kSuccess) r = n.uuid(dev, uuid, kUuidBuffer);
    if (r == kSuccess) r = n.memory(dev, &mem);
    if (r != kSuccess) {
      failures.push_back("GPU " + std::to_string(i) + ": " + n.error(r));
      continue;
    }
    wire::GpuInfo g;
    g.index = static_cast<int>(i);
    g.name = terminated(name, kNameBuffer);
    g.uuid = terminated(uuid, kUuidBuffer);
    g.memory_mb = static_cast<std::int64_t>(mem.total >> 20);
    out.gpus.push_back(std::move(g));
  }
  if (count > kMaxDevices) failures.push_back("NVML reported " + std::to_string(count) + " GPUs; the first " + std::to_string(kMaxDevices) + " are used");
  for (std::size_t i = 0; i < failures.size(); ++i) out.problem += (i ? "; " : "") + failures[i];
  n.shutdown();
  return out;
}

std::vector<wire::GpuInfo> select_gpus(const GpuDiscovery& found, const std::optional<std::vector<int>>& wanted) {
  if (!wanted) return found.gpus;
  std::vector<wire::GpuInfo> out;
  std::set<int> seen;
  for (const int idx : *wanted) {
    if (!seen.insert(idx).second) throw ConfigError("gpus", "GPU " + std::to_string(idx) + " is listed twice");
    const auto it = std::find_if(found.gpus.begin(), found.gpus.end(), [&](const wire::GpuInfo& g) { return g.index == idx; });
    if (it == found.gpus.end()) {
      std::string have;
      for (const auto& g : found.gpus) have += (have.empty() ? "" : ", ") + std::to_string(g.index);
      std::string msg = "GPU " + std::to_string(idx) + " is not on this machine (NVML found " +
                        std::to_string(found.gpus.size()) + (found.gpus.empty() ? "" : ": " + have) + ")";
      if (!found.problem.empty()) msg += ": " + found.problem;
      throw ConfigError("gpus", msg);
    }
    out.push_back(*it);
  }
  return out;
}

std::string describe_gpus(const GpuDiscovery& found, const std::vector<wire::GpuInfo>& offered) {
  if (offered.empty()) {
    if (!found.problem.empty()) return "no GPUs (" + found.problem + ")";
    return found.gpus.empty() ? "no GPUs (NVML found none)" : "no GPUs (gpus = [] in the configuration)";
  }
  std::string s = std::to_string(offered.size()) + (offered.size() == 1 ? " GPU: " : " GPUs: ");
  for (std::size_t i = 0; i < offered.size(); ++i) {
    const auto& g = offered[i];
    s += (i ? ", " : "") + std::to_string(g.index) + " " + g.name + " (" + std::to_string(g.memory_mb) + " MiB)";
  }
  if (!found.driver_version.empty()) s += "; driver " + found.driver_version;
  if (!found.problem.empty()) s += "; " + found.problem;
  return s;
}

}  // namespace dltrain::agent
