#include "leader/audit.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include <spdlog/spdlog.h>

namespace dltrain::leader {

AuditLog::AuditLog(std::string path) : path_(std::move(path)) {
  if (path_.empty()) return;
  const int fd = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd >= 0) file_ = ::fdopen(fd, "a");
  if (file_ == nullptr) {
    spdlog::error("audit: cannot open {}: {}; audit lines go to this log only", path_, std::strerror(errno));
    if (fd >= 0) ::close(fd);
    failed_ = true;
  }
}

AuditLog::~AuditLog() {
  if (file_ != nullptr) std::fclose(file_);
}

void AuditLog::write(nlohmann::json line) {
  line["time"] = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  spdlog::info("audit: {}", text);
  if (file_ == nullptr) return;
  if (std::fprintf(file_, "%s\n", text.c_str()) < 0 || std::fflush(file_) != 0) {
    if (!failed_) spdlog::error("audit: cannot write {}: {}", path_, std::strerror(errno));
    failed_ = true;
  }
}

}  // namespace dltrain::leader
