// What the dashboard (dashboard/, served by control/server.cpp) asks of the leader beyond
// the client protocol (private to lib/leader/; docs/protocol.md, "Dashboard"): a job's
// curves (`series`), kept from its workers' events, and its stored event log (`events`).
// Everything else it shows comes from list, agents, status and follow, like the CLI's.
// Functions of the leader's parts; not thread-safe: the leader's io thread calls them.
#pragma once

#include <cstddef>

#include <nlohmann/json.hpp>

#include "leader/job_table.h"
#include "store/store.h"
#include "wire/control_bodies.h"
#include "wire/task_events.h"

namespace dltrain::leader {

/// Finished jobs whose curves the leader keeps (the most recent ones); older ones answer
/// `series` with empty curves. Bounds the memory: at most this many finished jobs ×
/// their workers × kSeriesCapacity points.
inline constexpr std::size_t kKeptSeries = 32;

/// Adds what worker `t`'s progress event says to `j`'s curves (time since submission).
void record_series(JobRec& j, const TaskRec& t, const wire::events::Progress& p);
/// Adds worker 0's epoch_end (loss, test accuracy) to `j`'s curves; others' are not.
void record_series(JobRec& j, const TaskRec& t, const wire::events::EpochEnd& e);
/// Clears the curves of the finished jobs older than the kKeptSeries most recent ones.
void trim_series(JobTable& jobs);

/// `series {job}` → the job's curves with its id and state. Throws wire::Refused
/// (bad_request without a job, not_found for an unknown one).
nlohmann::json series_reply(const JobTable& jobs, const wire::JobQueryBody& b);
/// `events {job, limit}` → the latest `limit` events of the job's stored log (none without
/// a store: `db` null), their total and whether they persist. Throws wire::Refused
/// (not_found for an unknown job) and the store's errors.
nlohmann::json events_reply(const JobTable& jobs, const store::Store* db, const wire::EventsBody& b);

}  // namespace dltrain::leader
