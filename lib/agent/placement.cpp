#include "agent/placement.h"

#include <algorithm>

namespace dltrain::agent {
namespace {

// The agent with the most free cores that has `need` and is not excluded; "" if none.
std::string most_free(const std::vector<AgentSlots>& agents, int need, const std::vector<std::string>& excluded = {}) {
  const AgentSlots* best = nullptr;
  for (const auto& a : agents) {
    if (a.free_cores < need || std::find(excluded.begin(), excluded.end(), a.id) != excluded.end()) continue;
    if (best == nullptr || a.free_cores > best->free_cores) best = &a;
  }
  return best == nullptr ? std::string() : best->id;
}

void take(std::vector<AgentSlots>& agents, const std::string& id, int n) {
  for (auto& a : agents) {
    if (a.id == id) a.free_cores -= n;
  }
}

}  // namespace

std::optional<std::vector<std::string>> place(std::vector<AgentSlots> agents, int tasks, int threads_per_task) {
  std::vector<std::string> out;
  for (int t = 0; t < tasks; ++t) {
    const std::string best = most_free(agents, threads_per_task);
    if (best.empty()) return std::nullopt;
    take(agents, best, threads_per_task);
    out.push_back(best);
  }
  return out;
}

bool fits(const std::vector<int>& agent_cores, int tasks, int threads_per_task) {
  int slots = 0;
  for (const int c : agent_cores) slots += c / threads_per_task;
  return slots >= tasks;
}

Replacement place_again(std::vector<AgentSlots> agents, const std::vector<Replacing>& tasks, int threads_per_task) {
  Replacement r;
  r.placement.assign(tasks.size(), "");
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const auto& t = tasks[i];
    if (t.skip || t.current.empty()) continue;
    auto a = std::find_if(agents.begin(), agents.end(), [&](const AgentSlots& s) { return s.id == t.current; });
    const bool excluded = std::find(t.excluded.begin(), t.excluded.end(), t.current) != t.excluded.end();
    if (a != agents.end() && a->free_cores >= threads_per_task && !excluded) {
      r.placement[i] = t.current;
      a->free_cores -= threads_per_task;
    }
  }
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    if (tasks[i].skip || !r.placement[i].empty()) continue;
    const std::string best = most_free(agents, threads_per_task, tasks[i].excluded);
    if (best.empty()) {
      r.unplaced.push_back(i);
    } else {
      r.placement[i] = best;
      take(agents, best, threads_per_task);
    }
  }
  return r;
}

std::string orphan_key(const std::string& job, const std::string& task, std::uint32_t generation) {
  return job + "/" + task + "/" + std::to_string(generation);
}

bool AgentRegistry::live(const std::string& id) const {
  auto it = agents_.find(id);
  return it != agents_.end() && !it->second.lost && !it->second.stopping && !it->second.session.expired();
}

std::vector<AgentSlots> AgentRegistry::slots() const {
  std::vector<AgentSlots> out;
  for (const auto& [id, a] : agents_) {
    if (live(id)) out.push_back({id, a.free_cores});
  }
  return out;
}

std::vector<int> AgentRegistry::sizes() const {
  std::vector<int> out;
  for (const auto& [id, a] : agents_) {
    if (live(id)) out.push_back(a.cores);
  }
  return out;
}

int AgentRegistry::free_cores() const {
  int n = 0;
  for (const auto& s : slots()) n += s.free_cores;
  return n;
}

int AgentRegistry::task_slots(int threads_per_task) const {
  int n = 0;
  for (const int c : sizes()) n += c / threads_per_task;
  return n;
}

std::string AgentRegistry::hardware_class() const {
  for (const auto& [id, a] : agents_) {
    if (!a.lost) return a.hardware_class;
  }
  return "cpu";
}

void AgentRegistry::release_cores(const std::string& id, int n) {
  auto it = agents_.find(id);
  if (it != agents_.end()) it->second.free_cores += n;
}

bool AgentRegistry::holds_orphan(const std::string& id, const std::string& job, const std::string& task) const {
  auto it = agents_.find(id);
  if (it == agents_.end()) return false;
  const std::string prefix = job + "/" + task + "/";
  auto o = it->second.orphans.lower_bound(prefix);
  return o != it->second.orphans.end() && o->first.rfind(prefix, 0) == 0;
}

}  // namespace dltrain::agent
