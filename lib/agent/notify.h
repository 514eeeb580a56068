// systemd's service notification protocol (sd_notify(3)): READY, STATUS, WATCHDOG and
// STOPPING messages to $NOTIFY_SOCKET. Every call is a no-op when the agent was not
// started by systemd (no NOTIFY_SOCKET).
#pragma once

#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>

namespace dltrain::agent {

/// Talks to systemd for the daemon. Use from the io_context's thread only.
class SystemdNotifier {
 public:
  explicit SystemdNotifier(boost::asio::io_context& io);
  ~SystemdNotifier();

  /// READY=1 with a STATUS= line a person reads in `systemctl status`.
  void ready(const std::string& status);
  /// STATUS=<text>.
  void status(const std::string& text);
  /// STOPPING=1 (and a status saying why).
  void stopping(const std::string& status);
  /// When systemd set a watchdog (WatchdogSec=, seen through sd_watchdog_enabled), sends
  /// WATCHDOG=1 every half interval from the event loop, so a stuck loop stops the
  /// pings and systemd restarts the service. Returns the interval in µs, 0 when off.
  std::uint64_t start_watchdog();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace dltrain::agent
