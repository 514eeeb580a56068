#include "agent/notify.h"

#include <systemd/sd-daemon.h>

#include <boost/asio/steady_timer.hpp>
#include <spdlog/spdlog.h>

namespace dltrain::agent {

struct SystemdNotifier::Impl {
  boost::asio::steady_timer timer;
  std::chrono::microseconds half{0};
  explicit Impl(boost::asio::io_context& io) : timer(io) {}

  void send(const std::string& msg) {
    const int r = sd_notify(0, msg.c_str());
    if (r < 0) spdlog::warn("sd_notify failed: {}", std::strerror(-r));
  }

  void tick() {
    timer.expires_after(half);
    timer.async_wait([this](boost::system::error_code ec) {
      if (ec) return;
      send("WATCHDOG=1");
      tick();
    });
  }
};

SystemdNotifier::SystemdNotifier(boost::asio::io_context& io) : impl_(std::make_unique<Impl>(io)) {}
SystemdNotifier::~SystemdNotifier() = default;

void SystemdNotifier::ready(const std::string& status) { impl_->send("READY=1\nSTATUS=" + status); }
void SystemdNotifier::status(const std::string& text) { impl_->send("STATUS=" + text); }
void SystemdNotifier::stopping(const std::string& status) { impl_->send("STOPPING=1\nSTATUS=" + status); }

std::uint64_t SystemdNotifier::start_watchdog() {
  std::uint64_t usec = 0;
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return 0;
  impl_->half = std::chrono::microseconds(usec / 2);
  impl_->send("WATCHDOG=1");
  impl_->tick();
  return usec;
}

}  // namespace dltrain::agent
