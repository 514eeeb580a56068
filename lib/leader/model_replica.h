// A standby leader candidate's copy of the serving leader's artifacts (docs/ha.md
// "Artifacts"): the trained models and kept checkpoints (<state_dir>/models, a
// ModelStore) and the uploaded model files (<state_dir>/uploads, an UploadStore), the
// directories the candidate's own leader opens when it is elected, so that it serves
// them after the serving candidate's machine is lost. It asks the serving leader
// `replicate` (what it holds), fetches what the answer lists and it lacks, one window of
// one file at a time (model_read, model_download; each file's SHA-256 checked, a model
// listed only once whole), drops the models of jobs the leader no longer keeps, and asks
// again: each request acknowledges what the previous answer asked for, and an in-sync
// request waits at the leader until something changes.
// Thread-safety: none; every call and callback runs on the io_context's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>

#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <nlohmann/json.hpp>

#include "common/file_transfer.h"
#include "control/client.h"
#include "leader/model_store.h"
#include "wire/control_bodies.h"

namespace dltrain::leader {

/// Keeps a standby candidate's model and upload stores a copy of the serving leader's.
/// Create with make_shared; stop() before the candidate's own leader opens the stores.
class ModelReplica : public std::enable_shared_from_this<ModelReplica> {
 public:
  struct Options {
    std::string candidate;  ///< this candidate's name, as the election knows it
    std::string state_dir;  ///< where its leader keeps models/ and uploads/
    int retention = 20;     ///< model_retention: the jobs whose models both stores keep
    std::string agent_token;  ///< what it presents to the leader (a daemon's token)
    bool tls = false;         ///< the candidates serve wss:// (tls_cert_file is set)
    control::TlsClientOptions tls_options;  ///< how it checks the leader's certificate
    /// How long one request may take before the connection is dropped and made again.
    std::chrono::milliseconds request_timeout{30000};
  };

  ModelReplica(boost::asio::io_context& io, Options opt);
  ~ModelReplica();

  /// Copies from the leader serving at `address` ("HOST:PORT"): (re)connects when it is
  /// another than the one followed now. Opens the stores on first use; when they cannot
  /// be opened, says why (logged) and copies nothing.
  void follow(const std::string& address);
  /// Stops copying: closes the connection, drops a file half fetched (its part file), and
  /// closes the stores. Idempotent.
  void stop();

 private:
  /// One thing to fetch: a model (its manifest; its files in order) or an upload.
  struct Item {
    bool upload = false;
    ModelManifest manifest;  ///< a model
    std::string sha256;      ///< an upload
  };
  void connect();
  void retry_later(const std::string& why);
  void ask();
  void send(wire::ControlType type, const nlohmann::json& body);
  void on_message(const std::string& text);
  void on_inventory(const wire::ReplicaInventoryBody& inv);
  /// Starts the next item of the queue, or asks again when there is none.
  void next();
  /// Asks for the window of the current file at the writer's offset (or 0).
  void request_window();
  void on_chunk(const wire::ModelFileChunkBody& chunk);
  /// The current item failed (`why`, logged): skip it, go on with the next.
  void skip(const std::string& why);

  boost::asio::io_context& io_;
  Options opt_;
  std::string address_;  ///< the leader followed
  std::shared_ptr<control::ControlClient> link_;
  boost::asio::steady_timer retry_timer_, request_timer_;
  std::unique_ptr<ModelStore> models_;
  std::unique_ptr<UploadStore> uploads_;
  std::deque<Item> queue_;
  std::size_t file_ = 0;  ///< the current model's file being fetched
  std::string staging_;   ///< the current model's staging directory
  std::unique_ptr<ChunkedFileWriter> writer_;
  std::string pending_;   ///< the id of the request in flight ("" none)
  std::uint64_t next_id_ = 1;
  int failures_ = 0;      ///< connection attempts failed in a row (back-off)
};

}  // namespace dltrain::leader
