// Device top-k (lib/gpu) on a CUDA device: exact and sampled top-k of 0.1 % and 1 % of
// 10^7 and 10^8 floats, beside a device-to-device copy of the same buffer in the same run
// (the memory-bandwidth bound), and the bytes one step would copy to the host with and
// without selection on the device. One JSON object per line on stdout; torch.topk on the
// same device is bench/gpu/torch_topk.py. Run by scripts/gpu-check (docs/benchmarks.md,
// "GPU").
#include <chrono>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "compress/topk.h"
#include "gpu/device.h"
#include "gpu/device_topk.h"

using namespace dltrain;
using Clock = std::chrono::steady_clock;

namespace {

template <typename F>
double seconds_per_call(int reps, F&& f) {
  f();  // warm-up (allocations, first launch)
  gpu::synchronize();
  const auto t0 = Clock::now();
  for (int r = 0; r < reps; ++r) f();
  gpu::synchronize();
  return std::chrono::duration<double>(Clock::now() - t0).count() / reps;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"device top-k benchmark (lib/gpu)"};
  std::vector<std::size_t> sizes{10000000, 100000000};
  std::vector<double> ratios{0.001, 0.01};
  int reps = 20;
  app.add_option("--sizes", sizes, "buffer sizes, floats");
  app.add_option("--ratios", ratios, "densities k/n");
  app.add_option("--reps", reps, "timed calls per cell")->check(CLI::Range(1, 10000));
  CLI11_PARSE(app, argc, argv);
  std::string why;
  if (gpu::device_count(&why) == 0) {
    std::cerr << "no CUDA device (" << why << ")\n";
    return 77;
  }
  const std::string device = gpu::device_name(0);
  gpu::DeviceTopk topk;
  for (const auto n : sizes) {
    std::vector<float> host(n);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& v : host) v = normal(rng);
    gpu::DeviceArray<float> x, copy(n);
    x.upload(host);
    const double bytes = static_cast<double>(n) * sizeof(float);
    const double t_copy = seconds_per_call(reps, [&] { gpu::copy_on_device(copy.data(), x.data(), n * sizeof(float)); });
    // A copy reads and writes every byte: its bandwidth counts both (what a top-k that
    // reads the buffer once is held against).
    const double copy_gbps = 2 * bytes / t_copy / 1e9;
    for (const double ratio : ratios) {
      const std::size_t k = compress::k_for(n, ratio);
      gpu::DeviceArray<std::uint32_t> out;
      compress::SampledStats st;
      const double t_sampled = seconds_per_call(reps, [&] { st = topk.sampled(x.data(), n, k, 0.01, 42, out); });
      const double t_exact = seconds_per_call(std::max(1, reps / 4), [&] { topk.exact(x.data(), n, k, out); });
      for (const auto& [method, t] : {std::pair{"sampled", t_sampled}, std::pair{"exact", t_exact}}) {
        nlohmann::json j{{"device", device},
                         {"n", n},
                         {"ratio", ratio},
                         {"k", k},
                         {"method", method},
                         {"seconds", t},
                         {"input_gbps", bytes / t / 1e9},
                         {"copy_seconds", t_copy},
                         {"copy_gbps", copy_gbps},
                         {"fraction_of_copy_bandwidth", (bytes / t) / (2 * bytes / t_copy)},
                         {"pcie_bytes_dense", 4 * n},
                         {"pcie_bytes_selected", 8 * k}};
        if (std::string(method) == "sampled") j["rounds"] = st.rounds;
        std::cout << j.dump() << std::endl;
      }
    }
  }
  return 0;
}
