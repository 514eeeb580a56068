// Writes to the leader's store that must not stop it (private to lib/leader/).
#pragma once

#include <exception>

#include <spdlog/spdlog.h>

namespace dltrain::leader {

/// Runs `write`, a write to the leader's store (a history row, a plan, a job record the
/// leader also holds in memory): a failure (any std::exception, e.g. store::StoreError
/// for a full or read-only disk) is logged at error level as "store: <what> failed:
/// <why>" and the leader carries on serving from memory. Thread-safety: as `write`'s.
template <typename F>
void persist_or_log(const char* what, F&& write) {
  try {
    write();
  } catch (const std::exception& e) {
    spdlog::error("store: {} failed: {}", what, e.what());
  }
}

}  // namespace dltrain::leader
