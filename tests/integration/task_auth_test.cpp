// The task executables and the job secret: dltrain-ps and dltrain-worker read it from a
// file that must be private (mode 0600 or stricter), and a real PS shard process serves
// only workers that prove they know it for its job and generation.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "job/job_spec.h"
#include "common/secret.h"
#include "ps/client.h"
#include "support/process.h"
#include "support/temp_dir.h"
#include "support/names.h"

using Child = dltrain::testing::PipedChild;

namespace {

const std::string kBin = DLTRAIN_BIN_DIR;
const std::string kSecretHex = "6a0f3c1e9b2d4f5a7c8e0d1b3a5f7e9c2b4d6f8a0c1e3f5a7b9d0e2f4a6c8e0b";

fs::path write_secret(const fs::path& dir, mode_t mode) {
  const auto p = dir / "job.secret";
  std::ofstream(p) << kSecretHex << "\n";
  ::chmod(p.c_str(), mode);
  return p;
}

// A one-worker MLP job small enough to train in seconds.
fs::path write_job_json(const fs::path& dir) {
  const auto spec = dltrain::parse_job_toml(R"(
name = "auth"
model = "mlp"
data_dir = "/usr/share/datasets/fashion-mnist"
epochs = 1
workers = 1
ps_shards = 1
batch_size = 32
train_samples = 512
test_samples = 256
)");
  const auto p = dir / "job.json";
  std::ofstream(p) << json(spec).dump();
  return p;
}

dltrain::ps::PsClientOptions client_options(std::uint32_t generation, const std::vector<std::uint8_t>& secret) {
  dltrain::ps::PsClientOptions o;
  o.job = 9;
  o.generation = generation;
  o.secret = secret;
  o.timeout = 10s;
  return o;
}

}  // namespace

TEST(TaskSecretFile, PsAndWorkerRefuseASecretFileOthersCanRead) {
  TempDir d;
  const auto job = write_job_json(d.path);
  for (mode_t mode : {0644, 0640}) {
    const auto secret = write_secret(d.path, mode);
    char m[8];
    std::snprintf(m, sizeof m, "%04o", mode);
    const std::string expected = "--secret-file: secret file \"" + secret.string() + "\" has mode " + m +
                                 ": it must not be readable by group or others (chmod 600)";
    auto ps = run(kBin + "/dltrain-ps --job-id 9 --generation 1 --bind 127.0.0.1 --secret-file " + secret.string() +
                      " 2>&1",
                  30);
    EXPECT_EQ(ps.code, 2) << ps.out;
    EXPECT_NE(ps.out.find(expected), std::string::npos) << ps.out;
    EXPECT_EQ(ps.out.find("listening"), std::string::npos) << ps.out;
    auto worker = run(kBin + "/dltrain-worker --job-json " + job.string() +
                          " --job-id 9 --generation 1 --rank 0 --ps 127.0.0.1:1 --secret-file " + secret.string() +
                          " 2>&1",
                      60);
    EXPECT_EQ(worker.code, 2) << worker.out;
    EXPECT_NE(worker.out.find(expected), std::string::npos) << worker.out;
    EXPECT_EQ(ps.out.find(kSecretHex), std::string::npos);
    EXPECT_EQ(worker.out.find(kSecretHex), std::string::npos);
  }
  // Neither starts without one.
  auto none = run(kBin + "/dltrain-ps --job-id 9 --bind 127.0.0.1 2>&1", 30);
  EXPECT_NE(none.code, 0);
  EXPECT_NE(none.out.find("--secret-file is required"), std::string::npos) << none.out;
}

TEST(TaskSecretFile, APsProcessServesOnlyWorkersWithTheSecretForItsGeneration) {
  TempDir d;
  const auto secret_file = write_secret(d.path, 0600);
  const auto secret = dltrain::job_secret_from_hex(kSecretHex, "secret");
  Child ps({kBin + "/dltrain-ps", "--job-id", "9", "--generation", "1", "--bind", "127.0.0.1", "--secret-file",
            secret_file.string()},
           d.path / "ps.log");
  const auto listening = ps.event("listening", 30s);
  ASSERT_TRUE(listening) << slurp(d.path / "ps.log");
  const std::uint16_t port = (*listening)["port"];
  const std::vector<dltrain::ps::PsEndpoint> eps{{"127.0.0.1", port}};
  const auto layout = dltrain::ps::make_layout({4}, 4, 1);

  // The right secret and generation: served (connect says hello; query gets a reply).
  {
    dltrain::ps::PsClient ok(eps, layout, client_options(1, secret));
    ok.connect();
    EXPECT_EQ(ok.workers_done(), 0u);
  }
  // Another secret, and the right secret for generation 0: refused in the handshake.
  auto other = secret;
  other[0] ^= 0xff;
  dltrain::ps::PsClient stranger(eps, layout, client_options(1, other));
  EXPECT_THROW(stranger.connect(), dltrain::IoError);
  dltrain::ps::PsClient stale(eps, layout, client_options(0, secret));
  EXPECT_THROW(stale.connect(), dltrain::IoError);

  // A real worker process with the same 0600 file trains against it.
  const auto job = write_job_json(d.path);
  Child worker({kBin + "/dltrain-worker", "--job-json", job.string(), "--job-id", "9", "--generation", "1", "--rank",
                "0", "--ps", "127.0.0.1:" + std::to_string(port), "--secret-file", secret_file.string(), "--threads",
                "1"},
               d.path / "worker.log");
  const auto done = worker.event("done", 240s);
  EXPECT_TRUE(done) << slurp(d.path / "worker.log");
  const auto worker_rc = worker.wait(60s);
  ASSERT_TRUE(worker_rc.has_value()) << "the worker did not exit";
  EXPECT_EQ(*worker_rc, 0) << slurp(d.path / "worker.log");

  ps.signal(SIGTERM);
  const auto stopped = ps.event("stopped", 30s);
  ASSERT_TRUE(stopped) << slurp(d.path / "ps.log");
  EXPECT_EQ((*stopped)["rejected_connections"], 2) << stopped->dump();
  EXPECT_GT((*stopped)["pushes"].get<int>(), 0) << stopped->dump();
  const auto ps_rc = ps.wait(30s);
  ASSERT_TRUE(ps_rc.has_value()) << "the PS shard did not exit after SIGTERM";
  EXPECT_EQ(*ps_rc, 0);
  // The shard logged why it refused each, and neither log holds the secret.
  const auto ps_log = slurp(d.path / "ps.log");
  EXPECT_NE(ps_log.find("the peer does not know this job's secret"), std::string::npos) << ps_log;
  EXPECT_NE(ps_log.find("a task of generation 0 of this job; this shard serves generation 1 (a stale task)"),
            std::string::npos)
      << ps_log;
  EXPECT_EQ(ps_log.find(kSecretHex), std::string::npos);
  EXPECT_EQ(slurp(d.path / "worker.log").find(kSecretHex), std::string::npos);
}
