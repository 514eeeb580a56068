// A leader candidate for the election tests (tests/integration/ha_election_test.py): it
// campaigns through ha::LeaderElection against a real etcd and, while it serves, issues
// an "order" every --order-ms: a write fenced by its term (EtcdClient::put_if on the
// election key's create_revision) under /dltrain-test/orders/<term>/<seq>, made only
// while serving() says its lease is certainly alive. What happens is printed to stdout,
// one JSON object per line: started, serving {term}, standing_by {leader, term},
// deposed {why}, trouble {why}, order {term, seq, revision}, order_refused {term, seq,
// current_term}, held_back {term} (an order not sent: serving() false), error {message}
// (exit 2: etcd could not be reached at start, or a bad setting).
#include <atomic>
#include <csignal>
#include <iostream>
#include <mutex>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "common/log.h"
#include "ha/election.h"

namespace {

std::atomic<bool> g_stop{false};
std::mutex g_out;

void say(const nlohmann::json& j) {
  std::lock_guard<std::mutex> lock(g_out);
  std::cout << j.dump() << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace dltrain;
  CLI::App app{"a dltrain leader candidate for the election tests"};
  ha::EtcdOptions etcd;
  ha::ElectionOptions el;
  int order_ms = 100;
  int margin_ms = 500;
  app.add_option("--etcd", etcd.endpoints, "etcd client URLs")->required()->delimiter(',');
  app.add_option("--user", etcd.user, "etcd user");
  app.add_option("--password", etcd.password, "etcd password");
  app.add_option("--name", el.candidate, "candidate name")->required();
  app.add_option("--ttl", el.ttl_seconds, "lease TTL, s")->capture_default_str();
  app.add_option("--margin-ms", margin_ms, "safety margin, ms")->capture_default_str();
  app.add_option("--order-ms", order_ms, "ms between orders")->capture_default_str();
  int request_ms = 1000;
  app.add_option("--request-ms", request_ms, "etcd request timeout, ms")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  el.address = "127.0.0.1:0";
  el.safety_margin = std::chrono::milliseconds(margin_ms);
  etcd.request_timeout = std::chrono::milliseconds(request_ms);
  init_logging(el.candidate, "warn");
  std::signal(SIGTERM, [](int) { g_stop = true; });
  std::signal(SIGINT, [](int) { g_stop = true; });
  try {
    ha::EtcdClient probe(etcd);
    say({{"event", "started"}, {"name", el.candidate}, {"etcd", probe.check()}});
  } catch (const std::exception& e) {
    say({{"event", "error"}, {"message", e.what()}});
    return 2;
  }
  std::unique_ptr<ha::LeaderElection> election;
  try {
    election = std::make_unique<ha::LeaderElection>(
        etcd, el,
        ha::LeaderElection::Callbacks{
            [&](std::int64_t term) { say({{"event", "serving"}, {"name", el.candidate}, {"term", term}}); },
            [&](std::int64_t, const std::string& why) {
              say({{"event", "deposed"}, {"name", el.candidate}, {"why", why}});
            },
            [&](const ha::LeaderInfo& l) {
              say({{"event", "standing_by"}, {"name", el.candidate}, {"leader", l.candidate}, {"term", l.term}});
            },
            [&](const std::string& why) { say({{"event", "trouble"}, {"name", el.candidate}, {"why", why}}); }});
  } catch (const std::exception& e) {
    say({{"event", "error"}, {"message", e.what()}});
    return 2;
  }
  election->start();
  ha::EtcdClient orders(etcd);
  std::int64_t seq = 0, last_term = 0;
  while (!g_stop) {
    std::this_thread::sleep_for(std::chrono::milliseconds(order_ms));
    const std::int64_t term = election->term();
    if (term == 0) {
      if (last_term != 0) say({{"event", "held_back"}, {"term", last_term}});
      last_term = 0;
      continue;
    }
    last_term = term;
    ++seq;
    try {
      const std::string key = "/dltrain-test/orders/" + std::to_string(term) + "/" + std::to_string(seq);
      const auto r = orders.put_if(el.key, term, key, el.candidate);
      if (r.succeeded) {
        say({{"event", "order"}, {"term", term}, {"seq", seq}, {"revision", r.revision}});
      } else {
        say({{"event", "order_refused"},
             {"term", term},
             {"seq", seq},
             {"current_term", r.current ? r.current->create_revision : 0}});
      }
    } catch (const std::exception& e) {
      say({{"event", "trouble"}, {"name", el.candidate}, {"why", std::string("order: ") + e.what()}});
    }
  }
  election->stop();
  say({{"event", "stopped"}, {"name", el.candidate}});
  return 0;
}
