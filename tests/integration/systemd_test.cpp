// systemd integration: the notify protocol over a real AF_UNIX datagram socket owned by
// the test, the unit file through systemd-analyze, and token-file permissions.
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "support/temp_dir.h"
#include "support/names.h"
#include "support/wait.h"

namespace {

const std::string kBin = DLTRAIN_BIN_DIR;
const std::string kSrc = DLTRAIN_SOURCE_DIR;

void write_secret(const fs::path& p, const std::string& text, mode_t mode) {
  std::ofstream(p) << text << "\n";
  ::chmod(p.c_str(), mode);
}

// Receives datagrams until `want` is among them or the deadline passes.
bool receive_until(int fd, const std::string& want, std::chrono::milliseconds limit, std::vector<std::string>& got) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    timeval tv{0, 100000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::array<char, 4096> buf{};
    const ssize_t n = recv(fd, buf.data(), buf.size() - 1, 0);
    if (n > 0) {
      got.emplace_back(buf.data(), static_cast<std::size_t>(n));
      if (got.back().find(want) != std::string::npos) return true;
    }
  }
  return false;
}

}  // namespace

TEST(Systemd, NotifyReadyWatchdogStoppingAndCleanExit) {
  TempDir d;
  write_secret(d.path / "agent.token", "agent-secret", 0600);
  write_secret(d.path / "client.token", "client-secret", 0600);
  std::ofstream(d.path / "agent.toml") << "leader = true\nhost_tasks = false\nlisten_address = \"127.0.0.1\"\n"
                                       << "listen_port = 0\nagent_token_file = \"agent.token\"\n"
                                       << "client_token_file = \"client.token\"\nstate_dir = \"" << (d.path / "state").string()
                                       << "\"\n";
  const std::string sock_path = (d.path / "notify.sock").string();
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, sock_path.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0) << std::strerror(errno);

  const pid_t pid = fork();
  if (pid == 0) {
    setenv("NOTIFY_SOCKET", sock_path.c_str(), 1);
    setenv("WATCHDOG_USEC", "400000", 1);  // 0.4 s: a ping every 0.2 s
    unsetenv("WATCHDOG_PID");
    const std::string log = (d.path / "agent.log").string();
    freopen(log.c_str(), "w", stderr);
    execl((kBin + "/dltrain-agent").c_str(), "dltrain-agent", "--config", (d.path / "agent.toml").c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  std::vector<std::string> got;
  ASSERT_TRUE(receive_until(fd, "READY=1", 15s, got)) << "no READY=1";
  EXPECT_NE(got.back().find("STATUS=leader listening on 127.0.0.1:"), std::string::npos) << got.back();
  int pings = 0;
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> w;
    if (receive_until(fd, "WATCHDOG=1", 3s, w)) ++pings;
  }
  EXPECT_EQ(pings, 3);
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  std::vector<std::string> tail;
  EXPECT_TRUE(receive_until(fd, "STOPPING=1", 10s, tail));
  int st = 0;
  dltrain::testing::wait_until([&] { return waitpid(pid, &st, WNOHANG) != 0; }, 10s, 50ms);
  EXPECT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "status " << st;
  close(fd);
}

TEST(Systemd, UnitFilePassesSystemdAnalyzeVerify) {
  TempDir d;
  std::ifstream in(kSrc + "/systemd/dltrain-agent.service");
  ASSERT_TRUE(in);
  std::string unit((std::istreambuf_iterator<char>(in)), {});
  // Point ExecStart at the binary just built (verify checks that it is executable).
  const std::string installed = "/usr/bin/dltrain-agent";
  unit.replace(unit.find(installed), installed.size(), kBin + "/dltrain-agent");
  std::ofstream(d.path / "dltrain-agent.service") << unit;
  const std::string cmd = "systemd-analyze verify --man=no " + (d.path / "dltrain-agent.service").string() + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  std::array<char, 512> buf{};
  while (fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  const int rc = pclose(p);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_EQ(out.find("dltrain-agent.service:"), std::string::npos) << out;  // no complaint about the unit
}

TEST(Systemd, WorldReadableTokenFileIsRefused) {
  TempDir d;
  write_secret(d.path / "agent.token", "agent-secret", 0644);
  std::ofstream(d.path / "agent.toml") << "agent_token_file = \"agent.token\"\n";
  const std::string cmd = kBin + "/dltrain-agent --config " + (d.path / "agent.toml").string() + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  std::string out;
  std::array<char, 512> buf{};
  while (fgets(buf.data(), buf.size(), p) != nullptr) out += buf.data();
  const int st = pclose(p);
  EXPECT_EQ(WEXITSTATUS(st), 2) << out;
  EXPECT_NE(out.find("has mode 0644: it must not be readable by group or others (chmod 600)"), std::string::npos)
      << out;
}
