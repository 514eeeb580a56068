// What the leader reads of a task's files on its agent: a window of its log or step
// timeline (`dltrain logs`, `dltrain trace`), and a window of a file of the model its
// worker wrote (the leader's collection, leader/model_collection.cpp). Stateless: the
// paths come from task_launch.h.
#pragma once

#include <string>

#include "agent/task_launch.h"
#include "config/options.h"
#include "wire/control_bodies.h"

namespace dltrain::agent {

/// A window of the log (or, file "trace", the step timeline) of task `b.task` of `b.job`:
/// the running task's own when `running` is its launch, else the file its directory of
/// generation `b.generation` kept. A missing file is an empty window with exists = false;
/// never throws.
wire::LogChunkBody read_task_log(const config::AgentOptions& opt, const wire::LogRequestBody& b,
                                 const TaskLaunch* running);

/// The reply (control message text) to read_model_file request `id`: a window of at most
/// b.max_bytes bytes from b.offset of the model file, base64, with the whole file's
/// SHA-256 (hex) in the first window — the one the worker wrote into metadata.json
/// beside it when there is one, else computed; a not_found error naming the task,
/// checkpoint and file when it is absent. Throws IoError when the file cannot be read.
std::string model_file_reply(const config::AgentOptions& opt, const std::string& id,
                             const wire::ModelFileRequestBody& b);

}  // namespace dltrain::agent
