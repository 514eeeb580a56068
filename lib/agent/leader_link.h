// An agent's link to the leader (docs/protocol.md, "Agents"): the connection to the leader
// candidates with back-off, registration, heartbeats, the outbox of messages that wait for
// a link, the leader's orders dispatched by type and the replies awaited by request id.
// The agent (agent.cpp) owns one and gives it what only the agent knows through Hooks: the
// registration body, what to do once registered and when the leader is lost.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include "agent/leader_candidates.h"
#include "agent/outbox.h"
#include "config/options.h"
#include "wire/control.h"
#include "wire/control_bodies.h"

namespace dltrain::control {
class ControlClient;
}

namespace dltrain::agent {

/// Runs on the agent's io_context (single-threaded, like the agent): every member is
/// called on that thread. Create with std::make_shared (its timers hold weak references).
class LeaderLink : public std::enable_shared_from_this<LeaderLink> {
 public:
  /// What the link asks of its agent.
  struct Hooks {
    /// The body of a registration: this agent and the tasks it runs or whose exit waits
    /// in the outbox (docs/protocol.md, "register").
    std::function<wire::RegisterBody()> registration;
    /// After each registration the leader accepted (the outbox already sent); `first` is
    /// true once, for the first.
    std::function<void(bool first)> registered;
    /// The link was lost or the leader stopped answering (`why`), before the next
    /// candidate is tried.
    std::function<void(const std::string& why)> lost;
    /// The tasks running now (the heartbeat's running_tasks).
    std::function<std::size_t()> running_tasks;
    /// More fields of the heartbeat's body (the shard cache's figures); may be null.
    std::function<nlohmann::json()> heartbeat_extra;
    /// A reply to none of the link's own requests (a window of a model file, say): true
    /// when the hook took it.
    std::function<bool(const wire::Envelope&)> other_reply;
    /// A task_exit (its body) that was sent but not answered when the link was lost: it
    /// is sent again after the next registration, which must list the task as ended.
    std::function<void(const nlohmann::json& body)> exit_unanswered;
  };

  /// `opt` (leader_urls, tokens, TLS, heartbeat interval and timeout) must outlive the
  /// link. Throws ConfigError for a leader URL that does not parse (naming leader_url or
  /// leader_url[i]).
  LeaderLink(boost::asio::io_context& io, const config::AgentOptions& opt, Hooks hooks);
  ~LeaderLink();
  LeaderLink(const LeaderLink&) = delete;
  LeaderLink& operator=(const LeaderLink&) = delete;

  /// The leader's orders by type: register every handler before start(). A handler that
  /// throws gets the error reply (BodyError: bad_request naming the field; anything else:
  /// internal); an unknown type gets "unknown type".
  wire::Dispatcher<>& orders() { return orders_; }
  /// Dials the first candidate.
  void start();
  /// Stops reconnecting (the agent shuts down); the link stays open until close().
  void stop_reconnecting();
  /// Stops the heartbeats (the agent's tasks have stopped; it closes soon).
  void stop_heartbeats() { hb_timer_.cancel(); }
  /// Closes the link and stops the heartbeats.
  void close();

  /// Sends request `type` now when registered, otherwise keeps it in the outbox (a
  /// `droppable` one may be dropped first when the outbox is full: outbox.h). A
  /// task_event or task_exit gets this process's `sender` id and the next `seq`
  /// (TaskRefBody) and is kept until the leader answers it: when the link is lost first
  /// (a leader's machine gone silently drops what was on its way), it goes back into the
  /// outbox and is sent again, and the leader takes each (sender, seq) once.
  void send(wire::ControlType type, const nlohmann::json& body, bool droppable = false);
  /// Sends `text` (a request built by the caller) now; false, sending nothing, unless
  /// registered.
  bool send_now(std::string text);
  /// Sends a reply or error text to the leader on the current link (when there is one).
  void answer(std::string text);
  /// Sends the error reply to order `env`, which failed with `e` (BodyError: bad_request
  /// naming its field; anything else: internal), and logs it.
  void refuse(const wire::Envelope& env, const std::exception& e);

  /// Whether the link is open and registered.
  bool connected() const;
  /// The newest leader term this agent registered under, and the orders of older terms
  /// it refused (leader_candidates.h).
  std::int64_t newest_term() const { return leaders_.newest_term(); }
  std::uint64_t refused() const { return leaders_.refused(); }

 private:
  const std::string& url() const { return leaders_.url(); }
  void next_leader(const std::string& why);
  void connect();
  void schedule_reconnect();
  void do_register();
  void heartbeat();
  void on_message(const std::string& text);
  void on_registration_reply(const wire::Envelope& env);
  /// Sends `text` (request `id` of `type`) on the registered link, kept until answered
  /// when it is a task_event or task_exit.
  void send_tracked(const std::string& id, const std::string& type, std::string text);
  /// Puts the requests not answered on the link just lost back into the outbox, first.
  void requeue_unanswered();
  /// Times this agent's link to the leader (control::measure_link, docs/planner.md,
  /// "The link") after each registration, from a random moment in its first second, and
  /// sends it in a link_report; nothing when
  /// link_probe_bytes is 0 or a probe is still running (one that ends after the link moved
  /// to another leader measures again). A failed probe is logged.
  void probe_link();
  /// The probe itself, after probe_link's random delay.
  void measure();

  boost::asio::io_context& io_;
  const config::AgentOptions& opt_;
  Hooks hooks_;
  LeaderCandidates leaders_;
  std::shared_ptr<control::ControlClient> link_;
  boost::asio::steady_timer hb_timer_, retry_timer_, probe_timer_;
  std::chrono::milliseconds backoff_{500};
  bool registered_ = false, ever_registered_ = false, stopping_ = false;
  std::chrono::steady_clock::time_point last_heard_{};
  Outbox outbox_;
  std::uint64_t next_req_ = 1;
  /// task_event / task_exit requests sent on the current link and not yet answered: (id,
  /// text), oldest first (at most Outbox::kMaxMessages).
  std::deque<std::pair<std::string, std::string>> unanswered_;
  std::string sender_;     ///< this process's random id (TaskRefBody::sender)
  std::uint64_t seq_ = 0;  ///< the last TaskRefBody::seq given
  wire::Dispatcher<> orders_;
  std::map<std::string, std::function<void(const wire::Envelope&)>> awaiting_;
  bool probing_ = false;  ///< a measure_link runs
};

}  // namespace dltrain::agent
