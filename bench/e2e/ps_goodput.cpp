// PS data-plane goodput against raw TCP between the same two endpoints, in one run.
//
// Both ends read the job secret the data-plane handshake proves from --secret-file (hex,
// mode 0600), as dltrain's tasks do.
//
//   ps_goodput serve --secret-file F [--bind ADDR]
//     Starts a raw TCP echo-exchange server and a real PS shard server (ps::PsServer with
//     momentum SGD), prints {"raw_port":R,"ps_port":P} on one line, serves until stdin
//     closes or SIGTERM.
//   ps_goodput measure --secret-file F --host H --raw-port R --ps-port P [--floats N] [--rounds K] [--seconds S]
//     Alternates K rounds of: S seconds of a raw one-way TCP stream (timed until the
//     server confirms the last byte), S seconds of raw exchanges (write N·4 bytes, read
//     N·4 bytes back: the bytes and round trips of a dense push+pull, without framing or
//     arithmetic) and S seconds of dltrain dense push+pull of N floats. Prints one JSON
//     object with the payload goodput of each round (MB/s, 10^6 bytes; for exchanges and
//     push+pull both directions counted) and the medians.
//
// The raw stream is the physical limit of the link; PS goodput over it is the data
// plane's efficiency (docs/benchmarks/e2e.md, "PS data plane").
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <iostream>
#include <thread>
#include <vector>

#include <boost/asio.hpp>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/secret.h"
#include "ps/client.h"
#include "ps/partition.h"
#include "ps/server.h"
#include "ps/shard_state.h"

namespace asio = boost::asio;
using asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

constexpr std::uint64_t kJob = 1;
constexpr std::uint32_t kGeneration = 1;

/// Raw server: per connection, reads an 8-byte size. Size 0 is a stream: read and discard
/// until the peer shuts its side down, then answer with the 8-byte count received. Other
/// sizes are exchanges: repeatedly read that many bytes and write as many back until the
/// peer closes.
void raw_serve(tcp::acceptor& acceptor) {
  for (;;) {
    boost::system::error_code ec;
    tcp::socket s(acceptor.get_executor());
    acceptor.accept(s, ec);
    if (ec) return;
    std::thread([s = std::move(s)]() mutable {
      try {
        s.set_option(tcp::no_delay(true));
        std::uint64_t size = 0;
        asio::read(s, asio::buffer(&size, sizeof size));
        if (size > (1ull << 30)) return;
        if (size == 0) {
          std::vector<char> sink(1 << 20);
          std::uint64_t total = 0;
          boost::system::error_code rec;
          for (;;) {
            const auto got = s.read_some(asio::buffer(sink), rec);
            total += got;
            if (rec) break;
          }
          asio::write(s, asio::buffer(&total, sizeof total));
          return;
        }
        std::vector<char> buf(size);
        for (;;) {
          asio::read(s, asio::buffer(buf));
          asio::write(s, asio::buffer(buf));
        }
      } catch (const std::exception&) {
        // peer closed
      }
    }).detach();
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

int serve(const std::string& bind, const std::vector<std::uint8_t>& secret) {
  asio::io_context io;
  tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address(bind), 0));
  std::thread raw([&] { raw_serve(acceptor); });
  dltrain::ps::PsServerOptions opt;
  opt.bind_address = bind;
  opt.job = kJob;
  opt.generation = kGeneration;
  opt.secret = secret;
  dltrain::ps::PsServer server(opt, std::make_shared<dltrain::ps::ShardState>(0.9));
  server.start();
  std::cout << nlohmann::json{{"raw_port", acceptor.local_endpoint().port()}, {"ps_port", server.port()}}.dump()
            << std::endl;
  std::string line;
  while (std::getline(std::cin, line)) {
  }
  server.stop();
  // close() alone does not wake a thread blocked in accept(); shutdown() does (Linux).
  ::shutdown(acceptor.native_handle(), SHUT_RDWR);
  acceptor.close();
  raw.join();
  return 0;
}

int measure(const std::string& host, std::uint16_t raw_port, std::uint16_t ps_port, std::int64_t floats,
            int rounds, double seconds, const std::vector<std::uint8_t>& secret) {
  const std::uint64_t bytes = static_cast<std::uint64_t>(floats) * 4;
  // Raw exchange connection.
  asio::io_context io;
  tcp::socket raw(io);
  raw.connect(tcp::endpoint(asio::ip::make_address(host), raw_port));
  raw.set_option(tcp::no_delay(true));
  asio::write(raw, asio::buffer(&bytes, sizeof bytes));
  std::vector<char> out(bytes, 1), in(bytes);
  // PS client with the same number of floats in one tensor, cut into partitions as a
  // worker would.
  auto layout = dltrain::ps::make_layout({floats}, 262144, 1);
  dltrain::ps::PsClientOptions popt;
  popt.job = kJob;
  popt.generation = kGeneration;
  popt.secret = secret;
  dltrain::ps::PsClient client({{host, ps_port}}, layout, popt);
  client.connect();
  std::vector<float> params(static_cast<std::size_t>(floats), 0.5f), grad(params.size(), 1e-3f);
  client.init(params);
  client.pull(params);

  std::vector<double> stream_mbps, raw_mbps, ps_mbps, ps_wire_mbps;
  for (int r = 0; r < rounds; ++r) {
    {
      tcp::socket st(io);
      st.connect(tcp::endpoint(asio::ip::make_address(host), raw_port));
      const std::uint64_t zero = 0;
      asio::write(st, asio::buffer(&zero, sizeof zero));
      const auto ts = Clock::now();
      while (std::chrono::duration<double>(Clock::now() - ts).count() < seconds) asio::write(st, asio::buffer(out));
      st.shutdown(tcp::socket::shutdown_send);
      std::uint64_t received = 0;
      asio::read(st, asio::buffer(&received, sizeof received));
      const double dts = std::chrono::duration<double>(Clock::now() - ts).count();
      stream_mbps.push_back(static_cast<double>(received) / dts / 1e6);
    }
    auto t0 = Clock::now();
    std::uint64_t n = 0;
    while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds) {
      asio::write(raw, asio::buffer(out));
      asio::read(raw, asio::buffer(in));
      ++n;
    }
    double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    raw_mbps.push_back(2.0 * static_cast<double>(bytes * n) / dt / 1e6);

    const auto w0 = client.bytes_pushed() + client.bytes_pulled();
    t0 = Clock::now();
    n = 0;
    while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds) {
      client.push_pull(grad, 0.0f, params);  // lr 0: the parameters stay finite forever
      ++n;
    }
    dt = std::chrono::duration<double>(Clock::now() - t0).count();
    ps_mbps.push_back(2.0 * static_cast<double>(bytes * n) / dt / 1e6);
    ps_wire_mbps.push_back(static_cast<double>(client.bytes_pushed() + client.bytes_pulled() - w0) / dt / 1e6);
  }
  const double stream_med = median(stream_mbps), raw_med = median(raw_mbps), ps_med = median(ps_mbps);
  std::cout << nlohmann::json{{"floats", floats},
                              {"payload_bytes_each_way", bytes},
                              {"seconds_per_round", seconds},
                              {"stream_mb_per_s", stream_mbps},
                              {"exchange_mb_per_s", raw_mbps},
                              {"ps_mb_per_s", ps_mbps},
                              {"ps_wire_mb_per_s", ps_wire_mbps},
                              {"stream_median_mb_per_s", stream_med},
                              {"exchange_median_mb_per_s", raw_med},
                              {"ps_median_mb_per_s", ps_med},
                              {"ps_over_stream", stream_med > 0 ? ps_med / stream_med : 0.0},
                              {"ps_over_exchange", raw_med > 0 ? ps_med / raw_med : 0.0}}
                   .dump()
            << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"PS data-plane goodput against raw TCP (end-to-end benchmark probe)"};
  app.require_subcommand(1);
  std::string bind = "127.0.0.1", host = "127.0.0.1", secret_file;
  std::uint16_t raw_port = 0, ps_port = 0;
  std::int64_t floats = 702602;
  int rounds = 5;
  double seconds = 2.0;
  auto* s = app.add_subcommand("serve", "run the raw and PS servers");
  s->add_option("--bind", bind, "address to listen on");
  s->add_option("--secret-file", secret_file, "job secret (hex, mode 0600)")->required();
  auto* m = app.add_subcommand("measure", "measure against a running `serve`");
  m->add_option("--host", host, "server address");
  m->add_option("--secret-file", secret_file, "job secret (hex, mode 0600)")->required();
  m->add_option("--raw-port", raw_port, "raw stream/exchange port")->required();
  m->add_option("--ps-port", ps_port, "PS port")->required();
  m->add_option("--floats", floats, "floats per push and per pull")->check(CLI::Range(1, 1 << 26));
  m->add_option("--rounds", rounds, "alternating rounds")->check(CLI::Range(1, 100));
  m->add_option("--seconds", seconds, "seconds per measurement")->check(CLI::Range(0.1, 60.0));
  CLI11_PARSE(app, argc, argv);
  try {
    const auto secret = dltrain::read_job_secret_file(secret_file, "--secret-file");
    if (*s) return serve(bind, secret);
    return measure(host, raw_port, ps_port, floats, rounds, seconds, secret);
  } catch (const std::exception& e) {
    std::cerr << "ps_goodput: " << e.what() << '\n';
    return 1;
  }
}
