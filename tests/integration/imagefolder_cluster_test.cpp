// A standalone cluster (a leader and three agents on loopback, real processes) trains
// resnet20 on a PNG ImageFolder written from the real Fashion-MNIST images (28×28 padded
// to 32×32), with 2 workers + 1 PS shard: dense ASGD and DGC, through the real client.
#include <filesystem>
#include <iostream>
#include <memory>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "data/image.h"
#include "support/cluster.h"
#include "support/standalone_suite.h"
#include "support/image_folder.h"
#include "support/process.h"
#include "support/jobs.h"
#include "support/names.h"

namespace {

// 2,500 training and 500 test images, two of the training files unreadable.
class ImageFolderCluster : public dltrain::testing::StandaloneSuite<ImageFolderCluster> {
 public:
  static constexpr const char* kRootPrefix = "dltrain-imagefolder-cluster";
  static constexpr int kAgents = 3;
  static std::vector<std::string> agent_args() { return {"--progress-interval", "2"}; }
  static void prepare(const fs::path& root) {
    data_ = root / "fashion-mnist-png";
    dltrain::testing::write_fashion_mnist_folder(data_, 2500, 500, "png", 32);
    dltrain::testing::write_bytes(data_ / "train" / "Bag" / "empty.png", {});
    dltrain::testing::write_bytes(data_ / "train" / "Coat" / "broken.jpg", {0xFF, 0xD8, 0xFF, 0xE0, 0x00});
  }

 protected:
  // Submits `name` with resnet20 on the folder and follows it; returns the summary and
  // (in `events`) every line the client printed. `top` goes among the job's top-level
  // keys, `extra` after its [optimizer] table.
  static json train(const std::string& name, int epochs, const std::string& extra, std::vector<json>& events,
                    const std::string& top = "") {
    const auto job = dltrain::testing::write_job_file(root_, name, R"(model = "resnet20"
dataset = "imagefolder"
data_dir = ")" + data_.string() + R"("
image_size = 32
channels = 1
epochs = )" + std::to_string(epochs) + R"(
workers = 2
ps_shards = 1
batch_size = 32
seed = 3
)" + top + R"(
[optimizer]
lr = 0.05
warmup_epochs = 0.2
)" + extra);
    const auto id = dltrain::testing::submit_job(client_, job);
    auto r = dltrain::testing::follow_to_end(client_, id);
    EXPECT_EQ(r.code, 0) << r.out;
    std::istringstream lines(r.out);
    for (std::string line; std::getline(lines, line);) {
      auto j = json::parse(line, nullptr, false);
      if (j.is_object()) events.push_back(j);
    }
    auto summary = json::parse(last_line(r.out), nullptr, false);
    if (summary.is_object()) {
      RecordProperty("test_accuracy", std::to_string(summary.value("test_accuracy", 0.0)));
      RecordProperty("wall_seconds", std::to_string(summary.value("wall_seconds", 0.0)));
    }
    return summary;
  }

  static inline fs::path data_;
};

}  // namespace

TEST_F(ImageFolderCluster, Resnet20TrainsWellAboveChanceAndCountsTheUnreadableFiles) {
  std::vector<json> events;
  const auto s = train("resnet20-png", 3, "", events, "sync = \"sync\"\n");
  ASSERT_TRUE(s.is_object());
  EXPECT_EQ(s["state"], "succeeded") << s.dump();
  std::cout << "[ figures  ] resnet20 on the folder, BSP: test accuracy " << s["test_accuracy"] << std::endl;
  // Chance is 0.10. In BSP with a fixed seed the run is deterministic: 0.75 in 12 runs of
  // 12 on a 2-core machine, so the bound has a margin of 0.5. (It trained asynchronously
  // before, where the workers' staleness follows their timing: 0.21–0.50, and one run in
  // 12 ended below the bound.)
  EXPECT_GE(s["test_accuracy"].get<double>(), 0.25) << s.dump();
  EXPECT_EQ(s.value("skipped_images", -1), 2) << s.dump();
  int data_events = 0, skipped_events = 0, waits = 0;
  for (const auto& e : events) {
    const auto kind = e.value("event", "");
    if (kind == "data") {
      ++data_events;
      EXPECT_EQ(e["classes"], 10);
      EXPECT_EQ(e["train_images"], 2502);
      EXPECT_EQ(e["normalization"], "sample");
      // The padded Fashion-MNIST images: the pixel mean of the 28×28 originals (0.286)
      // shrinks by 784/1024 to about 0.219.
      EXPECT_NEAR(e["mean"][0].get<double>(), 0.219, 0.03) << e.dump();
    }
    if (kind == "skipped_image") ++skipped_events;
    if (kind == "progress" && e.contains("data_wait_seconds")) ++waits;
  }
  EXPECT_EQ(data_events, 2);  // one per worker
  EXPECT_GE(skipped_events, 2);
  EXPECT_GE(waits, 1);
}

TEST_F(ImageFolderCluster, Resnet20WithDgcTrainsAndCompresses) {
  std::vector<json> events;
  const auto s = train("resnet20-png-dgc", 2, kDgcCompression,
                       events);
  ASSERT_TRUE(s.is_object());
  EXPECT_EQ(s["state"], "succeeded") << s.dump();
  EXPECT_EQ(s["compression"], "dgc");
  EXPECT_GE(s["test_accuracy"].get<double>(), 0.25) << s.dump();  // chance is 0.10
  EXPECT_GT(s["compression_ratio_after_warmup"].get<double>(), 20.0) << s.dump();
}

TEST_F(ImageFolderCluster, ABadLayoutIsRefusedAtSubmitNamingThePath) {
  const auto bad = root_ / "bad-folder";
  fs::create_directories(bad / "train" / "cats");
  fs::create_directories(bad / "test" / "cats");
  const auto job = dltrain::testing::write_job_file(root_, "bad-layout", "model = \"resnet20\"\ndataset = \"imagefolder\"\n"
                                                                          "data_dir = \"" + bad.string() + "\"\n");
  auto r = run(client_ + " submit " + job.string() + " 2>&1", 30);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("data_dir"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find((bad / "train" / "cats").string() + "\" has no image files"), std::string::npos) << r.out;
}
