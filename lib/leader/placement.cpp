#include "leader/placement.h"

#include <algorithm>
#include <map>
#include <tuple>

namespace dltrain::leader {
namespace {

bool is_excluded(const std::vector<std::string>& excluded, const std::string& id) {
  return std::find(excluded.begin(), excluded.end(), id) != excluded.end();
}

// `a` has room for `need` (its cores, its GPUs, and a shard cache for a worker of a
// sharded data set) and is not `excluded`.
bool has_room(const AgentSlots& a, const TaskNeed& need, const std::vector<std::string>& excluded) {
  return a.free_cores >= need.cores && static_cast<int>(a.free_gpus.size()) >= need.gpus &&
         (!need.reads_shards || a.serves_shards) && !is_excluded(excluded, a.id);
}

// The agent with room for `need`, or nullptr: for an unpacked CPU task the one holding
// the most bytes of its shards (need.cached), then the most free cores; for a GPU or
// packed task the one holding the most of `held` (this job's packed tasks so far), then
// the most of its shards, then the most free GPUs (the fewest for a packed CPU task),
// then the most free cores.
AgentSlots* best_for(std::vector<AgentSlots>& agents, const TaskNeed& need, const std::vector<std::string>& excluded,
                     const std::map<std::string, int>& held = {}) {
  AgentSlots* best = nullptr;
  const auto held_by = [&](const AgentSlots& a) {
    auto it = held.find(a.id);
    return it == held.end() ? 0 : it->second;
  };
  const auto cached_by = [&](const AgentSlots& a) {
    const auto c = need.cached.find(a.id);
    return c == need.cached.end() ? std::int64_t{0} : c->second;
  };
  for (auto& a : agents) {
    if (!has_room(a, need, excluded)) continue;
    if (best == nullptr) {
      best = &a;
    } else if (need.gpus > 0) {
      const auto key = [&](const AgentSlots& x) {
        return std::tuple(held_by(x), cached_by(x), x.free_gpus.size(), x.free_cores);
      };
      if (key(a) > key(*best)) best = &a;
    } else if (need.pack) {
      // Packed CPU tasks (a local_group CPU job) keep off GPU machines where they can:
      // their cores are what the GPU workers there need.
      const auto key = [&](const AgentSlots& x) {
        return std::tuple(held_by(x), cached_by(x), -static_cast<std::ptrdiff_t>(x.free_gpus.size()), x.free_cores);
      };
      if (key(a) > key(*best)) best = &a;
    } else {
      const auto key = [&](const AgentSlots& x) { return std::tuple(cached_by(x), x.free_cores); };
      if (key(a) > key(*best)) best = &a;
    }
  }
  return best;
}

// Takes `need` from `a`: its cores and its lowest free GPU indices, which it returns.
std::vector<int> take_from(AgentSlots& a, const TaskNeed& need) {
  a.free_cores -= need.cores;
  std::vector<int> gpus(a.free_gpus.begin(), a.free_gpus.begin() + need.gpus);
  a.free_gpus.erase(a.free_gpus.begin(), a.free_gpus.begin() + need.gpus);
  return gpus;
}

}  // namespace

std::string AgentRec::gpu_model() const { return gpus.empty() ? std::string() : gpus.front().name; }

void AgentRec::take(const TaskHold& hold) {
  free_cores -= hold.cores;
  for (const int g : hold.gpus) {
    const auto pos = std::find(free_gpus.begin(), free_gpus.end(), g);
    if (pos != free_gpus.end()) free_gpus.erase(pos);
  }
}

std::optional<std::vector<Placed>> place(std::vector<AgentSlots> agents, const std::vector<TaskNeed>& tasks) {
  for (auto& a : agents) std::sort(a.free_gpus.begin(), a.free_gpus.end());
  std::vector<Placed> out(tasks.size());
  std::map<std::string, int> held;
  for (const bool gpu_pass : {true, false}) {
    for (std::size_t i = 0; i < tasks.size(); ++i) {
      if ((tasks[i].gpus > 0 || tasks[i].pack) != gpu_pass) continue;
      AgentSlots* a = best_for(agents, tasks[i], {}, held);
      if (a == nullptr) return std::nullopt;
      out[i].agent = a->id;
      out[i].gpus = take_from(*a, tasks[i]);
      if (gpu_pass) ++held[a->id];
    }
  }
  return out;
}

std::optional<std::vector<std::string>> place(std::vector<AgentSlots> agents, int tasks, int threads_per_task) {
  const auto placed = place(std::move(agents), std::vector<TaskNeed>(static_cast<std::size_t>(std::max(0, tasks)),
                                                                      TaskNeed{threads_per_task, 0, false, {}}));
  if (!placed) return std::nullopt;
  std::vector<std::string> out;
  for (const auto& p : *placed) out.push_back(p.agent);
  return out;
}

NeedTotals totals(const std::vector<TaskNeed>& tasks) {
  NeedTotals t;
  for (const auto& n : tasks) t.cores += n.cores, t.gpus += n.gpus;
  return t;
}

bool fits(const std::vector<AgentSlots>& agents, const std::vector<TaskNeed>& tasks) {
  return place(agents, tasks).has_value();
}

bool fits(const std::vector<int>& agent_cores, int tasks, int threads_per_task) {
  int slots = 0;
  for (const int c : agent_cores) slots += c / threads_per_task;
  return slots >= tasks;
}

std::vector<std::string> spread_shards(std::vector<AgentSlots> free, const std::vector<TaskNeed>& needs,
                                       const std::vector<Placed>& placement, int shards, int shard_cores,
                                       int max_shards) {
  const auto slot_of = [&](const std::string& id) {
    return std::find_if(free.begin(), free.end(), [&](const AgentSlots& a) { return a.id == id; });
  };
  std::vector<std::string> with_shard;
  for (std::size_t i = 0; i < placement.size() && i < needs.size(); ++i) {
    if (auto a = slot_of(placement[i].agent); a != free.end()) {
      a->free_cores -= needs[i].cores;
      for (const int g : placement[i].gpus) std::erase(a->free_gpus, g);
    }
    if (static_cast<int>(i) < shards) with_shard.push_back(placement[i].agent);
  }
  std::vector<std::string> added;
  for (std::size_t i = static_cast<std::size_t>(std::max(0, shards)); i < placement.size(); ++i) {
    if (shards + static_cast<int>(added.size()) >= max_shards) break;
    const auto& id = placement[i].agent;
    auto a = slot_of(id);
    // The cores a machine's free GPUs need stay theirs: a shard never strands a GPU.
    const int gpu_cores = static_cast<int>(a == free.end() ? 0 : a->free_gpus.size()) * shard_cores;
    if (a == free.end() || a->free_cores - gpu_cores < shard_cores || is_excluded(with_shard, id)) continue;
    a->free_cores -= shard_cores;
    with_shard.push_back(id);
    added.push_back(id);
  }
  return added;
}

std::vector<TaskNeed> job_needs(int ps_shards, int workers, int threads_per_task, int gpus_per_worker,
                                bool pack_workers) {
  std::vector<TaskNeed> out(static_cast<std::size_t>(std::max(0, ps_shards)), TaskNeed{threads_per_task, 0, false, {}});
  out.insert(out.end(), static_cast<std::size_t>(std::max(0, workers)),
             TaskNeed{threads_per_task, gpus_per_worker, pack_workers || gpus_per_worker > 0, {}});
  return out;
}

Replacement place_again(std::vector<AgentSlots> agents, const std::vector<Replacing>& tasks, int threads_per_task) {
  for (auto& a : agents) std::sort(a.free_gpus.begin(), a.free_gpus.end());
  Replacement r;
  r.placement.assign(tasks.size(), "");
  r.gpus.assign(tasks.size(), {});
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    const auto& t = tasks[i];
    if (t.skip || t.current.empty()) continue;
    const TaskNeed need{threads_per_task, t.gpus, t.gpus > 0, {}, t.reads_shards};
    auto a = std::find_if(agents.begin(), agents.end(), [&](const AgentSlots& s) { return s.id == t.current; });
    if (a != agents.end() && has_room(*a, need, t.excluded)) {
      r.placement[i] = t.current;
      r.gpus[i] = take_from(*a, need);
    }
  }
  for (std::size_t i = 0; i < tasks.size(); ++i) {
    if (tasks[i].skip || !r.placement[i].empty()) continue;
    const TaskNeed need{threads_per_task, tasks[i].gpus, tasks[i].gpus > 0, {}, tasks[i].reads_shards};
    AgentSlots* a = best_for(agents, need, tasks[i].excluded);
    if (a == nullptr) {
      r.unplaced.push_back(i);
    } else {
      r.placement[i] = a->id;
      r.gpus[i] = take_from(*a, need);
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
    if (live(id)) out.push_back({id, a.free_cores, a.free_gpus, a.serves_shards});
  }
  return out;
}

std::vector<AgentSlots> AgentRegistry::capacities() const {
  std::vector<AgentSlots> out;
  for (const auto& [id, a] : agents_) {
    if (!live(id)) continue;
    AgentSlots s{id, a.cores, {}, a.serves_shards};
    for (const auto& g : a.gpus) s.free_gpus.push_back(g.index);
    out.push_back(std::move(s));
  }
  return out;
}

int AgentRegistry::free_gpus() const {
  int n = 0;
  for (const auto& s : slots()) n += static_cast<int>(s.free_gpus.size());
  return n;
}

int AgentRegistry::total_gpus() const {
  int n = 0;
  for (const auto& [id, a] : agents_) {
    if (live(id)) n += static_cast<int>(a.gpus.size());
  }
  return n;
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

std::string AgentRegistry::hardware_class(bool gpu) const {
  for (const auto& [id, a] : agents_) {
    if (a.lost) continue;
    if (!gpu) return a.hardware_class;
    if (!a.gpus.empty()) return a.hardware_class + "/" + a.gpu_model();
  }
  return "cpu";
}

double AgentRegistry::slowest_link() const {
  double slowest = 0;
  for (const auto& [id, a] : agents_) {
    if (!live(id) || a.link_bytes_per_sec <= 0) continue;
    slowest = slowest > 0 ? std::min(slowest, a.link_bytes_per_sec) : a.link_bytes_per_sec;
  }
  return slowest;
}

void AgentRegistry::take(const std::string& id, const TaskHold& hold) {
  auto it = agents_.find(id);
  if (it != agents_.end()) it->second.take(hold);
}

void AgentRegistry::release(const std::string& id, const TaskHold& hold) {
  auto it = agents_.find(id);
  if (it == agents_.end()) return;
  auto& a = it->second;
  a.free_cores += hold.cores;
  for (const int g : hold.gpus) {
    const bool offered =
        std::any_of(a.gpus.begin(), a.gpus.end(), [&](const wire::GpuInfo& x) { return x.index == g; });
    const auto pos = std::lower_bound(a.free_gpus.begin(), a.free_gpus.end(), g);
    if (offered && (pos == a.free_gpus.end() || *pos != g)) a.free_gpus.insert(pos, g);
  }
}

bool AgentRegistry::holds_orphan(const std::string& id, const std::string& job, const std::string& task) const {
  auto it = agents_.find(id);
  if (it == agents_.end()) return false;
  const std::string prefix = job + "/" + task + "/";
  auto o = it->second.orphans.lower_bound(prefix);
  return o != it->second.orphans.end() && o->first.rfind(prefix, 0) == 0;
}

}  // namespace dltrain::leader
