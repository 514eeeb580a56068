// What collecting a worker's observations costs, piece by piece, measured on this machine
// (docs/benchmarks/load.md, "Metrics overhead"). A worker's step does, for its timeline and
// progress: seven steady_clock reads turned into Unix microseconds and one push into the
// StepTraceRing (wire/step_trace.h); every trace interval (5 s) it writes the ring to
// its trace file; every progress interval (5 s) it builds and prints one progress event.
// Its agent turns each progress event into TaskMetrics and serializes /metrics for every
// scrape. Each is timed here over many repetitions, with the code the worker and agent
// run, and reported per step or per interval; the fraction of a step's time follows from
// the step time given (--step-ms: the CNN job's 12–18 ms on this machine).
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "agent/task_metrics.h"
#include "control/metrics_server.h"
#include "wire/step_trace.h"
#include "wire/task_events.h"

namespace {

using Clock = std::chrono::steady_clock;

template <typename F>
double ns_per(std::int64_t reps, F&& f) {
  const auto t0 = Clock::now();
  for (std::int64_t i = 0; i < reps; ++i) f(i);
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count() / static_cast<double>(reps);
}

// Keeps a value alive so that the compiler cannot drop the work that made it.
volatile std::int64_t g_sink = 0;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"collection_bench: the cost of a worker's per-step timeline and progress collection"};
  std::int64_t steps = 20'000'000;
  std::int64_t writes = 200;
  std::size_t ring = 1000;
  double step_ms = 15.0, interval_s = 5.0;
  int tasks = 3;
  app.add_option("--steps", steps, "steps timed for the per-step part")->capture_default_str();
  app.add_option("--writes", writes, "trace writes, progress events and scrapes timed")->capture_default_str();
  app.add_option("--ring", ring, "steps the timeline keeps (the worker's default)")->capture_default_str();
  app.add_option("--step-ms", step_ms, "a step's time to compare with, ms")->capture_default_str();
  app.add_option("--interval", interval_s, "trace and progress interval, s")->capture_default_str();
  app.add_option("--tasks", tasks, "tasks on the agent being scraped")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (steps < 1 || writes < 1 || ring < 1 || tasks < 1 || step_ms <= 0 || interval_s <= 0) {
    std::cerr << "collection_bench: --steps, --writes, --ring, --tasks, --step-ms and --interval must be positive\n";
    return 2;
  }

  // Per step: the seven phase marks (six phases and the end) and the ring push.
  dltrain::wire::StepTraceRing trace(ring);
  const auto steady0 = Clock::now();
  const std::int64_t unix0 = 1'700'000'000'000'000;
  const double per_step_ns = ns_per(steps, [&](std::int64_t i) {
    dltrain::wire::StepRecord r;
    r.step = i + 1;
    for (auto& t : r.t) t = unix0 + std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - steady0).count();
    trace.push(r);
  });
  g_sink = trace.last(1).front().t[0];

  // Per trace interval: the full ring written to its file (atomic replace).
  const auto path = (std::filesystem::temp_directory_path() / "dltrain-collection-bench-trace.json").string();
  const double write_ns = ns_per(writes, [&](std::int64_t) {
    dltrain::wire::write_step_trace(path, dltrain::wire::step_trace_json("worker-0", trace.last(trace.size())));
  });
  const auto trace_bytes = std::filesystem::file_size(path);
  std::filesystem::remove(path);

  // Per progress interval: one progress event built and printed as a JSON line.
  dltrain::wire::events::Progress p;
  p.rank = 1, p.epoch = 3, p.step = 812, p.steps_per_epoch = 938, p.global_step = 2688, p.loss = 0.4123;
  p.lr = 0.05, p.images_per_sec = 2012.5, p.bytes_pushed = 123456789, p.bytes_pulled = 98765432;
  p.counters = dltrain::wire::events::StepCounters{};
  std::string line;
  const double progress_ns = ns_per(writes * 100, [&](std::int64_t i) {
    p.global_step = i;
    line = p.to_json().dump();
  });

  // Per scrape, on the agent: each task's latest progress taken in, /metrics serialized.
  std::vector<dltrain::agent::TaskMetrics> ms(static_cast<std::size_t>(tasks));
  for (int i = 0; i < tasks; ++i) {
    auto& m = ms[static_cast<std::size_t>(i)];
    m.job = "job-1", m.task = "worker-" + std::to_string(i), m.role = dltrain::wire::TaskKind::kWorker;
    m.on_event(*dltrain::wire::events::parse_task_event(nlohmann::json::parse(line), dltrain::wire::TaskKind::kWorker));
  }
  dltrain::agent::AgentFigures fig;
  fig.agent = "agent-0", fig.cores = 8, fig.memory_mb = 24000;
  std::size_t scrape_bytes = 0;
  const double scrape_ns = ns_per(writes * 10, [&](std::int64_t) {
    dltrain::control::MetricsBuilder b;
    dltrain::agent::add_agent_metrics(b, fig);
    for (const auto& m : ms) m.add_to(b, fig.agent, 1.7e9);
    scrape_bytes = b.serialize().size();
  });

  const double step_ns = step_ms * 1e6, interval_ns = interval_s * 1e9;
  const double worker_fraction = per_step_ns / step_ns + (write_ns + progress_ns) / interval_ns;
  nlohmann::json out = {
      {"per_step_ns", per_step_ns},
      {"trace_write_ms", write_ns / 1e6},
      {"trace_file_bytes", trace_bytes},
      {"progress_event_us", progress_ns / 1e3},
      {"progress_event_bytes", line.size()},
      {"scrape_us", scrape_ns / 1e3},
      {"scrape_bytes", scrape_bytes},
      {"settings", {{"steps", steps}, {"ring", ring}, {"step_ms", step_ms}, {"interval_s", interval_s}, {"tasks", tasks}}},
      {"worker_fraction_of_step_time", worker_fraction}};
  std::cout << out.dump(1) << "\n";
  std::fprintf(stderr,
               "per step %.1f ns (%.5f %% of a %.1f ms step); trace write %.2f ms and progress event %.2f us every "
               "%.0f s; worker total %.4f %%; a scrape of %d tasks %.1f us on the agent\n",
               per_step_ns, 100 * per_step_ns / step_ns, step_ms, write_ns / 1e6, progress_ns / 1e3, interval_s,
               100 * worker_fraction, tasks, scrape_ns / 1e3);
  return 0;
}
