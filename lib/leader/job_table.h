// The leader's jobs (private to lib/leader/): every job it knows by id, their submission
// order, and the number the next one gets. The one place a job enters or leaves the
// leader's memory, so that the order and the numbers stay consistent with the jobs;
// what a job is and how it moves between states are job_record.h's and states.h's.
// Lookups are those of a std::map (find, at, count, iteration by id). Not thread-safe:
// the leader's io thread owns it. Unit-tested in tests/unit/job_table_test.cpp.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "leader/job_record.h"

namespace dltrain::leader {

/// The jobs a leader holds.
class JobTable {
 public:
  using Map = std::map<std::string, JobRec>;

  Map::iterator find(const std::string& id) { return jobs_.find(id); }
  Map::const_iterator find(const std::string& id) const { return jobs_.find(id); }
  /// Throws std::out_of_range for an unknown id.
  JobRec& at(const std::string& id) { return jobs_.at(id); }
  const JobRec& at(const std::string& id) const { return jobs_.at(id); }
  bool count(const std::string& id) const { return jobs_.count(id) != 0; }
  Map::iterator begin() { return jobs_.begin(); }
  Map::iterator end() { return jobs_.end(); }
  Map::const_iterator begin() const { return jobs_.begin(); }
  Map::const_iterator end() const { return jobs_.end(); }
  std::size_t size() const { return jobs_.size(); }

  /// Ids in submission order (oldest first).
  const std::vector<std::string>& order() const { return order_; }
  /// The jobs in submission order (oldest first).
  std::vector<JobRec*> in_order();
  /// The same, read-only.
  std::vector<const JobRec*> in_order() const;
  /// At most `limit` jobs, the newest first.
  std::vector<const JobRec*> newest(std::size_t limit) const;

  /// The number the next new job gets (>= 1; "job-N").
  std::uint64_t next_number() const { return next_; }
  /// Gives `j` the next number and its id "job-N"; the counter moves on. A job that is
  /// then not added (its store refused it) gives the number back with unnumber().
  void number(JobRec& j);
  /// Gives back the number number() gave `j` last (only the latest one can be).
  void unnumber(const JobRec& j);
  /// Adds numbered job `j` at the end of the order; returns it where it is kept. Throws
  /// std::logic_error when its id is empty or taken.
  JobRec& add(JobRec j);
  /// A job read back from the store: added as add() does, the counter raised past it.
  JobRec& restore(JobRec j);
  /// The counter at least `n` (the store's saved one).
  void raise_next(std::uint64_t n) { next_ = std::max(next_, n); }

  /// The finished jobs beyond the `keep` most recently ended ones, by id: ranked by
  /// their end (a job whose end this process did not see, a restored one, ranks as older,
  /// in submission order); a finished exploration run whose job has not ended is kept.
  std::vector<std::string> beyond_retention(std::size_t keep) const;
  /// Removes the jobs `ids` (unknown ones are skipped).
  void erase(const std::vector<std::string>& ids);

 private:
  Map jobs_;
  std::vector<std::string> order_;
  std::uint64_t next_ = 1;
};

}  // namespace dltrain::leader
