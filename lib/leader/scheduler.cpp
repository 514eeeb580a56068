#include "leader/scheduler.h"

#include <algorithm>
#include <iterator>

namespace dltrain::leader {

void Scheduler::enqueue(const std::string& job, int priority) {
  if (std::find(queue_.begin(), queue_.end(), job) != queue_.end()) return;
  const auto behind = std::find_if(queue_.begin(), queue_.end(), [&](const std::string& q) { return priority_.at(q) < priority; });
  queue_.insert(behind, job);
  priority_[job] = priority;
}

bool Scheduler::remove(const std::string& job) {
  const auto it = std::find(queue_.begin(), queue_.end(), job);
  if (it == queue_.end()) return false;
  queue_.erase(it);
  priority_.erase(job);
  return true;
}

std::size_t Scheduler::position(const std::string& job) const {
  const auto it = std::find(queue_.begin(), queue_.end(), job);
  return it == queue_.end() ? 0 : static_cast<std::size_t>(it - queue_.begin()) + 1;
}

std::vector<Admitted> Scheduler::admit(const std::vector<AgentSlots>& idle, std::vector<AgentSlots> free,
                                       const std::function<std::vector<TaskNeed>(const std::string&)>& needs_of,
                                       const std::function<std::optional<ShardSpread>(const std::string&)>& spread_of,
                                       AdmitQuotas quotas) {
  std::vector<Admitted> out;
  std::set<std::string> held;  // users one of whose jobs waits for their quota in this pass
  for (auto it = queue_.begin(); it != queue_.end();) {
    const auto need = needs_of(*it);
    if (!fits(idle, need)) {
      ++it;  // not even on an idle cluster: it waits for agents, blocking nobody
      continue;
    }
    Quota* quota = nullptr;
    std::string owner;
    if (quotas.owner_of) {
      owner = quotas.owner_of(*it);
      const auto q = quotas.by_user.find(owner);
      if (q != quotas.by_user.end()) quota = &q->second;
    }
    const auto total = totals(need);
    if (quota && (held.count(owner) || !quota->allows(total))) {
      // Its owner's running jobs hold the quota: it waits for them, blocking nobody else;
      // the owner's later jobs wait behind it (first come, first served within a quota).
      held.insert(owner);
      ++it;
      continue;
    }
    auto placement = place(free, need);
    if (!placement) break;  // fits the cluster, not what is free: the queue waits behind it
    // A job spreads its shards only when no job waits behind it (spare cores go to the
    // queue first), and not when its owner has a core quota (a spread shard is a core more).
    const bool may_spread = spread_of && std::next(it) == queue_.end() && !(quota && quota->max_cores > 0);
    const auto spread = may_spread ? spread_of(*it) : std::nullopt;
    std::vector<std::string> added;
    if (spread) added = spread_shards(free, need, *placement, spread->shards, spread->shard_cores, spread->max_shards);
    const auto slot = [&](const std::string& id) -> AgentSlots& {
      return *std::find_if(free.begin(), free.end(), [&](const AgentSlots& s) { return s.id == id; });
    };
    for (std::size_t i = 0; i < need.size(); ++i) {
      auto& a = slot((*placement)[i].agent);
      a.free_cores -= need[i].cores;
      for (const int g : (*placement)[i].gpus) std::erase(a.free_gpus, g);
    }
    // (added is empty without a spread; the value read once keeps GCC's -O1 from doubting it)
    const int spread_cores = spread ? spread->shard_cores : 0;
    for (const auto& id : added) slot(id).free_cores -= spread_cores;
    if (quota) {
      quota->cores += total.cores + spread_cores * static_cast<int>(added.size());
      quota->gpus += total.gpus;
      ++quota->jobs;
    }
    out.push_back(Admitted{*it, std::move(*placement), std::move(added)});
    priority_.erase(*it);
    it = queue_.erase(it);
  }
  return out;
}

}  // namespace dltrain::leader
