// The leader's audit log: one JSON line per client request that changes something
// (docs/operations.md, "Users"), so that who submitted, cancelled or resumed what, and
// whether it was allowed, can be read after the fact.
#pragma once

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

namespace dltrain::leader {

/// An append-only file of JSON lines, created 0600. Each write() is one line, flushed to
/// the kernel at once (so that a leader that dies loses none it reported). A file that
/// cannot be opened or written is logged at error level once and then skipped: the audit
/// log never stops the leader. Not thread-safe: the leader's io thread only.
class AuditLog {
 public:
  /// Opens (creating) `path`; "" = no file, lines go to the leader's log only.
  explicit AuditLog(std::string path);
  ~AuditLog();
  AuditLog(const AuditLog&) = delete;
  AuditLog& operator=(const AuditLog&) = delete;

  /// Appends `line` (an object; "time", seconds since the epoch, added) and logs it at
  /// info level as "audit: <line>".
  void write(nlohmann::json line);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  bool failed_ = false;
};

}  // namespace dltrain::leader
