// The leader's job table (leader/job_table.h) without a leader: numbering and order,
// a refused job giving its number back, restored jobs raising the counter, and which
// finished jobs retention removes (ranked by their end, exploration runs of a live job
// kept), each figure worked out by hand from the jobs the test builds.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "leader/job_table.h"

using namespace dltrain;
using namespace dltrain::leader;

namespace {

using Clock = std::chrono::steady_clock;

// A job numbered by `t` in state `state` (terminal ones ended `ended_s` seconds after t0,
// or never seen ending when negative).
JobRec& add_job(JobTable& t, JobState state, Clock::time_point t0, double ended_s = -1) {
  JobRec j;
  t.number(j);
  j.life = JobLifecycle::restored(state, std::nullopt);
  if (ended_s >= 0) j.ended = t0 + std::chrono::milliseconds(static_cast<int>(ended_s * 1000));
  return t.add(std::move(j));
}

std::vector<std::string> ids(const std::vector<JobRec*>& js) {
  std::vector<std::string> out;
  for (const auto* j : js) out.push_back(j->id);
  return out;
}

}  // namespace

TEST(JobTable, NumbersJobsInOrderAndARefusedJobGivesItsNumberBack) {
  JobTable t;
  const auto t0 = Clock::now();
  EXPECT_EQ(t.next_number(), 1u);
  add_job(t, JobState::kQueued, t0);
  add_job(t, JobState::kRunning, t0);
  JobRec refused;
  t.number(refused);
  EXPECT_EQ(refused.id, "job-3");
  t.unnumber(refused);  // the store refused it: job-3 is given to the next one
  auto& third = add_job(t, JobState::kQueued, t0);
  EXPECT_EQ(third.id, "job-3");
  EXPECT_EQ(t.next_number(), 4u);
  EXPECT_EQ(ids(t.in_order()), (std::vector<std::string>{"job-1", "job-2", "job-3"}));
  const auto newest = t.newest(2);
  ASSERT_EQ(newest.size(), 2u);
  EXPECT_EQ(newest[0]->id, "job-3");
  EXPECT_EQ(newest[1]->id, "job-2");
  EXPECT_EQ(t.newest(10).size(), 3u);
  // A second job with a taken id, or one without an id, is a leader bug.
  JobRec again;
  again.id = "job-2";
  EXPECT_THROW(t.add(std::move(again)), std::logic_error);
  JobRec unnamed;
  EXPECT_THROW(t.add(std::move(unnamed)), std::logic_error);
  EXPECT_EQ(t.size(), 3u);
}

TEST(JobTable, RestoredJobsRaiseTheCounterPastThemAndTheStoredOne) {
  JobTable t;
  JobRec a;
  a.num = 7;
  a.id = "job-7";
  t.restore(std::move(a));
  JobRec b;
  b.num = 3;
  b.id = "job-3";
  t.restore(std::move(b));
  EXPECT_EQ(t.next_number(), 8u);
  t.raise_next(5);  // a stored counter below: no change
  EXPECT_EQ(t.next_number(), 8u);
  t.raise_next(12);  // jobs 8..11 were numbered, then refused or retired
  EXPECT_EQ(t.next_number(), 12u);
  EXPECT_EQ(ids(t.in_order()), (std::vector<std::string>{"job-7", "job-3"}));
}

TEST(JobTable, RetentionRemovesTheFinishedJobsThatEndedLongestAgo) {
  JobTable t;
  const auto t0 = Clock::now();
  add_job(t, JobState::kSucceeded, t0, 50);  // job-1: ended late although submitted first
  add_job(t, JobState::kFailed, t0, 10);     // job-2
  add_job(t, JobState::kRunning, t0);        // job-3: live, never retired
  add_job(t, JobState::kCancelled, t0, 30);  // job-4
  add_job(t, JobState::kSucceeded, t0);      // job-5: restored, its end not seen: oldest
  // Ended newest first: job-1 (50 s), job-4 (30 s), job-2 (10 s), job-5 (unseen).
  EXPECT_TRUE(t.beyond_retention(4).empty());
  EXPECT_EQ(t.beyond_retention(2), (std::vector<std::string>{"job-2", "job-5"}));
  EXPECT_EQ(t.beyond_retention(0), (std::vector<std::string>{"job-1", "job-4", "job-2", "job-5"}));
  t.erase(t.beyond_retention(2));
  EXPECT_EQ(ids(t.in_order()), (std::vector<std::string>{"job-1", "job-3", "job-4"}));
  EXPECT_FALSE(t.count("job-2"));
  EXPECT_EQ(t.next_number(), 6u);  // numbers are never reused
}

TEST(JobTable, AFinishedExplorationRunOfALiveJobIsKept) {
  JobTable t;
  const auto t0 = Clock::now();
  auto& parent = add_job(t, JobState::kExploring, t0);  // job-1
  const std::string parent_id = parent.id;
  auto& run = add_job(t, JobState::kSucceeded, t0, 5);  // job-2, its exploration run
  run.explore.profile_of = parent_id;
  add_job(t, JobState::kFailed, t0, 1);  // job-3
  EXPECT_EQ(t.beyond_retention(0), (std::vector<std::string>{"job-3"}));
  // Once its job has ended, the run goes like any other.
  t.at(parent_id).life = JobLifecycle::restored(JobState::kFailed, std::nullopt);
  t.at(parent_id).ended = t0 + std::chrono::seconds(9);
  EXPECT_EQ(t.beyond_retention(1), (std::vector<std::string>{"job-2", "job-3"}));
}
