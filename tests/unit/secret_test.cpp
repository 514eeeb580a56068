// Secret files and job secrets (common/secret.h): the mode check shared by token files and
// job secret files, the hex form, and private writes.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "common/secret.h"
#include "support/temp_dir.h"
#include "support/error_of.h"

using namespace dltrain;
using dltrain::testing::TempDir;
namespace fs = std::filesystem;

using dltrain::testing::message_of;

namespace {

const std::string kHex = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

void write_file(const fs::path& p, const std::string& text, mode_t mode) {
  std::ofstream(p) << text;
  ASSERT_EQ(::chmod(p.c_str(), mode), 0);
}

mode_t mode_of(const fs::path& p) {
  struct stat st {};
  EXPECT_EQ(::stat(p.c_str(), &st), 0);
  return st.st_mode & 07777;
}

}  // namespace

TEST(SecretFile, OnlyOwnerReadableFilesAreRead) {
  TempDir d;
  const auto f = d.path / "job.secret";
  write_file(f, kHex + "\r\nignored second line\n", 0600);
  EXPECT_EQ(read_private_file(f.string(), "--secret-file", "secret file"), kHex);
  write_file(f, kHex + "\n", 0400);
  EXPECT_EQ(read_private_file(f.string(), "--secret-file", "secret file"), kHex);
  for (mode_t bad : {0644, 0640, 0604, 0660, 0606, 0620}) {
    ASSERT_EQ(::chmod(f.c_str(), bad), 0);
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", bad);
    EXPECT_EQ(message_of<ConfigError>([&] { read_private_file(f.string(), "--secret-file", "secret file"); }),
              "--secret-file: secret file \"" + f.string() + "\" has mode " + mode +
                  ": it must not be readable by group or others (chmod 600)");
  }
  // Token files go through the same check (the default wording).
  ASSERT_EQ(::chmod(f.c_str(), 0644), 0);
  EXPECT_NE(message_of<ConfigError>([&] { read_private_file(f.string(), "agent_token_file"); })
                .find("agent_token_file: token file \"" + f.string() + "\" has mode 0644"),
            std::string::npos);
  write_file(f, "\n", 0600);
  EXPECT_EQ(message_of<ConfigError>([&] { read_private_file(f.string(), "k", "secret file"); }),
            "k: secret file \"" + f.string() + "\" is empty");
  EXPECT_NE(message_of<ConfigError>([&] { read_private_file((d.path / "absent").string(), "k"); }).find("No such file"),
            std::string::npos);
  ASSERT_EQ(::chmod(d.path.c_str(), 0700), 0);
  EXPECT_EQ(message_of<ConfigError>([&] { read_private_file(d.path.string(), "k", "secret file"); }),
            "k: secret file \"" + d.path.string() + "\" is not a regular file");
}

TEST(SecretFile, JobSecretsAreHexOfAtLeast32Bytes) {
  const auto s = job_secret_from_hex(kHex, "secret");
  ASSERT_EQ(s.size(), 32u);
  EXPECT_EQ(s[0], 0x00);
  EXPECT_EQ(s[1], 0x11);
  EXPECT_EQ(s[15], 0xff);
  EXPECT_EQ(to_hex(s), kHex);
  std::string upper = kHex;
  for (auto& c : upper) c = static_cast<char>(std::toupper(c));
  EXPECT_EQ(job_secret_from_hex(upper, "secret"), s);
  EXPECT_EQ(message_of<ConfigError>([&] { job_secret_from_hex(kHex.substr(1), "secret"); }),
            "secret: a job secret is hex, 2 characters per byte; got an odd length (63 characters)");
  std::string bad = kHex;
  bad[10] = 'g';
  // The message gives the position, never the secret.
  EXPECT_EQ(message_of<ConfigError>([&] { job_secret_from_hex(bad, "secret"); }),
            "secret: a job secret is hex; character 11 is not a hex digit");
  EXPECT_EQ(message_of<ConfigError>([&] { job_secret_from_hex(kHex.substr(0, 62), "secret"); }),
            "secret: a job secret needs at least 32 bytes (64 hex characters), got 31");
  const auto a = new_job_secret_hex(), b = new_job_secret_hex();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
  EXPECT_EQ(job_secret_from_hex(a, "secret").size(), 32u);
}

TEST(SecretFile, PrivateWritesAreMode0600EvenOverAnOpenFile) {
  TempDir d;
  const auto f = d.path / "job.secret";
  write_private_file(f.string(), kHex + "\n");
  EXPECT_EQ(mode_of(f), 0600u);
  EXPECT_EQ(read_job_secret_file(f.string(), "--secret-file"), job_secret_from_hex(kHex, "x"));
  // A world-readable file in the way (and a stale temporary) are replaced, not reused.
  write_file(f, "old", 0644);
  write_file(f.string() + ".tmp", "older", 0644);
  write_private_file(f.string(), "new\n");
  EXPECT_EQ(mode_of(f), 0600u);
  EXPECT_EQ(read_private_file(f.string(), "k"), "new");
  EXPECT_FALSE(fs::exists(f.string() + ".tmp"));
  EXPECT_THROW(write_private_file((d.path / "no-such-dir" / "x").string(), "y"), IoError);
}
