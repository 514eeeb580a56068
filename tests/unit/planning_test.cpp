// The leader's adapter to the planner (leader/planning.h) without a leader: the PS memory
// check against the live agents' memory (resnet18's 11.2 M parameters and their momentum
// are ~89 MB: refused on 64 MB, fine on 1 GiB; a TorchScript model and a cluster with no
// live agent are not judged), the plan it remembers, and the history rows a job leaves in
// a real RocksDB store (the slowest worker's epoch time, the bytes since the last row;
// none for an exploration run's epochs or a resumed job's end).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "leader/planning.h"
#include "planner/policy.h"
#include "store/rocksdb_store.h"
#include "support/session_double.h"
#include "support/temp_dir.h"

using namespace dltrain;
using namespace dltrain::leader;

namespace {

JobSpec resnet18_job() {
  JobSpec spec;
  spec.model = ModelKind::kResnet18;
  spec.channels = 1;  // Fashion-MNIST's, as the job file's reader sets them
  spec.image_size = 28;
  spec.workers = 2;
  spec.ps_shards = 1;
  return spec;
}

}  // namespace

TEST(Planning, APsShardThatFitsNoLiveAgentsMemoryIsRefusedAndNothingIsJudgedWithoutOne) {
  AgentRegistry agents;
  config::AgentOptions opt;
  Planning planning(agents, opt);
  EXPECT_FALSE(planning.ps_memory_problem(resnet18_job()).has_value()) << "no live agent: nothing to compare with";

  const std::shared_ptr<control::Session> session = std::make_shared<dltrain::testing::SessionDouble>();
  auto& a = agents["agent-a"];
  a.session = session;
  a.memory_mb = 64;
  const auto why = planning.ps_memory_problem(resnet18_job());
  ASSERT_TRUE(why.has_value()) << "~89 MB of parameters and momentum on a 64 MB agent";
  // torchvision's 11,181,642 for 3 channels and 10 classes, less the stem's 7·7·2·64 =
  // 6,272 weights of the two channels Fashion-MNIST does not have.
  EXPECT_NE(why->find("11175370-parameter resnet18"), std::string::npos) << *why;
  EXPECT_NE(why->find("ps_shards"), std::string::npos) << *why;

  auto scripted = resnet18_job();
  scripted.model = ModelKind::kTorchScript;
  EXPECT_FALSE(planning.ps_memory_problem(scripted).has_value()) << "a TorchScript model's size is the worker's to know";
  a.memory_mb = 1024;
  EXPECT_FALSE(planning.ps_memory_problem(resnet18_job()).has_value());
  a.memory_mb = 64;
  a.lost = true;  // a lost agent's memory does not count
  EXPECT_FALSE(planning.ps_memory_problem(resnet18_job()).has_value());
}

TEST(Planning, HistoryRowsAndThePlanGoIntoTheStore) {
  dltrain::testing::TempDir dir;
  auto db = store::RocksDbStore::open((dir.path / "db").string());
  AgentRegistry agents;
  config::AgentOptions opt;
  Planning planning(agents, opt);

  JobRec j;
  j.id = "job-7";
  j.spec.model = ModelKind::kCnn;
  j.spec.dataset = DatasetKind::kFashionMnist;
  j.spec.workers = 2;
  j.spec.batch_size = 64;
  j.figures.epoch_seconds = {{0, 10.0}, {1, 12.5}};
  j.bytes.pushed = {{0, 3000}, {1, 3000}};
  j.bytes.pulled = {{0, 2000}, {1, 2000}};
  wire::events::EpochEnd e;
  e.epoch = 1;
  e.eval_seconds = 1.5;
  planning.record_epoch(j, e);  // no store yet: nothing, and no error
  planning.use_store(db.get());
  planning.record_epoch(j, e);
  j.bytes.pushed = {{0, 5000}, {1, 5000}};  // 4,000 more bytes by the second epoch
  e.epoch = 2;
  planning.record_epoch(j, e);
  auto rows = db->history("cnn", "fashion-mnist");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].job, "job-7");
  EXPECT_EQ(rows[0].epoch, 1);
  EXPECT_EQ(rows[0].epoch_seconds, 12.5);  // the slowest worker's
  EXPECT_EQ(rows[0].bytes_per_epoch, 10000);
  EXPECT_EQ(rows[0].eval_seconds, 1.5);
  EXPECT_EQ(rows[0].workers, 2);
  EXPECT_EQ(rows[0].batch_size, 64);
  EXPECT_EQ(rows[1].epoch, 2);
  EXPECT_EQ(rows[1].bytes_per_epoch, 4000);

  // An exploration run's epochs and a resumed job's end leave no row.
  JobRec run = j;
  run.spec.profile = true;
  planning.record_epoch(run, e);
  JobRec resumed = j;
  resumed.resume.epoch = 3;
  planning.record_final(resumed);
  EXPECT_EQ(db->history("cnn", "fashion-mnist").size(), 2u);

  const planner::Config choice{4, 128};
  planning.remember(j.spec, choice);
  const auto key = planner::plan_key(j.spec);
  const auto stored = db->get_meta(key);
  ASSERT_TRUE(stored.has_value());
  EXPECT_EQ(planner::decode_plan(*stored, key), choice);
}

TEST(Planning, TheChosenMethodTakesItsRecipeAndAnAutoJobsProfileRunsTheCandidatesMethod) {
  JobSpec spec;
  spec.model = ModelKind::kMlpLarge;
  spec.epochs = 8;
  spec.compression.method_auto = true;
  // The recipe's defaults (compress::apply_method_defaults): DGC's warm-up over
  // min(1, 8/4) = 1 epoch in four stages, tensors under 16 KiB in full, the "auto" downlink.
  JobSpec dgc = spec;
  planner::apply_method(dgc, {compress::Method::kDgc, 0.01});
  EXPECT_FALSE(dgc.compression.method_auto);
  EXPECT_EQ(dgc.compression.method, compress::Method::kDgc);
  EXPECT_DOUBLE_EQ(dgc.compression.ratio, 0.01);
  EXPECT_DOUBLE_EQ(dgc.compression.warmup_epochs, 1.0);
  EXPECT_EQ(dgc.compression.min_compress_bytes, 16384);
  EXPECT_DOUBLE_EQ(dgc.compression.downlink_ratio, 0.0);
  JobSpec fp16 = spec;
  planner::apply_method(fp16, {compress::Method::kFp16, 1});
  EXPECT_EQ(fp16.compression.method, compress::Method::kFp16);
  EXPECT_TRUE(compress::half_downlink(fp16.compression));
  // The exploration run of a candidate runs the candidate's method, and says so.
  const auto run = planner::exploration_spec(spec, "job-7", {4, 64, {compress::Method::kDgc, 0.001}}, 40);
  EXPECT_EQ(run.compression.method, compress::Method::kDgc);
  EXPECT_DOUBLE_EQ(run.compression.ratio, 0.001);
  EXPECT_EQ(run.name, "profile 4x64 dgc 0.1% for job-7");
  // Its rows record the setting; a method = "auto" job's history is every method's.
  EXPECT_DOUBLE_EQ(planner::base_observation(run, "job-8", "cpu").compression_setting, 0.001);
  std::vector<store::Observation> rows(2);
  rows[1].compression = "dgc";
  EXPECT_EQ(planner::relevant_history(rows, spec).size(), 2u);
  EXPECT_EQ(planner::relevant_history(rows, dgc).size(), 1u);
  // Its options: the four candidates and a PowerSGD rank the history measured.
  rows[0].compression = "powersgd";
  rows[0].compression_setting = 2;
  const auto options = planner::method_options(spec, rows);
  ASSERT_EQ(options.size(), 5u);
  EXPECT_EQ(planner::method_label(options.back()), "powersgd rank 2");
  EXPECT_EQ(planner::method_options(dgc, rows).size(), 1u);
  // The stored plan keeps the method; one stored before it had none reads as none.
  const planner::Config c{4, 64, {compress::Method::kDgc, 0.01}};
  EXPECT_EQ(planner::decode_plan(planner::encode_plan(c), "k"), c);
  EXPECT_EQ(planner::decode_plan(R"({"workers":2,"batch_size":32})", "k"), (planner::Config{2, 32}));
  EXPECT_THROW(planner::decode_plan(R"({"workers":2,"batch_size":32,"method":"zip","setting":1})", "k"), ProtocolError);
}

// The shared plan's scaling curve from the planner's epoch-time model. The history: the
// CNN at batch 64 measured at 1, 2 and 4 workers, 1,000, 1,800 and 2,400 images/s (the
// job's whole rate). Seconds per image 1/1000, 1/1800, 1/2400; at 3 workers the model
// interpolates them: (1/1800 + 1/2400) / 2 = 1/2057.14. Speedup: 1, 1.8, 2.0571, 2.4;
// past the most workers measured, linear at 4's per-worker rate: 2,400 × 5/4 = 3,000
// (3.0), × 6/4 (3.6). Without a store, or with one worker count measured: empty.
TEST(Planning, TheSpeedupCurveIsTheEpochTimeModelsWithinTheMeasuredWorkersAndLinearBeyond) {
  dltrain::testing::TempDir dir;
  auto db = store::RocksDbStore::open((dir.path / "db").string());
  AgentRegistry agents;
  config::AgentOptions opt;
  Planning planning(agents, opt);
  JobSpec spec;
  spec.model = ModelKind::kCnn;
  spec.dataset = DatasetKind::kFashionMnist;
  spec.batch_size = 64;
  EXPECT_TRUE(planning.speedup(spec, 6).empty());  // no store
  planning.use_store(db.get());
  const auto row = [&](int w, double ips) {
    store::Observation o;
    o.model = "cnn";
    o.dataset = "fashion-mnist";
    o.workers = w;
    o.batch_size = 64;
    o.images_per_sec = ips;
    o.epoch_seconds = 60000.0 / ips;
    o.epoch = 1;
    o.job = "job-" + std::to_string(w);
    db->add_observation(o);
  };
  row(1, 1000);
  EXPECT_TRUE(planning.speedup(spec, 6).empty());  // one worker count: no curve
  row(2, 1800);
  row(4, 2400);
  const auto s = planning.speedup(spec, 6);
  ASSERT_EQ(s.size(), 6u);
  EXPECT_NEAR(s[0], 1.0, 1e-9);
  EXPECT_NEAR(s[1], 1.8, 1e-6);
  EXPECT_NEAR(s[2], 2.0 / (1.0 / 1.8 + 1.0 / 2.4), 1e-6);
  EXPECT_NEAR(s[3], 2.4, 1e-6);
  EXPECT_NEAR(s[4], 3.0, 1e-6);
  EXPECT_NEAR(s[5], 3.6, 1e-6);
  EXPECT_EQ(planning.speedup(spec, 2).size(), 2u);
}

// The accuracy bound: final accuracies (5 epochs) 0.92 at global batch 32 and 128, 0.90 at
// 256, 0.85 at 512. A job of batch 64 with target 0.905: 1 worker (64: 0.92), 2 (128:
// 0.92), 3 (192: halfway between 128 and 256, 0.91) reach it; 4 (256: 0.90) does not: at
// most 3. Target 0.95: no size reaches it, no cap. No target: no cap. Batch 256 (the most
// measured): 2 workers (512) still inside the history (0.85 < 0.905), 1 (256: 0.90) not:
// no size, no cap; with target 0.85, 2 workers (512: 0.85) and nothing beyond the history
// (3 × 256 = 768 > 512, not counted on).
TEST(Planning, TheAccuracyCapIsTheMostWorkersTheAccuracyModelLetsReachTheTarget) {
  dltrain::testing::TempDir dir;
  auto db = store::RocksDbStore::open((dir.path / "db").string());
  AgentRegistry agents;
  config::AgentOptions opt;
  Planning planning(agents, opt);
  planning.use_store(db.get());
  const auto final_row = [&](int w, int b, double acc) {
    store::Observation o;
    o.model = "cnn";
    o.dataset = "fashion-mnist";
    o.workers = w;
    o.batch_size = b;
    o.images_per_sec = 1000;
    o.epoch_seconds = 60;
    o.epoch = 5;
    o.final_accuracy = acc;
    o.job = "job-" + std::to_string(w) + "-" + std::to_string(b);
    db->add_observation(o);
  };
  final_row(1, 32, 0.92);
  final_row(2, 64, 0.92);
  final_row(2, 128, 0.90);
  final_row(4, 128, 0.85);
  JobSpec spec;
  spec.model = ModelKind::kCnn;
  spec.dataset = DatasetKind::kFashionMnist;
  spec.batch_size = 64;
  spec.epochs = 5;
  EXPECT_FALSE(planning.accuracy_cap(spec, 8).has_value());  // no target
  spec.target_accuracy = 0.905;
  EXPECT_EQ(planning.accuracy_cap(spec, 8), 3);
  EXPECT_EQ(planning.accuracy_cap(spec, 2), 2);
  spec.target_accuracy = 0.95;
  EXPECT_FALSE(planning.accuracy_cap(spec, 8).has_value());
  spec.batch_size = 256;
  spec.target_accuracy = 0.905;
  EXPECT_FALSE(planning.accuracy_cap(spec, 8).has_value());
  spec.target_accuracy = 0.85;
  EXPECT_EQ(planning.accuracy_cap(spec, 8), 2);
}
