// The leader's view of its agents (the registry) and where a job's tasks go (placement).
// The placement functions take plain numbers — free cores per agent, tasks, threads per
// task — and return agent ids, so that they are unit-tested with hand-built tables; the
// leader only calls them. Single-threaded: the leader's event loop owns all of it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "wire/control_bodies.h"

namespace dltrain::control {
class Session;
}

namespace dltrain::agent {

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
  std::map<std::string, int> orphans;
  std::string metrics_endpoint;        ///< HOST:PORT of its /metrics; "" = none
  std::vector<wire::GpuInfo> gpus;     ///< GPUs it offers (none held by tasks yet)
};

/// An agent's free cores as placement sees them.
struct AgentSlots {
  std::string id;
  int free_cores = 0;
};

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
};

/// Where a re-assigned job's tasks go: every task stays on its current agent where that
/// agent is in `agents` and has room; the others go, in order, to the agent with the most
/// free cores that does not exclude them. `placement[i]` is "" for skipped and unplaced
/// tasks; `unplaced` lists the indices of the latter.
struct Replacement {
  std::vector<std::string> placement;
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
  /// Free cores over the live agents.
  int free_cores() const;
  /// Tasks of `threads_per_task` cores that fit on the live agents when idle.
  int task_slots(int threads_per_task) const;
  /// The hardware class of the first agent not lost ("cpu" when there is none): the
  /// planner's price and history class.
  std::string hardware_class() const;
  /// Gives `n` cores back to `id` (a task there ended); unknown ids are ignored.
  void release_cores(const std::string& id, int n);
  /// Does `id` still run an orphan of `job`'s `task` (of any generation)? The task cannot
  /// start there again until it has ended.
  bool holds_orphan(const std::string& id, const std::string& job, const std::string& task) const;

 private:
  Map agents_;
};

}  // namespace dltrain::agent
