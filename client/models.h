// The trained models the leader keeps: `dltrain models` lists them, `dltrain model get`
// downloads one, and `dltrain predict` / `dltrain evaluate` hand over to dltrain-model,
// the LibTorch program installed beside this one (the client itself links no LibTorch).
#pragma once

#include <string>
#include <vector>

#include "commands.h"

namespace dltrain::client {

/// `dltrain model get` options.
struct ModelGetOptions {
  std::string dir;                   ///< -o: where the files go; "" = ./<job>-model
  std::string checkpoint = "last";   ///< --checkpoint: "last", "best", "epoch-N" or N
};

/// `dltrain models`: the models the leader keeps (of `opt.job_id` when set), newest first,
/// one line each, or the reply as JSON. Returns kExitOk. Throws what
/// BlockingControlClient::request throws.
int models(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json);

/// `dltrain model get JOB`: waits (up to opt.timeout) while the leader still collects the
/// job's model, then downloads each of its files in windows of at most 1 MiB into
/// `mo.dir` (created), each written to FILE.part and renamed only once its size and
/// SHA-256 match the leader's manifest. Prints what it wrote (JSON: the manifest and the
/// directory). Returns kExitOk. Throws RemoteError (no such job or model; a job that did
/// not succeed says so), ProtocolError (a checksum mismatch: nothing is left under the
/// file's name), IoError and TimeoutError.
int model_get(control::BlockingControlClient& c, const CommandOptions& opt, const ModelGetOptions& mo, bool as_json);

/// The files a job needs sent ahead of its submit (or plan) `request` (job_request()):
/// with model = "torchscript", its model_file, when it exists here (as resolved against the
/// job file's directory), and with init_from naming a model directory here, that
/// directory's state_dict.pt. Each is uploaded to the leader in windows of at most 1 MiB,
/// unless the leader already has that content, and named in the returned request by its
/// SHA-256 ("model_sha256", "init_sha256"); a model_file that is not here stays for the
/// leader to read at its path (a shared file system), an init_from that is no directory
/// here names a job. Says what it uploads on stderr unless `quiet`. Throws ConfigError for
/// a file larger than 2 GiB or a model directory without state_dict.pt, IoError when a
/// file cannot be read, and what BlockingControlClient::request throws.
nlohmann::json with_uploaded_model(control::BlockingControlClient& c, nlohmann::json request,
                                   const CommandOptions& opt, bool quiet);

/// `dltrain predict …` and `dltrain evaluate …` are dltrain-model's: replaces this process
/// with `<directory of self>/dltrain-model` and `args` (argv[1..]). Returns only when it
/// cannot (kExitBadInput, after saying where it looked).
int exec_model_tool(const std::string& self, const std::vector<std::string>& args);

}  // namespace dltrain::client
