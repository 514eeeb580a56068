// The plain single-process LibTorch training loop the end-to-end benchmark compares
// dltrain against: the same job file, model, data, normalisation, shuffling, learning-rate
// schedule and momentum SGD as a dltrain worker, with no PS, no sockets and no framework.
// It is the upper bound on one process's images/s (docs/benchmarks/e2e.md, "End to end").
//
// Usage: plain_loop JOB.toml [--max-seconds S]   (the job's device: cpu, or cuda)
// Prints one JSON object per line: {"event":"started",...}, one {"event":"epoch_end",...}
// per epoch (seconds since the start, training images/s excluding evaluation, test
// accuracy) and {"event":"done",...}. Exit status 0, or 1 with a message on stderr.
#include <chrono>
#include <fstream>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/errors.h"
#include "job/job_spec.h"
#include "data/idx.h"
#include "train/models.h"
#include "train/tensors.h"
#include "train/trainer.h"

namespace {
using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Plain single-process LibTorch training loop (the benchmark's reference)"};
  std::string job_path;
  double max_seconds = 0;
  app.add_option("job", job_path, "job file (TOML), as given to dltrain submit")->required();
  app.add_option("--max-seconds", max_seconds, "stop after this many seconds (0 = no limit)");
  CLI11_PARSE(app, argc, argv);
  try {
    using namespace dltrain;
    std::ifstream in(job_path);
    if (!in) throw IoError("cannot read " + job_path);
    std::stringstream text;
    text << in.rdbuf();
    const JobSpec spec = parse_job_toml(text.str(), ".", true);
    torch::set_num_threads(spec.threads_per_task);
    const auto t0 = Clock::now();

    auto [train_x, train_y] = train::to_tensors(data::load_split(spec.data_dir, "train", spec.train_samples),
                                                spec.dataset);
    auto [test_x, test_y] = train::to_tensors(data::load_split(spec.data_dir, "test", spec.test_samples),
                                              spec.dataset);
    torch::manual_seed(static_cast<std::uint64_t>(spec.seed));
    // device = "cuda": the model on the GPU, batches copied there from pinned memory, as a
    // dltrain worker does (train/models.h, to_device): the GPU benchmark's reference.
    const torch::Device device = train::training_device(spec.device);
    train::Model model = train::to_device(train::make_model(spec.model), device);
    auto& module = *model.module;
    module.train(true);
    // torch::optim::SGD: v = momentum·v + (g + wd·x); x -= lr·v — the update a dltrain PS
    // shard applies to the worker's gradient (docs/training.md).
    torch::optim::SGD opt(module.parameters(), torch::optim::SGDOptions(spec.optimizer.lr)
                                                   .momentum(spec.optimizer.momentum)
                                                   .weight_decay(spec.optimizer.weight_decay));
    const std::int64_t n = train_x.size(0), bs = spec.batch_size;
    const std::int64_t steps_per_epoch = (n + bs - 1) / bs;
    std::cout << nlohmann::json{{"event", "started"}, {"train_examples", n}, {"steps_per_epoch", steps_per_epoch},
                                {"parameters", train::parameter_count(module)}, {"load_seconds", since(t0)}}
                     .dump()
              << std::endl;
    // Same shuffling stream as dltrain's worker rank 0.
    torch::Generator gen = at::detail::createCPUGenerator(static_cast<std::uint64_t>(spec.seed) * 1000003ULL);
    double accuracy = -1, train_seconds = 0;
    std::int64_t steps = 0;
    bool stop = false;
    for (int epoch = 0; epoch < spec.epochs && !stop; ++epoch) {
      const auto te = Clock::now();
      auto perm = torch::randperm(n, gen, torch::kInt64);
      double loss_sum = 0;
      for (std::int64_t step = 0; step < steps_per_epoch; ++step) {
        auto idx = perm.slice(0, step * bs, std::min(n, (step + 1) * bs));
        const double pos = epoch + static_cast<double>(step) / static_cast<double>(steps_per_epoch);
        for (auto& g : opt.param_groups()) {
          static_cast<torch::optim::SGDOptions&>(g.options()).lr(train::learning_rate(spec.optimizer, pos, spec.epochs));
        }
        opt.zero_grad();
        auto xb = train_x.index_select(0, idx);
        if (device.is_cuda()) xb = xb.pin_memory();
        auto loss = torch::nn::functional::cross_entropy(model.forward(xb), train_y.index_select(0, idx));
        loss.backward();
        opt.step();
        loss_sum += loss.item<double>();
        ++steps;
      }
      const double epoch_seconds = since(te);
      train_seconds += epoch_seconds;
      accuracy = train::evaluate(module, model, test_x, test_y, spec.eval_batch_size);
      std::cout << nlohmann::json{{"event", "epoch_end"},
                                  {"epoch", epoch + 1},
                                  {"seconds", since(t0)},
                                  {"epoch_seconds", epoch_seconds},
                                  {"images_per_sec", static_cast<double>(n) / epoch_seconds},
                                  {"train_loss", loss_sum / static_cast<double>(steps_per_epoch)},
                                  {"test_accuracy", accuracy}}
                       .dump()
                << std::endl;
      if (max_seconds > 0 && since(t0) > max_seconds) stop = true;
    }
    std::cout << nlohmann::json{{"event", "done"}, {"test_accuracy", accuracy}, {"steps", steps},
                                {"train_seconds", train_seconds}, {"wall_seconds", since(t0)}}
                     .dump()
              << std::endl;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "plain_loop: " << e.what() << '\n';
    return 1;
  }
}
