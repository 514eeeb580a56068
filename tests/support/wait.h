// Waiting in tests for an event instead of sleeping for a guessed time.
#pragma once

#include <chrono>
#include <thread>

namespace dltrain::testing {

/// Polls `done()` every `poll` until it returns true or `timeout` has passed; returns its
/// last value. Bounded in time (and so in the number of polls), so a test that waits for
/// an event that never comes fails with its own assertion instead of hanging. Not a
/// timing assertion: how long the wait took is not looked at.
template <typename Predicate>
bool wait_until(Predicate&& done, std::chrono::milliseconds timeout,
                std::chrono::milliseconds poll = std::chrono::milliseconds(5)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return done();
    std::this_thread::sleep_for(poll);
  }
}

}  // namespace dltrain::testing
