// The control-plane load tool's settings, its shared state (what every simulated agent
// and client records into), and Link: one real control session (control::ControlClient,
// the WebSocket client agents and the CLI use) with the requests in flight on it.
//
// Everything runs on one io_context thread: no member is thread-safe, none needs to be.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <nlohmann/json.hpp>

#include "control/client.h"
#include "load/stats.h"
#include "wire/control.h"

namespace dltrain::load {

using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

/// What to simulate and for how long. Durations are seconds.
struct LoadOptions {
  std::string leader_url;     ///< ws://HOST:PORT of the leader
  std::string agent_token;    ///< bearer token of /v1/agent
  std::string client_token;   ///< bearer token of /v1/client
  int agents = 100;           ///< simulated agents, each its own session, >= 0
  int cores_per_agent = 4;    ///< cores each agent registers with, >= 1
  int clients = 100;          ///< simulated clients, each its own session, >= 0
  double duration = 60;       ///< the measured window, after every session is up
  double ramp_timeout = 120;  ///< at most this long for every session to connect (and agents to register)
  double drain_timeout = 120; ///< after the window, at most this long for submitted jobs to end
  double connect_rate = 500;  ///< sessions opened per second during the ramp
  /// A client's mean think time between a reply and its next request (uniform in
  /// [0.5, 1.5] × it); one request at a time, as `dltrain` sends them.
  double client_interval = 2;
  /// Relative weights of a client's periodic requests: status (of a known job), list,
  /// follow (a running job, until its summary).
  double weight_status = 5, weight_list = 1, weight_follow = 2;
  double submit_rate = 1;     ///< jobs submitted per second, in all, by random clients; 0 = none
  double submit_follow = 0.5; ///< share of submits with follow = true, [0, 1]
  int job_workers = 2;        ///< workers of each submitted job
  int job_ps = 1;             ///< PS shards of each submitted job
  int job_epochs = 2;         ///< epochs of each submitted job
  double epoch_seconds = 10;  ///< how long a simulated worker takes per epoch
  double progress_interval = 5;  ///< between two progress events of a simulated worker (the agents' default)
  double task_start = 0.5;    ///< from start_task to a PS shard's listening / a worker's started event
  std::string data_dir;       ///< data_dir of the submitted jobs (must exist on the leader with the four IDX files)
  double request_timeout = 10;   ///< a request without its reply by then is an error
  double monitor_interval = 5;   ///< between two `agents` requests of the monitor session
  int leader_pid = 0;            ///< the leader's pid, for its memory and CPU; 0 = not measured
  std::string name_prefix = "load-agent";  ///< agents register as PREFIX-0, PREFIX-1, ...
  std::uint64_t seed = 1;        ///< seeds every random choice of the clients
};

/// One submitted job as the tool last saw it (from submit, follow events, list).
struct JobEntry {
  std::string state = "queued";
  double wall_seconds = -1;  ///< the leader's, from submission to its end
  std::string error;         ///< why it failed, as the leader said
  /// succeeded, failed or cancelled.
  bool terminal() const { return state == "succeeded" || state == "failed" || state == "cancelled"; }
};

/// The state every simulated session shares, and what they record.
struct LoadRun {
  LoadRun(boost::asio::io_context& i, LoadOptions o) : io(i), opt(std::move(o)), rng(opt.seed) {}

  boost::asio::io_context& io;  ///< the tool's one event loop
  LoadOptions opt;               ///< the run's settings, tokens included
  Latencies latencies;           ///< round trips by kind
  Errors errors;                 ///< everything that went wrong, by category
  std::mt19937_64 rng;           ///< seeded with LoadOptions::seed
  /// Inside the measured window: request latencies are recorded (connect and register
  /// are recorded always, as they happen in the ramp).
  bool measuring = false;

  // Counters over the measured window.
  std::uint64_t messages_out = 0, messages_in = 0, bytes_in = 0, bytes_out = 0;
  std::uint64_t heartbeats_sent = 0, heartbeats_acked = 0;
  std::uint64_t events_received = 0;  ///< events the clients received (relayed by the leader)
  std::uint64_t list_bytes_max = 0;   ///< largest `list` reply, bytes (it holds every job)
  // Counters over the whole run.
  std::uint64_t tasks_started = 0, tasks_finished = 0;

  std::map<std::string, JobEntry> jobs;  ///< submitted jobs by id
  std::vector<std::string> job_ids;      ///< in submission order

  /// When a simulated task sent an event that the leader relays to followers, by
  /// relay_key(): a follower that receives it records the relay latency.
  std::unordered_map<std::string, Clock::time_point> relayed_at;

  /// Records `ms` under `kind` when measuring (or always, with `always`).
  void sample(const std::string& kind, double ms, bool always = false) {
    if (measuring || always) latencies.add(kind, ms);
  }
  /// Uniform in [0, 1).
  double uniform() { return std::uniform_real_distribution<double>(0, 1)(rng); }
  /// A submitted job that has not ended, at random among the last 64 submitted; "" if none.
  std::string running_job();
  /// A submitted job at random; "" if none.
  std::string any_job();
  /// Notes what the leader said of job `id` (a status or summary).
  void job_seen(const std::string& id, const json& status);
};

/// The key of a relayed task event: job/task/kind/step for progress (its global_step),
/// job/task/kind/epoch for epoch_end; "" for other kinds (not timed).
std::string relay_key(const std::string& job, const std::string& task, const json& ev);

/// One control session to the leader, over the project's ControlClient. Requests carry
/// ids "<prefix><n>"; the latency of each reply is recorded under the kind the request
/// was sent with, an error reply or a reply later than LoadOptions::request_timeout is
/// counted in LoadRun::errors. Create with make_shared.
class Link : public std::enable_shared_from_this<Link> {
 public:
  using ReplyFn = std::function<void(const wire::Envelope&)>;

  /// `who` names the session in error messages ("load-agent-3", "client-7").
  Link(LoadRun& run, control::PeerKind kind, std::string who);

  /// Connects and upgrades (10 s bound); records "connect" latency; calls `done(true)` on
  /// success, or counts the failure and calls `done(false)`.
  void connect(std::function<void(bool)> done);
  /// Sends request `type` with `body`; its reply's latency goes under `kind`; `on_reply`
  /// gets ok replies. `always`: record the latency outside the window too. `on_done` is
  /// called once the request is over, whatever its outcome: replied (ok or not) or timed
  /// out (see expire); never when the session is not open (nothing is sent then).
  void request(const std::string& type, const json& body, const std::string& kind, ReplyFn on_reply = {},
               bool always = false, std::function<void()> on_done = {});
  /// Answers a request of the leader (start_task, stop_task) with an empty ok reply.
  void reply(const std::string& id);
  /// Answers a request of the leader with an error reply (`code`: wire::error_code).
  void reply_error(const std::string& id, const std::string& code, const std::string& message);
  /// Closes the session; its end is then not an error.
  void close();
  /// Connected and not closing.
  bool is_open() const;
  /// Counts (and forgets) requests older than the request timeout, then calls their
  /// on_done.
  void expire(Clock::time_point now);
  /// Requests in flight.
  std::size_t pending() const { return pending_.size(); }

  /// Leader → this session: requests (agents) and events (clients).
  std::function<void(const wire::Envelope&)> on_incoming;
  /// The session ended without close() (already counted as an error).
  std::function<void()> on_lost;

 private:
  struct Pending {
    std::string kind;
    Clock::time_point sent;
    ReplyFn on_reply;
    bool always = false;
    std::function<void()> on_done;
  };
  void on_message(const std::string& text);
  void send(std::string text);

  LoadRun& run_;
  control::PeerKind kind_;
  std::string who_;
  std::shared_ptr<control::ControlClient> client_;
  std::unordered_map<std::string, Pending> pending_;
  std::uint64_t next_id_ = 1;
  bool closing_ = false;
};

}  // namespace dltrain::load
