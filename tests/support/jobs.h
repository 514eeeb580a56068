// Job file bodies several integration tests submit, kept as TOML files in
// tests/support/jobs/ (each says what it is for); a test adds its data_dir line, an
// epochs line and what is its own. A body that ends inside a [table] leaves what is
// appended to it in that table.
#pragma once

#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace dltrain::testing {

/// The text of tests/support/jobs/<name>.toml, after a newline (so that it may follow
/// any other body). Throws std::runtime_error naming the file when it cannot be read.
inline std::string job_text(const std::string& name) {
  const std::string path = std::string(DLTRAIN_SOURCE_DIR) + "/tests/support/jobs/" + name + ".toml";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read the test job file " + path);
  return "\n" + std::string((std::istreambuf_iterator<char>(in)), {});
}

inline const std::string kOneWorkerMlp = job_text("one-worker-mlp");
inline const std::string kCnn24000 = job_text("cnn-24000");
inline const std::string kDgcCompression = job_text("dgc-compression");
inline const std::string kAutoMlp = job_text("auto-mlp");
inline const std::string kShortCnn = job_text("short-cnn");
inline const std::string kShortOptimizer = job_text("short-optimizer");
inline const std::string kSmallDgc = job_text("small-dgc");
inline const std::string kCnn8000 = job_text("cnn-8000");

}  // namespace dltrain::testing
