// GPU discovery: the NVIDIA GPUs an agent offers, found through NVML (the driver's
// management library) loaded at run time, so that one dltrain-agent binary runs on
// machines with and without an NVIDIA driver. See docs/operations.md, "GPUs".
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "wire/control_bodies.h"

namespace dltrain::agent {

/// What NVML said about this machine's GPUs.
struct GpuDiscovery {
  std::vector<wire::GpuInfo> gpus;  ///< in NVML's index order (the CUDA_VISIBLE_DEVICES numbering)
  std::string driver_version;       ///< e.g. "580.65.06"; "" when NVML did not answer
  /// What went wrong ("" when nothing did, even with zero GPUs): the library could not be
  /// loaded (no NVIDIA driver), lacks a function, or nvmlInit failed (its nvmlErrorString,
  /// e.g. "Driver Not Loaded"), in which case `gpus` is empty; or, with the GPUs that
  /// answered listed, the devices whose queries failed and a count past 64.
  std::string problem;
};

/// Loads `library` with dlopen (a file name is looked up on the loader's path, as
/// "libnvidia-ml.so.1"; a path is used as it is), initialises NVML, reads every device's
/// name, UUID and total memory, shuts NVML down and unloads the library. Never throws:
/// a failure is reported in `problem`, a device whose queries fail is left out with
/// its index and NVML's error appended to `problem`. Calls nvmlInit_v2,
/// nvmlSystemGetDriverVersion, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2,
/// nvmlDeviceGetName, nvmlDeviceGetUUID, nvmlDeviceGetMemoryInfo, nvmlShutdown and
/// nvmlErrorString (NVML API reference, "Initialization and Cleanup", "Device Queries").
/// Thread-safety: NVML is reference-counted and thread-safe; call it from one thread
/// anyway (the agent calls it once at start).
GpuDiscovery discover_gpus(const std::string& library = "libnvidia-ml.so.1");

/// The GPUs an agent offers given its `gpus` setting: nullopt ("auto") = every GPU found;
/// otherwise exactly the listed NVML indices, in the order listed. Throws ConfigError
/// (field "gpus") for an index that was not found, naming the GPUs that were (and, when
/// NVML did not answer, why), or for an index listed twice.
std::vector<wire::GpuInfo> select_gpus(const GpuDiscovery& found, const std::optional<std::vector<int>>& wanted);

/// One line for the log: "2 GPUs: 0 NVIDIA H200 (143771 MiB), 1 …; driver 580.65" or
/// "no GPUs (libnvidia-ml.so.1: cannot open shared object file …)".
std::string describe_gpus(const GpuDiscovery& found, const std::vector<wire::GpuInfo>& offered);

}  // namespace dltrain::agent
