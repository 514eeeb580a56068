// dltrain-ps: one PS shard task of one job. Listens on an ephemeral port, announces it on
// stdout as {"event":"listening","port":P}, serves workers that prove they know the job
// secret (read from --secret-file, which must be mode 0600 or stricter) until
// SIGTERM/SIGINT, then prints {"event":"stopped",...} and exits 0. Exit code 2: a
// configuration error (e.g. a secret file readable by others); 1: any other failure.
#include <csignal>
#include <iostream>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "common/errors.h"
#include "common/log.h"
#include "common/secret.h"
#include "ps/server.h"

int main(int argc, char** argv) {
  CLI::App app{"dltrain PS shard task: holds partitions of a job's parameters, applies pushes, answers pulls"};
  dltrain::ps::PsServerOptions opt;
  double momentum = 0.9;
  int shard = 0;
  std::string log_level = "info", secret_file;
  app.add_option("--job-id", opt.job, "numeric job id")->required();
  app.add_option("--generation", opt.generation, "job generation");
  app.add_option("--secret-file", secret_file, "file holding the job secret (hex; mode 0600 or stricter)")
      ->required();
  app.add_option("--shard", shard, "shard index, 0-based");
  app.add_option("--momentum", momentum, "heavy-ball momentum in [0, 1)")->check(CLI::Range(0.0, 0.999999));
  app.add_option("--threads", opt.threads, "I/O threads")->check(CLI::Range(1, 1024));
  app.add_option("--bind", opt.bind_address, "address to listen on");
  app.add_option("--port", opt.port, "port to listen on (0 = ephemeral)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error");
  CLI11_PARSE(app, argc, argv);
  try {
    dltrain::init_logging("ps-" + std::to_string(shard), log_level);
    opt.secret = dltrain::read_job_secret_file(secret_file, "--secret-file");
    auto state = std::make_shared<dltrain::ps::ShardState>(momentum);
    dltrain::ps::PsServer server(opt, state);
    server.start();
    std::cout << nlohmann::json{{"event", "listening"}, {"port", server.port()}, {"shard", shard}}.dump()
              << '\n' << std::flush;
    spdlog::info("PS shard {} of job {} listening on {}:{}", shard, opt.job, opt.bind_address, server.port());
    boost::asio::io_context io;
    boost::asio::signal_set signals(io, SIGTERM, SIGINT);
    signals.async_wait([&](auto, int sig) { spdlog::info("signal {}: stopping", sig); });
    io.run();
    server.stop();
    std::cout << nlohmann::json{{"event", "stopped"},
                                {"shard", shard},
                                {"pushes", state->pushes()},
                                {"bytes_in", server.bytes_in()},
                                {"bytes_out", server.bytes_out()},
                                {"rejected_connections", server.rejected_connections()}}
                     .dump()
              << '\n' << std::flush;
    return 0;
  } catch (const dltrain::ConfigError& e) {
    spdlog::error("{}", e.what());
    std::cout << nlohmann::json{{"event", "error"}, {"message", e.what()}}.dump() << '\n' << std::flush;
    return 2;
  } catch (const std::exception& e) {
    spdlog::error("{}", e.what());
    std::cout << nlohmann::json{{"event", "error"}, {"message", e.what()}}.dump() << '\n' << std::flush;
    return 1;
  }
}
