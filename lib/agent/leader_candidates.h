// Which leader an agent follows (docs/ha.md "Finding the leader", "Fencing"): the
// candidates' URLs it tries in turn, and the newest leader term it has registered under,
// by which it refuses a deposed leader and its orders. Plain state, no sockets: the
// agent's link (agent.cpp) asks it what to do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace dltrain::agent {

/// Not thread-safe (the agent's io thread).
class LeaderCandidates {
 public:
  /// `urls`: leader_urls (at least one, as config::AgentOptions guarantees).
  explicit LeaderCandidates(std::vector<std::string> urls) : urls_(std::move(urls)) {}

  /// The URL to try now.
  const std::string& url() const { return urls_[at_]; }
  /// The one after it, in order, wrapping around. Returns true when that starts a new
  /// round (back to the first URL: the caller backs off before trying), false when there
  /// is another candidate to try at once.
  bool advance() {
    at_ = (at_ + 1) % urls_.size();
    return at_ == 0;
  }

  /// A leader registered this agent under `term` (0: a single leader). Returns the reason
  /// to refuse it when `term` is older than the newest term registered under (a deposed
  /// leader that has not noticed yet), else takes `term` as the newest and returns nullopt.
  std::optional<std::string> registered(std::int64_t term) {
    if (term < newest_) {
      ++refused_;
      return "its term " + std::to_string(term) + " is older than term " + std::to_string(newest_) +
             " this agent registered under";
    }
    newest_ = term;
    return std::nullopt;
  }
  /// An order of `term` (its envelope's; 0: none) arrived: the reason to refuse it when
  /// `term` is older than the newest registered under, else nullopt.
  std::optional<std::string> order(std::int64_t term) {
    if (term >= newest_) return std::nullopt;
    ++refused_;
    return "term " + std::to_string(term) + " is older than term " + std::to_string(newest_) +
           ", which this agent follows";
  }

  /// The newest term registered under (0: none, or single leaders only).
  std::int64_t newest_term() const { return newest_; }
  /// Registrations and orders refused so far.
  std::uint64_t refused() const { return refused_; }

 private:
  std::vector<std::string> urls_;
  std::size_t at_ = 0;
  std::int64_t newest_ = 0;
  std::uint64_t refused_ = 0;
};

}  // namespace dltrain::agent
