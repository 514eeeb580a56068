// The trained models the leader keeps (docs/training.md "The trained model"): one
// directory per job and checkpoint, <root>/<job>/<checkpoint>/, holding the model's files
// as the job's worker 0 wrote them and a manifest.json (what they are, their sizes and
// SHA-256). A model enters through a staging directory that is renamed into place only
// when every file arrived whole and checked, so a listed model is always complete; the
// oldest jobs' models beyond a bound are removed. Plain files, no LibTorch.
// Thread-safety: none (the leader's io thread only).
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/file_transfer.h"

namespace dltrain::leader {

/// One file of a stored model.
struct ModelFileInfo {
  std::string name;     ///< wire::kModelFiles
  std::int64_t bytes = 0;
  std::string sha256;   ///< hex
};

/// What manifest.json says of a stored model.
struct ModelManifest {
  std::string job;                   ///< "job-3"
  std::string checkpoint = "last";   ///< which of the job's models
  std::string model;                 ///< "cnn", "torchscript", …
  std::string dataset;               ///< "fashion-mnist", …
  std::optional<double> test_accuracy;  ///< the job's final test accuracy, [0, 1]
  int epochs = 0;                    ///< epochs the model was trained
  double created_unix = 0;           ///< when the leader stored it, seconds since the epoch
  std::string agent;                 ///< the agent it was collected from
  std::vector<ModelFileInfo> files;  ///< metadata.json first
  nlohmann::json to_json() const;
  /// Throws ProtocolError naming the missing or mistyped field.
  static ModelManifest from_json(const nlohmann::json& j);
  /// The files' total size, bytes.
  std::int64_t bytes() const;
  /// "JOB/CHECKPOINT/DIGEST", DIGEST the SHA-256 of the files' names and SHA-256s in
  /// order: two stores hold the same model exactly when their keys are equal (what a
  /// standby candidate reports it holds, docs/ha.md "Artifacts").
  std::string key() const;
};

/// The models under one directory.
class ModelStore {
 public:
  /// Opens (creates) `root` and reads every model's manifest there; a directory without a
  /// readable manifest (a model whose storing was interrupted) is removed. Keeps the
  /// models of at most `retention` jobs (>= 1). Throws IoError when `root` cannot be
  /// created.
  ModelStore(std::string root, int retention);

  /// An empty staging directory for job/checkpoint's files (any earlier one emptied).
  /// Throws IoError.
  std::string staging_dir(const std::string& job, const std::string& checkpoint) const;

  /// Writes `m`'s manifest into its staging directory and renames that to
  /// <root>/<job>/<checkpoint> (replacing an earlier model of that name), then removes the
  /// models of the oldest jobs beyond the retention (ranked by their newest model's
  /// created_unix). Throws IoError; the staging
  /// directory is then removed and nothing listed changes.
  void commit(const ModelManifest& m);

  /// The stored models, newest first; only `job`'s when given.
  std::vector<ModelManifest> list(const std::optional<std::string>& job = std::nullopt) const;

  /// job/checkpoint's model, if stored.
  std::optional<ModelManifest> find(const std::string& job, const std::string& checkpoint) const;

  /// The path of stored file `file` of job/checkpoint (exists when find() lists it).
  std::string file_path(const std::string& job, const std::string& checkpoint, const std::string& file) const;

  /// Removes every model of `job` (a job the leader no longer keeps).
  void remove_job(const std::string& job);
  /// Removes job/checkpoint's model, if stored.
  void remove(const std::string& job, const std::string& checkpoint);

  const std::string& root() const { return root_; }

 private:
  void prune();
  std::string root_;
  int retention_;
  std::vector<ModelManifest> models_;  ///< newest first
};

/// The model files clients upload with their jobs (model = "torchscript", `dltrain
/// submit`) and the trained state_dicts jobs start from (init_from), one per content:
/// <root>/<sha256>.pt (a ContentStore). An upload arrives in windows, in order, and is
/// kept only whole and matching its SHA-256; a file that is already there is not sent
/// again, and two clients uploading the same content share one upload. Bounded: at most
/// kMaxInFlight uploads at once (an idle one is dropped), and the least recently used
/// stored files beyond `retention` are removed, except those of jobs not yet ended.
class UploadStore {
 public:
  static constexpr std::size_t kMaxInFlight = 8;
  /// Creates `root` (throws IoError when it cannot) and drops any part files left there.
  UploadStore(std::string root, int retention);
  ~UploadStore();

  /// The stored file of `sha256`, if complete (its use time is refreshed).
  std::optional<std::string> find(const std::string& sha256) { return files_.find(sha256); }

  /// Takes window [offset, offset + bytes.size()) of the upload of `sha256`, a file of
  /// `size` bytes. An empty window at offset 0 asks where to begin: a new upload, the
  /// offset an upload of the same content in progress has reached, or `size` when the
  /// file is stored. A window at another offset than the upload's is not taken. Returns
  /// the offset of the next window wanted, `size` once the file is stored (then the
  /// least recently used files beyond the retention, except those in `keep`, are
  /// removed). Throws ProtocolError for bytes beyond `size`, a file that does not match
  /// `sha256` (it is dropped), no upload in progress, or too many uploads at once;
  /// IoError when a file cannot be written.
  std::int64_t put(const std::string& sha256, std::int64_t size, std::int64_t offset,
                   std::span<const std::uint8_t> bytes, const std::set<std::string>& keep = {});

  /// Puts a copy of the file at `path`, whose SHA-256 is `sha256`, in the store (a trained
  /// model's state_dict that a job starts from), unless that content is there; returns
  /// the stored path. Throws IoError, ProtocolError when the copy does not match `sha256`.
  std::string adopt(const std::string& path, const std::string& sha256);

  /// Drops the uploads that received nothing for `idle`.
  void expire(std::chrono::seconds idle);

  /// The SHA-256 of every stored file, most recently used first.
  std::vector<std::string> list() const { return files_.list(); }
  /// A writer of `sha256`'s file (`size` bytes) fetched from another store (a standby
  /// candidate's copy of the leader's uploads): the file is stored when the writer's
  /// finish() succeeds; then call stored(). Throws what ChunkedFileWriter throws.
  std::unique_ptr<ChunkedFileWriter> receive(const std::string& sha256, std::int64_t size);
  /// Marks `sha256`, just received, as the most recently used. No retention is applied:
  /// a copy mirrors the leader's set, which the leader bounds (remove() drops the rest).
  void stored(const std::string& sha256);
  /// Removes `sha256`'s stored file, if any.
  void remove(const std::string& sha256);

 private:
  struct InFlight;
  ContentStore files_;
  std::map<std::string, std::unique_ptr<InFlight>> in_flight_;  ///< by sha256
};

}  // namespace dltrain::leader
