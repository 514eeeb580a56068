// The leader's job and task state machines (leader/states.h), without sockets: every
// legal transition, every illegal one refused, and the string forms the JSON boundary
// (status, events, stored records) keeps. The expected tables are written out here by
// hand from docs/architecture.md's diagram, not computed from the code under test.
#include <set>
#include <string>
#include <utility>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "job/job_spec.h"
#include "leader/job_record.h"
#include "leader/states.h"
#include "wire/task_kind.h"

namespace {

using dltrain::leader::JobState;
using dltrain::leader::TaskState;
using dltrain::leader::legal_transition;
using dltrain::leader::to_string;

// Every legal job transition, by name.
const std::set<std::pair<std::string, std::string>> kLegalJob = {
    {"queued", "starting"},      {"queued", "exploring"},      {"queued", "failing"},        {"queued", "cancelling"},
    {"queued", "failed"},        {"queued", "cancelled"},      {"planning", "queued"},
    {"planning", "exploring"},   {"planning", "failing"},      {"planning", "cancelling"},
    {"planning", "failed"},      {"planning", "cancelled"},    {"exploring", "queued"},
    {"exploring", "failing"},    {"exploring", "cancelling"},  {"exploring", "failed"},
    {"exploring", "cancelled"},  {"starting", "running"},      {"starting", "recovering"},
    {"starting", "finishing"},   {"starting", "failing"},      {"starting", "cancelling"},
    {"starting", "failed"},      {"starting", "cancelled"},    {"running", "recovering"},
    {"running", "finishing"},    {"running", "failing"},       {"running", "cancelling"},
    {"running", "failed"},       {"running", "cancelled"},     {"recovering", "starting"},
    {"recovering", "failing"},   {"recovering", "cancelling"}, {"recovering", "failed"},
    {"recovering", "cancelled"}, {"finishing", "succeeded"},   {"finishing", "failing"},
    {"finishing", "cancelling"}, {"finishing", "failed"},      {"finishing", "cancelled"},
    {"failing", "failed"},       {"cancelling", "cancelled"},
};

const std::set<std::pair<std::string, std::string>> kLegalTask = {
    {"pending", "starting"}, {"pending", "exited"}, {"starting", "running"},
    {"starting", "exited"},  {"running", "exited"}, {"exited", "starting"},
};

TEST(JobStates, EveryTransitionIsLegalExactlyWhenTheTableSaysSo) {
  int legal = 0, refused = 0;
  for (const auto from : dltrain::leader::kJobStates) {
    for (const auto to : dltrain::leader::kJobStates) {
      const bool expected = kLegalJob.count({std::string(to_string(from)), std::string(to_string(to))}) > 0;
      EXPECT_EQ(legal_transition(from, to), expected) << to_string(from) << " -> " << to_string(to);
      (expected ? legal : refused) += 1;
    }
  }
  EXPECT_EQ(legal, 42);
  EXPECT_EQ(refused, 12 * 12 - 42);
}

TEST(JobStates, NothingLeavesATerminalState) {
  for (const auto from : {JobState::kSucceeded, JobState::kFailed, JobState::kCancelled}) {
    EXPECT_TRUE(dltrain::leader::terminal(from));
    for (const auto to : dltrain::leader::kJobStates) EXPECT_FALSE(legal_transition(from, to)) << to_string(to);
  }
  EXPECT_FALSE(dltrain::leader::terminal(JobState::kFailing));
  EXPECT_FALSE(dltrain::leader::terminal(JobState::kFinishing));
}

TEST(JobStates, AStateToItselfIsNoTransition) {
  for (const auto s : dltrain::leader::kJobStates) EXPECT_FALSE(legal_transition(s, s)) << to_string(s);
  for (const auto s : dltrain::leader::kTaskStates) EXPECT_FALSE(legal_transition(s, s)) << to_string(s);
}

TEST(TaskStates, EveryTransitionIsLegalExactlyWhenTheTableSaysSo) {
  int legal = 0;
  for (const auto from : dltrain::leader::kTaskStates) {
    for (const auto to : dltrain::leader::kTaskStates) {
      const bool expected = kLegalTask.count({std::string(to_string(from)), std::string(to_string(to))}) > 0;
      EXPECT_EQ(legal_transition(from, to), expected) << to_string(from) << " -> " << to_string(to);
      legal += expected ? 1 : 0;
    }
  }
  EXPECT_EQ(legal, 6);
}

TEST(States, TheStringFormsAreTheOnesStatusAndTheStoreUse) {
  const char* names[] = {"queued",     "planning",  "exploring",  "starting", "running", "recovering",
                         "finishing",  "failing",   "cancelling", "succeeded", "failed", "cancelled"};
  int i = 0;
  for (const auto s : dltrain::leader::kJobStates) {
    EXPECT_EQ(to_string(s), names[i]);
    EXPECT_EQ(dltrain::leader::parse_job_state(names[i]), s);
    EXPECT_EQ(nlohmann::json(s), names[i]);
    EXPECT_EQ(nlohmann::json(names[i]).get<JobState>(), s);
    ++i;
  }
  const char* task_names[] = {"pending", "starting", "running", "exited"};
  i = 0;
  for (const auto s : dltrain::leader::kTaskStates) {
    EXPECT_EQ(to_string(s), task_names[i]);
    EXPECT_EQ(nlohmann::json(task_names[i]).get<TaskState>(), s);
    ++i;
  }
  EXPECT_EQ(dltrain::wire::to_string(dltrain::wire::TaskKind::kPs), "ps");
  EXPECT_EQ(dltrain::wire::to_string(dltrain::wire::TaskKind::kWorker), "worker");
  EXPECT_EQ(nlohmann::json("worker").get<dltrain::wire::TaskKind>(), dltrain::wire::TaskKind::kWorker);
}

TEST(States, AnUnknownNameIsRefusedWithTheName) {
  EXPECT_FALSE(dltrain::leader::parse_job_state("Running"));
  EXPECT_FALSE(dltrain::leader::parse_task_state(""));
  EXPECT_FALSE(dltrain::wire::parse_task_kind("shell"));
  try {
    (void)nlohmann::json("paused").get<JobState>();
    FAIL() << "no error";
  } catch (const dltrain::InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "job state: unknown state \"paused\"");
  }
  try {
    (void)nlohmann::json("shell").get<dltrain::wire::TaskKind>();
    FAIL() << "no error";
  } catch (const dltrain::InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "task kind: expected ps or worker, got \"shell\"");
  }
}

// A stored job record as a restarted leader reads it: the states come back as enums, and
// a record naming a state that does not exist is refused with the state named (the
// leader then skips that job and says why) rather than read as some other state.
TEST(States, AStoredRecordKeepsItsStatesAndOneWithAnUnknownStateIsRefused) {
  nlohmann::json r;
  r["spec"] = dltrain::JobSpec{};
  r["state"] = "recovering";
  r["failing_state"] = "cancelled";
  auto j = dltrain::leader::job_from_record(7, r);
  EXPECT_EQ(j.state(), JobState::kRecovering);
  dltrain::leader::resume_stored_counters(j, r);
  EXPECT_EQ(j.life.target(), JobState::kCancelled);

  r["state"] = "paused";
  try {
    (void)dltrain::leader::job_from_record(7, r);
    FAIL() << "no error";
  } catch (const dltrain::ConfigError& e) {
    EXPECT_EQ(e.field(), "state");
    EXPECT_STREQ(e.what(), "state: stored job job-7: unknown state \"paused\"");
  }
  r["state"] = "running";
  r["failing_state"] = "running";  // not a terminal state
  auto k = dltrain::leader::job_from_record(7, r);
  EXPECT_THROW(dltrain::leader::resume_stored_counters(k, r), dltrain::ConfigError);
}

}  // namespace
