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
#include <optional>

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
#include "wire/task_args.h"
#include "wire/task_events.h"

namespace {

// The task's last words on stdout, for its agent and the leader.
void print_error(const std::exception& e) {
  dltrain::wire::events::write_line(std::cout, dltrain::wire::events::TaskError::of(e).to_json());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"dltrain PS shard task: holds partitions of a job's parameters, applies pushes, answers pulls"};
  dltrain::wire::PsTaskArgs args;
  args.add_to(app);
  CLI11_PARSE(app, argc, argv);
  namespace events = dltrain::wire::events;
  const int shard = args.shard;
  const std::string& checkpoint_path = args.checkpoint;
  try {
    dltrain::init_logging("ps-" + std::to_string(shard), args.log_level);
    dltrain::ps::PsServerOptions opt;
    opt.job = args.job_id;
    opt.generation = args.generation;
    opt.threads = args.threads;
    opt.bind_address = args.bind;
    opt.port = args.port;
    opt.sync.mode = args.sync;
    opt.sync.staleness = static_cast<std::uint32_t>(args.staleness);
    opt.sync.backup_workers = static_cast<std::uint32_t>(args.backup_workers);
    opt.sync.barrier_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(args.barrier_timeout_s * 1000));
    opt.sync.elastic = args.elastic_workers > 0;
    opt.sync.initial_workers = static_cast<std::uint32_t>(args.elastic_workers);
    opt.sync.member_grace = 2 * opt.sync.barrier_timeout;
    opt.secret = dltrain::read_job_secret_file(args.secret_file, "--secret-file");
    auto state = std::make_shared<dltrain::ps::ShardState>(args.momentum);
    // The checkpoint is loaded before the shard listens, so no worker's init can come
    // first and win over the restored parameters.
    std::optional<events::CheckpointLoad> restored;
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
          restored = events::CheckpointLoad{};
          restored->restored = true;
          restored->partitions = static_cast<std::int64_t>(parts);
          restored->workers_done = static_cast<std::int64_t>(done);
          restored->pushes = pushes;
        }
      } catch (const dltrain::Error& e) {
        // Kept for inspection, out of the way of the next checkpoint.
        const std::string aside = checkpoint_path + ".refused";
        std::rename(checkpoint_path.c_str(), aside.c_str());
        spdlog::error("refusing the checkpoint ({}); moved it to {}. Starting empty: the workers re-initialise "
                      "the parameters from their replicas",
                      e.what(), aside);
        restored = events::CheckpointLoad{};
        restored->error = e.what();
      }
      checkpointer = std::make_shared<dltrain::ps::ShardCheckpointer>(checkpoint_path, job, idx, state);
      // A worker exits once its `done` is acknowledged: make it durable first, so that a
      // restarted shard still counts it and worker 0's wait for the others can end.
      opt.on_done = [checkpointer] { checkpointer->save(); };
    }
    // Workers that finished before a re-assignment do not run again; a shard that did
    // not restore them from its checkpoint learns them here, so worker 0's wait for the
    // others can end.
    for (const auto r : args.workers_done) state->mark_done(r);
    // An elastic job's shard that restarts from its checkpoint does not know who is a
    // member now (the job may have been resized since it first started): every worker
    // becomes one again with its hello, as they all reconnect.
    if (opt.sync.elastic && restored && restored->restored) opt.sync.initial_workers = 0;
    dltrain::ps::PsServer server(opt, state);
    server.start();
    events::Listening listening;
    listening.port = server.port();
    listening.shard = shard;
    listening.checkpoint = restored;
    events::write_line(std::cout, listening.to_json());
    spdlog::info("PS shard {} of job {} listening on {}:{} (sync {})", shard, opt.job, opt.bind_address, server.port(),
                 dltrain::enum_name(args.sync));
    boost::asio::io_context io;
    boost::asio::signal_set signals(io, SIGTERM, SIGINT);
    boost::asio::steady_timer timer(io);
    const auto interval = std::chrono::milliseconds(static_cast<std::int64_t>(args.checkpoint_interval_s * 1000));
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
    // The shard's counters, for its agent's metrics endpoint.
    boost::asio::steady_timer stats_timer(io);
    const auto stats_interval = std::chrono::milliseconds(static_cast<std::int64_t>(args.stats_interval_s * 1000));
    auto write_stats = [&] {
      events::PsStats st;
      st.shard = shard;
      st.pushes = state->pushes();
      st.pulls = server.pulls();
      st.apply_seconds = server.apply_seconds();
      st.bytes_in = server.bytes_in();
      st.bytes_out = server.bytes_out();
      st.connections = server.connections();
      st.refused_handshakes = server.refused_handshakes();
      st.rejected_connections = server.rejected_connections();
      const auto sy = server.sync_stats();
      st.sync = args.sync;
      st.sync_steps = sy.steps;
      st.late_pushes = sy.late_pushes;
      st.sync_waits = sy.waits;
      st.sync_wait_seconds = sy.wait_seconds;
      st.workers_dropped = sy.dropped;
      st.max_lead = sy.max_lead;
      if (opt.sync.elastic) {
        const auto d = server.dispatch_stats();
        st.members_joined = sy.joins;
        st.members_left = sy.leaves;
        st.chunks_served = d.served;
        st.chunks_returned = d.returned;
        st.chunks_reissued = d.reissued;
      }
      if (checkpointer) {
        st.checkpoints = checkpointer->saves();
        if (checkpointer->saves() > 0) st.last_checkpoint_unix = checkpointer->last_save_unix();
      }
      events::write_line(std::cout, st.to_json());
    };
    std::function<void()> arm_stats = [&] {
      stats_timer.expires_after(stats_interval);
      stats_timer.async_wait([&](boost::system::error_code ec) {
        if (ec) return;
        write_stats();
        arm_stats();
      });
    };
    if (args.stats_interval_s > 0) arm_stats();
    signals.async_wait([&](auto, int sig) {
      spdlog::info("signal {}: stopping", sig);
      timer.cancel();
      stats_timer.cancel();
    });
    io.run();
    server.stop();
    const auto sy = server.sync_stats();
    if (opt.sync.mode != dltrain::ps::SyncMode::kAsync) {
      spdlog::info("sync {}: {} steps applied, {} late pushes dropped, {} pulls waited ({:.3f} s in all), {} workers "
                   "dropped by the barrier timeout, {} connections closed mid-step, {} rejoins, max lead {} steps",
                   dltrain::enum_name(args.sync), sy.steps, sy.late_pushes, sy.waits, sy.wait_seconds, sy.dropped, sy.departures,
                   sy.rejoins, sy.max_lead);
    }
    if (opt.sync.elastic) {
      const auto d = server.dispatch_stats();
      spdlog::info("elastic: {} workers joined, {} left, {} dropped by the barrier timeout; data dispatch: {} chunks "
                   "served, {} given back, {} served again",
                   sy.joins, sy.leaves, sy.dropped, d.served, d.returned, d.reissued);
    }
    events::PsStopped stopped;
    stopped.shard = shard;
    stopped.pushes = state->pushes();
    stopped.bytes_in = server.bytes_in();
    stopped.bytes_out = server.bytes_out();
    stopped.rejected_connections = server.rejected_connections();
    stopped.rebuilds = state->rebuilds();
    if (checkpointer) {
      try {
        checkpointer->save();
      } catch (const std::exception& e) {
        spdlog::error("the final checkpoint failed: {}", e.what());
        stopped.checkpoint_error = e.what();
      }
      stopped.checkpoints = checkpointer->saves();
    }
    write_stats();  // the final counts, the final checkpoint included
    events::write_line(std::cout, stopped.to_json());
    // A shard whose final checkpoint failed must not look cleanly stopped: the leader
    // would have its next incarnation load an older checkpoint instead of rebuilding it.
    return stopped.checkpoint_error ? 1 : 0;
  } catch (const dltrain::ConfigError& e) {
    spdlog::error("{}", e.what());
    print_error(e);
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    print_error(e);
    return 1;
  }
}
