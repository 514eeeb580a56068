#include "leader/model_replica.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <spdlog/spdlog.h>

#include "common/errors.h"
#include "job/job_spec.h"
#include "wire/control.h"
#include "wire/control_bodies.h"

namespace dltrain::leader {

namespace fs = std::filesystem;
using json = nlohmann::json;

ModelReplica::ModelReplica(boost::asio::io_context& io, Options opt)
    : io_(io), opt_(std::move(opt)), retry_timer_(io), request_timer_(io) {}

ModelReplica::~ModelReplica() { stop(); }

void ModelReplica::follow(const std::string& address) {
  if (address == address_ && link_) return;
  stop();
  address_ = address;
  failures_ = 0;
  try {
    models_ = std::make_unique<ModelStore>((fs::path(opt_.state_dir) / "models").string(), opt_.retention);
    uploads_ = std::make_unique<UploadStore>((fs::path(opt_.state_dir) / "uploads").string(), opt_.retention);
  } catch (const std::exception& e) {
    spdlog::error("standby: cannot open the stores to copy the leader's models into: {}; copying nothing", e.what());
    models_.reset();
    uploads_.reset();
    return;
  }
  connect();
}

void ModelReplica::stop() {
  address_.clear();
  retry_timer_.cancel();
  request_timer_.cancel();
  if (link_) {
    link_->close();
    link_.reset();
  }
  writer_.reset();  // removes its part file
  if (!staging_.empty()) {
    std::error_code ec;
    fs::remove_all(staging_, ec);
    staging_.clear();
  }
  queue_.clear();
  pending_.clear();
  models_.reset();
  uploads_.reset();
}

void ModelReplica::connect() {
  if (address_.empty()) return;
  const std::string url = (opt_.tls ? "wss://" : "ws://") + address_;
  try {
    link_ = std::make_shared<control::ControlClient>(io_, url, opt_.agent_token, control::PeerKind::kAgent,
                                                     opt_.tls_options);
  } catch (const std::exception& e) {
    link_.reset();
    return retry_later(e.what());
  }
  std::weak_ptr<ModelReplica> w = weak_from_this();
  link_->on_message = [w, current = link_.get()](const std::string& text) {
    auto self = w.lock();
    if (self && self->link_.get() == current) self->on_message(text);
  };
  link_->on_close = [w, current = link_.get()](const std::string& reason) {
    auto self = w.lock();
    if (self && self->link_.get() == current) self->retry_later("connection closed: " + reason);
  };
  link_->connect(std::chrono::seconds(10), [w, current = link_.get()](std::exception_ptr err) {
    auto self = w.lock();
    if (!self || self->link_.get() != current) return;
    if (err) {
      try {
        std::rethrow_exception(err);
      } catch (const std::exception& e) {
        return self->retry_later(e.what());
      }
    }
    if (self->failures_ == 0) spdlog::info("standby: copying the models and uploads of the leader at {}", self->address_);
    self->ask();
  });
}

void ModelReplica::retry_later(const std::string& why) {
  if (link_) {
    link_->close();
    link_.reset();
  }
  request_timer_.cancel();
  pending_.clear();
  writer_.reset();
  queue_.clear();
  if (!staging_.empty()) {
    std::error_code ec;
    fs::remove_all(staging_, ec);  // the files of a model half copied
    staging_.clear();
  }
  if (address_.empty()) return;
  // 0.5 s doubling to 8 s: a leader that has just gone is usually replaced within a TTL.
  const auto delay = std::chrono::milliseconds(std::min(8000, 500 << std::min(failures_, 4)));
  ++failures_;
  spdlog::log(failures_ <= 1 ? spdlog::level::info : spdlog::level::debug,
              "standby: copying from the leader at {}: {}; trying again in {} ms", address_, why, delay.count());
  retry_timer_.expires_after(delay);
  retry_timer_.async_wait([w = weak_from_this()](boost::system::error_code ec) {
    auto self = w.lock();
    if (!ec && self && !self->link_) self->connect();
  });
}

void ModelReplica::send(wire::ControlType type, const json& body) {
  pending_ = "replica-" + std::to_string(next_id_++);
  link_->send(wire::make_request(pending_, type, body));
  // A replicate request that is in sync waits at the leader up to kHold.
  const auto limit = opt_.request_timeout + (type == wire::ControlType::kReplicate
                                                 ? std::chrono::duration_cast<std::chrono::milliseconds>(
                                                       wire::ReplicateBody::kHold)
                                                 : std::chrono::milliseconds(0));
  request_timer_.expires_after(limit);
  request_timer_.async_wait([w = weak_from_this(), id = pending_, limit](boost::system::error_code ec) {
    auto self = w.lock();
    if (ec || !self || self->pending_ != id) return;
    self->retry_later("no answer within " + std::to_string(limit.count()) + " ms");
  });
}

void ModelReplica::ask() {
  if (!link_ || !models_) return;
  wire::ReplicateBody b;
  b.candidate = opt_.candidate;
  for (const auto& m : models_->list()) b.models.push_back(m.key());
  b.uploads = uploads_->list();
  send(wire::ControlType::kReplicate, b.to_json());
}

void ModelReplica::on_message(const std::string& text) {
  wire::Envelope env;
  try {
    env = wire::parse_envelope(text);
  } catch (const std::exception& e) {
    return retry_later(std::string("a malformed message: ") + e.what());
  }
  if (!env.is(wire::ControlType::kReply) || env.id != pending_) return;  // events, late replies
  pending_.clear();
  request_timer_.cancel();
  const bool asking = queue_.empty();
  if (!env.ok) {
    const std::string why = env.error.value("message", std::string("?"));
    if (asking) return retry_later("the leader: " + why);  // e.g. unavailable: its term ended
    return skip(why);
  }
  try {
    if (asking) {
      on_inventory(wire::parse_body<wire::ReplicaInventoryBody>(env));
    } else {
      on_chunk(wire::parse_body<wire::ModelFileChunkBody>(env));
    }
  } catch (const std::exception& e) {
    if (asking) return retry_later(std::string("a bad inventory: ") + e.what());
    skip(e.what());
  }
}

void ModelReplica::on_inventory(const wire::ReplicaInventoryBody& inv) {
  std::set<std::string> held, kept_jobs(inv.jobs.begin(), inv.jobs.end()), listed;
  for (const auto& m : models_->list()) held.insert(m.key());
  std::int64_t bytes = 0;
  for (const auto& mj : inv.models) {
    ModelManifest m;
    try {
      m = ModelManifest::from_json(mj);
      // Names that become paths here: one component each, not hidden (the store's
      // staging directory is one), files of a model only.
      wire::check_path_name(m.job, "job", "replicate");
      wire::check_path_name(m.checkpoint, "checkpoint", "replicate");
      if (m.job.front() == '.' || m.checkpoint.front() == '.') throw ProtocolError("a name starting with \".\"");
      for (const auto& f : m.files) {
        if (!wire::is_model_file(f.name) || !is_sha256_hex(f.sha256) || f.bytes < 0) {
          throw ProtocolError("file \"" + f.name + "\" is not a model file");
        }
      }
    } catch (const std::exception& e) {
      spdlog::warn("standby: not copied: a model the leader lists ({}): {}", mj.dump().substr(0, 200), e.what());
      continue;
    }
    kept_jobs.insert(m.job);
    listed.insert(m.key());
    if (held.count(m.key())) continue;
    bytes += m.bytes();
    queue_.push_back(Item{false, std::move(m), {}});
  }
  const auto have = uploads_->list();
  const std::set<std::string> have_uploads(have.begin(), have.end()), listed_uploads(inv.uploads.begin(), inv.uploads.end());
  std::size_t uploads = 0;
  for (const auto& u : inv.uploads) {
    if (!is_sha256_hex(u) || have_uploads.count(u)) continue;
    queue_.push_back(Item{true, {}, u});
    ++uploads;
  }
  // The uploads mirror the leader's: what it no longer keeps goes here too.
  for (const auto& u : have) {
    if (!listed_uploads.count(u)) uploads_->remove(u);
  }
  failures_ = 0;  // a leader that answers: the back-off starts again
  // The models of the jobs the leader retired go here too; a model of a job it still
  // keeps but does not list stays (this candidate may have stored it as an earlier
  // leader: it is served again when this one leads).
  for (const auto& m : models_->list()) {
    if (!listed.count(m.key()) && !kept_jobs.count(m.job)) {
      spdlog::info("standby: removing the models of {}: the leader no longer keeps the job", m.job);
      models_->remove_job(m.job);
    }
  }
  if (!queue_.empty()) {
    spdlog::info("standby: copying {} model(s) ({} bytes) and {} uploaded file(s) from the leader at {}",
                 queue_.size() - uploads, bytes, uploads, address_);
  }
  next();
}

void ModelReplica::next() {
  if (!link_) return;
  if (queue_.empty()) return ask();
  Item& it = queue_.front();
  writer_.reset();
  file_ = 0;
  if (!it.upload) {
    if (it.manifest.files.empty()) return skip("it lists no files");
    staging_ = models_->staging_dir(it.manifest.job, it.manifest.checkpoint);
  }
  request_window();
}

void ModelReplica::request_window() {
  const Item& it = queue_.front();
  const std::int64_t offset = writer_ ? writer_->offset() : 0;
  if (it.upload) {
    wire::ModelDownloadBody b;
    b.sha256 = it.sha256;
    b.offset = offset;
    return send(wire::ControlType::kModelDownload, b.to_json());
  }
  wire::ModelFileRequestBody b;
  b.job = it.manifest.job;
  b.checkpoint = it.manifest.checkpoint;
  b.file = it.manifest.files[file_].name;
  b.offset = offset;
  send(wire::ControlType::kModelRead, b.to_json());
}

void ModelReplica::on_chunk(const wire::ModelFileChunkBody& chunk) {
  Item& it = queue_.front();
  if (!writer_) {
    if (it.upload) {
      if (chunk.sha256 != it.sha256) throw ProtocolError("the leader sent " + chunk.sha256 + " for " + it.sha256);
      writer_ = uploads_->receive(it.sha256, chunk.size);
    } else {
      const auto& f = it.manifest.files[file_];
      if (chunk.size != f.bytes) {
        throw ProtocolError(f.name + " is " + std::to_string(chunk.size) + " bytes, its manifest says " +
                            std::to_string(f.bytes));
      }
      writer_ = std::make_unique<ChunkedFileWriter>((fs::path(staging_) / f.name).string(), f.bytes, f.sha256,
                                                    static_cast<std::int64_t>(kMaxModelFileBytes));
    }
  }
  writer_->append(chunk.offset, base64_decode(chunk.data));
  if (!writer_->complete()) return request_window();
  writer_->finish();
  writer_.reset();
  if (it.upload) {
    uploads_->stored(it.sha256);
    spdlog::info("standby: copied the uploaded model file {}", it.sha256);
  } else if (++file_ < it.manifest.files.size()) {
    return request_window();
  } else {
    models_->commit(it.manifest);
    staging_.clear();
    spdlog::info("standby: copied the model {}/{} ({} bytes)", it.manifest.job, it.manifest.checkpoint,
                 it.manifest.bytes());
  }
  queue_.pop_front();
  next();
}

void ModelReplica::skip(const std::string& why) {
  if (queue_.empty()) return ask();
  const Item& it = queue_.front();
  spdlog::warn("standby: not copied: {}: {}", it.upload ? "uploaded model file " + it.sha256
                                                        : "model " + it.manifest.job + "/" + it.manifest.checkpoint,
               why);
  writer_.reset();
  if (!staging_.empty()) {
    std::error_code ec;
    fs::remove_all(staging_, ec);
    staging_.clear();
  }
  queue_.pop_front();
  next();
}

}  // namespace dltrain::leader
