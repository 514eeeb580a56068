// The leader and an agent over the real control protocol, each with its peer played by
// hand: job secrets and generations in task messages, the queue's reasons, duplicate and
// malformed agents, a full disk under the store; malformed requests to an agent; a
// control client's lifetime. Shared fixtures: support/control_fixtures.h.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <optional>
#include <thread>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>
#include <future>
#include <gtest/gtest.h>

#include "agent/agent.h"
#include "agent/leader_candidates.h"
#include "leader/leader.h"
#include "common/errors.h"
#include "job/job_spec.h"
#include "common/secret.h"
#include "control/client.h"
#include "control/server.h"
#include "store/rocksdb_store.h"
#include "support/control_fixtures.h"
#include "support/temp_dir.h"
#include "support/tmpfs.h"
#include "support/wait.h"
#include "wire/control_bodies.h"

using namespace dltrain;
using namespace dltrain::testing;

TEST(LeaderTasks, MessagesOfAnOlderGenerationAreRefusedAndTheSecretStaysWithTheTasks) {
  RunningLeader l;
  FakeAgent agent(l.url(), "fake-1", 4);
  control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
  const auto sub = c.request("submit", {{"job_toml", kTwoTaskJob}, {"base_dir", "."}}, std::chrono::seconds(10));
  const std::string job = sub["job"];

  const auto ps = agent.next("start_task");
  ASSERT_TRUE(ps) << "the leader did not start the PS shard";
  EXPECT_EQ(ps->body["task"], "ps-0");
  const auto gen = ps->body["generation"].get<std::uint32_t>();
  EXPECT_EQ(gen, 1u);
  const std::string secret = ps->body["secret"];
  EXPECT_EQ(job_secret_from_hex(secret, "secret").size(), 32u);

  // The shard's "listening" event as a task of the previous generation would send it:
  // refused, and the job does not move on.
  // The port the fake PS shard reports: only relayed to the worker, never bound or dialled.
  const nlohmann::json listening{{"event", "listening"}, {"port", 5555}, {"address", "127.0.0.1"}};
  auto stale =
      agent.request("task_event", {{"job", job}, {"task", "ps-0"}, {"generation", gen - 1}, {"event", listening}});
  EXPECT_FALSE(stale.ok);
  EXPECT_EQ(stale.error["code"], "conflict");
  EXPECT_EQ(stale.error["field"], "generation");
  EXPECT_EQ(stale.error["message"], "stale generation");
  auto st = c.request("status", {{"job", job}}, std::chrono::seconds(10));
  EXPECT_EQ(st["state"], "starting");
  EXPECT_FALSE(st["tasks"][0].contains("endpoint")) << st.dump();

  // The same event from the current generation starts the worker, with the same secret.
  auto fresh = agent.request("task_event", {{"job", job}, {"task", "ps-0"}, {"generation", gen}, {"event", listening}});
  EXPECT_TRUE(fresh.ok) << fresh.error.dump();
  const auto worker = agent.next("start_task");
  ASSERT_TRUE(worker) << "the leader did not start the worker";
  EXPECT_EQ(worker->body["task"], "worker-0");
  EXPECT_EQ(worker->body["generation"], gen);
  EXPECT_EQ(worker->body["ps"], nlohmann::json::array({"127.0.0.1:5555"}));
  EXPECT_EQ(worker->body["secret"], secret);

  // A stale task's exit does not fail the job either.
  auto exit = agent.request("task_exit", {{"job", job}, {"task", "worker-0"}, {"generation", gen - 1}, {"exit_code", 1},
                                          {"signal", 0}, {"describe", "exit code 1"}, {"last_error", "boom"}});
  EXPECT_FALSE(exit.ok);
  EXPECT_EQ(exit.error["code"], "conflict");
  st = c.request("status", {{"job", job}}, std::chrono::seconds(10));
  EXPECT_EQ(st["state"], "running") << st.dump();

  // Clients never see the secret.
  EXPECT_EQ(st.dump().find(secret), std::string::npos);
  const auto list = c.request("list", nlohmann::json::object(), std::chrono::seconds(10));
  EXPECT_EQ(list.dump().find(secret), std::string::npos);

  // A second job gets its own secret.
  c.request("submit", {{"job_toml", kTwoTaskJob}, {"base_dir", "."}}, std::chrono::seconds(10));
  const auto ps2 = agent.next("start_task");
  ASSERT_TRUE(ps2);
  EXPECT_NE(ps2->body["job"], job);
  EXPECT_NE(ps2->body["secret"], secret);
}

// An agent sends again the task events and exits that a lost connection left unanswered
// (docs/protocol.md "Delivery"): the leader takes each (sender, seq) once, so a follower
// sees every epoch once; another process of the agent (a new sender) starts afresh.
TEST(LeaderTasks, ATaskEventSentAgainIsTakenOnceAndANewSenderStartsAfresh) {
  RunningLeader l;
  FakeAgent agent(l.url(), "fake-1", 4);
  control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
  const std::string job = c.request("submit", {{"job_toml", kTwoTaskJob}, {"base_dir", "."}}, std::chrono::seconds(10))["job"];
  const auto ps = agent.next("start_task");
  ASSERT_TRUE(ps);
  const auto gen = ps->body["generation"].get<std::uint32_t>();
  const auto sent = [&](const std::string& task, const nlohmann::json& ev, const std::string& sender, std::uint64_t seq) {
    return agent.request("task_event", {{"job", job}, {"task", task}, {"generation", gen}, {"event", ev},
                                        {"sender", sender}, {"seq", seq}});
  };
  ASSERT_TRUE(sent("ps-0", {{"event", "listening"}, {"port", 5555}, {"address", "127.0.0.1"}}, "s1", 1).ok);
  ASSERT_TRUE(agent.next("start_task"));  // worker-0
  control::BlockingControlClient follower(l.url(), "client-secret", std::chrono::seconds(10));
  follower.request("follow", {{"job", job}}, std::chrono::seconds(10));
  const auto epoch_end = [&](int epoch) {
    return nlohmann::json{{"event", "epoch_end"}, {"rank", 0}, {"epoch", epoch}, {"epochs", 5},
                          {"train_loss", 1.0}, {"epoch_seconds", 1.0}, {"images_per_sec", 100.0},
                          {"test_accuracy", 0.5}};
  };
  EXPECT_TRUE(sent("worker-0", epoch_end(1), "s1", 2).ok);
  const auto again = sent("worker-0", epoch_end(1), "s1", 2);  // its reply was lost: sent again
  EXPECT_TRUE(again.ok) << again.error.dump();  // answered, so the agent lets it go
  EXPECT_TRUE(sent("worker-0", epoch_end(2), "s1", 3).ok);
  EXPECT_TRUE(sent("worker-0", epoch_end(3), "s2", 1).ok);  // the agent restarted: numbers start again
  std::vector<int> epochs;
  for (int i = 0; i < 50 && epochs.size() < 4; ++i) {
    const auto ev = follower.next_event(std::chrono::milliseconds(epochs.size() < 3 ? 5000 : 300));
    if (!ev) break;
    if ((*ev)["event"] == "epoch_end") epochs.push_back((*ev)["epoch"]);
  }
  EXPECT_EQ(epochs, (std::vector<int>{1, 2, 3}));
}

// A restarted leader waits for the agents of the jobs it restored: a submit meanwhile is
// told that they re-register, naming the missing agent and the time left, and a refusal
// that only the unknown capacity causes is `unavailable` (retryable), not `infeasible`.
TEST(LeaderTasks, ASubmitWhileTheAgentsReRegisterIsToldSoAndWhenToRetry) {
  dltrain::testing::TempDir d;
  const auto state = d.path / "state";
  {
    RunningLeader l(state.string());
    FakeAgent agent(l.url(), "fake-1", 4);
    control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
    c.request("submit", {{"job_toml", kTwoTaskJob}, {"base_dir", "."}}, std::chrono::seconds(10));
    ASSERT_TRUE(agent.next("start_task"));
  }
  RunningLeader l(state.string());
  control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
  ASSERT_EQ(c.request("status", {{"job", "job-1"}}, std::chrono::seconds(10))["state"], "starting");  // the premise
  const auto sub = c.request("submit", {{"job_toml", kTwoTaskJob}, {"base_dir", "."}}, std::chrono::seconds(10));
  EXPECT_EQ(sub["state"], "queued");
  const std::string warning = sub.value("warning", "");
  EXPECT_NE(warning.find("more than the 0 cores of the agents registered now; it waits in the queue until agents "
                         "join (the agents are re-registering with this leader, which restored 1 running job and "
                         "waits for fake-1 (up to "),
            std::string::npos)
      << warning;
  EXPECT_NE(warning.find(" s more): retry then)"), std::string::npos) << warning;
  try {
    c.request("submit", {{"job_toml", std::string(kTwoTaskJob) + "device = \"cuda\"\n"}, {"base_dir", "."}},
              std::chrono::seconds(10));
    ADD_FAILURE() << "a cuda job was accepted with no GPU registered";
  } catch (const control::RemoteError& e) {
    EXPECT_EQ(e.code(), "unavailable");
    EXPECT_EQ(e.field(), "gpus_per_worker");
    EXPECT_NE(std::string(e.what()).find("no agent offers that many GPUs"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("re-registering with this leader"), std::string::npos) << e.what();
  }
}

TEST(LeaderTasks, TheSecretIsStoredWhileTheJobLivesAndOlderRecordsStayReadable) {
  dltrain::testing::TempDir d;
  const auto state = d.path / "state";
  std::string secret;
  {
    RunningLeader l(state.string());
    FakeAgent agent(l.url(), "fake-1", 4);
    control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
    c.request("submit", {{"job_toml", kTwoTaskJob}, {"base_dir", "."}}, std::chrono::seconds(10));
    const auto ps = agent.next("start_task");
    ASSERT_TRUE(ps);
    secret = ps->body["secret"];
  }
  {
    auto db = store::RocksDbStore::open((state / "db").string());
    auto jobs = db->jobs();
    ASSERT_EQ(jobs.size(), 1u);
    EXPECT_EQ(jobs[0].first, 1u);
    EXPECT_EQ(jobs[0].second["state"], "starting");
    EXPECT_EQ(jobs[0].second["secret"], secret);
    EXPECT_EQ(jobs[0].second["generation"], 1);
    // A record as a leader without job secrets wrote it: no "secret", no "generation".
    auto old = jobs[0].second;
    old.erase("secret");
    old.erase("generation");
    old["state"] = "succeeded";
    old["num"] = 7;
    old["test_accuracy"] = 0.8;
    db->put_job(7, old);
  }
  {
    // Restarted: the unfinished job is restored with its secret; the old record is served
    // as it was.
    RunningLeader l(state.string());
    control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
    auto j1 = c.request("status", {{"job", "job-1"}}, std::chrono::seconds(10));
    EXPECT_EQ(j1["state"], "starting");
    auto j7 = c.request("status", {{"job", "job-7"}}, std::chrono::seconds(10));
    EXPECT_EQ(j7["state"], "succeeded");
    EXPECT_DOUBLE_EQ(j7["test_accuracy"].get<double>(), 0.8);
    // Its agent comes back without the shard (it restarted too): the job had been
    // starting, so it is re-assigned as generation 2, with the same secret.
    FakeAgent agent(l.url(), "fake-1", 4);
    const auto ps = agent.next("start_task");
    ASSERT_TRUE(ps);
    EXPECT_EQ(ps->body["task"], "ps-0");
    EXPECT_EQ(ps->body["generation"], 2);
    EXPECT_EQ(ps->body["secret"], secret);
    // A message of generation 1 is refused now.
    auto stale = agent.request("task_event", {{"job", "job-1"}, {"task", "ps-0"}, {"generation", 1},
                                              {"event", {{"event", "listening"}, {"port", 5555}}}});
    EXPECT_FALSE(stale.ok);
    // Cancelled: its shard reports its exit and the job ends, dropping the secret.
    c.request("cancel", {{"job", "job-1"}}, std::chrono::seconds(10));
    ASSERT_TRUE(agent.next("stop_task"));
    EXPECT_TRUE(agent.request("task_exit", {{"job", "job-1"}, {"task", "ps-0"}, {"generation", 2}, {"exit_code", 0},
                                            {"signal", 0}, {"describe", "exit code 0"}})
                    .ok);
    wait_until([&] { return c.request("status", {{"job", "job-1"}}, std::chrono::seconds(10))["state"] == "cancelled"; },
               std::chrono::seconds(10), std::chrono::milliseconds(50));
    EXPECT_EQ(c.request("status", {{"job", "job-1"}}, std::chrono::seconds(10))["state"], "cancelled");
  }
  auto db = store::RocksDbStore::open((state / "db").string());
  for (const auto& [num, rec] : db->jobs()) {
    EXPECT_FALSE(rec.contains("secret")) << "job " << num << " still stores its secret after it ended";
  }
}

// No silent waits: a job larger than the whole cluster is accepted with a warning, its
// follower is told at once why it waits (and the status says the same), and its
// queue_timeout fails it with the reason.
TEST(LeaderQueue, AJobThatCannotFitSaysWhyAtSubmitAndWhileItWaitsAndFailsAfterItsQueueTimeout) {
  RunningLeader l;
  FakeAgent agent(l.url(), "fake-1", 2);
  control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
  const std::string toml =
      "name = \"big\"\nmodel = \"mlp\"\nworkers = 4\nps_shards = 1\nepochs = 1\nqueue_timeout = \"2s\"\n";
  const auto sub =
      c.request("submit", {{"job_toml", toml}, {"base_dir", "."}, {"follow", true}}, std::chrono::seconds(10));
  const std::string job = sub["job"];
  EXPECT_EQ(sub["state"], "queued");
  EXPECT_EQ(sub["warning"],
            "needs 5 cores (5 tasks x 1), more than the 2 cores of the agents registered now; it waits in the "
            "queue until agents join");

  // Collects the follower's events until one of `kind` arrives (at most 15 s).
  std::vector<nlohmann::json> seen;
  auto wait_for = [&](const std::string& kind) -> std::optional<nlohmann::json> {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
    while (std::chrono::steady_clock::now() < deadline) {
      auto e = c.next_event(std::chrono::milliseconds(500));
      if (!e) continue;
      seen.push_back(*e);
      if ((*e)["job"] == job && (*e)["event"] == kind) return e;
    }
    return std::nullopt;
  };
  const auto waiting = wait_for("waiting");
  ASSERT_TRUE(waiting) << nlohmann::json(seen).dump();
  EXPECT_EQ((*waiting)["position"], 1);
  EXPECT_EQ((*waiting)["cores_needed"], 5);
  EXPECT_EQ((*waiting)["cores_free"], 2);
  EXPECT_EQ((*waiting)["cores_total"], 2);
  EXPECT_EQ((*waiting)["fits_cluster"], false);
  EXPECT_EQ((*waiting)["queue_timeout_seconds"], 2.0);
  const auto st = c.request("status", {{"job", job}}, std::chrono::seconds(10));
  EXPECT_EQ(st["cores_total"], 2);
  EXPECT_EQ(st["fits_cluster"], false);

  // The heartbeat checker (every second) fails it once it has waited 2 s.
  const auto summary = wait_for("summary");
  ASSERT_TRUE(summary) << nlohmann::json(seen).dump();
  EXPECT_EQ((*summary)["state"], "failed");
  EXPECT_EQ((*summary)["error"],
            "waited 2 s in the queue (queue_timeout): it needs 5 cores, 2 are free and the cluster has 2 in all");
  const auto ended = c.request("status", {{"job", job}}, std::chrono::seconds(10));
  EXPECT_TRUE(ended["tasks"].empty()) << "nothing of the job may have started: " << ended.dump();
}

// Two machines with one host name (cloned VMs): the second agent is refused with what to
// do about it, and the first one carries on.
TEST(LeaderAgents, ASecondAgentWithTheSameNameIsRefusedWithTheFix) {
  RunningLeader l;
  FakeAgent first(l.url(), "vm", 2);
  try {
    FakeAgent second(l.url(), "vm", 2);
    ADD_FAILURE() << "a second agent named vm was registered";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("an agent named \\\"vm\\\" is already registered (from 127.0.0.1:"), std::string::npos) << m;
    EXPECT_NE(m.find("set a unique name = \\\"...\\\" in this agent's configuration (it defaults to the host name)"),
              std::string::npos)
        << m;
  }
  control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
  const auto agents = c.request("agents", nlohmann::json::object(), std::chrono::seconds(10));
  ASSERT_EQ(agents["agents"].size(), 1u);
  EXPECT_EQ(agents["agents"][0]["state"], "ready");
}

// The leader's state database on a full disk (a 192 MiB tmpfs — RocksDB preallocates
// about 70 MiB for its write-ahead log — that the test mounts and fills to 16 MiB free,
// below the store's default reserve of 64 MiB):
// a submit is refused with the cause and leaves nothing behind, the jobs already stored
// are still listed, and once space is freed submits are accepted again, with no gap in
// the job numbers; a restarted leader finds every accepted job.
TEST(LeaderStore, ASubmitIsRefusedWithTheCauseWhileTheDiskIsFullAndAcceptedOnceSpaceIsFreed) {
  dltrain::testing::Tmpfs fs(192u << 20);
  if (!fs.error().empty()) GTEST_SKIP() << "needs root to mount a tmpfs: " << fs.error();
  const auto state = fs.path() / "state";
  int accepted = 0;
  {
    RunningLeader l(state.string());
    control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
    c.request("submit", {{"job_toml", kTwoTaskJob}, {"base_dir", "."}}, std::chrono::seconds(10));
    ++accepted;
    ASSERT_GT(fs.fill(16u << 20), 0u);
    std::string refusal;
    try {
      c.request("submit", {{"job_toml", kTwoTaskJob}, {"base_dir", "."}}, std::chrono::seconds(10));
      ADD_FAILURE() << "a submit was accepted below the reserve";
    } catch (const control::RemoteError& e) {
      EXPECT_EQ(e.code(), "unavailable");
      refusal = e.what();
    }
    EXPECT_NE(refusal.find("the leader cannot store the job, so it does not accept it"), std::string::npos) << refusal;
    EXPECT_NE(refusal.find("below the reserve of 64.0 MiB"), std::string::npos) << refusal;
    // Reads go on: the accepted jobs are listed, the refused one is not.
    auto list = c.request("list", nlohmann::json::object(), std::chrono::seconds(10));
    EXPECT_EQ(list["jobs"].size(), static_cast<std::size_t>(accepted)) << list.dump();
    EXPECT_EQ(c.request("status", {{"job", "job-1"}}, std::chrono::seconds(10))["state"], "queued");

    fs.free_space();
    auto after = c.request("submit", {{"job_toml", kTwoTaskJob}, {"base_dir", "."}}, std::chrono::seconds(10));
    ++accepted;
    EXPECT_EQ(after["job"], "job-" + std::to_string(accepted));  // the refused submit used no number
  }
  RunningLeader again(state.string());
  control::BlockingControlClient c(again.url(), "client-secret", std::chrono::seconds(10));
  auto list = c.request("list", nlohmann::json::object(), std::chrono::seconds(10));
  EXPECT_EQ(list["jobs"].size(), static_cast<std::size_t>(accepted)) << list.dump();
}

// Found while writing tests/fuzz/fuzz_control.cpp: a number that overflows a double
// escaped the leader's message handler as nlohmann::json::out_of_range, out of its event
// loop, and ended the leader; mistyped register and task fields were read with nlohmann's
// value(), which threw (an "internal" error) or, for 1e300 into an int, was undefined
// behaviour. Now each is a bad_request naming the field, and the leader carries on.
TEST(LeaderAgents, MalformedAgentMessagesAreRefusedNamingTheFieldAndTheLeaderCarriesOn) {
  RunningLeader l;
  FakeAgent agent(l.url(), "fake-1", 4);
  const auto overflow = agent.raw(R"({"v":1,"id":"r1","type":"heartbeat","body":{"x":1e400}})", "");  // id unknown
  EXPECT_FALSE(overflow.ok);
  EXPECT_EQ(overflow.error["code"], "bad_request");
  EXPECT_NE(overflow.error["message"].get<std::string>().find("number overflow"), std::string::npos);
  const auto deep = agent.raw(R"({"v":1,"id":"r2","type":"heartbeat","body":{"x":)" + std::string(5000, '[') +
                                  std::string(5000, ']') + "}}",
                              "");  // not parsed, so its id is not known
  EXPECT_EQ(deep.error["code"], "bad_request");
  const auto reg = agent.request("register", {{"name", "fake-2"}, {"cores", 1e300}});
  EXPECT_FALSE(reg.ok);
  EXPECT_EQ(reg.error["code"], "bad_request");
  EXPECT_EQ(reg.error["field"], "cores");
  const auto ev = agent.request("task_event", {{"job", "job-1"}, {"task", "ps-0"}, {"generation", "1"}});
  EXPECT_EQ(ev.error["code"], "bad_request");
  EXPECT_EQ(ev.error["field"], "generation");
  control::BlockingControlClient c(l.url(), "client-secret", std::chrono::seconds(10));
  const auto agents = c.request("agents", nlohmann::json::object(), std::chrono::seconds(10));
  ASSERT_EQ(agents["agents"].size(), 1u);
  EXPECT_EQ(agents["agents"][0]["agent"], "fake-1");
  EXPECT_EQ(agents["agents"][0]["cores"], 4);
}

namespace {

// A leader played by hand: a control server on 127.0.0.1 that records what its agents
// send, and an agent connected to it, on one io_context the test runs.
struct FakeLeader {
  FakeLeader() {
    control::ControlServerOptions so;
    so.agent_token = "agent-secret";
    so.client_token = "client-secret";
    control::ControlHandler h;
    h.on_message = [this](const std::shared_ptr<control::Session>& s, const std::string& text) {
      session = s;
      auto env = wire::parse_envelope(text);
      if (env.type == "register") s->send(wire::make_reply(env.id, {{"agent_id", "a"}, {"heartbeat_interval_ms", 1000}}));
      got.push_back(env);
    };
    server = std::make_unique<control::ControlServer>(io, so, h);
    server->start();
    config::AgentOptions o;
    o.name = "agent-under-test";
    o.leader_url = "ws://127.0.0.1:" + std::to_string(server->port());
    o.agent_token = "agent-secret";
    o.state_dir = (dir.path / "state").string();
    o.cores = 2;
    a = std::make_unique<agent::Agent>(io, o);
    a->start();
  }
  ~FakeLeader() {
    a.reset();
    server->stop();
    io.run_for(std::chrono::milliseconds(100));
  }
  // The first message from the agent that `match` accepts, running the io for up to 10 s.
  std::optional<wire::Envelope> next(const std::function<bool(const wire::Envelope&)>& match) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < deadline) {
      const auto it = std::find_if(got.begin(), got.end(), match);
      if (it != got.end()) {
        auto e = *it;
        got.erase(it);
        return e;
      }
      io.restart();
      io.run_for(std::chrono::milliseconds(20));
    }
    return std::nullopt;
  }
  std::optional<wire::Envelope> reply_to(const std::string& id) {
    return next([&](const wire::Envelope& e) { return e.type == "reply" && e.id == id; });
  }

  dltrain::testing::TempDir dir;
  asio::io_context io;
  std::unique_ptr<control::ControlServer> server;
  std::unique_ptr<agent::Agent> a;
  std::shared_ptr<control::Session> session;
  std::deque<wire::Envelope> got;
};

}  // namespace

// Found while writing tests/fuzz/fuzz_control.cpp: an agent read start_task with
// b.at("job").get<std::string>(); a job that was not a string threw, and so did the
// catch handler that reported the failure (env.body.value("job", "")), out of the agent's
// event loop; a job or task named "../.." put the task's directory (and its secret file)
// outside the state directory. Now both are refused as bad_request naming the field, the
// failure is reported as a task_exit, and the agent carries on.
TEST(AgentRequests, MalformedStartTaskIsRefusedNamingTheFieldAndTheAgentCarriesOn) {
  FakeLeader l;
  ASSERT_TRUE(l.next([](const wire::Envelope& e) { return e.type == "register"; })) << "the agent did not register";
  ASSERT_TRUE(l.session);
  wire::StartTaskBody st;
  st.job = "job-1";
  st.job_num = 1;
  st.task = "ps-0";
  st.kind = wire::TaskKind::kPs;
  st.generation = 1;
  st.secret = std::string(64, 'a');
  st.spec = JobSpec{};
  auto body = st.to_json();
  body["job"] = 5;
  l.session->send(wire::make_request("l1", "start_task", body));
  auto r = l.reply_to("l1");
  ASSERT_TRUE(r) << "no reply to a start_task whose job is a number";
  EXPECT_FALSE(r->ok);
  EXPECT_EQ(r->error["code"], "bad_request");
  EXPECT_EQ(r->error["field"], "job");
  const auto exit = l.next([](const wire::Envelope& e) { return e.type == "task_exit"; });
  ASSERT_TRUE(exit) << "the refused start_task was not reported as a task_exit";
  EXPECT_EQ(exit->body["task"], "ps-0");
  EXPECT_EQ(exit->body["exit_code"], 126);

  body = st.to_json();
  body["job"] = "../../escaped";
  l.session->send(wire::make_request("l2", "start_task", body));
  r = l.reply_to("l2");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->error["field"], "job");
  EXPECT_FALSE(std::filesystem::exists(l.dir.path / "escaped"));

  // Still answering: a stop_task of a task it does not run is fine.
  l.session->send(wire::make_request("l3", "stop_task", wire::TaskRefBody{{}, "job-1", "ps-0", 1, {}, 0}.to_json()));
  r = l.reply_to("l3");
  ASSERT_TRUE(r) << "the agent stopped answering";
  EXPECT_TRUE(r->ok) << r->error.dump();
}

namespace {

// A leader candidate played by hand for the agent's fencing test: a control server on
// 127.0.0.1 whose registration reply carries `term`, recording what its agents send. What
// the server's handlers touch is shared with them, so that a handler completing after the
// candidate is gone (a session's close) finds it alive.
struct TermLeader {
  struct Seen {
    std::int64_t term = 0;
    std::shared_ptr<control::Session> session;
    std::deque<wire::Envelope> got;
    int closed = 0;
  };
  TermLeader(asio::io_context& io, std::int64_t term, std::uint16_t port = 0) : seen(std::make_shared<Seen>()) {
    seen->term = term;
    control::ControlServerOptions so;
    so.port = port;
    so.agent_token = "agent-secret";
    so.client_token = "client-secret";
    control::ControlHandler h;
    h.on_message = [st = seen](const std::shared_ptr<control::Session>& s, const std::string& text) {
      st->session = s;
      auto env = wire::parse_envelope(text);
      if (env.type == "register") {
        s->send(wire::make_reply(env.id, {{"agent_id", "a"}, {"heartbeat_interval_ms", 500}, {"leader", "l"},
                                          {"term", st->term}}));
      }
      if (env.type == "heartbeat") s->send(wire::make_reply(env.id, nlohmann::json::object()));
      st->got.push_back(env);
    };
    h.on_close = [st = seen](const std::shared_ptr<control::Session>&) { ++st->closed; };
    server = std::make_unique<control::ControlServer>(io, so, h);
    server->start();
  }
  ~TermLeader() {
    server->stop();
    seen->session.reset();
  }
  std::string url() const { return "ws://127.0.0.1:" + std::to_string(server->port()); }

  std::shared_ptr<Seen> seen;
  std::unique_ptr<control::ControlServer> server;
  std::deque<wire::Envelope>& got = seen->got;
  std::shared_ptr<control::Session>& session = seen->session;
  int& closed = seen->closed;
};

// Runs `io` until `done` holds, for at most 15 s; whether it did.
bool run_until(asio::io_context& io, const std::function<bool()>& done) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(15);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    io.restart();
    io.run_for(std::chrono::milliseconds(20));
  }
  return true;
}

std::optional<wire::Envelope> take(std::deque<wire::Envelope>& got, const std::function<bool(const wire::Envelope&)>& m) {
  const auto it = std::find_if(got.begin(), got.end(), m);
  if (it == got.end()) return std::nullopt;
  auto e = *it;
  got.erase(it);
  return e;
}

double metric(agent::Agent& a, const std::string& name) {
  control::MetricsBuilder b;
  a.collect_metrics(b);
  for (const auto& f : b.families()) {
    if (f.name == name && !f.metric.empty()) {
      const auto& m = f.metric.front();
      return f.type == prometheus::MetricType::Counter ? m.counter.value : m.gauge.value;
    }
  }
  return -1;
}

}  // namespace

// The agent's choice of leader alone: its candidates in turn, a new round after the last,
// and the newest term registered under, below which registrations and orders are refused.
TEST(AgentFencing, TheCandidatesAreTriedInTurnAndOlderTermsRefused) {
  agent::LeaderCandidates c({"ws://a:1", "ws://b:1", "ws://c:1"});
  EXPECT_EQ(c.url(), "ws://a:1");
  EXPECT_FALSE(c.advance());
  EXPECT_EQ(c.url(), "ws://b:1");
  EXPECT_FALSE(c.advance());
  EXPECT_TRUE(c.advance());  // back to the first: a new round
  EXPECT_EQ(c.url(), "ws://a:1");
  agent::LeaderCandidates one({"ws://a:1"});
  EXPECT_TRUE(one.advance());
  EXPECT_EQ(one.url(), "ws://a:1");

  EXPECT_FALSE(c.order(0));         // a single leader's orders carry no term
  EXPECT_FALSE(c.registered(7));
  EXPECT_FALSE(c.order(7));
  EXPECT_FALSE(c.registered(12));  // a newer leader
  EXPECT_EQ(c.order(7).value_or(""), "term 7 is older than term 12, which this agent follows");
  EXPECT_EQ(c.registered(7).value_or(""), "its term 7 is older than term 12 this agent registered under");
  EXPECT_FALSE(c.order(12));
  EXPECT_EQ(c.newest_term(), 12);
  EXPECT_EQ(c.refused(), 2u);
}

// docs/ha.md "Fencing", on the agent: it follows the candidates in leader_url in turn,
// and once it registered under a term it refuses an order of an older term (answering
// why) and a leader that registers it under an older term (a deposed leader that has
// not noticed yet), going on to the next candidate.
TEST(AgentFencing, OrdersAndLeadersOfAnOlderTermAreRefused) {
  asio::io_context io;
  auto old_leader = std::make_unique<TermLeader>(io, 5);
  TermLeader new_leader(io, 9);
  const auto old_port = old_leader->server->port();
  TempDir dir;
  config::AgentOptions o;
  o.name = "fenced-agent";
  o.leader_urls = {old_leader->url(), new_leader.url()};
  o.leader_url = o.leader_urls.front();
  o.agent_token = "agent-secret";
  o.state_dir = (dir.path / "state").string();
  o.cores = 2;
  o.heartbeat_interval = std::chrono::milliseconds(200);
  o.heartbeat_timeout = std::chrono::milliseconds(2000);
  agent::Agent a(io, o);
  a.start();
  const auto is = [](const char* type) { return [type](const wire::Envelope& e) { return e.type == type; }; };
  const auto reply_to = [](const std::string& id) {
    return [id](const wire::Envelope& e) { return e.type == "reply" && e.id == id; };
  };
  // The first candidate serves (term 5): its orders are taken.
  ASSERT_TRUE(run_until(io, [&] { return take(old_leader->got, is("register")).has_value(); }));
  const auto stop = wire::TaskRefBody{{}, "job-1", "ps-0", 1, {}, 0}.to_json();
  old_leader->session->send(wire::make_request("o1", "stop_task", stop, 5));
  std::optional<wire::Envelope> r;
  ASSERT_TRUE(run_until(io, [&] { return (r = take(old_leader->got, reply_to("o1"))).has_value(); }));
  EXPECT_TRUE(r->ok) << r->error.dump();
  EXPECT_EQ(metric(a, "dltrain_agent_leader_term"), 5);

  // It goes away; the agent registers with the next candidate, under term 9.
  old_leader.reset();
  ASSERT_TRUE(run_until(io, [&] { return take(new_leader.got, is("register")).has_value(); }));
  ASSERT_TRUE(run_until(io, [&] { return metric(a, "dltrain_agent_leader_term") == 9; }));
  // An order of term 5 is refused, naming both terms; one of term 9 is taken.
  new_leader.session->send(wire::make_request("n1", "stop_task", stop, 5));
  ASSERT_TRUE(run_until(io, [&] { return (r = take(new_leader.got, reply_to("n1"))).has_value(); }));
  EXPECT_FALSE(r->ok);
  EXPECT_EQ(r->error.value("code", ""), "conflict");
  EXPECT_EQ(r->error.value("field", ""), "term");
  EXPECT_EQ(r->error.value("message", ""), "term 5 is older than term 9, which this agent follows");
  new_leader.session->send(wire::make_request("n2", "stop_task", stop, 9));
  ASSERT_TRUE(run_until(io, [&] { return (r = take(new_leader.got, reply_to("n2"))).has_value(); }));
  EXPECT_TRUE(r->ok) << r->error.dump();
  EXPECT_EQ(metric(a, "dltrain_agent_stale_leader_refusals_total"), 1);

  // The old leader back on its address, still believing in term 5, and the new one gone:
  // the agent is registered by the old one but refuses it (it closes the session and is
  // not connected) and keeps trying the candidates.
  old_leader = std::make_unique<TermLeader>(io, 5, old_port);
  new_leader.server->stop();
  ASSERT_TRUE(run_until(io, [&] { return take(old_leader->got, is("register")).has_value(); }));
  ASSERT_TRUE(run_until(io, [&] { return metric(a, "dltrain_agent_stale_leader_refusals_total") >= 2; }));
  ASSERT_TRUE(run_until(io, [&] { return old_leader->closed > 0; }));
  EXPECT_EQ(metric(a, "dltrain_agent_leader_term"), 9);
  EXPECT_EQ(metric(a, "dltrain_agent_leader_connected"), 0);
}

// Found by LeakSanitizer (scripts/test --sanitize=address,undefined) in
// LeaderAgents.ASecondAgentWithTheSameNameIsRefusedWithTheFix: a client's read and write
// loops held themselves (a std::function capturing its own shared_ptr), released only
// when a read or write completed, so a client whose io_context ended with a read pending
// leaked with its socket and buffers. Now the pending operation's handler owns the loop.
TEST(ControlClientLifetime, AClientWhoseEventLoopEndsWithAReadPendingIsFreed) {
  RunningLeader l;
  std::weak_ptr<control::ControlClient> weak;
  {
    asio::io_context io;
    auto c = std::make_shared<control::ControlClient>(io, l.url(), "client-secret", control::PeerKind::kClient);
    std::optional<std::exception_ptr> done;
    c->connect(std::chrono::seconds(10), [&](std::exception_ptr e) { done = e; });
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!done && std::chrono::steady_clock::now() < deadline) io.run_for(std::chrono::milliseconds(20));
    ASSERT_TRUE(done.has_value() && !*done) << "the client did not connect";
    c->send(wire::make_request("1", "list", nlohmann::json::object()));  // a write in flight as well
    weak = c;
    c.reset();
    EXPECT_FALSE(weak.expired());  // the pending read holds it while the io_context lives
  }
  EXPECT_TRUE(weak.expired()) << "the client outlived its io_context";
}
