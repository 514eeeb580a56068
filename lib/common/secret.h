// Secrets on disk and in memory: private files (bearer tokens, job secrets), random bytes
// from OpenSSL's CSPRNG, and the hex form secrets travel in.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace dltrain {

/// Shortest job secret accepted, in bytes (256 bits).
inline constexpr std::size_t kMinJobSecretBytes = 32;

/// Reads the first line of a file that holds a secret (trailing spaces and CR removed).
/// The file must not be readable, writable or executable by group or others (mode 0600
/// or stricter), so that a secret left world-readable by mistake is refused rather than
/// used. `what` names the file in messages ("token file", "secret file"). Reads at most
/// 64 KiB. Throws ConfigError(field, ...) naming the path when the file cannot be opened,
/// is not a regular file, has a group/other mode bit set (the message gives the mode,
/// e.g. 0644, and says `chmod 600`), or is empty. Thread-safe.
std::string read_private_file(const std::string& path, const std::string& field,
                              const std::string& what = "token file");

/// The whole of a private file (a TLS private key, say), with the same checks as
/// read_private_file except that it may span lines; at most 1 MiB. Throws ConfigError as
/// read_private_file does. Thread-safe.
std::string read_private_file_text(const std::string& path, const std::string& field, const std::string& what);

/// The whole of a file that need not be private (a certificate, a CA bundle), at most
/// 1 MiB. Throws ConfigError(field, ...) naming the path and the reason (e.g. "No such
/// file or directory") when it cannot be read or is not a regular file, and when it is
/// empty. Thread-safe.
std::string read_file_text(const std::string& path, const std::string& field, const std::string& what);

/// `n` bytes from OpenSSL's CSPRNG (RAND_bytes). Throws Error when the generator fails.
/// Thread-safe.
std::vector<std::uint8_t> random_bytes(std::size_t n);

/// Lower-case hex of `bytes` (2 characters per byte).
std::string to_hex(std::span<const std::uint8_t> bytes);

/// Decodes a job secret from hex (either case): at least kMinJobSecretBytes bytes.
/// Throws ConfigError(field, ...) for an odd length, a non-hex character (its position is
/// named, never the secret) or a secret that is too short.
std::vector<std::uint8_t> job_secret_from_hex(std::string_view hex, const std::string& field);

/// A new random secret as hex (kMinJobSecretBytes bytes from the CSPRNG, 64 characters):
/// a job secret, or a bearer token of a standalone cluster. Throws Error when the
/// generator fails. Thread-safe.
std::string new_job_secret_hex();

/// Reads a job secret from a private file (read_private_file, then job_secret_from_hex).
/// Throws ConfigError(field, ...) as those do.
std::vector<std::uint8_t> read_job_secret_file(const std::string& path, const std::string& field);

/// Replaces `path` with a file of mode 0600 holding exactly `text`: written to
/// `path`.tmp (created 0600, never readable by others even for a moment; a symbolic link
/// there is refused), then renamed over `path`. Throws IoError naming the path.
void write_private_file(const std::string& path, const std::string& text);

}  // namespace dltrain
