// The agent's Supervisor with real child processes (/bin/sh, /bin/sleep): the environment
// a task is started with, and a stop that follows a start at once, which must signal the
// child only — never the agent, whose SIGTERM handler a child inherits until it execs.
#include <signal.h>
#include <stdlib.h>

#include <chrono>
#include <string>
#include <vector>

#include <boost/asio.hpp>
#include <gtest/gtest.h>

#include "agent/supervisor.h"

using namespace dltrain::agent;
namespace asio = boost::asio;

TEST(Supervisor, ATaskGetsTheAgentsEnvironmentWithItsOwnVariablesSetOrReplaced) {
  asio::io_context io;
  Supervisor sup(io);
  ::setenv("DLTRAIN_SUPERVISOR_INHERITED", "kept", 1);
  ::setenv("CUDA_VISIBLE_DEVICES", "7", 1);  // the agent's own value is replaced
  ProcessSpec spec;
  spec.argv = {"/bin/sh", "-c", "echo \"$CUDA_VISIBLE_DEVICES|$CUDA_DEVICE_ORDER|$DLTRAIN_SUPERVISOR_INHERITED\""};
  spec.env = {{"CUDA_VISIBLE_DEVICES", "1,3"}, {"CUDA_DEVICE_ORDER", "PCI_BUS_ID"}};
  std::vector<std::string> lines;
  ExitStatus status;
  bool done = false;
  sup.spawn(spec, [&](const std::string& l) { lines.push_back(l); }, [&](const ExitStatus& s) {
    status = s;
    done = true;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done && std::chrono::steady_clock::now() < deadline) io.run_for(std::chrono::milliseconds(20));
  ::unsetenv("DLTRAIN_SUPERVISOR_INHERITED");
  ::unsetenv("CUDA_VISIBLE_DEVICES");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0], "1,3|PCI_BUS_ID|kept");
  EXPECT_EQ(status.exit_code, 0);
}

TEST(Supervisor, StoppingTasksTheMomentTheyStartSignalsThemAndNeverTheAgent) {
  asio::io_context io;
  // What the agent does with SIGTERM (asio's signal_set: a handler writing to a pipe).
  asio::signal_set agent_signals(io, SIGTERM);
  bool agent_got_sigterm = false;
  agent_signals.async_wait([&](boost::system::error_code ec, int) {
    if (!ec) agent_got_sigterm = true;
  });
  Supervisor sup(io);
  constexpr int kTasks = 40;
  int ended = 0, by_sigterm = 0;
  for (int i = 0; i < kTasks; ++i) {
    ProcessSpec spec;
    spec.argv = {"/bin/sleep", "30"};
    const pid_t pid = sup.spawn(
        spec, [](const std::string&) {},
        [&](const ExitStatus& s) {
          ++ended;
          by_sigterm += s.signal == SIGTERM ? 1 : 0;
        });
    sup.stop(pid, std::chrono::seconds(10));  // at once: the child may not have exec'd yet
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (ended < kTasks && std::chrono::steady_clock::now() < deadline) io.run_for(std::chrono::milliseconds(50));
  io.run_for(std::chrono::milliseconds(200));  // a stray SIGTERM would have been delivered by now
  EXPECT_EQ(ended, kTasks);
  EXPECT_EQ(by_sigterm, kTasks);
  EXPECT_FALSE(agent_got_sigterm) << "a child's SIGTERM reached the agent's handler";
  agent_signals.cancel();
}
