// Running the real executables from integration tests.
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <sstream>
#include <string>

namespace dltrain::testing {

/// Exit code (-1 when killed or not started) and standard output of a command.
struct Result {
  int code = -1;
  std::string out;
};

/// Runs a shell command under `timeout` (seconds) and captures its stdout.
inline Result run(const std::string& cmd, int timeout_s = 300) {
  Result r;
  FILE* p = popen(("timeout " + std::to_string(timeout_s) + " " + cmd).c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), buf.size(), p) != nullptr) r.out += buf.data();
  const int st = pclose(p);
  r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

/// The last non-empty line of `s` (a followed job's summary).
inline std::string last_line(const std::string& s) {
  std::istringstream in(s);
  std::string line, last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last;
}

}  // namespace dltrain::testing
