// What the client prints for people: job events, job lines and the status, plan,
// history and agents tables. Scripts use --json instead, which prints the leader's JSON
// as it came; the integration tests parse both, so a change here is a change of interface.
#pragma once

#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

namespace dltrain::client {

/// A byte count with a decimal unit: "512 B", "1.5 kB", "12.3 MB", … up to TB (one
/// decimal above bytes). `bytes` ≥ 0.
std::string human_bytes(double bytes);

/// `v` in fixed notation with `prec` digits after the point ("0.9012" for 4).
std::string fmt(double v, int prec);

/// One line (two for a summary with compression or an error) for one event the leader
/// relays for a job (`state`, `progress`, `epoch_end`, `summary`, `restarting`, …; the
/// fields of docs/protocol.md). Events of other kinds print nothing; a missing scalar
/// field prints as its zero value.
void print_event(std::ostream& out, const nlohmann::json& event);

/// One line of `dltrain list`: id, state, name, model, workers, PS shards, epochs done
/// of total, test accuracy (or "-"), wall time in seconds. `job` is one of the leader's
/// job summaries. Leaves `out` right-adjusted.
void print_job_line(std::ostream& out, const nlohmann::json& job);

/// `dltrain list`: one print_job_line per job, or "no jobs". `jobs` is a JSON array.
void print_job_list(std::ostream& out, const nlohmann::json& jobs);

// print_job_status, print_plan and print_history take the reply by value: a member the
// leader left out reads as null there (a non-const operator[]), where a const
// operator[] on an absent key would be undefined.

/// `dltrain status JOB`: the job's line, one line per task (state, agent, endpoint, exit,
/// restarts, resyncs), re-assignments, the error and, for a queued job, why it waits.
/// `status` is the leader's reply to a "status" request.
void print_job_status(std::ostream& out, nlohmann::json status);

/// `dltrain plan`: the decision, the explorations a submit would run first, and the
/// table of candidates (workers, batch size, seconds per epoch, total seconds, accuracy,
/// cost, verdict). `plan` is the leader's reply to a "plan" request.
void print_plan(std::ostream& out, nlohmann::json plan);

/// `dltrain history`: one line per observation (job, model, dataset, source, workers x
/// batch size, epoch, epoch seconds, images/s, final accuracy if known). `history` is
/// the leader's reply to a "history" request.
void print_history(std::ostream& out, nlohmann::json history);

/// `dltrain status` and `agents` with HA (docs/ha.md): who serves, its term and since
/// when (UTC), and each other candidate's state, as one line; nothing for a single leader.
/// `leader` is the reply's "leader" object.
void print_leader(std::ostream& out, const nlohmann::json& leader);

/// `dltrain agents`: one line per agent (id, state, address, free/total cores, memory in
/// MiB, hardware class). `agents` is a JSON array.
void print_agents(std::ostream& out, const nlohmann::json& agents);

/// `dltrain dataset inspect`: data::inspect_dataset's report as text (classes with their
/// count per split, the image sizes seen, the unreadable files and why).
void print_dataset_report(std::ostream& out, const nlohmann::json& report);

}  // namespace dltrain::client
