// dltrain: the thin command-line client. Every decision is the leader's; this program
// finds the leader (leader_target.h), sends one request (commands.h), and prints what
// comes back (output.h). Here: the command line, the dispatch to one subcommand, and the
// mapping of errors to exit codes.
#include <filesystem>
#include <iostream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "commands.h"
#include "common/errors.h"
#include "data/export.h"
#include "data/inspect.h"
#include "data/pack.h"
#include "dataset_shards.h"
#include "control/client.h"
#include "dltrain/config.h"
#include "leader_target.h"
#include "models.h"
#include "output.h"
#include "slurm.h"
#include "wire/control.h"
#include "wire/control_bodies.h"

namespace client = dltrain::client;

int main(int argc, char** argv) {
  CLI::App app{"dltrain " DLTRAIN_VERSION
               ": submit and watch training jobs on a dltrain cluster.\n"
               "The leader is found from --leader/--token, then DLTRAIN_LEADER/DLTRAIN_TOKEN, then\n"
               "~/.config/dltrain/client.toml (leader, token), then a local `dltrain-agent --standalone` cluster.\n"
               "Exit codes: 0 ok, 1 job failed or cancelled, 2 bad input, 3 leader unreachable or unavailable, "
               "4 the job is another user's."};
  app.require_subcommand(1);
  std::string leader, token;
  int timeout_s = 30;
  bool as_json = false;
  std::string ca_file;
  app.add_option("--leader", leader,
                 "leader URL, ws://HOST:PORT or wss://HOST:PORT (TLS); with HA the candidates' URLs separated by "
                 "commas: the one that serves answers");
  app.add_option("--token", token, "client bearer token");
  app.add_option("--ca-file", ca_file,
                 "wss:// only: CA certificates (PEM) to verify the leader with (default: DLTRAIN_CA_FILE, the "
                 "client config's ca_file, else the system's trust store)");
  app.add_option("--timeout", timeout_s, "seconds to wait for the leader's answer (1..3600)")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  // Before or after the subcommand: `dltrain --json status` and `dltrain status --json`.
  app.add_flag("--json", as_json, "JSON output (also accepted after the subcommand)");
  app.set_version_flag("--version", DLTRAIN_VERSION);

  std::string job_file, job_id;
  bool follow_flag = false;
  auto* submit = app.add_subcommand("submit", "submit a job file; with --follow, print progress until it ends");
  submit->add_option("JOB_FILE", job_file, "job file (TOML), e.g. configs/jobs/fashion-mnist.toml")->required();
  submit->add_flag("-f,--follow", follow_flag, "print progress until the job ends; exit 1 unless it succeeds");
  submit->add_flag("--json", as_json, "one JSON object per line");
  auto* resume_cmd = app.add_subcommand(
      "resume", "continue a failed or cancelled job as a new job, from its latest epoch checkpoint ([checkpoint] "
                "every_epochs), at the epoch it reached; with --follow, print progress until it ends");
  resume_cmd->add_option("JOB", job_id, "the failed or cancelled job, e.g. job-3")->required();
  resume_cmd->add_flag("-f,--follow", follow_flag, "print progress until the new job ends; exit 1 unless it succeeds");
  resume_cmd->add_flag("--json", as_json, "one JSON object per line");
  auto* status = app.add_subcommand("status", "show one job, or every job");
  status->add_option("JOB", job_id, "job id, e.g. job-1");
  status->add_flag("--json", as_json, "JSON output");
  std::int64_t list_limit = client::CommandOptions{}.list_limit;
  status->add_option("--limit", list_limit, "without JOB: the latest this many jobs (ignored with a JOB)")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, dltrain::wire::ListBody::kMaxLimit));
  auto* list = app.add_subcommand("list", "list the latest jobs (the leader keeps job_retention finished ones)");
  list->add_flag("--json", as_json, "JSON output");
  list->add_option("--limit", list_limit, "the latest this many jobs")
      ->capture_default_str()
      ->check(CLI::Range(std::int64_t{1}, dltrain::wire::ListBody::kMaxLimit));
  auto* cancel = app.add_subcommand("cancel", "cancel a queued or running job");
  cancel->add_option("JOB", job_id, "job id")->required();
  cancel->add_flag("--json", as_json, "JSON output");
  int scale_workers = 0;
  auto* scale_cmd = app.add_subcommand(
      "scale", "resize a running elastic job (its job file's [elastic] bounds) without restarting it");
  scale_cmd->add_option("JOB", job_id, "job id")->required();
  scale_cmd->add_option("--workers", scale_workers, "the number of workers to run")->required()->check(CLI::Range(1, 1024));
  scale_cmd->add_flag("--json", as_json, "JSON output");
  auto* agents = app.add_subcommand("agents", "list the agents registered with the leader");
  agents->add_flag("--json", as_json, "JSON output");
  bool cluster_flag = false;
  auto* plan_cmd = app.add_subcommand(
      "plan", "show the planner's decision for a job file without running anything, or (--cluster) the shared plan");
  auto* plan_file = plan_cmd->add_option("JOB_FILE", job_file, "job file (TOML)");
  auto* plan_cluster = plan_cmd->add_flag(
      "--cluster", cluster_flag, "the leader's shared plan now: each elastic job's workers, reason, time left, deadline, and the latest resizes");
  plan_file->excludes(plan_cluster);
  plan_cmd->add_flag("--json", as_json, "JSON output");
  plan_cmd->callback([&]() {
    if (!cluster_flag && job_file.empty()) throw CLI::ValidationError("plan", "give a JOB_FILE, or --cluster");
  });
  std::string model_filter, dataset_filter;
  auto* history_cmd = app.add_subcommand("history", "list the leader's performance observations");
  history_cmd->add_option("--model", model_filter, "only this model");
  history_cmd->add_option("--dataset", dataset_filter, "only this dataset");
  history_cmd->add_flag("--json", as_json, "JSON output");
  auto* follow_cmd = app.add_subcommand("follow", "print a job's progress until it ends");
  follow_cmd->add_option("JOB", job_id, "job id")->required();
  follow_cmd->add_flag("--json", as_json, "one JSON object per line");
  client::LogsOptions logs_opt;
  auto* logs_cmd = app.add_subcommand("logs", "print a task's log (its stderr and its events), kept by its agent");
  logs_cmd->add_option("JOB", job_id, "job id")->required();
  logs_cmd->add_option("--task", logs_opt.task, "the task, e.g. worker-1 or ps-0")->capture_default_str();
  logs_cmd->add_option("--tail", logs_opt.tail, "the last N lines")->capture_default_str()->check(CLI::Range(0, 10000));
  logs_cmd->add_flag("-f,--follow", logs_opt.follow, "keep printing what the task logs until it ends");
  logs_cmd->add_flag("--json", as_json, "one JSON object per reply (text, offsets, agent)");
  std::string dataset_dir;
  int inspect_threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto* dataset_cmd = app.add_subcommand("dataset", "look at a data set on this machine (no leader needed)");
  dataset_cmd->require_subcommand(1);
  auto* inspect_cmd = dataset_cmd->add_subcommand(
      "inspect", "list an ImageFolder's (or CIFAR-10 directory's) classes, images per class and split, image "
                 "sizes and unreadable files; every image is decoded, as training would; exit 2 if the layout is "
                 "invalid");
  inspect_cmd->add_option("DIR", dataset_dir,
                          "the data_dir of a job (DIR/train/<class>/*.jpg|png and DIR/test/ or val/), or a sharded data "
                          "set: a directory with manifest.json, or its http(s)://, s3:// or file:// URL")
      ->required();
  bool inspect_verify = false;
  inspect_cmd->add_flag("--verify", inspect_verify,
                        "a sharded data set: also fetch every shard, check its SHA-256 and decode every image");
  inspect_cmd->add_option("--threads", inspect_threads, "decoding threads")->capture_default_str()->check(CLI::Range(1, 256));
  inspect_cmd->add_flag("--json", as_json, "JSON output");
  std::string pack_src, pack_dest, pack_size = "256MB";
  dltrain::data::PackOptions pack_opt;
  auto* pack_cmd = dataset_cmd->add_subcommand(
      "pack", "write an IDX (Fashion-MNIST, MNIST), CIFAR-10 or ImageFolder directory as a sharded data set: tar "
              "shards in WebDataset's layout (KEY.png|jpg + KEY.cls) and manifest.json, for data = \"URL\" "
              "(docs/data.md)");
  pack_cmd->add_option("SRC", pack_src, "the data set's directory")->required();
  pack_cmd->add_option("DEST", pack_dest, "where to write the shards and manifest.json (created)")->required();
  pack_cmd->add_option("--shard-size", pack_size, "target size of a shard (e.g. 256MB, 64MiB)")->capture_default_str();
  pack_cmd->add_option("--dataset", pack_opt.dataset, "auto, fashion-mnist, mnist, cifar10 or imagefolder")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "fashion-mnist", "mnist", "cifar10", "imagefolder"}));
  pack_cmd->add_option("--seed", pack_opt.seed, "shuffles the samples across the shards")->capture_default_str();
  pack_cmd->add_flag("--json", as_json, "JSON output");
  std::string idx_dir, out_dir;
  dltrain::data::IdxExportOptions export_opt;
  auto* from_idx_cmd = dataset_cmd->add_subcommand(
      "from-idx", "write an IDX data set (Fashion-MNIST, MNIST) as an ImageFolder of PNG or JPEG files: "
                  "OUT_DIR/train/<class>/NNNNNN.png and OUT_DIR/test/<class>/… (Fashion-MNIST's class names)");
  from_idx_cmd->add_option("IDX_DIR", idx_dir, "the four IDX files, e.g. /usr/share/datasets/fashion-mnist")->required();
  from_idx_cmd->add_option("OUT_DIR", out_dir, "where to write (created)")->required();
  from_idx_cmd->add_option("--format", export_opt.format, "png, jpeg, or mixed (even indices PNG, odd JPEG)")
      ->capture_default_str()
      ->check(CLI::IsMember({"png", "jpeg", "mixed"}));
  from_idx_cmd->add_option("--size", export_opt.size, "image side in pixels: the 28x28 image centred and zero-padded")
      ->capture_default_str()
      ->check(CLI::Range(28, 1024));
  from_idx_cmd->add_option("--quality", export_opt.jpeg_quality, "JPEG quality")->capture_default_str()->check(CLI::Range(1, 100));
  from_idx_cmd->add_option("--train", export_opt.train, "the first N training images (0 = all)")->check(CLI::NonNegativeNumber);
  from_idx_cmd->add_option("--test", export_opt.test, "the first N test images (0 = all)")->check(CLI::NonNegativeNumber);
  client::TraceOptions trace_opt;
  auto* trace_cmd = app.add_subcommand(
      "trace", "write the last steps' phases of a job's workers as Chrome trace-event JSON (chrome://tracing, Perfetto)");
  trace_cmd->add_option("JOB", job_id, "job id")->required();
  trace_cmd->add_option("--task", trace_opt.task, "one worker, e.g. worker-1 (default: every worker)");
  trace_cmd->add_option("--steps", trace_opt.steps, "the last N steps of each worker")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  auto* models_cmd = app.add_subcommand("models", "list the trained models the leader keeps (one job's with JOB)");
  models_cmd->add_option("JOB", job_id, "job id");
  models_cmd->add_flag("--json", as_json, "JSON output");
  client::ModelGetOptions model_get_opt;
  auto* model_cmd = app.add_subcommand("model", "the trained model of a job");
  model_cmd->require_subcommand(1);
  auto* model_get_cmd = model_cmd->add_subcommand(
      "get", "download a job's trained model (model.pt for TorchScript models, state_dict.pt, metadata.json), each "
             "file checked against its SHA-256");
  model_get_cmd->add_option("JOB", job_id, "job id")->required();
  model_get_cmd->add_option("-o,--output", model_get_opt.dir, "directory to write into (default: ./JOB-model)");
  model_get_cmd->add_option("--checkpoint", model_get_opt.checkpoint,
                             "which of the job's models: last, best, or N (after epoch N; [checkpoint] in the job)")
      ->capture_default_str();
  model_get_cmd->add_flag("--json", as_json, "JSON output");
  // Run by dltrain-model (LibTorch), beside this program: main() hands them over before
  // parsing; declared here for --help.
  app.add_subcommand("predict", "the top classes of images under a downloaded model (dltrain-model predict --help)")
      ->allow_extras()
      ->prefix_command();
  app.add_subcommand("evaluate", "a downloaded model's accuracy on a data set (dltrain-model evaluate --help)")
      ->allow_extras()
      ->prefix_command();
  client::SlurmOptions slurm_opt;
  auto* slurm_cmd = app.add_subcommand(
      "slurm", "inside a Slurm allocation (sbatch, salloc): a dltrain cluster of one agent per node, the first node "
               "the leader (docs/slurm.md)");
  slurm_cmd->require_subcommand(1);
  const auto launcher_options = [&](CLI::App* c) {
    c->add_option("--port", slurm_opt.port,
                  "the leader's control port on the first node (default: 20000 + job id mod 40000, so that "
                  "allocations sharing a node do not collide)");
    c->add_option("--dir", slurm_opt.dir,
                  "where to write client.toml and client.token (default: $SLURM_SUBMIT_DIR/dltrain-<job id>)");
    c->add_option("--state-root", slurm_opt.state_root,
                  "node-local directory for the agents' state, removed when they end (default: $TMPDIR, else /tmp)");
    c->add_option("--leader-state-dir", slurm_opt.leader_state_dir,
                  "keep the leader's state (planner history, jobs) here, e.g. on a shared file system (default: "
                  "node-local, removed)");
    c->add_option("--form-timeout", slurm_opt.form_timeout, "seconds for every node's agent to register")
        ->capture_default_str()
        ->check(CLI::Range(1, 3600));
    c->add_option("--stop-timeout", slurm_opt.stop_timeout, "seconds for the agents to stop before SIGKILL")
        ->capture_default_str()
        ->check(CLI::Range(1, 3600));
    c->add_option("--drain-poll", slurm_opt.drain_poll,
                  "seconds between each node's look at its Slurm state (a drained node's agent stops); 0 = never")
        ->capture_default_str()
        ->check(CLI::Range(0, 3600));
    c->add_option("--agent-log-level", slurm_opt.agent_log_level, "the agents' log level")
        ->capture_default_str()
        ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error"}));
  };
  auto* slurm_run_cmd = slurm_cmd->add_subcommand(
      "run", "form the cluster, run JOB_FILE to its end and exit with its status (a batch job's step)");
  slurm_run_cmd->add_option("JOB_FILE", slurm_opt.job_file, "job file (TOML)")->required();
  launcher_options(slurm_run_cmd);
  auto* slurm_serve_cmd = slurm_cmd->add_subcommand(
      "serve", "form the cluster and serve it until the allocation ends, scancel, or SIGTERM/SIGINT");
  launcher_options(slurm_serve_cmd);
  auto* slurm_show_cmd = slurm_cmd->add_subcommand(
      "show", "what run and serve would start here (nodes, addresses, leader) without starting anything");
  launcher_options(slurm_show_cmd);
  slurm_show_cmd->add_flag("--json", as_json, "JSON output");
  auto* slurm_agent_cmd = slurm_cmd->add_subcommand(
      "agent", "(started by run and serve through srun) this node's agent, configured from what Slurm granted it");
  if (argc >= 2 && (std::string(argv[1]) == "predict" || std::string(argv[1]) == "evaluate")) {
    std::error_code ec;
    return client::exec_model_tool(std::filesystem::read_symlink("/proc/self/exe", ec).string(),
                                   std::vector<std::string>(argv + 1, argv + argc));
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int rc = app.exit(e);  // prints help/version or the usage error
    return rc == 0 ? client::kExitOk : client::kExitBadInput;
  }
  if (slurm_cmd->parsed()) {
    std::error_code ec;
    const std::string self = std::filesystem::read_symlink("/proc/self/exe", ec).string();
    if (slurm_run_cmd->parsed()) return client::slurm_run(slurm_opt, self);
    if (slurm_serve_cmd->parsed()) return client::slurm_serve(slurm_opt, self);
    if (slurm_show_cmd->parsed()) return client::slurm_show(slurm_opt, as_json);
    if (slurm_agent_cmd->parsed()) return client::slurm_agent(self);
  }
  if (from_idx_cmd->parsed()) {
    try {
      const auto n = dltrain::data::export_idx_as_image_folder(idx_dir, out_dir, export_opt);
      std::cout << "wrote " << n << " " << export_opt.format << " files under " << out_dir << std::endl;
      return client::kExitOk;
    } catch (const std::exception& e) {
      std::cerr << "dltrain: " << e.what() << "\n";
      return client::kExitBadInput;
    }
  }
  if (pack_cmd->parsed()) {
    try {
      pack_opt.shard_bytes = dltrain::data::parse_byte_size(pack_size);
      auto report = dltrain::data::pack_dataset(pack_src, pack_dest, pack_opt);
      if (as_json) {
        std::cout << report.dump() << std::endl;
      } else {
        report["dest"] = std::filesystem::absolute(pack_dest).lexically_normal().string();
        client::print_pack_report(std::cout, report);
      }
      return client::kExitOk;
    } catch (const std::exception& e) {
      std::cerr << "dltrain: " << e.what() << "\n";
      return client::kExitBadInput;
    }
  }
  if (inspect_cmd->parsed() && client::is_sharded_location(dataset_dir)) {
    try {
      const auto report = client::inspect_shards(dataset_dir, inspect_verify);
      if (as_json) {
        std::cout << report.dump() << std::endl;
      } else {
        client::print_shards_report(std::cout, report);
      }
      const bool bad = report.contains("verified") && !report["verified"]["bad_shards"].empty();
      return bad ? client::kExitBadInput : client::kExitOk;
    } catch (const std::exception& e) {
      std::cerr << "dltrain: " << e.what() << "\n";
      return client::kExitBadInput;
    }
  }
  if (inspect_cmd->parsed()) {
    try {
      const auto report = dltrain::data::inspect_dataset(dataset_dir, inspect_threads);
      if (as_json) {
        std::cout << report.dump() << std::endl;
      } else {
        client::print_dataset_report(std::cout, report);
      }
      return client::kExitOk;
    } catch (const std::exception& e) {
      std::cerr << "dltrain: " << e.what() << "\n";
      return client::kExitBadInput;
    }
  }

  const auto timeout = std::chrono::seconds(timeout_s);
  client::Target target;
  try {
    target = client::find_leader(leader, token, ca_file);
  } catch (const dltrain::ConfigError& e) {
    std::cerr << "dltrain: " << e.what() << "\n";
    return client::kExitBadInput;
  }
  client::CommandOptions opt{target.leader, job_id, follow_flag, model_filter, dataset_filter, timeout};
  opt.list_limit = list_limit;
  try {
    nlohmann::json request;  // submit and plan: read before connecting, so a bad path is named as such
    if (submit->parsed() || (plan_cmd->parsed() && !cluster_flag)) request = client::job_request(job_file, follow_flag);
    // One leader, or the HA candidates (comma-separated): the first that answers, retried
    // for up to --timeout while a failover runs, each try said on stderr.
    const auto urls = dltrain::control::split_leader_urls(target.leader, "leader");
    // The first of `urls` that answers within `total` (each candidate tried for 5 s at
    // most); it becomes the leader the commands name.
    const auto connect = [&](std::chrono::milliseconds total) {
      auto [c, i] = dltrain::control::connect_first(
          urls, target.token, total, urls.size() > 1 ? std::min<std::chrono::milliseconds>(timeout, std::chrono::seconds(5)) : total,
          dltrain::control::TlsClientOptions{target.ca_file, "", target.ca_source},
          [&](const std::string& m) { if (urls.size() > 1) std::cerr << "dltrain: " << m << "\n"; });
      opt.leader = target.leader = urls[i];
      return std::move(c);
    };
    auto conn = connect(timeout);
    if (urls.size() > 1) {
      // A follower that loses its leader goes on with the candidate that serves next
      // (commands.h, follow_job): looked for during a failover's time, at least a minute.
      opt.reconnect = [&]() {
        const auto total = std::max<std::chrono::milliseconds>(timeout, std::chrono::seconds(60));
        std::cerr << "dltrain: lost the leader at " << opt.leader << "; looking for the candidate that serves (up to "
                  << std::chrono::duration_cast<std::chrono::seconds>(total).count() << " s)" << std::endl;
        auto again = connect(total);
        std::cerr << "dltrain: following on with the leader at " << opt.leader << std::endl;
        return again;
      };
    }
    auto& c = *conn;
    if (submit->parsed()) return client::submit(c, request, opt, as_json);
    if (plan_cmd->parsed()) return cluster_flag ? client::cluster_plan(c, opt, as_json) : client::plan(c, request, opt, as_json);
    if (resume_cmd->parsed()) return client::resume(c, opt, as_json);
    if (history_cmd->parsed()) return client::history(c, opt, as_json);
    if (follow_cmd->parsed()) return client::follow(c, opt, as_json);
    if (status->parsed()) return client::status(c, opt, as_json);
    if (list->parsed()) return client::list(c, opt, as_json);
    if (cancel->parsed()) return client::cancel(c, opt, as_json);
    if (scale_cmd->parsed()) return client::scale(c, opt, scale_workers, as_json);
    if (agents->parsed()) return client::agents(c, opt, as_json);
    if (logs_cmd->parsed()) return client::logs(c, opt, logs_opt, as_json);
    if (trace_cmd->parsed()) return client::trace(c, opt, trace_opt);
    if (models_cmd->parsed()) return client::models(c, opt, as_json);
    if (model_get_cmd->parsed()) return client::model_get(c, opt, model_get_opt, as_json);
  } catch (const dltrain::control::AuthError& e) {
    std::cerr << "dltrain: " << e.what() << ": check --token, DLTRAIN_TOKEN or the client config (from "
              << target.source << ")\n";
    return client::kExitBadInput;
  } catch (const dltrain::control::RemoteError& e) {
    std::cerr << "dltrain: the leader rejected the request: " << e.what() << " [" << e.code() << "]\n";
    // "unavailable": nothing is wrong with the request; the leader cannot take it now.
    if (e.code() == dltrain::wire::error_code::kUnavailable) return client::kExitNoLeader;
    return e.code() == dltrain::wire::error_code::kForbidden ? client::kExitForbidden : client::kExitBadInput;
  } catch (const dltrain::TimeoutError& e) {
    std::cerr << "dltrain: cannot reach the leader at " << target.leader << " (from " << target.source
              << "): " << e.what() << "\n";
    return client::kExitNoLeader;
  } catch (const dltrain::IoError& e) {
    std::cerr << "dltrain: cannot reach the leader at " << target.leader << " (from " << target.source
              << "): " << e.what() << "\n";
    return client::kExitNoLeader;
  } catch (const std::exception& e) {
    // Also a bad job file (ConfigError from job_request) and a CA file that cannot be read.
    std::cerr << "dltrain: " << e.what() << "\n";
    return client::kExitBadInput;
  }
  return client::kExitOk;
}
