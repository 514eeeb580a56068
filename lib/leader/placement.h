// The leader's view of its agents (the registry) and where a job's tasks go (placement).
// The placement functions take plain numbers — free cores and free GPU indices per agent,
// the cores and GPUs each task needs — and return agent ids (and GPU indices), so that
// they are unit-tested with hand-built tables; the leader only calls them.
// Single-threaded: the leader's event loop owns all of it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "wire/control_bodies.h"

namespace dltrain::control {
class Session;
}

namespace dltrain::leader {

/// What one task holds on its agent while it runs: cores, and the indices of its GPUs.
struct TaskHold {
  int cores = 0;
  std::vector<int> gpus;
};

/// One agent as the leader knows it.
struct AgentRec {
  std::string id;
  std::string address;                 ///< its advertise_address (where its PS tasks listen)
  int cores = 0;                       ///< cores it offers, >= 1
  int free_cores = 0;                  ///< cores not held by a task, [.., cores]
  std::int64_t memory_mb = 0;
  std::string hardware_class;          ///< the planner's price class, e.g. "cpu"
  std::weak_ptr<control::Session> session;
  std::chrono::steady_clock::time_point last_seen;
  bool lost = false;                   ///< silent for heartbeat_timeout: its tasks were re-assigned
  bool stopping = false;               ///< its tasks ended because it shuts down: place nothing there
  /// Tasks still running there that the leader no longer counts on ("job/task/generation",
  /// see orphan_key) → the cores they hold until their exit is reported.
  std::map<std::string, TaskHold> orphans;
  std::string metrics_endpoint;        ///< HOST:PORT of its /metrics; "" = none
  std::vector<wire::GpuInfo> gpus;     ///< GPUs it offers
  std::vector<int> free_gpus;          ///< indices of those not held by a task, ascending
  /// Its link as it measured it after registering (link_probe), bytes/s each way; 0 =
  /// not measured (an older agent, or the probe failed).
  double link_bytes_per_sec = 0;
  /// Its shard cache's figures as its last heartbeat gave them (capacity_bytes, bytes,
  /// shards, hits, misses, fetches, bytes_fetched, evictions, failures); null = no cache.
  nlohmann::json shard_cache;
  /// The SHA-256s of the shards its cache holds (sent with a heartbeat when they change).
  std::set<std::string> cached_shards;
  /// It has a shard cache (registered with shard_cache_bytes > 0, or too old to say):
  /// workers of a sharded data set may go there.
  bool serves_shards = true;

  /// The model of its GPUs ("NVIDIA H200"; the first one's), "" without GPUs.
  std::string gpu_model() const;
  /// Takes `hold` from its free cores and GPUs (a task placed or running there); GPU
  /// indices not free are ignored.
  void take(const TaskHold& hold);
};

/// An agent's free cores and GPUs as placement sees them.
struct AgentSlots {
  std::string id;
  int free_cores = 0;
  std::vector<int> free_gpus;  ///< free GPU indices, ascending
  bool serves_shards = true;   ///< it has a shard cache (AgentRec::serves_shards)
};

/// What one task needs: cores (>= 1) and GPUs (>= 0, all on the same agent).
struct TaskNeed {
  int cores = 1;
  int gpus = 0;
  /// Placed with the job's other packed tasks where it can (GPU workers, and the workers
  /// of a local_group job): fewer machines, larger local groups. Implied by gpus > 0.
  bool pack = false;
  /// A worker of a sharded data set: agent id → bytes of the job's shards its cache holds.
  /// Among agents with room, an unpacked CPU task goes to the one holding the most, then
  /// the one with the most free cores; a packed one weighs it after the job's tasks
  /// already there. Empty for other tasks.
  std::map<std::string, std::int64_t> cached;
  /// A worker of a sharded data set: it reads through its agent's shard cache, so it goes
  /// only to agents with one (AgentSlots::serves_shards).
  bool reads_shards = false;
};

/// Where one task goes: its agent and the GPU indices it is given ({} for a CPU task).
struct Placed {
  std::string agent;
  std::vector<int> gpus;
};

/// Greedy placement of tasks with needs `tasks` (a job's PS shards and workers), in two
/// passes: first the packed tasks (those that need GPUs, or pack), each on the agent with
/// room (cores and GPUs) that already holds the most of this job's packed tasks, then —
/// for a GPU task — the most free GPUs (for a packed CPU task the fewest), then the most
/// free cores (so a job's GPU workers fill one machine before the next: a large local
/// group); each is given the agent's lowest free GPU indices. Then the other tasks, each on the agent with the most free cores (spreading
/// them over machines). Ties: the
/// first in `agents`. Returns one Placed per task, in `tasks` order, or nullopt when some
/// task finds no agent with room. O(tasks × agents).
std::optional<std::vector<Placed>> place(std::vector<AgentSlots> agents, const std::vector<TaskNeed>& tasks);

/// The PS shards a job with ps_shards = "auto" adds to `placement`, the place() of its
/// `needs` (its `shards` shards first, then its workers) on `free` (every agent's free
/// cores and GPUs before the job): one on each agent that holds some of the job's workers
/// but none of its shards and keeps `shard_cores` free cores once the job's tasks are
/// taken — besides `shard_cores` for each GPU still free there, so that no GPU is left
/// without a core — in the order of the workers' ranks, until the job has `max_shards`. A shard
/// beside every machine's workers is BytePS's answer to the PS's incast (Jiang et al.,
/// OSDI'20, §3.1, colocated servers): each link then carries its own workers' pushes to
/// the other shards and the other workers' pushes to its shard, not every worker's.
/// Returns the added shards' agents, in order (none when no agent has room); a task's
/// cores are accounted like any other's. O(tasks × agents).
std::vector<std::string> spread_shards(std::vector<AgentSlots> free, const std::vector<TaskNeed>& needs,
                                       const std::vector<Placed>& placement, int shards, int shard_cores,
                                       int max_shards);

/// What tasks need together: cores and GPUs.
struct NeedTotals {
  int cores = 0;
  int gpus = 0;
};
/// The sums of `tasks`' cores and GPUs (a user's quota counts them, scheduler.h).
NeedTotals totals(const std::vector<TaskNeed>& tasks);

/// Could tasks with needs `tasks` be placed (place()) on `agents` if every one were
/// idle? `agents` carries each agent's total cores and all its GPU indices.
bool fits(const std::vector<AgentSlots>& agents, const std::vector<TaskNeed>& tasks);

/// A job's needs: `ps_shards` CPU tasks of `threads_per_task` cores, then `workers` of
/// `threads_per_task` cores and `gpus_per_worker` GPUs each (the order of JobRec::tasks),
/// packed with `pack_workers` (a local_group job).
std::vector<TaskNeed> job_needs(int ps_shards, int workers, int threads_per_task, int gpus_per_worker,
                                bool pack_workers = false);

/// Greedy placement of `tasks` tasks of `threads_per_task` cores each (≥ 1): each in turn
/// on the agent with the most free cores (ties: the first in `agents`), spreading a job
/// over machines. Returns one agent id per task, or nullopt when some task finds no agent
/// with enough free cores. O(tasks × agents).
std::optional<std::vector<std::string>> place(std::vector<AgentSlots> agents, int tasks, int threads_per_task);

/// Could `tasks` tasks of `threads_per_task` cores fit on agents of these sizes (their
/// total cores, every agent idle)?
bool fits(const std::vector<int>& agent_cores, int tasks, int threads_per_task);

/// One task of a job being placed again (a re-assignment).
struct Replacing {
  std::string current;                 ///< the agent it ran on ("" = none)
  bool skip = false;                   ///< needs no place (a worker that finished)
  std::vector<std::string> excluded;   ///< agents it must not go to (one still runs an orphan of it)
  int gpus = 0;                        ///< GPUs it needs (a worker of a cuda job)
  bool reads_shards = false;           ///< a worker of a sharded data set (TaskNeed::reads_shards)
};

/// Where a re-assigned job's tasks go: every task stays on its current agent where that
/// agent is in `agents` and has room (cores, and its GPUs); the others go, in order, to
/// the agent with the most free GPUs (GPU tasks) or cores that does not exclude them.
/// `placement[i]` is "" for skipped and unplaced tasks, `gpus[i]` the GPU indices task i
/// is given; `unplaced` lists the indices of the unplaced tasks.
struct Replacement {
  std::vector<std::string> placement;
  std::vector<std::vector<int>> gpus;
  std::vector<std::size_t> unplaced;
};
Replacement place_again(std::vector<AgentSlots> agents, const std::vector<Replacing>& tasks, int threads_per_task);

/// The key of an orphaned task in AgentRec::orphans.
std::string orphan_key(const std::string& job, const std::string& task, std::uint32_t generation);

/// The agents registered with the leader, by id, and the queries placement needs.
class AgentRegistry {
 public:
  using Map = std::map<std::string, AgentRec>;

  /// Every registered agent (lost ones too), by id, as a std::map.
  Map::iterator begin() { return agents_.begin(); }
  Map::iterator end() { return agents_.end(); }
  Map::const_iterator begin() const { return agents_.begin(); }
  Map::const_iterator end() const { return agents_.end(); }
  /// The agent `id`, or end().
  Map::iterator find(const std::string& id) { return agents_.find(id); }
  Map::const_iterator find(const std::string& id) const { return agents_.find(id); }
  /// Throws std::out_of_range for an unknown id.
  AgentRec& at(const std::string& id) { return agents_.at(id); }
  const AgentRec& at(const std::string& id) const { return agents_.at(id); }
  /// The agent `id`, registered (empty) if it was not.
  AgentRec& operator[](const std::string& id) { return agents_[id]; }

  /// Registered, connected, neither lost nor shutting down: tasks may be placed there.
  bool live(const std::string& id) const;
  /// The live agents' free cores, in id order (the input of place / place_again).
  std::vector<AgentSlots> slots() const;
  /// The live agents' total cores.
  std::vector<int> sizes() const;
  /// The live agents as if idle: total cores and every GPU index (the input of fits()).
  std::vector<AgentSlots> capacities() const;
  /// Free cores over the live agents.
  int free_cores() const;
  /// Free GPUs over the live agents.
  int free_gpus() const;
  /// GPUs of the live agents.
  int total_gpus() const;
  /// Tasks of `threads_per_task` cores that fit on the live agents when idle.
  int task_slots(int threads_per_task) const;
  /// The hardware class of the first agent not lost ("cpu" when there is none): the
  /// planner's price and history class. With `gpu` (a cuda job's), the first such agent
  /// that offers GPUs, with its GPU model appended ("cpu/NVIDIA H200"): a job's history
  /// and price on one GPU model say nothing of another.
  std::string hardware_class(bool gpu = false) const;
  /// The slowest measured link of the live agents, bytes/s each way: what a job spread
  /// over them can count on (the planner's compression choice); 0 when none measured.
  double slowest_link() const;
  /// Takes `hold` from `id`'s free cores and GPUs (a task placed there); unknown ids are
  /// ignored.
  void take(const std::string& id, const TaskHold& hold);
  /// Gives `hold` back to `id` (a task there ended); unknown ids are ignored, and so are
  /// GPU indices the agent does not offer or has free already.
  void release(const std::string& id, const TaskHold& hold);
  /// release() of `n` cores and no GPU.
  void release_cores(const std::string& id, int n) { release(id, TaskHold{n, {}}); }
  /// Does `id` still run an orphan of `job`'s `task` (of any generation)? The task cannot
  /// start there again until it has ended.
  bool holds_orphan(const std::string& id, const std::string& job, const std::string& task) const;

 private:
  Map agents_;
};

}  // namespace dltrain::leader
