// GPU discovery through NVML loaded at run time (agent/gpus.h), the `gpus` setting, and
// the GPUs in a registration. The machine that runs CI has no NVIDIA driver, so the
// library loaded here is tests/support/nvml_double.cpp (NVML's C ABI, devices from the
// environment) beside a missing library and a real one that is not NVML (zlib).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "agent/gpus.h"
#include "config/options.h"
#include "common/errors.h"
#include "wire/control_bodies.h"

namespace {

using dltrain::agent::discover_gpus;
using dltrain::agent::select_gpus;

// Sets (or, with nullptr, unsets) an environment variable for one test's lifetime.
class Env {
 public:
  Env(const char* name, const char* value) : name_(name) {
    if (value) {
      setenv(name, value, 1);
    } else {
      unsetenv(name);
    }
  }
  ~Env() { unsetenv(name_); }

 private:
  const char* name_;
};

TEST(GpuDiscovery, AMissingLibraryMeansNoGpusAndSaysWhy) {
  const auto d = discover_gpus("libdltrain-no-such-nvml.so.1");
  EXPECT_TRUE(d.gpus.empty());
  EXPECT_NE(d.problem.find("NVML could not be loaded"), std::string::npos) << d.problem;
  EXPECT_NE(d.problem.find("libdltrain-no-such-nvml.so.1"), std::string::npos) << d.problem;
  EXPECT_EQ(dltrain::agent::describe_gpus(d, d.gpus), "no GPUs (" + d.problem + ")");
}

TEST(GpuDiscovery, ALibraryThatIsNotNvmlIsNamedWithTheMissingFunction) {
  const auto d = discover_gpus("libz.so.1");
  EXPECT_TRUE(d.gpus.empty());
  EXPECT_EQ(d.problem, "libz.so.1 is not a usable NVML: it has no nvmlInit_v2");
}

TEST(GpuDiscovery, ReadsEveryDeviceNameUuidAndMemory) {
  Env devs("NVML_DOUBLE_DEVICES", "NVIDIA H200:143771;NVIDIA A100-SXM4-80GB:81920");
  const auto d = discover_gpus(DLTRAIN_NVML_DOUBLE);
  EXPECT_EQ(d.problem, "");
  EXPECT_EQ(d.driver_version, "580.65.06");
  ASSERT_EQ(d.gpus.size(), 2u);
  EXPECT_EQ(d.gpus[0].index, 0);
  EXPECT_EQ(d.gpus[0].name, "NVIDIA H200");
  EXPECT_EQ(d.gpus[0].memory_mb, 143771);
  EXPECT_EQ(d.gpus[0].uuid, "GPU-00000000-0000-0000-0000-000000000000");
  EXPECT_EQ(d.gpus[1].index, 1);
  EXPECT_EQ(d.gpus[1].name, "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(d.gpus[1].memory_mb, 81920);
  EXPECT_EQ(dltrain::agent::describe_gpus(d, d.gpus),
            "2 GPUs: 0 NVIDIA H200 (143771 MiB), 1 NVIDIA A100-SXM4-80GB (81920 MiB); driver 580.65.06");
}

TEST(GpuDiscovery, AFailedInitIsReportedWithNvmlsErrorString) {
  Env devs("NVML_DOUBLE_DEVICES", "NVIDIA H200:143771");
  Env err("NVML_DOUBLE_INIT_ERROR", "9");
  const auto d = discover_gpus(DLTRAIN_NVML_DOUBLE);
  EXPECT_TRUE(d.gpus.empty());
  EXPECT_EQ(d.problem, "nvmlInit failed: Driver Not Loaded (NVML error 9)");
}

TEST(GpuDiscovery, ADeviceWhoseQueryFailsIsLeftOutAndNamed) {
  Env devs("NVML_DOUBLE_DEVICES", "NVIDIA H200:143771;NVIDIA H200:143771;NVIDIA H200:143771");
  Env bad("NVML_DOUBLE_BAD_DEVICE", "1");
  const auto d = discover_gpus(DLTRAIN_NVML_DOUBLE);
  ASSERT_EQ(d.gpus.size(), 2u);
  EXPECT_EQ(d.gpus[0].index, 0);
  EXPECT_EQ(d.gpus[1].index, 2);  // NVML's numbering is kept: CUDA_VISIBLE_DEVICES=2 is that GPU
  EXPECT_EQ(d.problem, "GPU 1: GPU is lost (NVML error 15)");
}

TEST(GpuDiscovery, NoDevicesIsAnAnswerNotAProblem) {
  Env devs("NVML_DOUBLE_DEVICES", nullptr);
  const auto d = discover_gpus(DLTRAIN_NVML_DOUBLE);
  EXPECT_TRUE(d.gpus.empty());
  EXPECT_EQ(d.problem, "");
  EXPECT_EQ(dltrain::agent::describe_gpus(d, d.gpus), "no GPUs (NVML found none)");
}

dltrain::agent::GpuDiscovery three_gpus() {
  dltrain::agent::GpuDiscovery d;
  for (int i = 0; i < 3; ++i) {
    dltrain::wire::GpuInfo g;
    g.index = i;
    g.name = "GPU model " + std::to_string(i);
    g.memory_mb = 1000 * (i + 1);
    d.gpus.push_back(g);
  }
  return d;
}

TEST(GpuSelection, AutoOffersEveryGpuAListExactlyThoseInItsOrder) {
  const auto d = three_gpus();
  EXPECT_EQ(select_gpus(d, std::nullopt).size(), 3u);
  const auto some = select_gpus(d, std::vector<int>{2, 0});
  ASSERT_EQ(some.size(), 2u);
  EXPECT_EQ(some[0].index, 2);
  EXPECT_EQ(some[0].memory_mb, 3000);
  EXPECT_EQ(some[1].index, 0);
  EXPECT_TRUE(select_gpus(d, std::vector<int>{}).empty());
}

TEST(GpuSelection, AMissingOrRepeatedGpuIsAConfigErrorNamingWhatWasFound) {
  const auto d = three_gpus();
  try {
    select_gpus(d, std::vector<int>{0, 5});
    FAIL() << "GPU 5 was accepted";
  } catch (const dltrain::ConfigError& e) {
    EXPECT_EQ(e.field(), "gpus");
    EXPECT_NE(std::string(e.what()).find("GPU 5 is not on this machine (NVML found 3: 0, 1, 2)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(select_gpus(d, std::vector<int>{1, 1}), dltrain::ConfigError);
  dltrain::agent::GpuDiscovery none;
  none.problem = "NVML could not be loaded: libnvidia-ml.so.1: cannot open shared object file";
  try {
    select_gpus(none, std::vector<int>{0});
    FAIL() << "GPU 0 was accepted without NVML";
  } catch (const dltrain::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("(NVML found 0): NVML could not be loaded"), std::string::npos) << e.what();
  }
}

TEST(GpuOptions, GpusIsAutoNoneOrAListOfIndices) {
  const auto parse_agent_options = [](const std::string& text, const std::string& dir) {
    return dltrain::config::parse_agent_options("agent_token = \"gpu-test-agent-token-0123456789abcdef\"\n" + text, dir);
  };
  EXPECT_FALSE(parse_agent_options("", ".").gpus.has_value());
  EXPECT_FALSE(parse_agent_options("gpus = \"auto\"", ".").gpus.has_value());
  EXPECT_EQ(parse_agent_options("gpus = \"none\"", ".").gpus, std::vector<int>{});
  EXPECT_EQ(parse_agent_options("gpus = [0, 2]", ".").gpus, (std::vector<int>{0, 2}));
  EXPECT_EQ(parse_agent_options("nvml_library = \"/opt/nvidia/lib/libnvidia-ml.so.1\"", ".").nvml_library,
            "/opt/nvidia/lib/libnvidia-ml.so.1");
  for (const char* bad : {"gpus = \"some\"", "gpus = 2", "gpus = [-1]", "gpus = [64]", "gpus = [1.5]",
                          "gpus = [\"0\"]", "nvml_library = \"\""}) {
    try {
      parse_agent_options(bad, ".");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const dltrain::ConfigError& e) {
      EXPECT_EQ(e.field().substr(0, 4), std::string(bad).substr(0, 4)) << bad << ": " << e.what();
    }
  }
}

TEST(GpuOptions, AFileWithABadGpusNamesTheKeyAndTheFile) {
  const auto path = std::filesystem::temp_directory_path() / ("dltrain-gpus-" + std::to_string(::getpid()) + ".toml");
  std::ofstream(path) << "agent_token = \"gpu-test-agent-token-0123456789abcdef\"\ngpus = \"most\"\n";
  try {
    dltrain::config::load_agent_options(path.string());
    ADD_FAILURE() << "gpus = \"most\" was accepted";
  } catch (const dltrain::ConfigError& e) {
    EXPECT_EQ(e.field(), "gpus");
    EXPECT_EQ(std::string(e.what()), "gpus: expected one of auto | none, got \"most\" (in " + path.string() + ")");
  }
  std::filesystem::remove(path);
}

TEST(GpuRegistration, GpusTravelInTheRegisterBodyAndBadOnesAreRefused) {
  dltrain::wire::RegisterBody r;
  r.name = "gpu-host";
  r.cores = 8;
  dltrain::wire::GpuInfo g;
  g.index = 3;
  g.name = "NVIDIA H200";
  g.uuid = "GPU-1";
  g.memory_mb = 143771;
  r.gpus.push_back(g);
  const auto back = dltrain::wire::RegisterBody::from_json(r.to_json());
  ASSERT_EQ(back.gpus.size(), 1u);
  EXPECT_EQ(back.gpus[0].index, 3);
  EXPECT_EQ(back.gpus[0].name, "NVIDIA H200");
  EXPECT_EQ(back.gpus[0].memory_mb, 143771);
  EXPECT_NO_THROW(back.check("register"));
  // An older agent's registration has no "gpus": none.
  auto j = r.to_json();
  j.erase("gpus");
  EXPECT_TRUE(dltrain::wire::RegisterBody::from_json(j).gpus.empty());

  auto twice = r;
  twice.gpus.push_back(g);
  EXPECT_THROW(twice.check("register"), dltrain::wire::BodyError);
  auto out_of_range = r;
  out_of_range.gpus[0].index = 64;
  EXPECT_THROW(out_of_range.check("register"), dltrain::wire::BodyError);
  auto negative = r;
  negative.gpus[0].memory_mb = -1;
  EXPECT_THROW(negative.check("register"), dltrain::wire::BodyError);
  auto many = r;
  many.gpus.clear();
  for (int i = 0; i < 65; ++i) many.gpus.push_back(g);
  EXPECT_THROW(many.check("register"), dltrain::wire::BodyError);
}

}  // namespace
