#include "agent/task_metrics.h"

#include <chrono>

#include "common/overloaded.h"

namespace dltrain::agent {

namespace events = wire::events;
using control::MetricLabels;

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void TaskMetrics::on_event(const events::TaskEvent& ev) {
  std::visit(Overloaded{[&](const events::Progress& p) {
                          if (p.counters) counters = *p.counters;
                          bytes_pushed = p.bytes_pushed;
                          bytes_pulled = p.bytes_pulled;
                          skipped_steps = p.skipped_steps;
                          loss = p.loss;
                          lr = p.lr;
                          images_per_sec = p.images_per_sec;
                          density = p.density;
                          compression_ratio = p.compression_ratio ? std::optional<double>(*p.compression_ratio)
                                                                  : std::nullopt;
                          epoch = p.epoch;
                        },
                        [&](const events::EpochEnd& e) {
                          bytes_pushed = e.bytes_pushed;
                          bytes_pulled = e.bytes_pulled;
                          epoch = e.epoch;
                          if (e.test_accuracy) test_accuracy = e.test_accuracy;
                        },
                        [&](const events::Done& d) {
                          if (d.counters) counters = *d.counters;
                          bytes_pushed = d.bytes_pushed;
                          bytes_pulled = d.bytes_pulled;
                          skipped_steps = d.skipped_steps;
                          if (d.compression_ratio) compression_ratio = *d.compression_ratio;
                          images_per_sec = 0;  // it trains no more
                        },
                        [&](const events::SkippedStep& s) { skipped_steps = s.skipped_steps; },
                        [&](const events::PsStats& s) { ps = s; },
                        [&](const events::PsStopped& s) {
                          if (!ps) ps.emplace();
                          ps->pushes = s.pushes;
                          ps->bytes_in = s.bytes_in;
                          ps->bytes_out = s.bytes_out;
                          ps->rejected_connections = s.rejected_connections;
                          ps->connections = 0;
                          if (s.checkpoints) ps->checkpoints = *s.checkpoints;
                        },
                        [](const auto&) {}},
             ev);
}

void TaskMetrics::restarted(double now_unix) {
  TaskMetrics fresh;
  fresh.job = job;
  fresh.task = task;
  fresh.role = role;
  fresh.threads = threads;
  fresh.restarts = restarts;
  fresh.start_unix = now_unix;
  *this = std::move(fresh);
}

void TaskMetrics::add_to(control::MetricsBuilder& out, const std::string& agent, double now_unix) const {
  const MetricLabels l{{"agent", agent}, {"job", job}, {"task", task}, {"role", std::string(wire::to_string(role))}};
  auto with = [&](const char* k, const std::string& v) {
    auto x = l;
    x.emplace_back(k, v);
    return x;
  };
  out.gauge("dltrain_task_start_time_seconds",
            "Unix time the task's current process started (counters restart at 0 with it)", l, start_unix);
  out.gauge("dltrain_task_running", "1 while the task's process runs (or waits to be restarted), 0 after it ended", l,
            running ? 1 : 0);
  out.counter("dltrain_task_restarts_total", "Restarts of the task by its agent after it died", l, restarts);
  if (role == wire::TaskKind::kWorker) {
    out.counter("dltrain_worker_images_total", "Images trained on (skipped steps excluded)", l,
                static_cast<double>(counters.images));
    out.counter("dltrain_worker_steps_total", "Steps taken (gradients pushed)", l, static_cast<double>(counters.steps));
    out.counter("dltrain_worker_step_phase_seconds_total",
                "Wall time of the steps by phase: data (gather the batch), compute (forward and backward), "
                "compress (top-k selection), exchange (push and pull, waiting for the PS included)",
                with("phase", "data"), counters.data_seconds);
    out.counter("dltrain_worker_step_phase_seconds_total", "", with("phase", "compute"), counters.compute_seconds);
    out.counter("dltrain_worker_step_phase_seconds_total", "", with("phase", "compress"), counters.compress_seconds);
    out.counter("dltrain_worker_step_phase_seconds_total", "", with("phase", "exchange"), counters.exchange_seconds);
    out.counter("dltrain_worker_push_bytes_total", "Bytes sent to the PS shards (frame headers included)", l,
                static_cast<double>(bytes_pushed));
    out.counter("dltrain_worker_pull_bytes_total", "Bytes received from the PS shards (frame headers included)", l,
                static_cast<double>(bytes_pulled));
    out.counter("dltrain_worker_skipped_steps_total", "Steps skipped for a NaN/Inf loss or gradient", l,
                static_cast<double>(skipped_steps));
    out.counter("dltrain_worker_resyncs_total", "Dense resyncs after a lost PS connection", l,
                static_cast<double>(counters.resyncs));
    out.gauge("dltrain_worker_epoch", "Epoch in progress (1-based; the last one once finished)", l, epoch);
    if (images_per_sec) {
      out.gauge("dltrain_worker_images_per_second", "Training throughput since the previous progress report", l,
                *images_per_sec);
    }
    if (loss) out.gauge("dltrain_worker_loss", "Mean training loss since the previous progress report", l, *loss);
    if (lr) out.gauge("dltrain_worker_learning_rate", "Learning rate of the latest step", l, *lr);
    if (density) out.gauge("dltrain_worker_uplink_density", "Fraction of gradient entries pushed, (0, 1]", l, *density);
    if (compression_ratio) {
      out.gauge("dltrain_worker_compression_ratio", "Dense fp32 bytes / bytes sent, both directions, so far", l,
                *compression_ratio);
    }
    if (test_accuracy) {
      out.gauge("dltrain_worker_test_accuracy", "Test accuracy after the last finished epoch (rank 0), [0, 1]", l,
                *test_accuracy);
    }
  } else if (role == wire::TaskKind::kPs && ps) {
    out.counter("dltrain_ps_pushes_total", "Push frames applied", l, static_cast<double>(ps->pushes));
    out.counter("dltrain_ps_pulls_total", "Pull frames answered", l, static_cast<double>(ps->pulls));
    out.counter("dltrain_ps_apply_seconds_total", "Wall time applying pushes", l, ps->apply_seconds);
    out.counter("dltrain_ps_receive_bytes_total", "Bytes read from workers", l, static_cast<double>(ps->bytes_in));
    out.counter("dltrain_ps_transmit_bytes_total", "Bytes written to workers", l, static_cast<double>(ps->bytes_out));
    out.gauge("dltrain_ps_connections", "Worker connections open", l, static_cast<double>(ps->connections));
    out.counter("dltrain_ps_refused_handshakes_total", "Connections refused in the authentication handshake", l,
                static_cast<double>(ps->refused_handshakes));
    out.counter("dltrain_ps_rejected_connections_total",
                "Connections closed for a failed handshake or a malformed or refused frame", l,
                static_cast<double>(ps->rejected_connections));
    out.counter("dltrain_ps_checkpoints_total", "Checkpoints written", l, static_cast<double>(ps->checkpoints));
    if (ps->last_checkpoint_unix && running) {
      out.gauge("dltrain_ps_checkpoint_age_seconds", "Time since the latest checkpoint was written", l,
                now_unix - *ps->last_checkpoint_unix);
    }
    if (ps->sync != ps::SyncMode::kAsync) {  // the step barrier's record (ps/sync.h)
      out.counter("dltrain_ps_sync_steps_total", "Synchronous steps applied, all partitions", l,
                  static_cast<double>(ps->sync_steps));
      out.counter("dltrain_ps_late_pushes_total", "Pushes dropped because their step was applied (backup workers)", l,
                  static_cast<double>(ps->late_pushes));
      out.counter("dltrain_ps_barrier_waits_total", "Pulls that waited for the barrier", l,
                  static_cast<double>(ps->sync_waits));
      out.counter("dltrain_ps_barrier_wait_seconds_total", "Time pulls waited for the barrier, summed", l,
                  ps->sync_wait_seconds);
      out.counter("dltrain_ps_barrier_dropped_workers_total", "Workers dropped from the barrier by its timeout", l,
                  static_cast<double>(ps->workers_dropped));
      out.gauge("dltrain_ps_max_lead_steps", "Most steps a worker was ahead of the slowest when a pull was answered", l,
                static_cast<double>(ps->max_lead));
    }
  }
}

void add_agent_metrics(control::MetricsBuilder& out, const AgentFigures& a) {
  const MetricLabels l{{"agent", a.agent}};
  out.gauge("dltrain_agent_cores", "Cores the agent offers to tasks", l, a.cores);
  out.gauge("dltrain_agent_cores_free", "Cores not held by a running task", l, a.cores - a.cores_used);
  out.gauge("dltrain_agent_memory_bytes", "Memory the agent offers to tasks", l,
            static_cast<double>(a.memory_mb) * 1024.0 * 1024.0);
  out.gauge("dltrain_agent_gpus", "GPUs the agent offers to tasks (NVML, docs/operations.md \"GPUs\")", l,
            static_cast<double>(a.gpus.size()));
  out.gauge("dltrain_agent_gpus_free", "GPUs not held by a running task", l,
            static_cast<double>(a.gpus.size()) - a.gpus_used);
  for (const auto& g : a.gpus) {
    out.gauge("dltrain_agent_gpu_memory_bytes", "Total memory of one offered GPU",
              {{"agent", a.agent}, {"gpu", std::to_string(g.index)}, {"model", g.name}},
              static_cast<double>(g.memory_mb) * 1024.0 * 1024.0);
  }
  out.gauge("dltrain_agent_tasks_running", "Task processes running (or waiting to be restarted), by role",
            {{"agent", a.agent}, {"role", "worker"}}, a.workers_running);
  out.gauge("dltrain_agent_tasks_running", "", {{"agent", a.agent}, {"role", "ps"}}, a.ps_running);
  out.counter("dltrain_agent_task_restarts_total", "Restarts of dead tasks since the agent started", l,
              static_cast<double>(a.task_restarts));
  out.gauge("dltrain_agent_leader_connected", "1 while registered with the leader", l, a.leader_connected ? 1 : 0);
  out.gauge("dltrain_agent_leader_term",
            "The newest leader term this agent registered under (docs/ha.md); 0 with a single leader", l,
            static_cast<double>(a.leader_term));
  out.counter("dltrain_agent_stale_leader_refusals_total",
              "Registrations and orders refused because their leader term was older than one already followed", l,
              static_cast<double>(a.stale_refused));
}

}  // namespace dltrain::agent
