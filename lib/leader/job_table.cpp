// JobTable (leader/job_table.h): the leader's jobs, their order and numbering.
#include "leader/job_table.h"

#include <algorithm>
#include <stdexcept>

namespace dltrain::leader {

std::vector<JobRec*> JobTable::in_order() {
  std::vector<JobRec*> out;
  out.reserve(order_.size());
  for (const auto& id : order_) out.push_back(&jobs_.at(id));
  return out;
}

std::vector<const JobRec*> JobTable::in_order() const {
  std::vector<const JobRec*> out;
  out.reserve(order_.size());
  for (const auto& id : order_) out.push_back(&jobs_.at(id));
  return out;
}

std::vector<const JobRec*> JobTable::newest(std::size_t limit) const {
  std::vector<const JobRec*> out;
  for (auto it = order_.rbegin(); it != order_.rend() && out.size() < limit; ++it) out.push_back(&jobs_.at(*it));
  return out;
}

void JobTable::number(JobRec& j) {
  j.num = next_++;
  j.id = "job-" + std::to_string(j.num);
}

void JobTable::unnumber(const JobRec& j) {
  if (j.num + 1 == next_) --next_;
}

JobRec& JobTable::add(JobRec j) {
  if (j.id.empty() || jobs_.count(j.id)) throw std::logic_error("job table: no id, or a second job " + j.id);
  const std::string id = j.id;
  auto& kept = jobs_.emplace(id, std::move(j)).first->second;
  order_.push_back(id);
  return kept;
}

JobRec& JobTable::restore(JobRec j) {
  raise_next(j.num + 1);
  return add(std::move(j));
}

std::vector<std::string> JobTable::beyond_retention(std::size_t keep) const {
  struct Finished {
    std::chrono::steady_clock::time_point ended;
    std::size_t position;
    const JobRec* job;
  };
  std::vector<Finished> finished;
  for (std::size_t i = 0; i < order_.size(); ++i) {
    const JobRec& j = jobs_.at(order_[i]);
    if (j.terminal()) finished.push_back({j.ended.value_or(std::chrono::steady_clock::time_point{}), i, &j});
  }
  std::vector<std::string> gone;
  if (finished.size() <= keep) return gone;
  std::sort(finished.begin(), finished.end(), [](const Finished& a, const Finished& b) {
    return a.ended != b.ended ? a.ended > b.ended : a.position > b.position;
  });
  for (std::size_t k = keep; k < finished.size(); ++k) {
    const JobRec& j = *finished[k].job;
    if (!j.explore.profile_of.empty()) {
      const auto parent = jobs_.find(j.explore.profile_of);
      if (parent != jobs_.end() && !parent->second.terminal()) continue;
    }
    gone.push_back(j.id);
  }
  return gone;
}

void JobTable::erase(const std::vector<std::string>& ids) {
  for (const auto& id : ids) jobs_.erase(id);
  order_.erase(std::remove_if(order_.begin(), order_.end(), [&](const std::string& id) { return !jobs_.count(id); }),
               order_.end());
}

}  // namespace dltrain::leader
