// dltrain-model: a trained model (what `dltrain model get` downloads) run with LibTorch.
// `dltrain predict` and `dltrain evaluate` are this program (client/models.h hands them
// over), so that the thin client links no LibTorch.
//   dltrain-model predict MODEL_DIR IMAGE...   the top classes of each image
//   dltrain-model evaluate MODEL_DIR --data DIR  top-1 accuracy on a data set's test split
// Exit codes: 0 ok, 1 some image could not be read (the others are printed), 2 bad input.
#include <iomanip>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/log.h"
#include "dltrain/config.h"
#include "job/job_spec.h"
#include "train/data_feed.h"
#include "train/model_io.h"

namespace {

using json = nlohmann::json;
namespace train = dltrain::train;

int predict(const std::string& dir, const std::vector<std::string>& images, int top, bool as_json) {
  const auto m = train::load_model_dir(dir);
  std::vector<std::size_t> kept;
  std::vector<std::string> errors;
  const auto x = train::image_batch(m, images, kept, errors);
  const auto probs = train::predict_probabilities(m, x);
  const auto k = std::min<std::int64_t>(top, m.classes);
  const auto [p, idx] = probs.topk(k, 1);
  for (std::size_t r = 0; r < kept.size(); ++r) {
    const auto row = static_cast<std::int64_t>(r);
    json tops = json::array();
    for (std::int64_t j = 0; j < k; ++j) {
      const auto label = idx[row][j].item<std::int64_t>();
      tops.push_back({{"label", label},
                      {"class", m.class_names[static_cast<std::size_t>(label)]},
                      {"probability", p[row][j].item<double>()}});
    }
    if (as_json) {
      std::cout << json{{"image", images[kept[r]]}, {"top", tops}}.dump() << "\n";
      continue;
    }
    std::cout << images[kept[r]] << ":";
    for (const auto& t : tops) {
      const std::string name = t["class"].get<std::string>();
      std::cout << "  " << (name.empty() ? "class " + std::to_string(t["label"].get<std::int64_t>()) : name) << " "
                << std::fixed << std::setprecision(4) << t["probability"].get<double>();
    }
    std::cout << "\n";
  }
  std::cout << std::flush;
  for (const auto& e : errors) std::cerr << "dltrain predict: skipped " << e << "\n";
  return errors.empty() ? 0 : 1;
}

int evaluate(const std::string& dir, const std::string& data_dir, std::int64_t limit, int threads, bool as_json) {
  const auto m = train::load_model_dir(dir);
  if (!m.meta.contains("job")) throw dltrain::ConfigError("model", dir + "/metadata.json has no \"job\" (its data set)");
  auto spec = dltrain::job_from_json(m.meta["job"]);
  spec.data_dir = data_dir;
  spec.workers = 1;
  spec.test_samples = limit;
  torch::set_num_threads(threads);
  auto feed = train::make_data_feed(spec, 0, threads, torch::make_generator<torch::CPUGeneratorImpl>(1));
  auto model = m.model;
  const double acc = feed->evaluate(*model.module, model);
  const auto info = feed->info();
  json out{{"accuracy", acc}, {"images", info.test_images}, {"dataset", std::string(dltrain::enum_name(spec.dataset))}, {"data_dir", data_dir},
           {"model", m.name}};
  if (feed->skipped_images() > 0) out["skipped_images"] = feed->skipped_images();
  if (m.meta.contains("test_accuracy")) out["job_test_accuracy"] = m.meta["test_accuracy"];
  if (as_json) {
    std::cout << out.dump() << std::endl;
    return 0;
  }
  std::cout << "accuracy " << std::fixed << std::setprecision(4) << acc << " on " << info.test_images << " test images of "
            << data_dir << " (" << dltrain::enum_name(spec.dataset) << ", " << m.name << ")";
  if (m.meta.contains("test_accuracy")) {
    std::cout << "; the job reported " << m.meta["test_accuracy"].get<double>();
    if (m.meta.contains("job")) std::cout << " on " << m.meta["job"].value("test_samples", 0) << " (0 = all)";
  }
  std::cout << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dltrain-model " DLTRAIN_VERSION
               ": run a trained model that `dltrain model get JOB -o DIR` downloaded (also as `dltrain predict` and "
               "`dltrain evaluate`).\nExit codes: 0 ok, 1 an image could not be read (the others are printed), 2 bad "
               "input."};
  app.require_subcommand(1);
  std::string dir, data_dir;
  std::vector<std::string> images;
  int top = 3;
  bool as_json = false;
  std::int64_t limit = 0;
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto* predict_cmd = app.add_subcommand(
      "predict", "print the top classes and their probabilities for each image (JPEG or PNG), decoded, resized, "
                 "centre-cropped and normalised as the job's test images were");
  predict_cmd->add_option("MODEL_DIR", dir, "the model's directory (metadata.json, state_dict.pt[, model.pt])")->required();
  predict_cmd->add_option("IMAGE", images, "image files")->required();
  predict_cmd->add_option("-k,--top", top, "classes per image")->capture_default_str()->check(CLI::Range(1, 1000));
  predict_cmd->add_flag("--json", as_json, "one JSON object per image");
  auto* evaluate_cmd = app.add_subcommand(
      "evaluate", "top-1 accuracy on the test split of a data set in the job's format (IDX, CIFAR-10 or ImageFolder: "
                  "DIR/test/<class>/…), computed as the job's evaluation");
  evaluate_cmd->add_option("MODEL_DIR", dir, "the model's directory")->required();
  evaluate_cmd->add_option("--data", data_dir, "the data set's directory (the job's data_dir layout)")->required();
  evaluate_cmd->add_option("--limit", limit, "the first N test images (0 = all)")->check(CLI::NonNegativeNumber);
  evaluate_cmd->add_option("--threads", threads, "threads")->capture_default_str()->check(CLI::Range(1, 256));
  evaluate_cmd->add_flag("--json", as_json, "JSON output");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  dltrain::init_logging("dltrain-model", "warn");
  try {
    if (predict_cmd->parsed()) return predict(dir, images, top, as_json);
    return evaluate(dir, data_dir, limit, threads, as_json);
  } catch (const std::exception& e) {
    std::cerr << "dltrain " << (predict_cmd->parsed() ? "predict" : "evaluate") << ": " << e.what() << "\n";
    return 2;
  }
}
