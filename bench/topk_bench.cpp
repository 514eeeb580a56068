// Selection-kernel benchmark: dltrain's exact and sampled top-k against a memcpy of the
// same buffer (the memory-bandwidth limit, measured in the same run) and torch::topk,
// all on one thread. Prints a Markdown table and writes JSON (argv[1], default
// topk_bench.json).
#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <iostream>
#include <random>
#include <vector>

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "compress/topk.h"

using namespace dltrain::compress;
using Clock = std::chrono::steady_clock;

namespace {

template <typename F>
double median_seconds(int reps, F&& f) {
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    f();
    t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double recall(std::vector<std::uint32_t> got, std::vector<std::uint32_t> want) {
  std::vector<std::uint32_t> both;
  std::set_intersection(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(both));
  return static_cast<double>(both.size()) / static_cast<double>(want.size());
}

}  // namespace

int main(int argc, char** argv) {
  const std::string out_path = argc > 1 ? argv[1] : "topk_bench.json";
  torch::set_num_threads(1);
  nlohmann::json results = nlohmann::json::array();
  std::cout << "| n | ratio | kernel | time (ms) | GB/s of input | % of memcpy | recall |\n"
            << "|---|---|---|---|---|---|---|\n";
  for (std::size_t n : {std::size_t{1000000}, std::size_t{10000000}}) {
    std::mt19937 g(1);
    std::normal_distribution<float> d;
    std::vector<float> x(n), copy(n);
    for (auto& v : x) v = d(g);
    const int reps = n > 1000000 ? 7 : 21;
    const double bytes = 4.0 * static_cast<double>(n);
    const double t_memcpy = median_seconds(reps, [&] {
      std::memcpy(copy.data(), x.data(), 4 * n);
      asm volatile("" ::: "memory");
    });
    auto row = [&](double ratio, const std::string& kernel, double t, double rec) {
      const double gbps = bytes / t / 1e9;
      const double pct = 100.0 * t_memcpy / t;
      std::printf("| %zu | %s | %s | %.3f | %.2f | %.1f%% | %s |\n", n,
                  ratio > 0 ? (std::to_string(ratio * 100).substr(0, 4) + "%").c_str() : "-", kernel.c_str(),
                  t * 1e3, gbps, pct, rec >= 0 ? std::to_string(rec).substr(0, 6).c_str() : "-");
      results.push_back({{"n", n},
                         {"ratio", ratio},
                         {"kernel", kernel},
                         {"seconds", t},
                         {"gb_per_s", gbps},
                         {"fraction_of_memcpy", t_memcpy / t},
                         {"recall", rec >= 0 ? nlohmann::json(rec) : nlohmann::json(nullptr)}});
    };
    row(0, "memcpy", t_memcpy, -1);
    for (double ratio : {0.01, 0.001}) {
      const std::size_t k = k_for(n, ratio);
      TopkScratch s;
      std::vector<std::uint32_t> exact, sampled;
      const double t_exact = median_seconds(reps, [&] { topk_exact(x, k, exact, s); });
      row(ratio, "dltrain exact top-k", t_exact, 1.0);
      std::uint64_t seed = 1;
      const double t_sampled = median_seconds(reps, [&] { topk_sampled(x, k, 0.01, seed++, sampled, s); });
      row(ratio, "dltrain sampled top-k (DGC, 1% sample)", t_sampled, recall(sampled, exact));
      auto tx = torch::from_blob(x.data(), {static_cast<std::int64_t>(n)}, torch::kFloat32);
      const double t_torch = median_seconds(std::max(3, reps / 3), [&] {
        auto r = torch::topk(tx.abs(), static_cast<std::int64_t>(k));
        (void)r;
      });
      row(ratio, "torch::topk(abs(x))", t_torch, 1.0);
    }
  }
  std::ofstream(out_path) << results.dump(2) << "\n";
  std::cout << "\nwrote " << out_path << "\n";
  return 0;
}
