// Typed errors thrown at dltrain's library boundaries.
//
// Every message says what was expected and what was found, with the offending value,
// so that a user can fix the input without reading the source.
#pragma once

#include <stdexcept>
#include <string>

namespace dltrain {

/// Base class of every error dltrain throws on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A configuration or job file is malformed or names an invalid value.
/// `field()` is the dotted TOML path of the offending key (e.g. "optimizer.lr"),
/// empty when the problem is the file as a whole.
class ConfigError : public Error {
 public:
  ConfigError(std::string field, const std::string& message)
      : Error(field.empty() ? message : field + ": " + message), field_(std::move(field)) {}
  const std::string& field() const noexcept { return field_; }

 private:
  std::string field_;
};

/// A peer sent bytes that violate the wire or control protocol.
class ProtocolError : public Error {
 public:
  using Error::Error;
};

/// A file, socket or process operation failed.
class IoError : public Error {
 public:
  using Error::Error;
};

/// A caller broke a documented precondition of a function: sizes that must match do not,
/// an input that must be non-empty is empty, a weight that must be positive is not. A
/// programming error of the caller, never caused by a peer or a file.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// A wait ran past its deadline.
/// Training diverged: the loss or gradient stayed NaN/Inf for too many steps in a row.
class DivergedError : public Error {
 public:
  using Error::Error;
};

class TimeoutError : public Error {
 public:
  using Error::Error;
};

}  // namespace dltrain
