// A control session that is only an identity (control::Session): what the leader's parts
// keep of an agent's connection (AgentRec::session) when a test plays the agent without a
// socket. Sending and closing do nothing.
#pragma once

#include <cstdint>
#include <string>

#include "control/server.h"

namespace dltrain::testing {

class SessionDouble : public control::Session {
 public:
  explicit SessionDouble(control::PeerKind kind = control::PeerKind::kAgent, std::uint64_t id = 1)
      : kind_(kind), id_(id), identity_(kind == control::PeerKind::kClient ? control::ClientIdentity{"admin", true}
                                                                          : control::ClientIdentity{}) {}
  void send(std::string) override {}
  void close() override {}
  control::PeerKind kind() const override { return kind_; }
  const std::string& peer() const override { return peer_; }
  std::uint64_t id() const override { return id_; }
  const control::ClientIdentity& identity() const override { return identity_; }

 private:
  control::PeerKind kind_;
  std::uint64_t id_;
  control::ClientIdentity identity_;
  std::string peer_ = "127.0.0.1:1";
};

}  // namespace dltrain::testing
