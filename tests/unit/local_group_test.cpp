// The local group (group/local_group.h) with real processes: each member is a child
// process of the test (fork) that joins over a real Unix socket and reports what it
// holds afterwards, or the error it got, through a pipe.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/ringbuffer_sink.h>
#include <spdlog/spdlog.h>

#include "support/process.h"
#include "support/temp_dir.h"
#include "support/wait.h"

#include "ps/client.h"
#include "group/local_group.h"

using namespace dltrain::group;
namespace fs = std::filesystem;
using dltrain::testing::TempDir;
using dltrain::testing::wait_until;

namespace {

std::string floats(const std::vector<float>& v) {
  std::ostringstream os;
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? " " : "") << v[i];
  return os.str();
}

using MemberFn = std::function<std::string(LocalGroup&)>;

struct Member {
  pid_t pid = -1;
  int out = -1;
};

// Starts member `rank` of a group of `names` in a child process, running `fn` once the
// group is formed; the child writes fn's result, or "error: <what()>", to a pipe, and
// its log to `log_file` when one is given.
Member start(const std::string& socket, int rank, const std::vector<std::string>& names, MemberFn fn,
             std::uint64_t job = 7, std::chrono::milliseconds timeout = std::chrono::milliseconds(20000),
             const std::string& log_file = "") {
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    std::string result;
    try {
      if (!log_file.empty()) {
        spdlog::set_default_logger(spdlog::basic_logger_mt("member", log_file, true));
        spdlog::flush_on(spdlog::level::info);
      }
      LocalGroupOptions o;
      o.socket_path = socket;
      o.rank = rank;
      o.members = names;
      o.job = job;
      o.generation = 3;
      o.timeout = timeout;
      auto g = LocalGroup::join(o);
      result = fn(*g);
    } catch (const std::exception& e) {
      result = std::string("error: ") + e.what();
    }
    (void)!::write(fds[1], result.data(), result.size());
    ::close(fds[1]);
    ::_exit(0);
  }
  ::close(fds[1]);
  return Member{pid, fds[0]};
}

// What the member reported (its pipe read to the end), once it has exited.
std::string finish(Member& m) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t r = ::read(m.out, buf, sizeof buf);
    if (r <= 0) break;
    out.append(buf, static_cast<std::size_t>(r));
  }
  ::close(m.out);
  int status = 0;
  ::waitpid(m.pid, &status, 0);
  return out;
}

const std::vector<std::string> kThree{"worker-0", "worker-1", "worker-2"};

}  // namespace

TEST(LocalGroup, ThreeProcessesSumInRankOrderAndShareMemberZerosValues) {
  TempDir dir;
  const std::string sock = dir.path.string() + "/g.sock";
  std::vector<Member> m;
  for (int r = 0; r < 3; ++r) {
    m.push_back(start(sock, r, kThree, [r](LocalGroup& g) {
      // Member r holds (r + 1)·i + r/2: the sum over r = 0, 1, 2 is 6·i + 1.5, exactly.
      std::vector<float> v(5);
      for (int i = 0; i < 5; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>((r + 1) * i) + 0.5f * r;
      g.allreduce_sum(v);
      std::vector<float> b = r == 0 ? std::vector<float>{7, 8, 9} : std::vector<float>{0, 0, 0};
      g.broadcast(b);
      return floats(v) + " | " + floats(b) + " | pushes " + std::to_string(g.pushes());
    }));
  }
  EXPECT_EQ(finish(m[0]), "1.5 7.5 13.5 19.5 25.5 | 7 8 9 | pushes 1");
  EXPECT_EQ(finish(m[1]), "1.5 7.5 13.5 19.5 25.5 | 7 8 9 | pushes 0");
  EXPECT_EQ(finish(m[2]), "1.5 7.5 13.5 19.5 25.5 | 7 8 9 | pushes 0");
  EXPECT_FALSE(fs::exists(sock)) << "member 0 removes the rendezvous once the group is whole";
}

TEST(LocalGroup, TwoProcessesMemberOneStartingFirstAndAStaleSocketFileLeftBehind) {
  TempDir dir;
  const std::string sock = dir.path.string() + "/g.sock";
  {
    std::ofstream stale(sock);  // a file where the socket goes (a crashed run's)
  }
  const std::vector<std::string> names{"worker-4", "worker-5"};
  const std::string log = dir.path.string() + "/member-1.log";
  auto one = start(sock, 1, names, [](LocalGroup& g) {
    std::vector<float> v{-1.25f, 2.0f};
    g.allreduce_sum(v);
    return floats(v);
  }, 7, std::chrono::milliseconds(20000), log);
  // Member 0 starts once member 1 has been refused at the stale file and retries.
  ASSERT_TRUE(wait_until([&] { return dltrain::testing::slurp(log).find("waiting for worker-4") != std::string::npos; },
                         std::chrono::seconds(15)))
      << dltrain::testing::slurp(log);
  auto zero = start(sock, 0, names, [](LocalGroup& g) {
    std::vector<float> v{0.25f, 3.0f};
    g.allreduce_sum(v);
    return floats(v);
  });
  EXPECT_EQ(finish(zero), "-1 5");
  EXPECT_EQ(finish(one), "-1 5");
}

TEST(LocalGroup, AMemberThatDiesFailsTheOthersAtOnceNamingIt) {
  TempDir dir;
  const std::string sock = dir.path.string() + "/g.sock";
  std::vector<Member> m;
  for (int r = 0; r < 3; ++r) {
    m.push_back(start(sock, r, kThree, [r](LocalGroup& g) -> std::string {
      std::vector<float> v(1000, 1.0f);
      g.allreduce_sum(v);                 // all three
      if (r == 2) ::raise(SIGKILL);       // member 2 dies between two steps
      g.allreduce_sum(v);
      return "no error";
    }));
  }
  const std::string zero = finish(m[0]);
  const std::string one = finish(m[1]);
  finish(m[2]);
  // Member 0 sees member 2's connection close; member 1 then sees member 0 end (the
  // worker process exits on the error): nobody waits for the 20 s timeout.
  EXPECT_NE(zero.find("error: local group: worker-2 (member 2 of 3) left the group during allreduce_sum"),
            std::string::npos)
      << zero;
  EXPECT_NE(one.find("error: local group: worker-0 (member 0 of 3) left the group"), std::string::npos) << one;
}

TEST(LocalGroup, AStalledMemberFailsTheGroupAfterTheTimeoutNamingIt) {
  TempDir dir;
  const std::string sock = dir.path.string() + "/g.sock";
  const std::vector<std::string> names{"worker-0", "worker-1"};
  const auto timeout = std::chrono::milliseconds(800);
  auto zero = start(sock, 0, names, [](LocalGroup& g) {
    std::vector<float> v(4, 1.0f);
    g.allreduce_sum(v);
    return std::string("no error");
  }, 7, timeout);
  auto one = start(sock, 1, names, [](LocalGroup&) {
    ::raise(SIGSTOP);  // stopped (continued by the test after member 0 gave up)
    return std::string("continued");
  }, 7, timeout);
  const std::string z = finish(zero);
  ::kill(one.pid, SIGCONT);
  finish(one);
  EXPECT_NE(z.find("error: local group: worker-1 (member 1 of 2) sent nothing for 0.8 s during allreduce_sum "
                   "(stalled)"),
            std::string::npos)
      << z;
}

TEST(LocalGroup, AMemberOfAnotherJobIsRefusedAndTheMissingMemberIsNamed) {
  TempDir dir;
  const std::string sock = dir.path.string() + "/g.sock";
  const std::vector<std::string> names{"worker-0", "worker-1"};
  const auto timeout = std::chrono::milliseconds(1500);
  auto zero = start(sock, 0, names, [](LocalGroup&) { return std::string("formed"); }, 7, timeout);
  auto other = start(sock, 1, names, [](LocalGroup&) { return std::string("formed"); }, 8, timeout);
  const std::string o = finish(other);
  const std::string z = finish(zero);
  EXPECT_NE(o.find("refused worker-1 (member 1 of 2): of job 8 generation 3, but this group is of job 7 generation 3"),
            std::string::npos)
      << o;
  EXPECT_NE(z.find("error: local group of worker-0 (member 0 of 2): worker-1 (member 1 of 2) did not join within "
                   "1.5 s"),
            std::string::npos)
      << z;
}

TEST(LocalGroup, MembersThatDisagreeOnALengthAreToldSo) {
  TempDir dir;
  const std::string sock = dir.path.string() + "/g.sock";
  const std::vector<std::string> names{"worker-0", "worker-1"};
  auto zero = start(sock, 0, names, [](LocalGroup& g) {
    std::vector<float> v(3, 1.0f);
    g.allreduce_sum(v);
    return std::string("no error");
  });
  auto one = start(sock, 1, names, [](LocalGroup& g) {
    std::vector<float> v(4, 1.0f);
    g.allreduce_sum(v);
    return std::string("no error");
  });
  const std::string z = finish(zero);
  finish(one);
  EXPECT_NE(z.find("worker-1 (member 1 of 2) is at operation 0 (allreduce_sum of 4 elements), worker-0 (member 0 "
                   "of 2) at 0 (allreduce_sum of 3): the members disagree"),
            std::string::npos)
      << z;
}

TEST(LocalGroup, AGroupOfOneNeedsNoSocketAndAskingToStopEndsAWait) {
  LocalGroupOptions o;
  o.socket_path = "/nonexistent/dir/g.sock";
  o.members = {"worker-0"};
  auto g = LocalGroup::join(o);
  std::vector<float> v{1.5f};
  g->allreduce_sum(v);
  EXPECT_EQ(v[0], 1.5f);
  EXPECT_TRUE(g->pushes());
  // Member 1 of a group whose member 0 never comes, asked to stop while it waits.
  TempDir dir;
  std::atomic<bool> stop{false};
  LocalGroupOptions w;
  w.socket_path = dir.path.string() + "/none.sock";
  w.rank = 1;
  w.members = {"worker-0", "worker-1"};
  w.stop_requested = &stop;
  // The stop comes once the join has said that it waits (its log, caught here).
  auto ring = std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(16);
  const auto previous = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>("local-group-test", ring));
  std::thread t([&] {
    wait_until([&] {
      for (const auto& line : ring->last_formatted()) {
        if (line.find("waiting for worker-0") != std::string::npos) return true;
      }
      return false;
    }, std::chrono::seconds(10));
    stop = true;
  });
  EXPECT_THROW(LocalGroup::join(w), dltrain::ps::StopRequested);
  t.join();
  const auto said = ring->last_formatted();
  spdlog::set_default_logger(previous);
  EXPECT_TRUE(std::any_of(said.begin(), said.end(), [](const std::string& line) {
    return line.find("waiting for worker-0 (member 0 of 2) to open the group at") != std::string::npos;
  })) << "the join did not say that it waits";
  // A path too long for a Unix socket is a configuration error naming the limit.
  o.members = {"worker-0", "worker-1"};
  o.socket_path = std::string(200, 'x');
  try {
    LocalGroup::join(o);
    FAIL() << "a 200-byte socket path was accepted";
  } catch (const dltrain::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("1 to 107 bytes, got 200"), std::string::npos) << e.what();
  }
}
