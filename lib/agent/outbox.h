// What an agent keeps for the leader while it has none (a leader restart, a failover):
// its tasks' events and exits, sent in order once it registers again. Bounded: at
// kMaxMessages, progress events go first (oldest first), then other events; an exit is
// never dropped (the leader needs it to free the task's cores).
#pragma once

#include <algorithm>
#include <cstddef>
#include <deque>
#include <string>
#include <utility>

namespace dltrain::agent {

/// Not thread-safe (the agent's io thread).
class Outbox {
 public:
  static constexpr std::size_t kMaxMessages = 10000;

  /// Keeps control message `text` (a request of the agent's). When full, makes room by
  /// dropping the oldest progress event, else the oldest message that is not a
  /// task_exit; a `droppable` message that still finds no room is not kept.
  void push(std::string text, bool droppable) {
    if (q_.size() >= kMaxMessages) {
      auto victim = std::find_if(q_.begin(), q_.end(), is_progress);
      if (victim == q_.end()) victim = std::find_if(q_.begin(), q_.end(), [](const std::string& m) { return !is_exit(m); });
      if (victim != q_.end()) q_.erase(victim);
    }
    if (droppable && q_.size() >= kMaxMessages) return;
    q_.push_back(std::move(text));
  }
  /// Puts `msgs` (oldest first) before every kept message: requests sent on a connection
  /// that was lost before the leader answered them, older than anything kept since.
  /// Bounded: the oldest progress events go first, then other events; exits all stay.
  void push_front(const std::deque<std::string>& msgs) {
    q_.insert(q_.begin(), msgs.begin(), msgs.end());
    while (q_.size() > kMaxMessages) {
      auto victim = std::find_if(q_.begin(), q_.end(), is_progress);
      if (victim == q_.end()) victim = std::find_if(q_.begin(), q_.end(), [](const std::string& m) { return !is_exit(m); });
      if (victim == q_.end()) break;  // only exits: every one is kept
      q_.erase(victim);
    }
  }
  /// Whether request text `m` (as wire::make_request writes it, without blanks) is a
  /// task's progress event. A log line quoted in an event cannot match: its quotes are
  /// escaped there.
  static bool is_progress(const std::string& m) { return m.find("\"event\":\"progress\"") != std::string::npos; }
  /// Whether request text `m` is a task_exit.
  static bool is_exit(const std::string& m) { return m.find("\"type\":\"task_exit\"") != std::string::npos; }
  /// Every kept message, oldest first; the outbox is empty after.
  std::deque<std::string> take_all() { return std::exchange(q_, {}); }
  std::size_t size() const { return q_.size(); }

 private:
  std::deque<std::string> q_;
};

}  // namespace dltrain::agent
