// Training and evaluation speed of every built-in model in one process, with what the
// process spent in the kernel: images/s of training steps (forward, backward, momentum
// SGD) and of evaluation (train::evaluate, the worker's own code path), each with the
// system time and minor page faults it cost (getrusage). A malloc that hands large blocks
// back to the kernel shows up here as system time and faults, before a job shows it as a
// slow epoch (docs/benchmarks/main-job.md, "Model speed"; docs/training.md, "Memory allocator").
//
// Usage: model_speed [--models cnn,mlp,...] [--threads 1] [--batch 64] [--eval-batch 128]
//                    [--train-images N] [--eval-images N] [--repeat 3]
// Inputs are random images of each model's usual shape (the speed depends on the shapes
// only): cnn, mlp, mlp-large 1×28×28 (Fashion-MNIST), resnet20 3×32×32 (CIFAR-10),
// resnet18 3×64×64. Prints one JSON object per model and repetition on stdout
// ({"model", "allocator", "train_images_per_sec", "train_sys_seconds", ...}); a table on
// stderr. Exit status 0, or 1 with a message on stderr.
#include <sys/resource.h>

#include <chrono>
#include <iostream>
#include <map>
#include <sstream>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include "common/native_libs.h"
#include "train/models.h"
#include "train/tensors.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Usage {
  double wall = 0, sys = 0;
  long minor_faults = 0;
  static Usage now() {
    rusage r{};
    getrusage(RUSAGE_SELF, &r);
    return {std::chrono::duration<double>(Clock::now().time_since_epoch()).count(),
            static_cast<double>(r.ru_stime.tv_sec) + static_cast<double>(r.ru_stime.tv_usec) * 1e-6, r.ru_minflt};
  }
  Usage operator-(const Usage& o) const { return {wall - o.wall, sys - o.sys, minor_faults - o.minor_faults}; }
};

struct Shape {
  std::int64_t channels, size, train_images, eval_images;
};

// Images per phase by default: about as many seconds per model on one core of the
// reference machine (docs/benchmarks.md).
const std::map<std::string, Shape> kShapes{
    {"cnn", {1, 28, 6400, 10000}},     {"mlp", {1, 28, 12800, 10000}},    {"mlp-large", {1, 28, 6400, 10000}},
    {"resnet20", {3, 32, 640, 2000}}, {"resnet18", {3, 64, 128, 500}},
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Training and evaluation images/s of the built-in models, with the process's system time"};
  std::string models = "cnn,mlp,mlp-large,resnet20";
  int threads = 1, batch = 64, eval_batch = 128, repeat = 3;
  std::int64_t train_images = 0, eval_images = 0;
  app.add_option("--models", models, "comma-separated: cnn, mlp, mlp-large, resnet20, resnet18");
  app.add_option("--threads", threads, "LibTorch intra-op threads (a task's cores)")->check(CLI::Range(1, 256));
  app.add_option("--batch", batch, "training batch size")->check(CLI::Range(1, 65536));
  app.add_option("--eval-batch", eval_batch, "evaluation batch size (a job's eval_batch_size)")
      ->check(CLI::Range(1, 65536));
  app.add_option("--train-images", train_images, "training images per measurement (0: the model's default)");
  app.add_option("--eval-images", eval_images, "evaluation images per measurement (0: the model's default)");
  app.add_option("--repeat", repeat, "measurements per model")->check(CLI::Range(1, 100));
  CLI11_PARSE(app, argc, argv);
  try {
    torch::set_num_threads(threads);
    torch::manual_seed(1);
    const std::string allocator = dltrain::allocator_name();
    const std::string blas = dltrain::blas_name();
    std::cerr << fmt::format("allocator: {}; BLAS: {}; {} thread(s), batch {}, eval batch {}\n", allocator, blas,
                             threads, batch, eval_batch);
    std::cerr << fmt::format("{:<10} {:>12} {:>9} {:>9} {:>12} {:>9} {:>9} {:>9}\n", "model", "train img/s",
                             "sys s", "faults", "eval img/s", "eval s", "sys s", "faults");
    std::stringstream list(models);
    for (std::string name; std::getline(list, name, ',');) {
      const auto it = kShapes.find(name);
      if (it == kShapes.end()) throw std::runtime_error("--models: unknown model \"" + name + "\"");
      const Shape sh = it->second;
      const std::int64_t nt = train_images > 0 ? train_images : sh.train_images;
      const std::int64_t ne = eval_images > 0 ? eval_images : sh.eval_images;
      auto model = dltrain::train::make_model(dltrain::parse_enum<dltrain::ModelKind>(name, "--models"), sh.channels, 10, sh.size);
      auto& module = *model.module;
      torch::optim::SGD opt(module.parameters(), torch::optim::SGDOptions(0.01).momentum(0.9));
      const auto x = torch::randn({std::max(nt, ne), sh.channels, sh.size, sh.size});
      const auto y = torch::randint(0, 10, {std::max(nt, ne)}, torch::kInt64);
      for (int r = 0; r < repeat; ++r) {
        module.train(true);
        const auto t0 = Usage::now();
        for (std::int64_t lo = 0; lo < nt; lo += batch) {
          const std::int64_t hi = std::min(nt, lo + batch);
          opt.zero_grad();
          auto loss = torch::nn::functional::cross_entropy(model.forward(x.slice(0, lo, hi)), y.slice(0, lo, hi));
          loss.backward();
          opt.step();
        }
        const Usage train = Usage::now() - t0;
        const auto t1 = Usage::now();
        const double acc = dltrain::train::evaluate(module, model, x.slice(0, 0, ne), y.slice(0, 0, ne), eval_batch);
        const Usage eval = Usage::now() - t1;
        const nlohmann::json row{{"model", name},
                                 {"allocator", allocator},
                                 {"blas", blas},
                                 {"threads", threads},
                                 {"batch", batch},
                                 {"eval_batch", eval_batch},
                                 {"repeat", r + 1},
                                 {"train_images", nt},
                                 {"train_images_per_sec", static_cast<double>(nt) / train.wall},
                                 {"train_sys_seconds", train.sys},
                                 {"train_minor_faults", train.minor_faults},
                                 {"eval_images", ne},
                                 {"eval_seconds", eval.wall},
                                 {"eval_images_per_sec", static_cast<double>(ne) / eval.wall},
                                 {"eval_sys_seconds", eval.sys},
                                 {"eval_minor_faults", eval.minor_faults},
                                 {"eval_accuracy_on_random_labels", acc}};
        std::cout << row.dump() << std::endl;
        std::cerr << fmt::format("{:<10} {:>12.0f} {:>9.2f} {:>9} {:>12.0f} {:>9.2f} {:>9.2f} {:>9}\n", name,
                                 static_cast<double>(nt) / train.wall, train.sys, train.minor_faults,
                                 static_cast<double>(ne) / eval.wall, eval.wall, eval.sys, eval.minor_faults);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "model_speed: " << e.what() << '\n';
    return 1;
  }
}
