// The `dltrain` client on its own, without a cluster: how it finds the leader and its
// token from a client configuration, and the errors and exit codes when it cannot.
// Each run gets an empty HOME (no ~/.config/dltrain/client.toml, no standalone file) and
// none of the DLTRAIN_* variables, so only the configuration the test writes is read.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "support/process.h"
#include "support/temp_dir.h"
#include "support/names.h"

namespace {

const std::string kBin = DLTRAIN_BIN_DIR;

// A loopback TCP port bound but not listening: a connection to it is refused at once,
// and nothing else can take the port while the test holds it.
class RefusingPort {
 public:
  RefusingPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (fd_ >= 0 && ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
      port_ = ntohs(a.sin_port);
    }
  }
  ~RefusingPort() {
    if (fd_ >= 0) ::close(fd_);
  }
  RefusingPort(const RefusingPort&) = delete;
  RefusingPort& operator=(const RefusingPort&) = delete;
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

struct ClientRun {
  TempDir dir{"dltrain-client-test"};
  fs::path home = dir.path / "home";
  fs::path config = dir.path / "client.toml";
  ClientRun() { fs::create_directory(home); }

  // `dltrain ARGS` with only `config` to find the leader from; stdout and stderr together.
  dltrain::testing::Result run(const std::string& args) const {
    return dltrain::testing::run("env -u DLTRAIN_LEADER -u DLTRAIN_TOKEN -u DLTRAIN_CA_FILE -u XDG_CONFIG_HOME "
                                 "-u XDG_STATE_HOME HOME=" + home.string() + " DLTRAIN_CLIENT_CONFIG=" +
                                     config.string() + " " + kBin + "/dltrain " + args + " 2>&1",
                                 60);
  }
};

TEST(ClientConfig, AMissingTokenFileIsAConfigErrorNamingTheConfigThePathAndTheReason) {
  ClientRun c;
  const fs::path token_file = c.dir.path / "no-such.token";
  std::ofstream(c.config) << "leader = \"ws://127.0.0.1:9\"\ntoken_file = \"" << token_file.string() << "\"\n";
  const auto r = c.run("list");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.out, "dltrain: token_file: client config " + c.config.string() + ": cannot read token file \"" +
                       token_file.string() + "\": No such file or directory\n");
}

TEST(ClientConfig, ATokenFileThatIsADirectoryOrEmptyIsAConfigErrorNamingIt) {
  ClientRun c;
  const fs::path dir_token = c.dir.path / "token.d";
  fs::create_directory(dir_token);
  std::ofstream(c.config) << "leader = \"ws://127.0.0.1:9\"\ntoken_file = \"" << dir_token.string() << "\"\n";
  auto r = c.run("agents");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.out, "dltrain: token_file: client config " + c.config.string() + ": token file \"" +
                       dir_token.string() + "\" is not a regular file\n");

  const fs::path empty_token = c.dir.path / "empty.token";
  std::ofstream{empty_token};
  std::ofstream(c.config) << "leader = \"ws://127.0.0.1:9\"\ntoken_file = \"" << empty_token.string() << "\"\n";
  r = c.run("agents");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.out, "dltrain: token_file: client config " + c.config.string() + ": token file \"" +
                       empty_token.string() + "\" is empty\n");
}

TEST(ClientConfig, AReadableTokenFileIsUsedAndTheClientGoesOnToTheLeader) {
  ClientRun c;
  RefusingPort port;
  ASSERT_GT(port.port(), 0);
  const std::string leader = "ws://127.0.0.1:" + std::to_string(port.port());
  const fs::path token_file = c.dir.path / "client.token";
  std::ofstream(token_file) << "client-secret\n";
  std::ofstream(c.config) << "leader = \"" << leader << "\"\ntoken_file = \"" << token_file.string() << "\"\n";
  const auto r = c.run("--timeout 5 list");
  // Past the token: the leader from the config is tried, and refuses the connection.
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_EQ(r.out.rfind("dltrain: cannot reach the leader at " + leader + " (from " + c.config.string() + "): ", 0),
            0u)
      << r.out;
}

TEST(ClientConfig, ATokenFromTheFlagsMeansTheConfigsTokenFileIsNotRead) {
  ClientRun c;
  RefusingPort port;
  ASSERT_GT(port.port(), 0);
  const std::string leader = "ws://127.0.0.1:" + std::to_string(port.port());
  std::ofstream(c.config) << "leader = \"" << leader << "\"\ntoken_file = \"" << (c.dir.path / "gone.token").string()
                          << "\"\n";
  const auto r = c.run("--token flag-secret --timeout 5 list");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_EQ(r.out.find("token_file"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.rfind("dltrain: cannot reach the leader at " + leader + " (from " + c.config.string() + "): ", 0),
            0u)
      << r.out;
}

TEST(ClientConfig, NoTokenAnywhereStillSaysSo) {
  std::error_code ec;
  if (fs::exists("/etc/dltrain/client.toml", ec)) GTEST_SKIP() << "/etc/dltrain/client.toml may hold a token";
  ClientRun c;
  std::ofstream(c.config) << "leader = \"ws://127.0.0.1:9\"\n";
  const auto r = c.run("list");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(r.out, "dltrain: token: no client token for ws://127.0.0.1:9: pass --token, set DLTRAIN_TOKEN or put "
                   "token in the client config\n");
}

}  // namespace
