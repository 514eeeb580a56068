#include "wire/task_args.h"

#include <sstream>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "common/errors.h"

namespace dltrain::wire {
namespace {

// Shortest text that reads back as the same double.
std::string num(double v) { return fmt::format("{}", v); }

}  // namespace

std::vector<std::string> PsTaskArgs::to_argv(const std::string& program) const {
  std::vector<std::string> a{program,
                             "--job-id", std::to_string(job_id),
                             "--generation", std::to_string(generation),
                             "--secret-file", secret_file,
                             "--shard", std::to_string(shard),
                             "--momentum", num(momentum),
                             "--threads", std::to_string(threads),
                             "--bind", bind,
                             "--checkpoint", checkpoint,
                             "--checkpoint-interval", num(checkpoint_interval_s),
                             "--stats-interval", num(stats_interval_s),
                             "--log-level", log_level};
  if (sync != ps::SyncMode::kAsync) {
    a.insert(a.end(), {"--sync", std::string(enum_name(sync)), "--staleness", std::to_string(staleness), "--backup-workers",
                       std::to_string(backup_workers), "--barrier-timeout", num(barrier_timeout_s)});
  }
  if (port != 0) a.insert(a.end(), {"--port", std::to_string(port)});
  if (elastic_workers > 0) a.insert(a.end(), {"--elastic-workers", std::to_string(elastic_workers)});
  if (!workers_done.empty()) {
    std::string ranks;
    for (const auto r : workers_done) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    a.insert(a.end(), {"--workers-done", ranks});
  }
  return a;
}

void PsTaskArgs::add_to(CLI::App& app) {
  app.add_option("--job-id", job_id, "numeric job id")->required();
  app.add_option("--generation", generation, "job generation");
  app.add_option("--secret-file", secret_file, "file holding the job secret (hex; mode 0600 or stricter)")->required();
  app.add_option("--shard", shard, "shard index, 0-based");
  app.add_option("--momentum", momentum, "heavy-ball momentum in [0, 1)")
      ->check(CLI::Validator(
          [](const std::string& text) {
            const double v = std::stod(text);
            return v >= 0.0 && v < 1.0 ? std::string() : "must be in [0, 1), got " + text;
          },
          "[0, 1)"));
  app.add_option("--threads", threads, "I/O threads")->check(CLI::Range(1, 1024));
  app.add_option("--bind", bind, "address to listen on");
  app.add_option("--port", port, "port to listen on (0 = ephemeral)");
  app.add_option("--checkpoint", checkpoint,
                 "checkpoint file: loaded at start when present, written periodically and at stop (\"\" = none)");
  app.add_option("--checkpoint-interval", checkpoint_interval_s, "seconds between checkpoints")
      ->check(CLI::Range(0.1, 86400.0));
  app.add_option("--stats-interval", stats_interval_s, "seconds between ps_stats events (the shard's counters)")
      ->check(CLI::Range(0.1, 86400.0));
  app.add_option("--workers-done", workers_done,
                 "ranks of workers that already finished (a shard rebuilt for a re-assigned job)")
      ->delimiter(',');
  // Only the names (a transformer over the enum would take its numbers too).
  std::vector<std::string> names;
  for (const auto& n : EnumNames<ps::SyncMode>::kNames) names.emplace_back(n.name);
  app.add_option_function<std::string>(
         "--sync", [this](const std::string& s) { sync = parse_enum<ps::SyncMode>(s, "--sync"); },
         "consistency model: async, ssp (bounded staleness) or sync (BSP)")
      ->check(CLI::IsMember(names));
  app.add_option("--staleness", staleness, "ssp: steps a worker may be ahead of the slowest")->check(CLI::Range(0, 1000));
  app.add_option("--backup-workers", backup_workers, "sync: pushes a step may go without")->check(CLI::Range(0, 1023));
  app.add_option("--barrier-timeout", barrier_timeout_s,
                 "ssp/sync: seconds a pull waits before the workers it waits for are dropped")
      ->check(CLI::Range(0.1, 86400.0));
  app.add_option("--elastic-workers", elastic_workers,
                 "an elastic job's workers when the shard starts (0: the job is not elastic)")
      ->check(CLI::Range(0, 1024));
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
}

std::vector<std::string> WorkerTaskArgs::to_argv(const std::string& program) const {
  std::vector<std::string> a{program,
                             "--job-json", job_json,
                             "--job-id", std::to_string(job_id),
                             "--generation", std::to_string(generation),
                             "--secret-file", secret_file,
                             "--rank", std::to_string(rank),
                             "--ps", ps,
                             "--threads", std::to_string(threads),
                             "--log-level", log_level};
  if (!replica_file.empty()) a.insert(a.end(), {"--replica-file", replica_file});
  if (!init_replica.empty()) a.insert(a.end(), {"--init-replica", init_replica});
  if (!trace_file.empty()) a.insert(a.end(), {"--trace-file", trace_file});
  if (resume_epoch > 0) a.insert(a.end(), {"--resume-epoch", std::to_string(resume_epoch)});
  if (ps_timeout_s > 0) a.insert(a.end(), {"--ps-timeout", num(ps_timeout_s)});
  if (progress_interval_s > 0) a.insert(a.end(), {"--progress-interval", num(progress_interval_s)});
  if (!local_group_socket.empty()) {
    a.insert(a.end(), {"--local-group-socket", local_group_socket, "--local-group-rank",
                       std::to_string(local_group_rank), "--local-group-members", local_group_members});
  }
  return a;
}

void WorkerTaskArgs::add_to(CLI::App& app) {
  app.add_option("--job-json", job_json, "job specification (JSON, as sent by the leader)")->required();
  app.add_option("--job-id", job_id, "numeric job id")->required();
  app.add_option("--generation", generation, "job generation");
  app.add_option("--secret-file", secret_file, "file holding the job secret (hex; mode 0600 or stricter)")->required();
  app.add_option("--rank", rank, "worker rank, 0-based")->required();
  app.add_option("--ps", ps, "PS shard endpoints HOST:PORT, comma-separated, shard order")->required();
  app.add_option("--threads", threads, "intra-op threads")->check(CLI::Range(1, 1024));
  app.add_option("--ps-timeout", ps_timeout_s,
                 "seconds the PS shards may stay silent within a call (default: the job's ps.timeout)")
      ->check(CLI::Range(1.0, 86400.0));
  app.add_option("--resume-epoch", resume_epoch, "after a restart: epochs already finished")
      ->check(CLI::Range(0, 100000));
  app.add_option("--replica-file", replica_file,
                 "on SIGTERM, save the parameter replica here (for a re-assignment of the job)");
  app.add_option("--init-replica", init_replica,
                 "initialise the PS shards from this saved replica instead of the seeded parameters");
  app.add_option("--trace-file", trace_file,
                 "keep the last steps' phase timestamps here (read by `dltrain trace`; rewritten every 5 s)");
  app.add_option("--progress-interval", progress_interval_s, "seconds between progress events (default 5)")
      ->check(CLI::Range(0.1, 86400.0));
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  app.add_option("--local-group-socket", local_group_socket,
                 "Unix socket of this worker's local group (its member 0 listens there)");
  app.add_option("--local-group-rank", local_group_rank, "this worker's place in its local group")
      ->check(CLI::Range(0, 255));
  app.add_option("--local-group-members", local_group_members,
                 "the local group's task names, comma-separated, in rank order");
}

std::vector<HostPort> WorkerTaskArgs::endpoints() const {
  std::vector<HostPort> out;
  std::stringstream ss(ps);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(parse_host_port(item, "--ps", "HOST:PORT[,HOST:PORT...]"));
  if (out.empty()) throw ConfigError("--ps", "expected HOST:PORT[,HOST:PORT...], got \"" + ps + "\"");
  return out;
}

}  // namespace dltrain::wire
