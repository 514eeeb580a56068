// WorkerLoop's events and the end of its run (train/worker_loop.h): progress, epoch and
// profile events, rank 0's evaluation and checkpoints, stopping with a replica.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include <fmt/ranges.h>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/errors.h"
#include "common/file_transfer.h"
#include "dltrain/config.h"
#include "ps/checkpoint.h"
#include "train/worker_loop.h"

namespace dltrain::train::detail {
namespace {

/// Training images the BatchNorm statistics are re-estimated over before an evaluation.
/// 1,000 estimate them as well as 5,000 did (resnet20 on Fashion-MNIST: test accuracy
/// within ±0.4 point of 5,000's at four points of its first epoch, 9 points above the
/// running statistics at its end; docs/training.md) at a fifth of the cost.
constexpr std::int64_t kRecalibrationImages = 1000;

/// BatchNorm running statistics are not trained parameters and are not held by the PS.
/// Before every evaluation they are re-estimated for the evaluated parameters: reset,
/// then a cumulative average (momentum = None) over `batches` training batches in train
/// mode (the procedure of Izmailov et al. 2018, "Averaging Weights Leads to Wider Optima",
/// §3.2, bn_update).
void recalibrate_batchnorm(torch::nn::Module& m, const Model& model, const torch::Tensor& x,
                           int batches, int batch) {
  std::vector<torch::nn::BatchNorm2dImpl*> bns;
  for (auto& mod : m.modules(false)) {
    if (auto* bn = dynamic_cast<torch::nn::BatchNorm2dImpl*>(mod.get())) bns.push_back(bn);
  }
  if (bns.empty()) return;
  for (auto* bn : bns) {
    bn->reset_running_stats();
    bn->options.momentum(c10::nullopt);
  }
  torch::NoGradGuard ng;
  m.train(true);
  const std::int64_t n = x.size(0);
  for (int b = 0; b < batches; ++b) {
    const std::int64_t lo = (static_cast<std::int64_t>(b) * batch) % n;
    const std::int64_t hi = std::min(n, lo + batch);
    model.forward(x.slice(0, lo, hi));
  }
  for (auto* bn : bns) bn->options.momentum(0.1);
}

}  // namespace

// One skipped_image event for each of the first unreadable files (DataFeed keeps the count).
void WorkerLoop::report_skipped_images() {
  for (auto& m : feed_->take_skip_messages()) {
    wire::events::SkippedImage ev;
    ev.rank = cfg_.rank;
    ev.message = std::move(m);
    ev.skipped_images = feed_->skipped_images();
    sink_(ev.to_json());
  }
}

void WorkerLoop::maybe_report(const StepPlan& s) {
  wire::events::Progress ev;
  const double since = rep_.take_progress(ev);
  if (since <= 0) return;
  ev.rank = cfg_.rank;
  ev.epoch = s.epoch + 1;
  ev.step = s.step + 1;
  ev.steps_per_epoch = steps_per_epoch_;
  ev.global_step = replica_.global_step;
  ev.lr = s.lr;
  ev.bytes_pushed = ex_.bytes_pushed();
  ev.bytes_pulled = ex_.bytes_pulled();
  ev.density = last_density_;
  ev.compression_ratio = ex_.meter().total().ratio();
  ev.skipped_steps = rep_.skipped_steps();
  ev.counters = counters();
  if (feed_->streaming()) {
    const double wait = rep_.wait_since_report(feed_->wait_seconds());
    ev.data_wait_seconds = wait;
    ev.data_wait_fraction = std::clamp(wait / since, 0.0, 1.0);
    ev.skipped_images = feed_->skipped_images();
  }
  sink_(ev.to_json());
}

void WorkerLoop::profiled() {
  wire::events::Profile ev;
  ev.rank = cfg_.rank;
  ev.steps = replica_.global_step;
  rep_.fill_profile(ev);
  if (cfg_.rank == 0) {
    // One evaluation, timed as after an epoch: the planner adds it to every epoch.
    wire::events::EpochEnd probe;
    evaluate_on_test(probe);
    ev.eval_seconds = probe.eval_seconds;
  }
  ev.bytes_pushed = ex_.bytes_pushed();
  ev.bytes_pulled = ex_.bytes_pulled();
  sink_(ev.to_json());
  stop_ = true;
}

void WorkerLoop::end_epoch(int epoch, double epoch_seconds, double epoch_wait) {
  wire::events::EpochEnd ev;
  ev.rank = cfg_.rank;
  ev.epoch = epoch + 1;
  ev.epochs = spec_.epochs;
  ev.train_loss = rep_.epoch_loss();
  ev.epoch_seconds = epoch_seconds;
  ev.images_per_sec = static_cast<double>(n_) / epoch_seconds;
  if (feed_->streaming()) ev.data_wait_seconds = epoch_wait;
  // The last epoch: tells the PS this worker is done; rank 0 then waits for the others
  // so that the final accuracy is that of the finished model.
  if (epoch + 1 == spec_.epochs || stop_) {
    feed_->release_chunks();  // an elastic job: its last chunk acknowledged
    ex_.finish([this] { check_stop(); });
  }
  if (cfg_.rank == 0) {
    evaluate_on_test(ev);
    save_checkpoints(epoch);
  }
  if (feed_->streaming()) ev.skipped_images = feed_->skipped_images();
  report_skipped_images();
  ev.bytes_pushed = ex_.bytes_pushed();
  ev.bytes_pulled = ex_.bytes_pulled();
  sink_(ev.to_json());
  epochs_finished_ = epoch + 1;
}

// Rank 0: the test accuracy of the PS's current parameters (a dense pull), with the
// BatchNorm statistics re-estimated for them.
void WorkerLoop::evaluate_on_test(wire::events::EpochEnd& ev) {
  const auto t_eval = Clock::now();
  ex_.pull_dense();
  replica_.write_model();
  // kRecalibrationImages in batches of 250, at most one pass over a smaller sample: each
  // forward costs what evaluating as many test images does, and rank 0's evaluation holds
  // up the other workers in sync mode (docs/training.md, "BatchNorm running statistics").
  const auto& recal = feed_->recalibration_inputs();
  const int batches = static_cast<int>(std::min<std::int64_t>(kRecalibrationImages, recal.size(0)) + 249) / 250;
  recalibrate_batchnorm(*model_.module, model_, recal, batches, 250);
  const double acc = feed_->evaluate(*model_.module, model_);
  ev.test_accuracy = acc;
  ev.eval_seconds = seconds_since(t_eval);
  final_accuracy_ = acc;
}

// Asked to stop (its job is being re-assigned, or its agent stops): the replica is the
// PS's parameters as of this worker's last pull, the freshest copy the job may have of a
// shard that was lost. `pulled_at` ranks the replicas of several workers.
void WorkerLoop::stopped() {
  ex_.settle_for_stop();
  wire::events::WorkerStopped ev;
  ev.rank = cfg_.rank;
  ev.epochs_done = epochs_finished_;
  if (!cfg_.replica_path.empty()) {
    wire::events::Replica r;
    try {
      ps::write_replica_file(cfg_.replica_path, replica_.params, replica_.layout, cfg_.job,
                             static_cast<std::uint64_t>(replica_.global_step));
      r.path = cfg_.replica_path;
      r.steps = replica_.global_step;
      r.epochs_done = epochs_finished_;
      r.pulled_at = replica_.pulled_at;
    } catch (const std::exception& e) {
      r.error = e.what();
    }
    ev.replica = r;
  }
  sink_(ev.to_json());
  throw Stopped("worker " + std::to_string(cfg_.rank) + ": stopped at step " + std::to_string(replica_.global_step));
}

// Rank 0 at the job's end ("last"), and at the evaluations [checkpoint] asks for: the
// model it last evaluated (the PS's parameters of that evaluation's dense pull, its
// BatchNorm statistics), which is what the reported test accuracy is of, written beside a
// metadata file. A model that cannot be written costs the files, not the job: a warning.
void WorkerLoop::save_artifact(const std::string& checkpoint) noexcept {
  if (cfg_.artifact_dir.empty() || cfg_.rank != 0) return;
  const std::string dir = checkpoint == "last"
                              ? cfg_.artifact_dir
                              : (std::filesystem::path(cfg_.artifact_dir).parent_path() / ("model-" + checkpoint)).string();
  try {
    const auto files = save_model_files(model_, dir);
    const auto info = feed_->info();
    nlohmann::json meta{{"model", std::string(enum_name(spec_.model))},
                        {"classes", feed_->classes()},
                        {"class_names", info.class_names},
                        {"dltrain_version", DLTRAIN_VERSION},
                        {"channels", info.channels},
                        {"image_size", info.image_size},
                        {"mean", info.mean},
                        {"std", info.std},
                        {"dataset", std::string(enum_name(spec_.dataset))},
                        {"epochs", spec_.epochs},
                        {"epoch", epochs_finished_},
                        {"checkpoint", checkpoint},
                        {"job", nlohmann::json(spec_)}};
    if (!spec_.model_file.empty()) meta["model_file"] = spec_.model_file;
    if (final_accuracy_ >= 0) meta["test_accuracy"] = final_accuracy_;
    // The last model names the others beside it, for whoever collects them (the leader):
    // those in its directory, which a restarted worker 0 finds too.
    if (checkpoint == "last") meta["checkpoints"] = written_checkpoints();
    meta["files"] = nlohmann::json::array();
    meta["sha256"] = nlohmann::json::object();
    for (const auto& f : files) {
      const auto name = std::filesystem::path(f).filename().string();
      meta["files"].push_back(name);
      meta["sha256"][name] = sha256_file_hex(f);
    }
    // Whole or not at all: the metadata names the files the leader collects, so a
    // metadata.json cut short (a full disk) must not stand beside them.
    const auto path = std::filesystem::path(dir) / "metadata.json";
    const auto part = std::filesystem::path(dir) / "metadata.json.part";
    {
      std::ofstream out(part, std::ios::trunc);
      out << meta.dump(1) << "\n";
      out.flush();
      if (!out) throw IoError("cannot write " + part.string());
    }
    std::filesystem::rename(part, path);
    spdlog::info("trained model ({}) written to {} ({})", checkpoint, dir, fmt::join(meta["files"], ", "));
  } catch (const std::exception& e) {
    spdlog::warn("the trained model ({}) was not written to {}: {}", checkpoint, dir, e.what());
  }
}

std::vector<std::string> WorkerLoop::written_checkpoints() const {
  namespace fs = std::filesystem;
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(fs::path(cfg_.artifact_dir).parent_path(), ec)) {
    const auto name = e.path().filename().string();
    if (name.rfind("model-", 0) == 0 && fs::is_regular_file(e.path() / "metadata.json", ec)) names.push_back(name.substr(6));
  }
  std::sort(names.begin(), names.end());
  return names;
}

void WorkerLoop::save_checkpoints(int epoch) noexcept {
  const auto& c = spec_.checkpoint;
  if (final_accuracy_ < 0) return;
  if (c.best && best_accuracy_ < 0) {
    // A restarted worker 0 goes on from the best model it had written.
    try {
      std::ifstream in(std::filesystem::path(cfg_.artifact_dir).parent_path() / "model-best" / "metadata.json");
      if (in) best_accuracy_ = nlohmann::json::parse(in).value("test_accuracy", -1.0);
    } catch (const std::exception&) {
      best_accuracy_ = -1.0;
    }
  }
  // epochs_finished_ is set after this epoch's event; the metadata's "epoch" is this one.
  const int done_epochs = epochs_finished_;
  epochs_finished_ = epoch + 1;
  if (c.every_epochs > 0 && (epoch + 1) % c.every_epochs == 0) save_artifact("epoch-" + std::to_string(epoch + 1));
  if (c.best && final_accuracy_ > best_accuracy_) {
    best_accuracy_ = final_accuracy_;
    save_artifact("best");
  }
  epochs_finished_ = done_epochs;
}

void WorkerLoop::left() {
  // The chunks go back first: once the shards count it out, rank 0 may end the job.
  feed_->release_chunks();
  const auto members = ex_.leave();
  wire::events::Left ev;
  ev.rank = cfg_.rank;
  ev.steps = replica_.global_step;
  ev.members = members;
  spdlog::info("worker {}: left the job after {} steps; {} workers still train", cfg_.rank, ev.steps, members);
  sink_(ev.to_json());
}

void WorkerLoop::done() {
  save_artifact("last");
  wire::events::Done ev;
  ev.rank = cfg_.rank;
  if (final_accuracy_ >= 0) ev.test_accuracy = final_accuracy_;
  ev.steps = replica_.global_step;
  ev.skipped_steps = rep_.skipped_steps();
  ev.wall_seconds = seconds_since(t_start_);
  ev.bytes_pushed = ex_.bytes_pushed();
  ev.bytes_pulled = ex_.bytes_pulled();
  ev.traffic = ex_.meter().total();
  ev.traffic_after_warmup = ex_.meter().after_warmup();
  ev.compression_ratio = ev.traffic->ratio();
  ev.compression_ratio_after_warmup = ev.traffic_after_warmup->ratio();
  ev.counters = counters();
  if (feed_->streaming()) {
    ev.skipped_images = feed_->skipped_images();
    ev.data_wait_seconds = feed_->wait_seconds();
  }
  sink_(ev.to_json());
}

}  // namespace dltrain::train::detail
