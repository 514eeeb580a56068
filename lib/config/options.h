// Agent configuration (the daemon's TOML file), parsed once into AgentOptions.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "wire/control_bodies.h"

namespace dltrain::config {

/// One user of a shared cluster: a [users.NAME] table of the leader's configuration
/// (docs/operations.md, "Users"). The client token (client_token) is the user "admin",
/// an admin without quotas: a configuration without [users] is one admin user.
struct UserOptions {
  std::string name;          ///< the table's key: [A-Za-z0-9_.-], 1–64 characters; not "admin"
  std::string token;         ///< its bearer token (token_file or token); unique, not the agent or client token
  /// Not a configuration key: which key gave the token ("token" or "token_file"), for messages.
  std::string token_key = "token_file";
  bool admin = false;        ///< role = "admin": may cancel, read and resume every user's jobs
  /// Quotas over the user's running jobs together (0 = no bound): cores and GPUs their
  /// tasks hold, and jobs running at once. A job that can never fit them is refused at
  /// submit; one that fits once the user's other jobs end waits in the queue.
  int max_cores = 0, max_gpus = 0, max_running_jobs = 0;
  /// Its jobs' place in the queue, [-1000, 1000]: ahead of every queued job of lower
  /// priority, behind those of the same or higher (default 0, the admin's). Running jobs
  /// are never stopped for a queued one.
  int priority = 0;
};

/// A leader candidate's [ha] table: leadership through an etcd election, the leader's
/// state in etcd (docs/ha.md). Absent (empty `etcd`): the single leader with RocksDB.
struct HaOptions {
  /// Client URLs of the etcd members, "http://HOST:PORT" or "https://HOST:PORT".
  std::vector<std::string> etcd;
  std::string user;      ///< etcd user (RBAC); empty: none
  std::string password;  ///< its password (or password_file)
  /// https:// members: CA certificates to verify them with (empty: the system's), and a
  /// client certificate and key when etcd asks for one (PEM).
  std::string ca_file, cert_file, key_file;
  /// TTL of the leader's etcd lease, [2 s, 300 s] whole seconds: a standby serves at most
  /// this long (plus one election) after the serving leader's machine died.
  int lease_ttl_seconds = 10;
  /// Prefix of every key dltrain writes ("/dltrain": /dltrain/leader, /dltrain/state/...):
  /// one per dltrain cluster sharing an etcd.
  std::string prefix = "/dltrain";
  /// The longest one etcd request may take on one member.
  std::chrono::milliseconds request_timeout{2000};
  /// How long a job's end waits for the candidates standing by to hold copies of its
  /// trained models, checkpoints and uploaded model files (docs/ha.md "Artifacts");
  /// 0 = it does not wait (they still copy them). [0, 1 h].
  std::chrono::milliseconds replication_timeout{60000};
  bool enabled() const { return !etcd.empty(); }
};

/// Options of one dltrain-agent. See configs/agent.toml and configs/leader.toml.
struct AgentOptions {
  std::string name;                        ///< defaults to the host name
  bool leader = false;                     ///< this agent is the leader
  std::string leader_url = "ws://127.0.0.1:7070";  ///< agents: where the leader listens (leader_urls[0])
  /// Agents: every address a leader may serve at (the key leader_url, a string or a list
  /// of the HA candidates' URLs); the agent follows whichever serves. Never empty.
  std::vector<std::string> leader_urls{"ws://127.0.0.1:7070"};
  /// Leader candidates: [ha] (docs/ha.md); disabled by default.
  HaOptions ha;
  /// Leader: the cluster's users besides "admin" (the client token), from [users.NAME].
  std::vector<UserOptions> users;
  std::string listen_address = "127.0.0.1";  ///< leader: control endpoint address
  std::uint16_t listen_port = 7070;        ///< leader: control endpoint port (0 = ephemeral)
  std::string advertise_address = "127.0.0.1";  ///< address workers use to reach this agent's PS tasks
  std::string task_bind_address = "0.0.0.0";    ///< address PS tasks listen on
  /// Prometheus metrics endpoint (`GET /metrics`, docs/operations.md "Metrics"): the IP
  /// literal it listens on; empty = no endpoint. An address that is not loopback needs
  /// metrics_token.
  std::string metrics_address;
  std::uint16_t metrics_port = 9464;       ///< its port; 0 = ephemeral (see `dltrain agents`)
  /// Bearer token scrapers present (`Authorization: Bearer ...`); empty = none asked for,
  /// allowed only on a loopback metrics_address. Unrelated to the agent and client tokens,
  /// so a scraper's credentials can neither run jobs nor join the cluster.
  std::string metrics_token;
  /// Not a configuration key: "HOST:PORT" of the running metrics endpoint, which the
  /// agent reports when it registers ("" = none).
  std::string metrics_endpoint;
  bool host_tasks = true;                  ///< leader: also run tasks like any agent
  /// Leader: the shared plan (leader/shared_plan.h, docs/operations.md "The shared plan")
  /// resizes elastic jobs whenever a job arrives or ends or an agent comes or goes: a job
  /// that arrives on a full cluster starts at its min_workers with workers the running
  /// ones give up, spare cores go to the job with the shortest time left, users keep fair
  /// shares. false = every job keeps the size it was started with (FIFO queue). Key
  /// `shared_plan` (boolean).
  bool shared_plan = false;
  int cores = 0;                           ///< cores offered to tasks; 0 = all online cores
  std::int64_t memory_mb = 0;              ///< memory offered; 0 = physical memory
  std::string hardware_class = "cpu";      ///< label used by the planner's price table
  /// GPUs offered to tasks, by NVML index: nullopt = "auto" (every GPU NVML finds), an
  /// empty list = "none", else exactly these (each must exist, or the agent does not start).
  std::optional<std::vector<int>> gpus;
  /// Where NVML is loaded from (dlopen): a file name looked up on the loader's path, or a
  /// path for a driver installed outside it.
  std::string nvml_library = "libnvidia-ml.so.1";
  /// Not a configuration key: the GPUs found and selected at start (agent/gpus.h), which
  /// the agent reports when it registers and in its metrics.
  std::vector<wire::GpuInfo> gpu_devices;
  std::string state_dir = "/var/lib/dltrain";  ///< task directories, logs, (leader) store
  std::string agent_token;                 ///< bearer token agents present to the leader
  std::string client_token;                ///< leader: bearer token clients present
  std::string task_bin_dir;                ///< where dltrain-ps/dltrain-worker live; empty = next to the agent
  /// Leader: serve the control port over TLS (wss://) with this certificate chain and
  /// private key (PEM; the key file 0600 or stricter). Both or neither.
  std::string tls_cert_file;
  std::string tls_key_file;
  /// Agents with a wss:// leader_url: CA certificates (PEM) to verify the leader with;
  /// empty = the system's trust store.
  std::string tls_ca_file;
  /// Not a configuration key: set for the agent inside the leader's process, which trusts
  /// exactly its leader's certificate (it reaches it on 127.0.0.1).
  std::string tls_pinned_cert_file;
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds heartbeat_timeout{10000};
  std::chrono::milliseconds task_stop_grace{10000};  ///< SIGTERM → SIGKILL delay
  /// A task's log (its stderr, task.log in its directory) is rotated to task.log.1 when
  /// it grows past this many bytes, checked every 5 s: at most about twice this on disk.
  std::uintmax_t task_log_max_bytes = 8u << 20;
  int task_max_restarts = 3;       ///< restarts of a worker or PS shard that died, per task (0 = none);
                                   ///< leader: also re-assignments of a job, per job
  /// Leader: how long a job whose agent was lost waits for free cores on other agents to
  /// re-assign its tasks to, before it ends failed.
  std::chrono::milliseconds reassign_timeout{300000};
  /// Time between two checkpoints of a PS shard's state (its task directory, file
  /// `shard.ckpt`); a shard also checkpoints when a worker finishes and when it stops.
  std::chrono::milliseconds ps_checkpoint_interval{10000};
  /// Time between two progress events of a worker task (its loss, images/s, bytes), what
  /// `dltrain submit --follow` prints while a job trains.
  std::chrono::milliseconds progress_interval{5000};
  /// Leader: how long a job may wait in the queue before it fails with the reason, for
  /// jobs without their own queue_timeout; 0 = for ever.
  std::chrono::milliseconds queue_timeout{0};
  /// Leader: finished jobs (succeeded, failed, cancelled) kept, in memory and in the store,
  /// [1, 10000]; the oldest beyond it are removed with their event logs (their history
  /// rows stay, for the planner). Queued and running jobs are never removed.
  int job_retention = 1000;
  /// Leader: the trained models (leader/model_store.h) of at most this many jobs are
  /// kept under <state_dir>/models, [1, 10000]; the oldest jobs' models beyond it are
  /// removed.
  int model_retention = 50;
  std::string log_level = "info";
  /// Leader: price of one task-hour per hardware class ([prices] table), for the planner.
  std::map<std::string, double> prices{{"cpu", 1.0}};
  int explore_steps = 40;          ///< leader: steps per worker of an exploration run
  /// Agent: the largest payload of the link probe it sends the leader after registering
  /// (link_probe, docs/planner.md), bytes, [0, 3 MiB]; 0 = no probe. The probe grows its
  /// payload from 64 KiB by ×4 until one takes 0.2 s or this size is reached.
  std::int64_t link_probe_bytes = 3 << 20;
  /// Agent: the shard cache's bound (docs/data.md, "The cache"), bytes, >= 0; the least
  /// recently used shard not held by a worker goes first. 0 = no cache: jobs whose data is
  /// a sharded data set cannot run here.
  std::int64_t cache_bytes = std::int64_t{20} << 30;
  /// Agent: the shard cache's directory; empty = <state_dir>/shard-cache.
  std::string cache_dir;
  /// Agent: where s3:// data URLs go (data::S3Settings): the store's base URL (empty =
  /// AWS_ENDPOINT_URL, else AWS's), the signing region (empty = AWS_REGION, else
  /// us-east-1), and an AWS shared-credentials file (empty = AWS_ACCESS_KEY_ID and
  /// AWS_SECRET_ACCESS_KEY from the agent's environment).
  std::string s3_endpoint, s3_region, s3_credentials_file;
  /// Leader: relative cost within which candidates of different compression methods
  /// count as tied (planner::PlanRequest::method_tie), [0, 1].
  double method_tie = 0.05;
  double switch_threshold = 0.10;  ///< leader: relative predicted gain needed to change a plan
  double margin_sigmas = 0.0;      ///< leader: planner safety margin (docs/planner.md)
  /// Leader: a running worker whose step count times this factor is below its job's
  /// most advanced worker's is flagged as a straggler (`dltrain status`, metrics); 0 = off.
  double straggler_factor = 2.0;
};

/// Parses an agent TOML file. `agent_token_file` / `client_token_file` keys read the
/// token from a file (first line). Throws ConfigError naming the key for a syntax error,
/// an unknown key, a wrong type or an out-of-range value.
AgentOptions load_agent_options(const std::string& path);

/// Same, from text (for tests); `base_dir` resolves relative token files.
AgentOptions parse_agent_options(const std::string& text, const std::string& base_dir);

}  // namespace dltrain::config
