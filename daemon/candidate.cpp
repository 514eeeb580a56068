#include "candidate.h"

#include <boost/asio/post.hpp>
#include <spdlog/spdlog.h>

#include "common/errors.h"
#include "common/host_port.h"
#include "ha/etcd_store.h"

namespace dltrain::daemon {

namespace asio = boost::asio;


Candidacy::Candidacy(asio::io_context& io, const config::AgentOptions& opt, agent::SystemdNotifier& notifier)
    : io_(io), opt_(opt), notifier_(notifier), retry_timer_(io) {
  etcd_.endpoints = opt.ha.etcd;
  etcd_.user = opt.ha.user;
  etcd_.password = opt.ha.password;
  etcd_.ca_file = opt.ha.ca_file;
  etcd_.cert_file = opt.ha.cert_file;
  etcd_.key_file = opt.ha.key_file;
  etcd_.request_timeout = opt.ha.request_timeout;
  key_ = opt.ha.prefix + "/leader";
  candidates_prefix_ = opt.ha.prefix + "/candidates/";
  if (opt.listen_port == 0) {
    throw ConfigError("listen_port", "a leader candidate ([ha]) needs a fixed port: agents and clients list it");
  }
  election_opt_.key = key_;
  election_opt_.candidate = opt.name;
  election_opt_.address = format_host_port(opt.advertise_address, opt.listen_port);
  election_opt_.ttl_seconds = opt.ha.lease_ttl_seconds;
  election_opt_.safety_margin = std::chrono::milliseconds(std::min(1000, 250 * opt.ha.lease_ttl_seconds));
  election_opt_.candidates_prefix = candidates_prefix_;
  try {
    election_ = make_election();
  } catch (const ConfigError& e) {
    throw ConfigError("ha." + e.field(), e.what());
  }
  if (!opt.state_dir.empty()) {
    leader::ModelReplica::Options ro;
    ro.candidate = opt.name;
    ro.state_dir = opt.state_dir;
    ro.retention = opt.model_retention;
    ro.agent_token = opt.agent_token;
    ro.tls = !opt.tls_cert_file.empty();
    ro.tls_options = control::TlsClientOptions{opt.tls_ca_file, "", "tls_ca_file"};
    replica_ = std::make_shared<leader::ModelReplica>(io, ro);
  }
}

std::unique_ptr<ha::LeaderElection> Candidacy::make_election() {
  // Callbacks run on the election's thread: each is posted to the daemon's loop, where
  // the leader lives. `alive_` drops what arrives after this object is gone.
  std::weak_ptr<bool> alive = alive_;
  ha::LeaderElection::Callbacks cb;
  cb.elected = [this, alive](std::int64_t term) {
    asio::post(io_, [this, alive, term] {
      if (alive.lock()) become_leader(term);
    });
  };
  cb.deposed = [this, alive](std::int64_t term, const std::string& why) {
    asio::post(io_, [this, alive, term, why] {
      if (alive.lock()) step_down(term, why);
    });
  };
  cb.standing_by = [this, alive](const ha::LeaderInfo& l) {
    asio::post(io_, [this, alive, l] {
      if (!alive.lock()) return;
      spdlog::info("standing by: {} serves at {} (term {})", l.candidate, l.address, l.term);
      notifier_.status("standing by: " + l.candidate + " serves at " + l.address + " (term " + std::to_string(l.term) + ")");
      // Copies the serving leader's models and uploads while it stands by; not while its
      // own leader runs (a notice can arrive late).
      if (replica_ && !leader_ && l.candidate != opt_.name && !l.address.empty()) replica_->follow(l.address);
    });
  };
  cb.trouble = [](const std::string& why) { spdlog::warn("leader election: {}", why); };
  return std::make_unique<ha::LeaderElection>(etcd_, election_opt_, std::move(cb));
}

Candidacy::~Candidacy() { stop(); }

void Candidacy::start() {
  try {
    ha::EtcdClient probe(etcd_);
    spdlog::info("leader candidate {}: {}", opt_.name, probe.check());
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError("ha.etcd", std::string("etcd cannot be used: ") + e.what());
  }
  election_->start();
}

void Candidacy::stop() {
  alive_.reset();
  retry_timer_.cancel();
  if (replica_) replica_->stop();
  if (leader_) {
    leader_->stop();
    leader_.reset();
  }
  if (election_) election_->stop();  // resigns when it serves
}

void Candidacy::become_leader(std::int64_t term) {
  if (!election_ || election_->term() != term || leader_) return;  // that term is over already
  // The leader opens the stores the standby copied into: the copy stops first (a file
  // half fetched is dropped).
  if (replica_) replica_->stop();
  ha::EtcdOptions etcd = etcd_;
  const std::string prefix = opt_.ha.prefix, key = key_;
  std::weak_ptr<bool> alive = alive_;
  leader::LeaderTerm t;
  t.term = term;
  ha::LeaderElection* election = election_.get();  // outlives the leader: stop() ends the leader first
  t.serving = [election, term] { return election->term() == term; };
  t.open_store = [this, etcd, prefix, key, term, alive]() -> std::unique_ptr<store::Store> {
    return std::make_unique<ha::EtcdStore>(etcd, prefix, key, term, [this, alive, term](const std::string& why) {
      // On the io thread already (the leader writes from it); stepping down is posted so
      // that the write's caller finishes first.
      asio::post(io_, [this, alive, term, why] {
        if (alive.lock()) step_down(term, why);
      });
    });
  };
  // The candidates as the election's thread last read them: no etcd request on the loop.
  t.candidates = [election] { return election->candidates(); };
  try {
    leader_.emplace(io_, opt_, std::move(t));
    leader_->start();
    term_ = term;
  } catch (const std::exception& e) {
    // It cannot lead (its port taken, etcd unreadable): give the term up so that another
    // candidate leads, and campaign again after a pause.
    spdlog::error("elected (term {}) but the leader cannot start: {}; resigning, campaigning again in 10 s", term,
                  e.what());
    notifier_.status("the leader could not start: " + std::string(e.what()));
    leader_.reset();
    election_->stop();
    election_ = make_election();
    retry_timer_.expires_after(std::chrono::seconds(10));
    retry_timer_.async_wait([this, alive](boost::system::error_code ec) {
      if (!ec && alive.lock() && election_) election_->start();
    });
    return;
  }
  spdlog::info("serving as the leader on {}:{}, term {}", opt_.listen_address, leader_->port(), term);
  notifier_.status("serving as the leader, term " + std::to_string(term));
}

void Candidacy::step_down(std::int64_t term, const std::string& why) {
  if (!leader_ || term != term_) return;
  spdlog::warn("stepping down (term {}): {}; standing by", term_, why);
  leader_->stop();
  leader_.reset();
  term_ = 0;
  notifier_.status("standing by (stepped down: " + why + ")");
}

void Candidacy::collect_metrics(control::MetricsBuilder& out) const {
  const control::MetricLabels l{{"candidate", opt_.name}};
  out.gauge("dltrain_ha_serving", "1 while this leader candidate serves as the leader (docs/ha.md), 0 standing by", l,
            leader_ ? 1 : 0);
  out.gauge("dltrain_ha_term", "The term this candidate serves (the etcd election key's create revision); 0 standing by",
            l, static_cast<double>(term_));
}

}  // namespace dltrain::daemon
