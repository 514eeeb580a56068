// One PS shard under load from simulated workers (docs/benchmarks/load.md, "The PS under
// load"). No LibTorch: a simulated worker pushes and pulls gradient-sized buffers with the
// real ps::PsClient against real ps::PsServer shards, at a given rate.
//
// Both roles read the job secret the data-plane handshake proves from --secret-file
// (hex, mode 0600), as dltrain's tasks do.
//
//   ps_load serve --secret-file F [--bind ADDR] [--momentum M] [--threads T]
//     Starts one PS shard (ps::PsServer over a ps::ShardState with heavy-ball momentum M)
//     and prints {"port":P,"pid":N} on one line. Then reads commands from stdin, one per
//     line, answering each with one JSON line: `stats` (pushes applied, apply seconds,
//     pulls, bytes in/out, ShardState::state_bytes(), VmRSS and VmHWM of this process in
//     bytes, from /proc/self/status). Serves until stdin closes or SIGTERM.
//   ps_load worker --secret-file F --shards H:P[,H:P...] --rank R --workers N
//                  [--floats N] [--partition-floats P] [--ratio r] [--downlink-ratio d]
//                  [--rate S] [--seconds T] [--warmup W] [--start-at UNIX_S] [--lr LR]
//     One simulated worker: a flat parameter vector of N floats (one tensor, cut into
//     partitions of at most P floats and spread over the shards as a dltrain worker
//     does), init, a dense pull, then steps of push+pull. Dense (--ratio 1): the whole
//     gradient as fp32. Sparse (--ratio r < 1): ⌈r·n⌉ indices per partition (ascending,
//     a fresh random set every step, drawn before the run) and their fp32 values, the
//     DGC uplink's wire form; with --downlink-ratio d < 1 the pulls are the sparse
//     downlink too (the shard keeps this worker's x_seen). --rate S paces the steps at S
//     per second (0: as fast as the shard answers, closed loop). It waits until
//     --start-at (so that every worker starts together), runs --warmup seconds
//     unmeasured, then --seconds measured, and prints one JSON object: steps, steps/s,
//     latency of push+pull (mean, p50, p90, p99, max; ms), bytes pushed/pulled per step.
//
// Every push carries gradient values 1e-3 and learning rate --lr (default 1e-3), so that
// the parameters move by about 1e-6 per push (1e-5 with momentum 0.9): finite for any run
// this tool makes, and — what matters for the sparse downlink — x − x_seen is not zero,
// so a sparse pull selects among real differences as in training. (With lr 0 every
// difference is 0, a degenerate input for the sampled top-k.)
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/secret.h"
#include "ps/client.h"
#include "ps/partition.h"
#include "ps/server.h"
#include "ps/shard_state.h"

using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

constexpr std::uint64_t kJob = 1;
constexpr std::uint32_t kGeneration = 1;

/// Value of a "VmRSS:" style line of /proc/self/status, bytes (0 when absent).
std::uint64_t proc_status_bytes(const std::string& key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind(key, 0) == 0) {
      std::istringstream in(line.substr(key.size()));
      std::uint64_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

int serve(const std::string& bind, double momentum, int threads, const std::vector<std::uint8_t>& secret) {
  dltrain::ps::PsServerOptions opt;
  opt.bind_address = bind;
  opt.job = kJob;
  opt.generation = kGeneration;
  opt.secret = secret;
  opt.threads = threads;
  auto state = std::make_shared<dltrain::ps::ShardState>(momentum);
  dltrain::ps::PsServer server(opt, state);
  server.start();
  std::cout << json{{"port", server.port()}, {"pid", ::getpid()}}.dump() << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
    if (line == "stats") {
      std::cout << json{{"pushes", state->pushes()},
                        {"apply_seconds", server.apply_seconds()},
                        {"pulls", server.pulls()},
                        {"bytes_in", server.bytes_in()},
                        {"bytes_out", server.bytes_out()},
                        {"connections", server.connections()},
                        {"state_bytes", state->state_bytes()},
                        {"rss_bytes", proc_status_bytes("VmRSS:")},
                        {"hwm_bytes", proc_status_bytes("VmHWM:")},
                        {"cpu_seconds", static_cast<double>(std::clock()) / CLOCKS_PER_SEC}}
                       .dump()
                << std::endl;
    } else if (!line.empty()) {
      std::cout << json{{"error", "unknown command \"" + line + "\" (expected stats)"}}.dump() << std::endl;
    }
  }
  server.stop();
  return 0;
}

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  // Nearest rank (the ⌈q·n⌉-th smallest value).
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

/// The encoded sparse push of one step: per partition, indices then values.
struct SparseStep {
  std::vector<std::vector<std::uint32_t>> indices;
  std::vector<std::vector<float>> values;
};

struct WorkerArgs {
  std::vector<dltrain::ps::PsEndpoint> shards;
  int rank = 0, workers = 1;
  std::int64_t floats = 1 << 20, partition_floats = 262144;
  double ratio = 1.0, downlink_ratio = 1.0, rate = 0, seconds = 5, warmup = 1, start_at = 0;
  float lr = 1e-3f;
};

int worker(const WorkerArgs& a, const std::vector<std::uint8_t>& secret) {
  auto layout = dltrain::ps::make_layout({a.floats}, a.partition_floats, static_cast<int>(a.shards.size()));
  dltrain::ps::PsClientOptions popt;
  popt.job = kJob;
  popt.generation = kGeneration;
  popt.secret = secret;
  popt.rank = static_cast<std::uint32_t>(a.rank);
  popt.num_workers = static_cast<std::uint32_t>(a.workers);
  popt.sparse_downlink = a.downlink_ratio < 1.0;
  popt.timeout = std::chrono::milliseconds(120000);
  dltrain::ps::PsClient client(a.shards, layout, popt);
  std::vector<float> params(static_cast<std::size_t>(a.floats), 0.5f), grad(params.size(), 1e-3f);

  // Sparse steps drawn before the run (the uplink of DGC: k = ⌈ratio·n⌉ per partition).
  const bool sparse = a.ratio < 1.0;
  std::vector<SparseStep> steps;
  if (sparse) {
    std::mt19937_64 rng(static_cast<std::uint64_t>(a.rank) * 7919 + 1);
    steps.resize(8);
    for (auto& st : steps) {
      for (const auto& p : layout.partitions) {
        const auto n = static_cast<std::size_t>(p.length);
        const auto k = std::max<std::size_t>(1, static_cast<std::size_t>(std::ceil(a.ratio * static_cast<double>(n))));
        // Floyd's sample of k distinct indices of n, then sorted.
        std::vector<std::uint32_t> idx;
        idx.reserve(k);
        std::vector<char> taken(n, 0);
        for (std::size_t j = n - k; j < n; ++j) {
          std::uniform_int_distribution<std::size_t> d(0, j);
          std::size_t t = d(rng);
          if (taken[t]) t = j;
          taken[t] = 1;
          idx.push_back(static_cast<std::uint32_t>(t));
        }
        std::sort(idx.begin(), idx.end());
        st.indices.push_back(std::move(idx));
        st.values.emplace_back(k, 1e-3f);
      }
    }
  }
  std::vector<dltrain::ps::PartitionPush> pushes(layout.partitions.size());
  auto encode = [&](std::size_t step) {
    for (std::size_t i = 0; i < layout.partitions.size(); ++i) {
      const auto& p = layout.partitions[i];
      auto& e = pushes[i];
      if (sparse) {
        const auto& st = steps[step % steps.size()];
        e.codec = dltrain::wire::Codec::kSparseF32;
        e.count = static_cast<std::uint32_t>(st.indices[i].size());
        e.first = std::as_bytes(std::span(st.indices[i]));
        e.second = std::as_bytes(std::span(st.values[i]));
      } else {
        e.codec = dltrain::wire::Codec::kDenseF32;
        e.count = static_cast<std::uint32_t>(p.length);
        e.first = std::as_bytes(std::span(grad).subspan(static_cast<std::size_t>(p.offset),
                                                         static_cast<std::size_t>(p.length)));
        e.second = {};
      }
    }
  };

  client.connect();
  client.init(params);
  client.pull(params);

  // Everyone starts together (the driver sets --start-at a little in the future).
  if (a.start_at > 0) {
    timespec now{};
    ::clock_gettime(CLOCK_REALTIME, &now);
    const double wait = a.start_at - (static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec));
    if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
  const auto t0 = Clock::now();
  const auto measure_from = t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.warmup));
  const auto end = measure_from + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(a.seconds));
  const auto period = a.rate > 0 ? std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / a.rate))
                                 : Clock::duration::zero();
  std::vector<double> lat_ms;
  lat_ms.reserve(1 << 16);
  std::uint64_t step = 0, measured = 0, b0 = 0, p0 = 0;
  bool measuring = false;
  auto next = t0;
  double measured_seconds = a.seconds;
  for (;;) {
    auto now = Clock::now();
    if (now >= end) break;
    if (!measuring && now >= measure_from) {
      measuring = true;
      b0 = client.bytes_pushed();
      p0 = client.bytes_pulled();
    }
    if (period > Clock::duration::zero()) {
      if (now < next) {
        std::this_thread::sleep_until(next);
        continue;
      }
      next += period;
    }
    encode(step);
    const auto s0 = Clock::now();
    client.push_pull(pushes, a.lr, a.downlink_ratio, params);
    const auto s1 = Clock::now();
    ++step;
    if (measuring) {
      ++measured;
      lat_ms.push_back(std::chrono::duration<double, std::milli>(s1 - s0).count());
    }
  }
  if (!measuring) measured_seconds = 0;
  double sum = 0;
  for (double v : lat_ms) sum += v;
  const double n = static_cast<double>(std::max<std::uint64_t>(1, measured));
  std::cout << json{{"rank", a.rank},
                    {"steps", measured},
                    {"steps_per_s", measured_seconds > 0 ? static_cast<double>(measured) / measured_seconds : 0.0},
                    {"partitions", layout.partitions.size()},
                    {"latency_ms",
                     {{"mean", lat_ms.empty() ? 0.0 : sum / static_cast<double>(lat_ms.size())},
                      {"p50", percentile(lat_ms, 0.50)},
                      {"p90", percentile(lat_ms, 0.90)},
                      {"p99", percentile(lat_ms, 0.99)},
                      {"max", percentile(lat_ms, 1.0)}}},
                    {"bytes_pushed_per_step", static_cast<double>(client.bytes_pushed() - b0) / n},
                    {"bytes_pulled_per_step", static_cast<double>(client.bytes_pulled() - p0) / n}}
                   .dump()
            << std::endl;
  client.done();
  return 0;
}

std::vector<dltrain::ps::PsEndpoint> parse_shards(const std::string& list) {
  std::vector<dltrain::ps::PsEndpoint> out;
  std::istringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    const auto colon = item.rfind(':');
    if (colon == std::string::npos) throw std::runtime_error("--shards: expected HOST:PORT, got \"" + item + "\"");
    const int port = std::stoi(item.substr(colon + 1));
    if (port < 1 || port > 65535) throw std::runtime_error("--shards: port out of range in \"" + item + "\"");
    out.push_back({item.substr(0, colon), static_cast<std::uint16_t>(port)});
  }
  if (out.empty()) throw std::runtime_error("--shards: no shard given");
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGPIPE, SIG_IGN);
  CLI::App app{"One PS shard under load from simulated workers (no LibTorch)"};
  app.require_subcommand(1);
  std::string bind = "127.0.0.1", secret_file, shards;
  double momentum = 0.9;
  int threads = 1;
  WorkerArgs w;
  auto* s = app.add_subcommand("serve", "run one PS shard");
  s->add_option("--bind", bind, "address to listen on");
  s->add_option("--secret-file", secret_file, "job secret (hex, mode 0600)")->required();
  s->add_option("--momentum", momentum, "heavy-ball momentum of the shard (0 for dgc)")->check(CLI::Range(0.0, 0.999));
  s->add_option("--threads", threads, "I/O threads of the shard")->check(CLI::Range(1, 64));
  auto* c = app.add_subcommand("worker", "run one simulated worker");
  c->add_option("--secret-file", secret_file, "job secret (hex, mode 0600)")->required();
  c->add_option("--shards", shards, "HOST:PORT of every shard, comma-separated, in shard order")->required();
  c->add_option("--rank", w.rank, "this worker's rank")->check(CLI::Range(0, 4095));
  c->add_option("--workers", w.workers, "workers of the job")->check(CLI::Range(1, 4096));
  c->add_option("--floats", w.floats, "parameters of the model")->check(CLI::Range(1, 1 << 28));
  c->add_option("--partition-floats", w.partition_floats, "largest partition")->check(CLI::Range(1, 1 << 28));
  c->add_option("--ratio", w.ratio, "uplink density; 1 = dense fp32")->check(CLI::Range(1e-6, 1.0));
  c->add_option("--downlink-ratio", w.downlink_ratio, "downlink density; 1 = dense pulls")->check(CLI::Range(1e-6, 1.0));
  c->add_option("--rate", w.rate, "steps per second (0 = closed loop)")->check(CLI::Range(0.0, 1e6));
  c->add_option("--seconds", w.seconds, "measured seconds")->check(CLI::Range(0.1, 3600.0));
  c->add_option("--warmup", w.warmup, "unmeasured seconds first")->check(CLI::Range(0.0, 600.0));
  c->add_option("--start-at", w.start_at, "wall-clock (Unix seconds) to start the steps at");
  c->add_option("--lr", w.lr, "learning rate sent with every push")->check(CLI::Range(0.0, 1.0));
  CLI11_PARSE(app, argc, argv);
  try {
    const auto secret = dltrain::read_job_secret_file(secret_file, "--secret-file");
    if (*s) return serve(bind, momentum, threads, secret);
    if (w.rank >= w.workers) throw std::runtime_error("--rank must be below --workers");
    w.shards = parse_shards(shards);
    return worker(w, secret);
  } catch (const std::exception& e) {
    std::cerr << "ps_load: " << e.what() << '\n';
    return 1;
  }
}
