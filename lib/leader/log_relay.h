// `dltrain logs`: the leader relays a client's request for a window of a task's log to the
// agent that runs (or ran) it, and the agent's answer back. Agents keep the logs; the
// relay keeps nothing but the requests in flight. A part with its own state and no
// sockets: the leader hands it, with each request, how to answer that client.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "wire/control.h"

namespace dltrain::leader {

/// The read_log requests in flight. Not thread-safe (the leader's io thread).
class LogRelay {
 public:
  using Clock = std::chrono::steady_clock;
  /// How long an agent has to answer a read_log before its client is told it did not.
  static constexpr std::chrono::seconds kReplyTimeout{10};
  /// How the relay answers the client of one request: a reply body, or an error (code,
  /// message, field). Either may find the client gone and do nothing.
  struct Client {
    std::function<void(const nlohmann::json& body)> reply;
    std::function<void(const std::string& code, const std::string& message, const std::string& field)> error;
  };

  /// Remembers request `id` (the read_log the leader sent to `agent` at `now`, for a task
  /// that will `running` run again or not) and whom to answer.
  void expect(const std::string& id, const std::string& agent, bool running, Client client, Clock::time_point now);
  /// True when `env`, a reply from an agent, answers a request in flight: its client gets
  /// the agent's body with "agent" and "running" (the task runs now and will go on:
  /// the agent's view and the leader's together), or the agent's error prefixed with its
  /// name. False for any other reply.
  bool on_reply(const wire::Envelope& env);
  /// Answers the requests whose agent did not reply by `now` − kReplyTimeout (an
  /// unavailable error naming the agent) and forgets them.
  void expire(Clock::time_point now);
  /// Requests in flight.
  std::size_t size() const { return pending_.size(); }

 private:
  struct Pending {
    std::string agent;
    bool running = false;
    Clock::time_point deadline;
    Client client;
  };
  std::map<std::string, Pending> pending_;  // by the read_log's request id
};

}  // namespace dltrain::leader
