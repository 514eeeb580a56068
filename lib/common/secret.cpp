#include "common/secret.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <openssl/rand.h>

#include "common/errors.h"

namespace dltrain {
namespace {

// Closes a file descriptor at scope exit.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The first `max_bytes` of a regular file; with `private_only`, refused when group or
// others have any access to it.
std::string read_file(const std::string& path, const std::string& field, const std::string& what,
                      std::size_t max_bytes, bool private_only) {
  // The mode is checked on the descriptor that is then read (no window between the
  // check and the read for the file to be swapped).
  Fd f{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (f.fd < 0) throw ConfigError(field, "cannot read " + what + " \"" + path + "\": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) {
    throw ConfigError(field, "cannot read " + what + " \"" + path + "\": " + std::strerror(errno));
  }
  if (!S_ISREG(st.st_mode)) throw ConfigError(field, what + " \"" + path + "\" is not a regular file");
  if (private_only && (st.st_mode & 077) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw ConfigError(field, what + " \"" + path + "\" has mode " + mode +
                                 ": it must not be readable by group or others (chmod 600)");
  }
  std::string text(max_bytes, '\0');
  std::size_t got = 0;
  while (got < max_bytes) {
    const ssize_t n = ::read(f.fd, text.data() + got, max_bytes - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw ConfigError(field, "cannot read " + what + " \"" + path + "\": " + std::strerror(errno));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  text.resize(got);
  return text;
}

}  // namespace

std::string read_private_file_text(const std::string& path, const std::string& field, const std::string& what) {
  std::string text = read_file(path, field, what, 1u << 20, true);
  if (text.empty()) throw ConfigError(field, what + " \"" + path + "\" is empty");
  return text;
}

std::string read_file_text(const std::string& path, const std::string& field, const std::string& what) {
  std::string text = read_file(path, field, what, 1u << 20, false);
  if (text.empty()) throw ConfigError(field, what + " \"" + path + "\" is empty");
  return text;
}

std::string read_private_file(const std::string& path, const std::string& field, const std::string& what) {
  const std::string text = read_file(path, field, what, 64 * 1024, true);
  std::string line = text.substr(0, text.find('\n'));
  while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
  if (line.empty()) throw ConfigError(field, what + " \"" + path + "\" is empty");
  return line;
}

std::vector<std::uint8_t> random_bytes(std::size_t n) {
  std::vector<std::uint8_t> b(n);
  if (n > 0 && RAND_bytes(b.data(), static_cast<int>(n)) != 1) throw Error("OpenSSL RAND_bytes failed");
  return b;
}

std::string to_hex(std::span<const std::uint8_t> bytes) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  s.reserve(2 * bytes.size());
  for (std::uint8_t c : bytes) {
    s += hex[c >> 4];
    s += hex[c & 15];
  }
  return s;
}

std::vector<std::uint8_t> job_secret_from_hex(std::string_view hex, const std::string& field) {
  if (hex.size() % 2 != 0) {
    throw ConfigError(field, "a job secret is hex, 2 characters per byte; got an odd length (" +
                                 std::to_string(hex.size()) + " characters)");
  }
  std::vector<std::uint8_t> out(hex.size() / 2);
  for (std::size_t i = 0; i < hex.size(); i += 2) {
    const int hi = hex_value(hex[i]), lo = hex_value(hex[i + 1]);
    if (hi < 0 || lo < 0) {
      throw ConfigError(field, "a job secret is hex; character " + std::to_string(i + (hi < 0 ? 1 : 2)) +
                                   " is not a hex digit");
    }
    out[i / 2] = static_cast<std::uint8_t>(hi << 4 | lo);
  }
  if (out.size() < kMinJobSecretBytes) {
    throw ConfigError(field, "a job secret needs at least " + std::to_string(kMinJobSecretBytes) + " bytes (" +
                                 std::to_string(2 * kMinJobSecretBytes) + " hex characters), got " +
                                 std::to_string(out.size()));
  }
  return out;
}

std::string new_job_secret_hex() { return to_hex(random_bytes(kMinJobSecretBytes)); }

std::vector<std::uint8_t> read_job_secret_file(const std::string& path, const std::string& field) {
  return job_secret_from_hex(read_private_file(path, field, "secret file"), field);
}

void write_private_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    Fd f{::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600)};
    if (f.fd < 0) throw IoError("cannot write \"" + tmp + "\": " + std::strerror(errno));
    // An existing file keeps its mode through O_TRUNC; make sure it is 0600.
    if (::fchmod(f.fd, 0600) != 0) throw IoError("cannot chmod \"" + tmp + "\": " + std::strerror(errno));
    std::size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = ::write(f.fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw IoError("cannot write \"" + tmp + "\": " + std::strerror(errno));
      done += static_cast<std::size_t>(n);
    }
    const int fd = f.fd;
    f.fd = -1;
    if (::close(fd) != 0) throw IoError("cannot write \"" + tmp + "\": " + std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    throw IoError("cannot write \"" + path + "\": " + std::strerror(errno));
  }
}

}  // namespace dltrain
