// The leader's recovery (leader/recovery.h) alone, without sockets: a real agent registry
// and job records, and the job state machine's actions recorded by a double of
// JobActions that changes states as leader/states.h allows. Every expected placement,
// generation and message is worked out by hand from the agents' cores.
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "control/server.h"
#include "leader/recovery.h"
#include "support/session_double.h"
#include "wire/task_events.h"

using namespace dltrain::leader;
namespace events = dltrain::wire::events;
using json = nlohmann::json;
using namespace std::chrono_literals;

namespace {

// A connected agent's control session (AgentRegistry::live needs one).
using OpenSession = dltrain::testing::SessionDouble;  // an agent's session, always open

// What recovery asked of the leader, in order.
struct RecordedActions : JobActions {
  std::vector<json> published;
  std::vector<json> logged;
  int stops_sent = 0;
  std::vector<std::pair<std::string, dltrain::wire::StartTaskBody>> started;
  std::vector<std::string> failures;
  int enqueued = 0;

  void set_state(JobRec& j, JobState s) override {
    if (j.state() != s && legal_transition(j.state(), s)) j.life.move_to(s);
  }
  void set_task_state(const JobRec&, TaskRec& t, TaskState s) override {
    if (t.state != s && legal_transition(t.state, s)) t.state = s;
  }
  void publish(JobRec&, const json& ev) override { published.push_back(ev); }
  void log_event(const JobRec&, const json& ev) override { logged.push_back(ev); }
  void send_stops(JobRec&) override { ++stops_sent; }
  void start_task(JobRec& j, TaskRec& t, dltrain::wire::StartTaskBody body) override {
    set_task_state(j, t, TaskState::kStarting);
    started.emplace_back(t.name, std::move(body));
  }
  void fail_job(JobRec& j, const std::string& why) override {
    failures.push_back(why);
    j.life.head_for(JobState::kFailed, JobState::kFailing);
  }
  void fail_unplaced(JobRec& j, const std::string& why) override { fail_job(j, why); }
  void stop_tasks(JobRec&) override {}
  void maybe_finish(JobRec&) override {}
  void enqueue(JobRec&) override { ++enqueued; }
  void save(const JobRec&) override {}
  TaskHold hold_of(const JobRec& j, const TaskRec& t) const override { return {j.spec.threads_per_task, t.gpus}; }

  std::vector<std::string> published_kinds() const {
    std::vector<std::string> out;
    for (const auto& e : published) out.push_back(events::kind_of(e));
    return out;
  }
};

class RecoveryTest : public ::testing::Test {
 protected:
  RecoveryOptions opt{3, 10s, 10s, 1h};
  AgentRegistry agents;
  std::vector<std::shared_ptr<OpenSession>> sessions;
  RecordedActions actions;
  Recovery recovery{opt, agents, actions};
  JobRec j;

  void add_agent(const std::string& id, int cores) {
    auto& a = agents[id];
    a.id = id;
    a.cores = cores;
    a.free_cores = cores;
    sessions.push_back(std::make_shared<OpenSession>());
    a.session = sessions.back();
  }
  // A running task of `j` on `agent`, holding one core there.
  TaskRec& add_task(const std::string& name, TaskKind kind, int index, const std::string& agent) {
    TaskRec t;
    t.name = name;
    t.kind = kind;
    t.index = index;
    t.agent = agent;
    t.state = TaskState::kRunning;
    agents.take(agent, {1, {}});
    j.tasks.push_back(t);
    return j.tasks.back();
  }
  // A running job of one core per task.
  void running_job() {
    j.id = "job-1";
    j.num = 1;
    j.spec.threads_per_task = 1;
    j.life = JobLifecycle::restored(JobState::kRunning, std::nullopt);
  }
  // A running job whose ps-0, worker-0 and worker-1 run on these agents.
  void ps_and_two_workers(const std::string& ps, const std::string& w0, const std::string& w1) {
    running_job();
    add_task("ps-0", TaskKind::kPs, 0, ps);
    add_task("worker-0", TaskKind::kWorker, 0, w0);
    add_task("worker-1", TaskKind::kWorker, 1, w1);
  }
  // Task `name` reports its exit after the stop (`ok`: exit status 0), as on_task_exit
  // records it.
  void exits(const std::string& name, bool ok) {
    auto* t = j.find_task(name);
    ASSERT_NE(t, nullptr) << name;
    t->state = TaskState::kExited;
    t->ok_exit = ok;
    agents.release(t->agent, {1, {}});
  }
};

}  // namespace

// a1 (4 cores) runs ps-0 and worker-0, a2 (4) runs worker-1, a3 (4) is idle. a2 is
// lost: worker-1 exits with it and its core goes back. The job stops its other tasks and
// waits for their exits (their agent lives). Once they have exited (the shard with its
// checkpoint, exit 0; the worker stopped by its signal), generation 2 places ps-0 and
// worker-0 where they were (a1: 4 - 2 = 2 free) and worker-1 on the live agent with the
// most free cores (a3: 4 free > a1's 2); the shard restores generation 1's checkpoint.
TEST_F(RecoveryTest, ALostAgentReassignsTheJobAsItsNextGenerationOnTheLiveAgents) {
  add_agent("a1", 4);
  add_agent("a2", 4);
  add_agent("a3", 4);
  ps_and_two_workers("a1", "a1", "a2");
  ASSERT_EQ(agents.at("a1").free_cores, 2);
  ASSERT_EQ(agents.at("a2").free_cores, 3);

  recovery.agent_lost("a2", "no heartbeat for 10000 ms", {&j});
  EXPECT_TRUE(agents.at("a2").lost);
  EXPECT_EQ(agents.at("a2").free_cores, 4);
  EXPECT_EQ(j.find_task("worker-1")->state, TaskState::kExited);
  EXPECT_EQ(j.find_task("worker-1")->exit, "lost with its agent");
  EXPECT_EQ(j.state(), JobState::kRecovering);
  EXPECT_EQ(j.recovery.reason, "agent a2 was lost (no heartbeat for 10000 ms)");
  EXPECT_EQ(actions.stops_sent, 1);
  ASSERT_EQ(actions.published_kinds(), std::vector<std::string>{"recovering"});
  EXPECT_EQ(events::Recovering::from_json(actions.published[0]).generation, 1u);
  EXPECT_EQ(j.generation, 1u) << "ps-0 and worker-0 still run: their exits are on the way";
  // A second loss report of the same agent changes nothing.
  recovery.agent_lost("a2", "again", {&j});
  EXPECT_EQ(actions.stops_sent, 1);

  exits("ps-0", true);
  exits("worker-0", false);
  recovery.try_resume(j);
  EXPECT_EQ(j.generation, 2u);
  EXPECT_EQ(j.recovery.reassignments, 1);
  EXPECT_EQ(j.state(), JobState::kStarting);
  EXPECT_EQ(j.find_task("ps-0")->agent, "a1");
  EXPECT_EQ(j.find_task("worker-0")->agent, "a1");
  EXPECT_EQ(j.find_task("worker-1")->agent, "a3");
  EXPECT_EQ(agents.at("a1").free_cores, 2);
  EXPECT_EQ(agents.at("a3").free_cores, 3);
  EXPECT_TRUE(j.recovery.seed.empty()) << "the shard keeps its state: no replica needed";
  ASSERT_EQ(actions.published_kinds(), (std::vector<std::string>{"recovering", "reassigned"}));
  const auto ra = events::Reassigned::from_json(actions.published[1]);
  EXPECT_EQ(ra.generation, 2u);
  ASSERT_EQ(ra.moved.size(), 1u);
  EXPECT_EQ(ra.moved[0].task, "worker-1");
  EXPECT_EQ(ra.moved[0].from, "a2");
  EXPECT_EQ(ra.moved[0].to, "a3");
  // Only the shard starts now (the workers follow once it listens), from its checkpoint.
  ASSERT_EQ(actions.started.size(), 1u);
  EXPECT_EQ(actions.started[0].first, "ps-0");
  EXPECT_EQ(actions.started[0].second.restore_generation, std::optional<std::uint32_t>(1u));
  EXPECT_TRUE(actions.started[0].second.workers_done.empty());
}

// The shard's agent a2 is lost: its state must be rebuilt from the freshest replica of a
// worker that stays where its file is: worker-1 (pulled at 20 s) over worker-0 (10 s).
// The other workers wait until the seed has started.
TEST_F(RecoveryTest, ALostShardIsRebuiltFromTheFreshestReplicaAndTheSeedStartsFirst) {
  add_agent("a1", 4);
  add_agent("a2", 4);
  add_agent("a3", 4);
  ps_and_two_workers("a2", "a1", "a3");
  for (const auto& [name, pulled_at] : {std::pair{"worker-0", 10.0}, std::pair{"worker-1", 20.0}}) {
    auto& w = *j.find_task(name);
    w.replica = events::Replica{};
    w.replica->path = "/tmp/" + std::string(name) + ".replica";
    w.replica->pulled_at = pulled_at;
    w.replica_generation = 1;
  }

  recovery.agent_lost("a2", "no heartbeat", {&j});
  exits("worker-0", false);
  exits("worker-1", false);
  recovery.try_resume(j);
  ASSERT_EQ(j.generation, 2u);
  EXPECT_EQ(j.recovery.seed, "worker-1");
  EXPECT_EQ(j.recovery.seed_generation, 1u);
  // ps-0 goes to the agent with the most free cores after the workers stayed: a1 and a3
  // have 3 each, the first in id order wins.
  EXPECT_EQ(j.find_task("ps-0")->agent, "a1");
  ASSERT_EQ(actions.started.size(), 1u);
  EXPECT_FALSE(actions.started[0].second.restore_generation.has_value()) << "a moved shard starts empty";
  EXPECT_EQ(events::Reassigned::from_json(actions.published.back()).replica_from, std::optional<std::string>("worker-1"));

  j.life = JobLifecycle::restored(JobState::kRunning, std::nullopt);  // its shards listen
  EXPECT_FALSE(Recovery::seed_started(j, *j.find_task("worker-0")));
  EXPECT_EQ(j.recovery.seed, "worker-1");
  EXPECT_TRUE(Recovery::seed_started(j, *j.find_task("worker-1")));
  EXPECT_TRUE(j.recovery.seed.empty());
}

// a1 has 2 cores, both taken again by ps-0 and worker-0 staying there: the lost worker-1
// has no place. The job says so once and waits; past reassign_timeout (1 h) it fails
// with the numbers.
TEST_F(RecoveryTest, ATaskWithoutAPlaceWaitsThenFailsTheJobAtTheReassignTimeout) {
  add_agent("a1", 2);
  add_agent("a2", 1);
  ps_and_two_workers("a1", "a1", "a2");
  recovery.agent_lost("a2", "no heartbeat", {&j});
  exits("ps-0", true);
  exits("worker-0", false);
  recovery.try_resume(j);
  recovery.try_resume(j);  // still no place: said once
  EXPECT_EQ(j.state(), JobState::kRecovering);
  EXPECT_EQ(j.generation, 1u);
  ASSERT_EQ(actions.published_kinds(), (std::vector<std::string>{"recovering", "waiting_for_agent"}));
  const auto w = events::WaitingForAgent::from_json(actions.published[1]);
  EXPECT_EQ(w.tasks, std::vector<std::string>{"worker-1"});
  EXPECT_EQ(w.timeout_ms, 3600000);
  EXPECT_TRUE(actions.failures.empty());

  j.recovery.since = Recovery::Clock::now() - 2h;  // the timeout has passed
  recovery.try_resume(j);
  ASSERT_EQ(actions.failures.size(), 1u);
  EXPECT_EQ(actions.failures[0],
            "agent a2 was lost (no heartbeat); no agent had free cores for worker-1 within 3600 s (reassign_timeout)");
  EXPECT_EQ(j.state(), JobState::kFailing);
}

// A job re-assigned max_reassignments (3) times already is failed at the next loss,
// and a job that was only starting is re-assigned like a running one.
TEST_F(RecoveryTest, TheReassignmentBoundFailsTheJobWithTheCount) {
  add_agent("a1", 4);
  running_job();
  add_task("ps-0", TaskKind::kPs, 0, "a1");
  j.recovery.reassignments = 3;
  recovery.tasks_lost(j, "worker-1 on agent a2 was killed by signal 9");
  ASSERT_EQ(actions.failures.size(), 1u);
  EXPECT_EQ(actions.failures[0],
            "worker-1 on agent a2 was killed by signal 9; the job was already re-assigned 3 times (task_max_restarts)");
  EXPECT_EQ(actions.stops_sent, 0);

  JobRec starting;
  starting.id = "job-2";
  starting.spec.threads_per_task = 1;
  starting.life = JobLifecycle::restored(JobState::kStarting, std::nullopt);
  starting.recovery.reassignments = 2;
  TaskRec ps;
  ps.name = "ps-0";
  ps.kind = TaskKind::kPs;
  ps.agent = "a1";
  ps.state = TaskState::kStarting;
  starting.tasks.push_back(ps);
  recovery.tasks_lost(starting, "worker-0 on agent a1 exited with status 1");
  EXPECT_EQ(starting.state(), JobState::kRecovering) << "ps-0's stop is on the way";
  EXPECT_EQ(starting.recovery.reason, "worker-0 on agent a1 exited with status 1");
  EXPECT_EQ(actions.failures.size(), 1u);
}

// A restored job waits for its agents. a1 came back without worker-1 (it ended while the
// link was down): that is noted, not acted on, until every agent is back; then the job
// is adopted and the missing task re-assigned. A second restored job whose agent a2
// never comes back is adopted when its window ends, its task lost with that agent and
// placed on a1 (1 core free after job-1's 3) as generation 2.
TEST_F(RecoveryTest, AdoptionWaitsForTheAgentsThenReassignsWhatDidNotComeBack) {
  add_agent("a1", 4);
  add_agent("a2", 4);
  ps_and_two_workers("a1", "a1", "a1");
  auto& w1 = *j.find_task("worker-1");
  j.recovery.adopt_until = Recovery::Clock::now() + recovery.adoption_window();
  EXPECT_EQ(recovery.adoption_window(), 25s) << "heartbeat timeout 10 s + the agents' 15 s back-off";
  ASSERT_TRUE(Recovery::adopting(j));
  w1.state = TaskState::kExited;
  recovery.tasks_gone(j, "worker-1 on agent a1 ended while its agent was disconnected");
  EXPECT_EQ(j.state(), JobState::kRunning) << "nothing is re-assigned while adopting";
  recovery.agent_back(j);
  EXPECT_FALSE(Recovery::adopting(j));
  EXPECT_EQ(j.state(), JobState::kRecovering);
  EXPECT_EQ(j.recovery.reason,
            "the leader restarted and worker-1 on agent a1 ended while its agent was disconnected did not come back");

  JobRec k;
  k.id = "job-2";
  k.spec.threads_per_task = 1;
  k.life = JobLifecycle::restored(JobState::kRunning, std::nullopt);
  TaskRec t;
  t.name = "worker-0";
  t.kind = TaskKind::kWorker;
  t.agent = "a2";
  t.state = TaskState::kRunning;
  k.tasks.push_back(t);
  k.recovery.adopt_until = Recovery::Clock::now() + 25s;
  agents.at("a2").session.reset();  // a2 has not registered again
  recovery.agent_back(k);
  EXPECT_TRUE(Recovery::adopting(k)) << "a2 is not back: the window is still open";
  recovery.tick(k, Recovery::Clock::now());
  EXPECT_TRUE(Recovery::adopting(k));
  recovery.tick(k, Recovery::Clock::now() + 26s);
  EXPECT_FALSE(Recovery::adopting(k));
  EXPECT_EQ(k.recovery.reason, "the leader restarted and worker-0 on a2 did not come back");
  EXPECT_EQ(k.generation, 2u);
  EXPECT_EQ(k.state(), JobState::kStarting);
  EXPECT_EQ(k.tasks[0].agent, "a1");
  EXPECT_EQ(k.tasks[0].state, TaskState::kPending) << "generation 2's worker-0, started once the shards listen";
  EXPECT_EQ(agents.at("a1").free_cores, 0);
}

// An elastic job ([1, 3]) of ps-0 and worker-0 on a1, worker-1 and worker-2 on a2: a2 is
// lost. The job keeps running with worker-0 (1 >= min_workers 1): no re-assignment, no
// stops, its size 1, a "resized" event from 3 to 1 naming the agent. With min_workers 2,
// or when the lost agent held rank 0 or a shard, it is re-assigned as before.
TEST_F(RecoveryTest, ALostAgentShrinksAnElasticJobThatKeepsItsMinimum) {
  add_agent("a1", 4);
  add_agent("a2", 4);
  ps_and_two_workers("a1", "a1", "a2");
  add_task("worker-2", TaskKind::kWorker, 2, "a2");
  j.spec.workers = 3;
  j.spec.elastic = {1, 3};
  recovery.agent_lost("a2", "no heartbeat for 10000 ms", {&j});
  EXPECT_EQ(j.state(), JobState::kRunning);
  EXPECT_EQ(j.generation, 1u) << "not re-assigned";
  EXPECT_EQ(actions.stops_sent, 0);
  EXPECT_EQ(j.spec.workers, 1);
  EXPECT_EQ(j.find_task("worker-1"), nullptr);
  EXPECT_EQ(j.find_task("worker-2"), nullptr);
  EXPECT_EQ(agents.at("a2").free_cores, 4);
  ASSERT_EQ(actions.published_kinds(), std::vector<std::string>{"resized"});
  const auto ev = events::Resized::from_json(actions.published[0]);
  EXPECT_EQ(ev.from, 3);
  EXPECT_EQ(ev.to, 1);
  EXPECT_EQ(ev.by, "agent a2 was lost (no heartbeat for 10000 ms)");
  EXPECT_EQ(ev.leaving, (std::vector<std::string>{"worker-1", "worker-2"}));
}

// Below min_workers (worker-1 of 2 lost, min 2): re-assigned as a fixed-size job is.
TEST_F(RecoveryTest, ALostAgentReassignsAnElasticJobThatWouldFallBelowItsMinimum) {
  add_agent("a1", 4);
  add_agent("a2", 4);
  ps_and_two_workers("a1", "a1", "a2");
  j.spec.workers = 2;
  j.spec.elastic = {2, 3};
  recovery.agent_lost("a2", "gone", {&j});
  EXPECT_EQ(j.state(), JobState::kRecovering);
  EXPECT_EQ(actions.published_kinds(), std::vector<std::string>{"recovering"});
}

// Rank 0 (which evaluates) lost with a1: re-assigned too.
TEST_F(RecoveryTest, ALostAgentReassignsAnElasticJobThatLostRankZero) {
  add_agent("a1", 4);
  add_agent("a2", 4);
  add_agent("a3", 4);
  ps_and_two_workers("a3", "a1", "a2");
  j.spec.workers = 2;
  j.spec.elastic = {1, 3};
  recovery.agent_lost("a1", "gone", {&j});
  EXPECT_EQ(j.state(), JobState::kRecovering);
  EXPECT_EQ(actions.published_kinds(), std::vector<std::string>{"recovering"});
}
