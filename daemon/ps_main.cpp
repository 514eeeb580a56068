// dltrain-ps: one PS shard task of one job. Listens on an ephemeral port (or --port, the
// one it had before a restart), announces it on stdout as {"event":"listening","port":P},
// serves workers that prove they know the job secret (read from --secret-file, which must
// be mode 0600 or stricter) until SIGTERM/SIGINT, then prints {"event":"stopped",...} and
// exits 0. With --checkpoint FILE it loads FILE at start when it exists (a restart) and
// writes its state there every --checkpoint-interval seconds, whenever a worker finishes,
// and when it stops. Exit code 2: a configuration error (e.g. a secret file readable by
// others); 1: any other failure.
#include <chrono>
#include <csignal>
#include <functional>
#include <cstdio>
#include <iostream>
#include <memory>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/errors.h"
#include "common/log.h"
#include "common/secret.h"
#include "ps/checkpoint.h"
#include "ps/server.h"

int main(int argc, char** argv) {
  CLI::App app{"dltrain PS shard task: holds partitions of a job's parameters, applies pushes, answers pulls"};
  dltrain::ps::PsServerOptions opt;
  double momentum = 0.9;
  int shard = 0;
  std::string log_level = "info", secret_file, checkpoint_path;
  double checkpoint_interval = 10.0;
  app.add_option("--job-id", opt.job, "numeric job id")->required();
  app.add_option("--generation", opt.generation, "job generation");
  app.add_option("--secret-file", secret_file, "file holding the job secret (hex; mode 0600 or stricter)")
      ->required();
  app.add_option("--shard", shard, "shard index, 0-based");
  app.add_option("--momentum", momentum, "heavy-ball momentum in [0, 1)")->check(CLI::Range(0.0, 0.999999));
  app.add_option("--threads", opt.threads, "I/O threads")->check(CLI::Range(1, 1024));
  app.add_option("--bind", opt.bind_address, "address to listen on");
  app.add_option("--port", opt.port, "port to listen on (0 = ephemeral)");
  app.add_option("--checkpoint", checkpoint_path,
                 "checkpoint file: loaded at start when present, written periodically and at stop (\"\" = none)");
  app.add_option("--checkpoint-interval", checkpoint_interval, "seconds between checkpoints")
      ->check(CLI::Range(0.1, 86400.0));
  std::vector<std::uint32_t> workers_done;
  app.add_option("--workers-done", workers_done,
                 "ranks of workers that already finished (a shard rebuilt for a re-assigned job)")
      ->delimiter(',');
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  CLI11_PARSE(app, argc, argv);
  try {
    dltrain::init_logging("ps-" + std::to_string(shard), log_level);
    opt.secret = dltrain::read_job_secret_file(secret_file, "--secret-file");
    auto state = std::make_shared<dltrain::ps::ShardState>(momentum);
    // The checkpoint is loaded before the shard listens, so no worker's init can come
    // first and win over the restored parameters.
    nlohmann::json restored = nullptr;
    std::shared_ptr<dltrain::ps::ShardCheckpointer> checkpointer;
    if (!checkpoint_path.empty()) {
      const auto job = opt.job;
      const auto idx = static_cast<std::uint32_t>(shard);
      try {
        if (auto snap = dltrain::ps::read_checkpoint_file(checkpoint_path, job, idx)) {
          const auto parts = snap->partitions.size();
          const auto done = snap->done.size();
          const auto pushes = snap->pushes;
          state->restore(std::move(*snap));
          spdlog::info("restored {} partitions, {} finished workers and {} pushes from the checkpoint {}", parts,
                       done, pushes, checkpoint_path);
          restored = {{"restored", true}, {"partitions", parts}, {"workers_done", done}, {"pushes", pushes}};
        }
      } catch (const dltrain::Error& e) {
        // Kept for inspection, out of the way of the next checkpoint.
        const std::string aside = checkpoint_path + ".refused";
        std::rename(checkpoint_path.c_str(), aside.c_str());
        spdlog::error("refusing the checkpoint ({}); moved it to {}. Starting empty: the workers re-initialise "
                      "the parameters from their replicas",
                      e.what(), aside);
        restored = {{"restored", false}, {"error", e.what()}};
      }
      checkpointer = std::make_shared<dltrain::ps::ShardCheckpointer>(checkpoint_path, job, idx, state);
      // A worker exits once its `done` is acknowledged: make it durable first, so that a
      // restarted shard still counts it and worker 0's wait for the others can end.
      opt.on_done = [checkpointer] { checkpointer->save(); };
    }
    // Workers that finished before a re-assignment do not run again; a shard that did
    // not restore them from its checkpoint learns them here, so worker 0's wait for the
    // others can end.
    for (const auto r : workers_done) state->mark_done(r);
    dltrain::ps::PsServer server(opt, state);
    server.start();
    nlohmann::json listening{{"event", "listening"}, {"port", server.port()}, {"shard", shard}};
    if (!restored.is_null()) listening["checkpoint"] = restored;
    std::cout << listening.dump() << '\n' << std::flush;
    spdlog::info("PS shard {} of job {} listening on {}:{}", shard, opt.job, opt.bind_address, server.port());
    boost::asio::io_context io;
    boost::asio::signal_set signals(io, SIGTERM, SIGINT);
    boost::asio::steady_timer timer(io);
    const auto interval = std::chrono::milliseconds(static_cast<std::int64_t>(checkpoint_interval * 1000));
    std::function<void()> arm = [&] {
      timer.expires_after(interval);
      timer.async_wait([&](boost::system::error_code ec) {
        if (ec) return;
        try {
          if (checkpointer->save() && checkpointer->saves() == 1) {
            spdlog::info("first checkpoint written to {} ({} bytes)", checkpoint_path, checkpointer->last_bytes());
          }
        } catch (const std::exception& e) {
          spdlog::warn("checkpoint failed, the previous one stays: {}", e.what());
        }
        arm();
      });
    };
    if (checkpointer) arm();
    signals.async_wait([&](auto, int sig) {
      spdlog::info("signal {}: stopping", sig);
      timer.cancel();
    });
    io.run();
    server.stop();
    nlohmann::json stopped{{"event", "stopped"},
                           {"shard", shard},
                           {"pushes", state->pushes()},
                           {"bytes_in", server.bytes_in()},
                           {"bytes_out", server.bytes_out()},
                           {"rejected_connections", server.rejected_connections()}};
    if (checkpointer) {
      try {
        checkpointer->save();
      } catch (const std::exception& e) {
        spdlog::error("the final checkpoint failed: {}", e.what());
        stopped["checkpoint_error"] = e.what();
      }
      stopped["checkpoints"] = checkpointer->saves();
    }
    std::cout << stopped.dump() << '\n' << std::flush;
    // A shard whose final checkpoint failed must not look cleanly stopped: the leader
    // would have its next incarnation load an older checkpoint instead of rebuilding it.
    return stopped.contains("checkpoint_error") ? 1 : 0;
  } catch (const dltrain::ConfigError& e) {
    spdlog::error("{}", e.what());
    std::cout << nlohmann::json{{"event", "error"}, {"message", e.what()}}.dump() << '\n' << std::flush;
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    std::cout << nlohmann::json{{"event", "error"}, {"message", e.what()}}.dump() << '\n' << std::flush;
    return 1;
  }
}
