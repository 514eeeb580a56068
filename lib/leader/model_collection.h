// The leader's trained models (private to lib/leader/): collected from worker 0's agent
// when a job ends, one window of one file at a time, each file's SHA-256 checked, kept in
// the model store (model_store.h) before the job may end; listed and read by clients; the
// model files clients upload (UploadStore) and the init_from and resume requests that
// start a job from a kept model. The leader wires it to its job table, its agents and
// its endpoints; it owns the stores and the collections in flight.
// Not thread-safe: the leader's io thread owns it.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file_transfer.h"
#include "control/server.h"
#include "leader/job_table.h"
#include "leader/model_store.h"
#include "leader/placement.h"
#include "wire/control.h"
#include "wire/control_bodies.h"

namespace dltrain::leader {

/// The trained models a leader collects, keeps and serves, and the files clients upload.
/// Client requests return their reply's body or throw wire::Refused (code, message, field).
class ModelCollection {
 public:
  using Clock = std::chrono::steady_clock;
  using json = nlohmann::json;
  using SessionPtr = std::shared_ptr<control::Session>;
  /// How long the leader waits for one window of a model file from an agent.
  static constexpr std::chrono::seconds kReplyTimeout{30};

  /// What collection asks of the leader.
  struct Hooks {
    /// Sends request `id` of `type` with `body` to an agent's session (the leader's
    /// fenced order); false when it was held back.
    std::function<bool(const SessionPtr&, const std::string& id, wire::ControlType type, const json& body)> order;
    /// `j`'s collection ended (j.model says how): the job may end now.
    std::function<void(JobRec& j)> ended;
    /// The names of the leader candidates standing by (docs/ha.md "Artifacts"): a job's
    /// model is theirs too before the job ends. Empty function or list: none (a single
    /// leader, or every other candidate down).
    std::function<std::vector<std::string>()> standbys;
  };

  /// `jobs` and `agents` are the leader's and must outlive this.
  ModelCollection(JobTable& jobs, const AgentRegistry& agents, Hooks hooks)
      : jobs_(jobs), agents_(agents), hooks_(std::move(hooks)) {}

  /// Keeps models in <state_dir>/models and uploads in <state_dir>/uploads, each keeping
  /// the files of the `retention` latest jobs. Throws what the stores' constructors throw
  /// (IoError, ConfigError): the model store is then kept if it opened, the uploads not.
  /// Without a store (no state_dir, or one that did not open) what needs it is refused
  /// as unavailable.
  void open(const std::string& state_dir, int retention);
  /// How long a job's end waits for the standby candidates to hold its models (0: it
  /// does not wait; the standbys still copy them). Default 60 s.
  void set_replication_timeout(std::chrono::milliseconds t) { replication_timeout_ = t; }

  /// Starts collecting `j`'s model once every task exited: a succeeding job's "last"
  /// model and the checkpoints its metadata names; a failing or cancelled job's latest
  /// epoch checkpoint (what `dltrain resume` starts from). True while it is collected
  /// (Hooks::ended is called when it ends); false, with j.model done and its error said,
  /// when there is nothing to collect.
  bool collect(JobRec& j);
  /// True when `env` (a reply from an agent) answers a read_model_file; goes on.
  bool on_reply(const wire::Envelope& env);
  /// Ends the collections whose agent was lost or did not answer in time, and the
  /// uploads left unfinished for 2 minutes (UploadStore::expire).
  void expire(Clock::time_point now);
  /// Whether `job`'s model is being collected, or waits for the standbys to hold it.
  bool collecting(const std::string& job) const { return collecting_.count(job) != 0 || awaiting_.count(job) != 0; }

  /// `replicate {candidate, models, uploads}` (request `id`) from a standby candidate on
  /// session `s`: records what it holds (an acknowledgement) and answers with the
  /// inventory (wire::ReplicaInventoryBody) at once when the inventory changed since its
  /// last answer on this session, else parks the request until it changes or
  /// ReplicateBody::kHold has passed (expire()). `reply` sends a reply on a session. Jobs
  /// whose end waited for this standby go on when it now holds their models.
  using Reply = std::function<void(const SessionPtr&, const std::string& id, const json& body)>;
  void on_replicate(const SessionPtr& s, const std::string& id, const wire::ReplicateBody& b, const Reply& reply);
  /// The standby on session `s` went away (its session closed): its parked request is
  /// dropped, jobs no longer wait for it; what it held is remembered until it asks again.
  void on_replica_closed(const SessionPtr& s);
  /// Whether session `s` is a standby candidate's (it sent replicate): it may read models
  /// (model_read) and uploads (model_download) without registering as an agent.
  bool is_replica(const SessionPtr& s) const;
  /// The candidates that hold every model of `job` and its uploaded files, as far as
  /// their last acknowledgement says.
  std::vector<std::string> replicas_of(const std::string& job) const;

  /// The stored models (of `job` when given), newest first, as JSON manifests (at most
  /// 1,000: the latest).
  json models_json(const std::optional<std::string>& job) const;
  /// `models {job?}` → the stored models and the jobs whose model is being collected.
  json on_models(const wire::ModelsQueryBody& b) const;
  /// `model_read {job, checkpoint, file, offset, max_bytes}` → a window of a stored file.
  json on_model_read(const wire::ModelFileRequestBody& b) const;
  /// `model_upload {sha256, size, offset, data}` (client) → where the next window starts.
  json on_model_upload(const wire::ModelUploadBody& b);
  /// `model_download {sha256, offset, max_bytes}` (agent) → a window of an uploaded file.
  json on_model_download(const wire::ModelDownloadBody& b) const;
  /// The uploaded file `sha256` (a submitted model_file), checked in its stead.
  std::optional<std::string> uploaded(const std::string& sha256) const;
  /// init_from of submitted `spec`: the state_dict of a model the leader keeps (a job
  /// id) or of one the client uploaded (b.init_sha256), as spec.init_sha256. Throws
  /// Refused (invalid_job, field init_from).
  void resolve_init_from(const wire::SubmitBody& b, JobSpec& spec);
  /// `resume {job}`: the job continuing failed or cancelled `b.job` from its latest epoch
  /// checkpoint (its configuration as planned, the checkpoint's state_dict as
  /// init_from, JobRec::resume set), for the leader to accept; `ps_memory_problem` is
  /// the submit's check. Throws Refused.
  JobRec resume_job(const wire::ResumeBody& b,
                    const std::function<std::optional<std::string>(const JobSpec&)>& ps_memory_problem);

 private:
  /// A job's model on its way from worker 0's agent, one file window at a time.
  struct Collecting {
    std::string job, agent;
    wire::ModelFileRequestBody req;     ///< the window asked for last
    std::string req_id;                 ///< that request's id
    Clock::time_point deadline;         ///< its reply is due
    std::vector<std::string> pending;   ///< files still to fetch after req.file
    std::string staging;                ///< where the files go (ModelStore::staging_dir)
    std::unique_ptr<ChunkedFileWriter> writer;  ///< req.file, from its first window on
    std::string sha256;                 ///< req.file's, as its agent said
    ModelManifest manifest;             ///< the checkpoint being collected, so far
    std::vector<std::string> checkpoints_left;  ///< named by the last model's metadata
    std::string stored;                 ///< the first checkpoint stored (the job's model), "" before
  };
  SessionPtr session_of(const std::string& agent) const;
  void request_window(Collecting& c);
  void take_metadata(Collecting& c);
  /// Goes on after a window of `c` arrived (`chunk`): asks for the next window, file or
  /// checkpoint, or ends the collection (which destroys `c`). Throws what writing or
  /// storing the files throws; the caller ends the collection with it.
  void take_chunk(Collecting& c, const wire::ModelFileChunkBody& chunk);
  /// A failed or cancelled job's checkpoint its agent does not have: asks for the one
  /// before it; false when there is none to ask for.
  bool try_earlier_checkpoint(Collecting& c);
  /// Ends `job`'s collection ("" = stored) and lets the job end once the standbys hold
  /// its models (await_replicas).
  void end(std::string job, const std::string& error);

  // ---- replication to the standby candidates (model_replication.cpp)
  /// A standby candidate as its last replicate request said.
  struct Replica {
    std::set<std::string> models;   ///< ModelManifest::key() of each model it holds
    std::set<std::string> uploads;  ///< SHA-256 of each upload it holds
    std::weak_ptr<control::Session> session;
    std::uint64_t session_id = 0;
    bool connected = false;         ///< its session is open: jobs wait for it
    std::string parked;             ///< the id of its request waiting for a change ("" none)
    Clock::time_point parked_until;
    std::uint64_t answered_version = 0;  ///< inventory_version_ of its last answer
  };
  /// A job whose end waits until every standby holds what it must.
  struct Awaiting {
    std::set<std::string> models, uploads;
    Clock::time_point deadline;
  };
  /// What every standby must hold of `job` before it ends: its models' keys and its
  /// uploaded files (model_file, init_from).
  Awaiting wanted_of(const JobRec& j) const;
  /// The standbys of Hooks::standbys copying now (session open) that do not yet hold all
  /// of `a` (with how much is left).
  std::vector<std::string> missing_replicas(const Awaiting& a) const;
  /// Lets `j` end now, or once the standbys hold its models (within the timeout).
  void await_replicas(JobRec& j);
  /// Ends the waits that are satisfied or past their deadline.
  void check_awaiting(Clock::time_point now);
  /// The models or uploads changed: parked requests are answered.
  void inventory_changed();
  json inventory_json() const;
  void answer(Replica& r, const Reply& reply);

  std::chrono::milliseconds replication_timeout_{60000};
  std::map<std::string, Replica> replicas_;   ///< by candidate name
  std::map<std::string, Awaiting> awaiting_;  ///< by job
  std::uint64_t inventory_version_ = 1;
  Reply reply_;  ///< the last on_replicate's, for answers of parked requests

  JobTable& jobs_;
  const AgentRegistry& agents_;
  Hooks hooks_;
  std::unique_ptr<ModelStore> models_;   ///< <state_dir>/models; null without one
  std::unique_ptr<UploadStore> uploads_;  ///< <state_dir>/uploads; null without one
  std::map<std::string, Collecting> collecting_;  ///< by job
  std::uint64_t next_req_ = 1;
};

}  // namespace dltrain::leader
