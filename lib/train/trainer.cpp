#include "train/trainer.h"

#include <cmath>
#include <numbers>
#include <thread>

#include <torch/torch.h>

#include "common/errors.h"
#include "train/idx.h"
#include "train/models.h"

namespace dltrain::train {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Normalised [N, 1, 28, 28] float tensor and int64 labels of a split.
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

}  // namespace

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
  popt.rank = static_cast<std::uint32_t>(cfg.rank);
  popt.num_workers = static_cast<std::uint32_t>(spec.workers);
  popt.timeout = cfg.ps_timeout;
  ps::PsClient client(cfg.shards, layout, popt);
  client.connect();
  client.init(params);
  client.pull(params);
  flat.write_params(params);

  const std::int64_t n = train_x.size(0);
  const std::int64_t bs = spec.batch_size;
  const std::int64_t steps_per_epoch = std::max<std::int64_t>(1, (n + bs - 1) / bs);
  sink({{"event", "started"},
        {"rank", cfg.rank},
        {"train_examples", n},
        {"steps_per_epoch", steps_per_epoch},
        {"parameters", layout.total_floats},
        {"partitions", layout.partitions.size()},
        {"load_seconds", seconds_since(t_start)}});

  torch::Generator gen = at::detail::createCPUGenerator(
      static_cast<std::uint64_t>(spec.seed) * 1000003ULL + static_cast<std::uint64_t>(cfg.rank));
  std::int64_t global_step = 0;
  double final_accuracy = -1.0;
  auto last_report = Clock::now();
  std::int64_t images_since_report = 0;
  const auto wd = static_cast<float>(spec.optimizer.weight_decay);

  for (int epoch = 0; epoch < spec.epochs; ++epoch) {
    const auto t_epoch = Clock::now();
    auto perm = torch::randperm(n, gen, torch::kInt64);
    double loss_sum = 0;
    std::int64_t loss_count = 0;
    double recent_loss = 0;
    std::int64_t recent_count = 0;
    for (std::int64_t step = 0; step < steps_per_epoch; ++step) {
      const std::int64_t lo = step * bs;
      const std::int64_t hi = std::min(n, lo + bs);
      auto idx = perm.slice(0, lo, hi);
      auto xb = train_x.index_select(0, idx);
      auto yb = train_y.index_select(0, idx);
      module.zero_grad();
      auto loss = torch::nn::functional::cross_entropy(model.forward(xb), yb);
      loss.backward();
      const double lv = loss.item<double>();
      if (!std::isfinite(lv)) {
        throw Error("worker " + std::to_string(cfg.rank) + ": loss became " + std::to_string(lv) +
                    " at epoch " + std::to_string(epoch + 1) + " step " + std::to_string(step) +
                    "; lower optimizer.lr");
      }
      flat.read_grads(grads);
      if (wd > 0) {
        for (std::size_t i = 0; i < grads.size(); ++i) grads[i] += wd * params[i];
      }
      const double pos = epoch + static_cast<double>(step) / steps_per_epoch;
      const auto lr = static_cast<float>(learning_rate(spec.optimizer, pos, spec.epochs));
      client.push_pull(grads, lr, params);
      flat.write_params(params);
      ++global_step;
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
              {"bytes_pulled", client.bytes_pulled()}});
        last_report = Clock::now();
        images_since_report = 0;
        recent_loss = 0;
        recent_count = 0;
      }
    }
    const double epoch_seconds = seconds_since(t_epoch);
    nlohmann::json ev{{"event", "epoch_end"},
                      {"rank", cfg.rank},
                      {"epoch", epoch + 1},
                      {"epochs", spec.epochs},
                      {"train_loss", loss_sum / static_cast<double>(std::max<std::int64_t>(1, loss_count))},
                      {"epoch_seconds", epoch_seconds},
                      {"images_per_sec", static_cast<double>(n) / epoch_seconds}};
    const bool last = epoch + 1 == spec.epochs;
    if (last) {
      // Tell the PS this worker is done; rank 0 then waits for the others so that the
      // final accuracy is that of the finished model.
      client.done();
      if (cfg.rank == 0) {
        const auto deadline = Clock::now() + cfg.finish_timeout;
        while (client.workers_done() < static_cast<std::uint32_t>(spec.workers)) {
          if (Clock::now() >= deadline) {
            throw TimeoutError("worker 0: the other workers did not finish within " +
                               std::to_string(cfg.finish_timeout.count()) + " s");
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
      }
    }
    if (cfg.rank == 0) {
      const auto t_eval = Clock::now();
      client.pull(params);  // the PS's current parameters (dense pull)
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
  }
  sink({{"event", "done"},
        {"rank", cfg.rank},
        {"test_accuracy", final_accuracy},
        {"steps", global_step},
        {"wall_seconds", seconds_since(t_start)},
        {"bytes_pushed", client.bytes_pushed()},
        {"bytes_pulled", client.bytes_pulled()}});
  return final_accuracy;
}

}  // namespace dltrain::train
