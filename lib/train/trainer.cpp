#include "train/trainer.h"

#include <cmath>
#include <numbers>
#include <thread>

#include <torch/torch.h>

#include "common/errors.h"
#include "compress/compressor.h"
#include "ps/checkpoint.h"
#include "train/idx.h"
#include "train/models.h"
#include "train/tensors.h"

namespace dltrain::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Copies the model's parameters into / out of one flat float vector, in parameters() order.
class FlatParams {
 public:
  explicit FlatParams(torch::nn::Module& m) : params_(m.parameters()) {
    for (const auto& p : params_) sizes_.push_back(p.numel());
  }
  const std::vector<std::int64_t>& sizes() const { return sizes_; }
  void read_params(std::vector<float>& out) const { gather(out, false); }
  void read_grads(std::vector<float>& out) const { gather(out, true); }
  void write_params(const std::vector<float>& in) {
    torch::NoGradGuard ng;
    std::int64_t off = 0;
    for (auto& p : params_) {
      std::memcpy(p.data_ptr<float>(), in.data() + off, sizeof(float) * p.numel());
      off += p.numel();
    }
  }

 private:
  void gather(std::vector<float>& out, bool grad) const {
    std::int64_t off = 0;
    for (const auto& p : params_) {
      const auto t = grad ? p.grad() : p;
      if (grad && !t.defined()) {
        std::fill(out.begin() + off, out.begin() + off + p.numel(), 0.0f);
      } else {
        auto c = t.contiguous();
        std::memcpy(out.data() + off, c.data_ptr<float>(), sizeof(float) * p.numel());
      }
      off += p.numel();
    }
  }
  std::vector<torch::Tensor> params_;
  std::vector<std::int64_t> sizes_;
};

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

std::pair<torch::Tensor, torch::Tensor> to_tensors(const Split& s, const std::string& dataset) {
  // Per-dataset pixel mean and standard deviation over the training set.
  const double mean = dataset == "mnist" ? 0.1307 : 0.2860;
  const double stdv = dataset == "mnist" ? 0.3081 : 0.3530;
  auto x = torch::from_blob(const_cast<std::uint8_t*>(s.images.pixels.data()),
                            {s.images.count, 1, s.images.rows, s.images.cols}, torch::kUInt8)
               .to(torch::kFloat32)
               .div_(255.0)
               .sub_(mean)
               .div_(stdv);
  auto y = torch::from_blob(const_cast<std::uint8_t*>(s.labels.data()),
                            {static_cast<std::int64_t>(s.labels.size())}, torch::kUInt8)
               .to(torch::kInt64);
  return {x, y};
}

double evaluate(torch::nn::Module& m, const Model& model, const torch::Tensor& x,
                const torch::Tensor& y) {
  torch::NoGradGuard ng;
  m.eval();
  std::int64_t correct = 0;
  const std::int64_t n = x.size(0);
  for (std::int64_t lo = 0; lo < n; lo += 1000) {
    const std::int64_t hi = std::min(n, lo + 1000);
    auto pred = model.forward(x.slice(0, lo, hi)).argmax(1);
    correct += pred.eq(y.slice(0, lo, hi)).sum().item<std::int64_t>();
  }
  m.train(true);
  return static_cast<double>(correct) / static_cast<double>(n);
}

double learning_rate(const OptimizerSpec& opt, double epoch_pos, int epochs) {
  if (opt.warmup_epochs > 0 && epoch_pos < opt.warmup_epochs) {
    return opt.lr * (0.1 + 0.9 * epoch_pos / opt.warmup_epochs);
  }
  if (opt.lr_schedule == "cosine") {
    const double span = epochs - opt.warmup_epochs;
    const double t = span > 0 ? std::clamp((epoch_pos - opt.warmup_epochs) / span, 0.0, 1.0) : 1.0;
    return opt.lr * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
  }
  if (opt.lr_schedule == "step") {
    const double f = epoch_pos / epochs;
    return opt.lr * (f >= 0.75 ? 0.01 : f >= 0.5 ? 0.1 : 1.0);
  }
  return opt.lr;
}

double run_worker(const WorkerConfig& cfg, const ProgressSink& sink) {
  const JobSpec& spec = cfg.spec;
  torch::set_num_threads(std::max(1, cfg.threads));
  const auto t_start = Clock::now();

  // Data: this worker's shard of the training set; rank 0 also loads the test set.
  Split train = load_split(spec.data_dir, "train", spec.train_samples);
  auto [train_x, train_y] = to_tensors(train, spec.dataset);
  const auto shard = shard_indices(train_x.size(0), cfg.rank, spec.workers);
  auto shard_idx = torch::tensor(shard, torch::kInt64);
  train_x = train_x.index_select(0, shard_idx).contiguous();
  train_y = train_y.index_select(0, shard_idx).contiguous();
  train = Split{};
  torch::Tensor test_x, test_y;
  if (cfg.rank == 0) {
    Split test = load_split(spec.data_dir, "test", spec.test_samples);
    std::tie(test_x, test_y) = to_tensors(test, spec.dataset);
  }

  // Identical initial replicas on every worker (same seed); the PS keeps the first.
  torch::manual_seed(static_cast<std::uint64_t>(spec.seed));
  Model model = make_model(spec.model);
  auto& module = *model.module;
  module.train(true);
  FlatParams flat(module);
  auto layout = ps::make_layout(flat.sizes(), spec.partition_size, spec.ps_shards);
  std::vector<float> params(static_cast<std::size_t>(layout.total_floats));
  std::vector<float> grads(params.size());
  flat.read_params(params);

  ps::PsClientOptions popt;
  popt.job = cfg.job;
  popt.generation = cfg.generation;
  popt.secret = cfg.secret;
  popt.rank = static_cast<std::uint32_t>(cfg.rank);
  popt.num_workers = static_cast<std::uint32_t>(spec.workers);
  popt.timeout = cfg.ps_timeout;
  popt.reconnect_timeout = cfg.ps_timeout;
  popt.sparse_downlink = spec.compression.downlink_ratio < 1.0;
  popt.stop_requested = cfg.stop_requested;
  if (!cfg.init_replica_path.empty()) {
    // A re-assigned job: this worker's saved replica is the freshest copy of the
    // parameters; a shard rebuilt elsewhere takes it as its initial values.
    const auto steps = ps::read_replica_file(cfg.init_replica_path, params, layout, cfg.job);
    sink({{"event", "replica_loaded"}, {"rank", cfg.rank}, {"path", cfg.init_replica_path}, {"steps", steps}});
  }
  ps::PsClient client(cfg.shards, layout, popt);
  auto unix_now = [] {
    return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  };
  try {
    client.connect();
    client.init(params);
    client.pull(params);
  } catch (const ps::StopRequested&) {
    sink({{"event", "stopped"}, {"rank", cfg.rank}, {"replica", nullptr}});
    throw Stopped("worker " + std::to_string(cfg.rank) + ": stopped before it held the PS's parameters");
  }
  double pulled_at = unix_now();  // when `params` last took the PS's values
  flat.write_params(params);

  std::vector<std::int64_t> lengths;
  for (const auto& p : layout.partitions) lengths.push_back(p.length);
  compress::GradientCompressor compressor(spec.compression, lengths,
                                          static_cast<std::uint64_t>(spec.seed) * 7919ULL + static_cast<std::uint64_t>(cfg.rank));
  std::vector<ps::PartitionPush> pushes(layout.partitions.size());
  compress::CompressionSpec downlink_spec = spec.compression;
  downlink_spec.ratio = spec.compression.downlink_ratio;
  // Bytes the same exchange would cost dense: a push frame (header + n floats) and a
  // pull request header per partition up, a dense pull reply per partition down.
  std::uint64_t dense_up_per_step = 0, dense_down_per_step = 0;
  for (const auto& p : layout.partitions) {
    dense_up_per_step += 2 * wire::kHeaderSize + 4 * static_cast<std::uint64_t>(p.length);
    dense_down_per_step += wire::kHeaderSize + 4 * static_cast<std::uint64_t>(p.length);
  }
  struct Traffic {
    std::uint64_t up = 0, down = 0, dense_up = 0, dense_down = 0;
  } total, after_warmup;
  std::int64_t skipped_steps = 0, consecutive_skips = 0;
  constexpr std::int64_t kMaxConsecutiveSkips = 20;

  // A PS shard that went away (its process died; its agent restarts it on the same port
  // from its latest checkpoint): reconnect, offer this replica as init, take the shard's
  // parameters with a dense pull and carry on. The step whose exchange failed is lost.
  // Bounded: each resync by the PS timeout, and resyncs in a row without a successful
  // step by kMaxConsecutiveResyncs.
  constexpr int kMaxConsecutiveResyncs = 10;
  int consecutive_resyncs = 0, resyncs = 0;
  bool done_sent = false;
  auto recover = [&](const ps::PsConnectionLost& lost) {
    std::string reason = lost.what();
    std::size_t shard = lost.shard();
    for (;;) {
      if (++consecutive_resyncs > kMaxConsecutiveResyncs) {
        throw IoError("worker " + std::to_string(cfg.rank) + ": lost the PS connection " +
                      std::to_string(kMaxConsecutiveResyncs) + " times in a row without a successful step; last: " +
                      reason);
      }
      const auto t0 = Clock::now();
      try {
        client.resync(params);
        // A shard that restarted without a checkpoint has forgotten who finished.
        if (done_sent) client.done();
      } catch (const ps::PsConnectionLost& again) {
        reason = again.what();
        shard = again.shard();
        continue;
      } catch (const IoError& e) {
        throw IoError("worker " + std::to_string(cfg.rank) + ": PS shard " + std::to_string(shard) +
                      " went away (" + reason + ") and " + e.what());
      }
      flat.write_params(params);
      ++resyncs;
      sink({{"event", "ps_resync"},
            {"rank", cfg.rank},
            {"shard", shard},
            {"reason", reason},
            {"seconds", seconds_since(t0)},
            {"resyncs", resyncs}});
      return;
    }
  };

  const std::int64_t n = train_x.size(0);
  const std::int64_t bs = spec.batch_size;
  const std::int64_t steps_per_epoch = std::max<std::int64_t>(1, (n + bs - 1) / bs);
  sink({{"event", "started"},
        {"rank", cfg.rank},
        {"train_examples", n},
        {"steps_per_epoch", steps_per_epoch},
        {"parameters", layout.total_floats},
        {"partitions", layout.partitions.size()},
        {"load_seconds", seconds_since(t_start)},
        {"resume_epoch", cfg.resume_epoch}});

  torch::Generator gen = at::detail::createCPUGenerator(
      static_cast<std::uint64_t>(spec.seed) * 1000003ULL + static_cast<std::uint64_t>(cfg.rank));
  // After a restart the worker continues after the last epoch it finished, from the PS's
  // current parameters (pulled above), with the learning-rate schedule where it was.
  const int first_epoch = std::clamp(cfg.resume_epoch, 0, spec.epochs - 1);
  std::int64_t global_step = first_epoch * steps_per_epoch;
  double final_accuracy = -1.0;
  auto last_report = Clock::now();
  std::int64_t images_since_report = 0;
  const auto wd = static_cast<float>(spec.optimizer.weight_decay);
  const bool plain = spec.compression.method == compress::Method::kNone && spec.compression.downlink_ratio >= 1.0;
  double last_density = 1.0;
  auto ratio = [](std::uint64_t dense, std::uint64_t actual) {
    return actual == 0 ? nlohmann::json(nullptr) : nlohmann::json(static_cast<double>(dense) / static_cast<double>(actual));
  };

  // Exploration runs (spec.profile) measure throughput after a few warm-up steps.
  constexpr std::int64_t kProfileWarmupSteps = 5;
  Clock::time_point t_profile{};
  std::int64_t profile_images = 0;
  bool stop = false;
  int epochs_finished = first_epoch;
  auto check_stop = [&] {
    if (cfg.stop_requested != nullptr && cfg.stop_requested->load(std::memory_order_relaxed)) {
      throw ps::StopRequested("the worker was asked to stop");
    }
  };
  try {
    for (int epoch = first_epoch; epoch < spec.epochs && !stop; ++epoch) {
      const auto t_epoch = Clock::now();
      auto perm = torch::randperm(n, gen, torch::kInt64);
      double loss_sum = 0;
      std::int64_t loss_count = 0;
      double recent_loss = 0;
      std::int64_t recent_count = 0;
      for (std::int64_t step = 0; step < steps_per_epoch; ++step) {
        check_stop();
        const std::int64_t lo = step * bs;
        const std::int64_t hi = std::min(n, lo + bs);
        auto idx = perm.slice(0, lo, hi);
        auto xb = train_x.index_select(0, idx);
        auto yb = train_y.index_select(0, idx);
        module.zero_grad();
        auto loss = torch::nn::functional::cross_entropy(model.forward(xb), yb);
        loss.backward();
        const double lv = loss.item<double>();
        flat.read_grads(grads);
        bool finite = std::isfinite(lv);
        for (std::size_t i = 0; finite && i < grads.size(); ++i) finite = std::isfinite(grads[i]);
        if (!finite) {
          // A NaN/Inf gradient is never pushed: the step is skipped and counted.
          ++skipped_steps;
          if (++consecutive_skips > kMaxConsecutiveSkips) {
            throw Error("worker " + std::to_string(cfg.rank) + ": " + std::to_string(consecutive_skips) +
                        " consecutive steps had a NaN/Inf loss or gradient (epoch " + std::to_string(epoch + 1) +
                        ", step " + std::to_string(step + 1) + "); the model diverged: lower optimizer.lr or set "
                        "compression.clip_norm");
          }
          sink({{"event", "skipped_step"}, {"rank", cfg.rank}, {"epoch", epoch + 1}, {"step", step + 1},
                {"loss", std::isfinite(lv) ? nlohmann::json(lv) : nlohmann::json(nullptr)},
                {"skipped_steps", skipped_steps}});
          continue;
        }
        consecutive_skips = 0;
        if (wd > 0) {
          for (std::size_t i = 0; i < grads.size(); ++i) grads[i] += wd * params[i];
        }
        const double pos = epoch + static_cast<double>(step) / steps_per_epoch;
        const auto lr = static_cast<float>(learning_rate(spec.optimizer, pos, spec.epochs));
        const double density = spec.compression.method == compress::Method::kNone
                                   ? 1.0
                                   : compress::density_at(spec.compression, pos);
        const double downlink = compress::density_at(downlink_spec, pos);
        const auto up0 = client.bytes_pushed(), down0 = client.bytes_pulled();
        try {
          if (plain) {
            client.push_pull(grads, lr, params);
          } else {
            compressor.clip(grads, spec.workers);
            for (const auto& p : layout.partitions) {
              const auto& e = compressor.encode(
                  p.key, std::span<const float>(grads).subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.length)),
                  density, static_cast<std::uint64_t>(global_step));
              auto& pp = pushes[p.key];
              pp.count = static_cast<std::uint32_t>(e.count());
              pp.second = {};
              pp.seed = e.seed;
              switch (e.encoding) {
                case compress::Encoding::kDense:
                  pp.codec = wire::Codec::kDenseF32;
                  pp.first = std::as_bytes(std::span<const float>(e.values));
                  break;
                case compress::Encoding::kDenseF16:
                  pp.codec = wire::Codec::kDenseF16;
                  pp.first = std::as_bytes(std::span<const std::uint16_t>(e.half));
                  break;
                case compress::Encoding::kSparse:
                  pp.codec = wire::Codec::kSparseF32;
                  pp.first = std::as_bytes(std::span<const std::uint32_t>(e.indices));
                  pp.second = std::as_bytes(std::span<const float>(e.values));
                  break;
                case compress::Encoding::kSeeded:
                  pp.codec = wire::Codec::kSeededF32;
                  pp.first = std::as_bytes(std::span<const float>(e.values));
                  break;
              }
            }
            client.push_pull(pushes, lr, downlink, params);
          }
          consecutive_resyncs = 0;
        } catch (const ps::PsConnectionLost& lost) {
          recover(lost);  // this step's gradient is dropped; params now hold the PS's values
        }
        pulled_at = unix_now();
        const std::uint64_t up = client.bytes_pushed() - up0, down = client.bytes_pulled() - down0;
        for (Traffic* t : {&total, &after_warmup}) {
          if (t == &after_warmup && pos < spec.compression.warmup_epochs) continue;
          t->up += up;
          t->down += down;
          t->dense_up += dense_up_per_step;
          t->dense_down += dense_down_per_step;
        }
        last_density = density;
        flat.write_params(params);
        ++global_step;
        if (global_step == kProfileWarmupSteps) t_profile = Clock::now();
        if (global_step > kProfileWarmupSteps) profile_images += hi - lo;
        if (spec.max_steps > 0 && global_step >= spec.max_steps) stop = true;
        loss_sum += lv;
        ++loss_count;
        recent_loss += lv;
        ++recent_count;
        images_since_report += hi - lo;
        const double since = seconds_since(last_report);
        if (since >= cfg.progress_interval_s) {
          sink({{"event", "progress"},
                {"rank", cfg.rank},
                {"epoch", epoch + 1},
                {"step", step + 1},
                {"steps_per_epoch", steps_per_epoch},
                {"global_step", global_step},
                {"loss", recent_loss / static_cast<double>(recent_count)},
                {"lr", lr},
                {"images_per_sec", static_cast<double>(images_since_report) / since},
                {"bytes_pushed", client.bytes_pushed()},
                {"bytes_pulled", client.bytes_pulled()},
                {"density", last_density},
                {"compression_ratio", ratio(total.dense_up + total.dense_down, total.up + total.down)},
                {"skipped_steps", skipped_steps}});
          last_report = Clock::now();
          images_since_report = 0;
          recent_loss = 0;
          recent_count = 0;
        }
        if (stop) break;
      }
      if (spec.profile) {
        if (stop || epoch + 1 == spec.epochs) {
          const double secs = t_profile == Clock::time_point{} ? 0.0 : seconds_since(t_profile);
          sink({{"event", "profile"},
                {"rank", cfg.rank},
                {"steps", global_step},
                {"measured_images", profile_images},
                {"measured_seconds", secs},
                {"images_per_sec", secs > 0 ? static_cast<double>(profile_images) / secs : 0.0},
                {"bytes_pushed", client.bytes_pushed()},
                {"bytes_pulled", client.bytes_pulled()}});
          stop = true;
        }
        continue;
      }
      const double epoch_seconds = seconds_since(t_epoch);
      nlohmann::json ev{{"event", "epoch_end"},
                        {"rank", cfg.rank},
                        {"epoch", epoch + 1},
                        {"epochs", spec.epochs},
                        {"train_loss", loss_sum / static_cast<double>(std::max<std::int64_t>(1, loss_count))},
                        {"epoch_seconds", epoch_seconds},
                        {"images_per_sec", static_cast<double>(n) / epoch_seconds}};
      const bool last = epoch + 1 == spec.epochs || stop;
      if (last) {
        // Tell the PS this worker is done; rank 0 then waits for the others so that the
        // final accuracy is that of the finished model.
        for (;;) {
          try {
            client.done();
            break;
          } catch (const ps::PsConnectionLost& lost) {
            recover(lost);
          }
        }
        done_sent = true;
        if (cfg.rank == 0) {
          const auto deadline = Clock::now() + cfg.finish_timeout;
          auto workers_done = [&] {
            for (;;) {
              try {
                return client.workers_done();
              } catch (const ps::PsConnectionLost& lost) {
                recover(lost);
              }
            }
          };
          while (workers_done() < static_cast<std::uint32_t>(spec.workers)) {
            if (Clock::now() >= deadline) {
              throw TimeoutError("worker 0: the other workers did not finish within " +
                                 std::to_string(cfg.finish_timeout.count()) + " s");
            }
            check_stop();
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
          }
        }
      }
      if (cfg.rank == 0) {
        const auto t_eval = Clock::now();
        try {
          client.pull(params);  // the PS's current parameters (dense pull)
        } catch (const ps::PsConnectionLost& lost) {
          recover(lost);  // ends with a dense pull too
        }
        flat.write_params(params);
        recalibrate_batchnorm(module, model, train_x, 20, 250);
        const double acc = evaluate(module, model, test_x, test_y);
        ev["test_accuracy"] = acc;
        ev["eval_seconds"] = seconds_since(t_eval);
        final_accuracy = acc;
      }
      ev["bytes_pushed"] = client.bytes_pushed();
      ev["bytes_pulled"] = client.bytes_pulled();
      sink(ev);
      epochs_finished = epoch + 1;
    }
  } catch (const ps::StopRequested&) {
    // Asked to stop (its job is being re-assigned, or its agent stops): the replica is
    // the PS's parameters as of this worker's last pull, the freshest copy the job may
    // have of a shard that was lost. `pulled_at` ranks the replicas of several workers.
    nlohmann::json replica = nullptr;
    if (!cfg.replica_path.empty()) {
      try {
        ps::write_replica_file(cfg.replica_path, params, layout, cfg.job, static_cast<std::uint64_t>(global_step));
        replica = {{"path", cfg.replica_path},
                   {"steps", global_step},
                   {"epochs_done", epochs_finished},
                   {"pulled_at", pulled_at}};
      } catch (const std::exception& e) {
        replica = {{"error", e.what()}};
      }
    }
    sink({{"event", "stopped"}, {"rank", cfg.rank}, {"epochs_done", epochs_finished}, {"replica", replica}});
    throw Stopped("worker " + std::to_string(cfg.rank) + ": stopped at step " + std::to_string(global_step));
  }
  sink({{"event", "done"},
        {"rank", cfg.rank},
        {"test_accuracy", final_accuracy >= 0 ? nlohmann::json(final_accuracy) : nlohmann::json(nullptr)},
        {"steps", global_step},
        {"skipped_steps", skipped_steps},
        {"wall_seconds", seconds_since(t_start)},
        {"bytes_pushed", client.bytes_pushed()},
        {"bytes_pulled", client.bytes_pulled()},
        {"traffic",
         {{"up", total.up}, {"down", total.down}, {"dense_up", total.dense_up}, {"dense_down", total.dense_down}}},
        {"traffic_after_warmup",
         {{"up", after_warmup.up},
          {"down", after_warmup.down},
          {"dense_up", after_warmup.dense_up},
          {"dense_down", after_warmup.dense_down}}},
        {"compression_ratio", ratio(total.dense_up + total.dense_down, total.up + total.down)},
        {"compression_ratio_after_warmup",
         ratio(after_warmup.dense_up + after_warmup.dense_down, after_warmup.up + after_warmup.down)}});
  return final_accuracy;
}

}  // namespace dltrain::train
