// A real etcd for unit tests that need one (Debian's etcd-server): one member on
// loopback ports, started on first use and shared by every test of the binary, its data
// in a temporary directory; killed when the binary exits. Tests keep apart by key
// prefix. Without /usr/bin/etcd, shared() is null and the tests skip.
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>

#include "ha/etcd_client.h"
#include "support/process.h"
#include "support/temp_dir.h"

namespace dltrain::testing {

class EtcdServer {
 public:
  /// The binary's etcd, started on the first call; null without /usr/bin/etcd. Throws
  /// std::runtime_error when it does not serve within 60 s.
  static EtcdServer* shared() {
    static std::unique_ptr<EtcdServer> server = [] {
      return std::filesystem::exists("/usr/bin/etcd") ? std::make_unique<EtcdServer>() : nullptr;
    }();
    return server.get();
  }

  /// The client URL, "http://127.0.0.1:PORT".
  const std::string& url() const { return url_; }
  /// Options for a client of it.
  ha::EtcdOptions options() const {
    ha::EtcdOptions o;
    o.endpoints = {url_};
    return o;
  }

  EtcdServer() {
    // etcd cannot be given port 0 (its gateway dials the address it listens on): ports
    // the kernel picked, then released.
    url_ = "http://127.0.0.1:" + std::to_string(free_port());
    const std::string peer = "http://127.0.0.1:" + std::to_string(free_port());
    proc_ = std::make_unique<Background>(
        "/usr/bin/etcd --name unit --data-dir " + (dir_.path / "data").string() + " --listen-client-urls " + url_ +
            " --advertise-client-urls " + url_ + " --listen-peer-urls " + peer + " --initial-advertise-peer-urls " +
            peer + " --initial-cluster unit=" + peer,
        (dir_.path / "etcd.log").string());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      try {
        ha::EtcdClient c(options());
        c.put("/unit-test/ready", "1");
        return;
      } catch (const std::exception& e) {
        if (std::chrono::steady_clock::now() > deadline || proc_->wait(0) != -1) {
          throw std::runtime_error(std::string("etcd did not serve: ") + e.what());
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

 private:
  static unsigned short free_port() {
    boost::asio::io_context io;
    boost::asio::ip::tcp::acceptor a(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
    return a.local_endpoint().port();
  }

  TempDir dir_;
  std::string url_;
  std::unique_ptr<Background> proc_;
};

}  // namespace dltrain::testing
