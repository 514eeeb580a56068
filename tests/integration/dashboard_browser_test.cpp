// The leader's dashboard in a real browser: Debian's headless Chromium, driven over the
// DevTools protocol by tests/integration/dashboard_browser.mjs (Node, no npm package),
// against a standalone cluster (a leader and three agents on loopback) training a short
// job. Without the token the page shows the login form and nothing else, a wrong token
// changes nothing; with it, the agents table has one row per registered agent, the
// running job's curves grow between two screenshots, a stopped worker is flagged as a
// straggler, the finished job's final accuracy is `dltrain status --json`'s, and an
// automatic job's planner table is the one `dltrain status --json` holds. The
// screenshots stay in the directory the test prints (DLTRAIN_DASHBOARD_SCREENSHOTS, or
// dashboard-screenshots/ in the build directory).
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cluster.h"
#include "support/process.h"
#include "support/wait.h"
#include "support/jobs.h"
#include "support/names.h"

namespace {

// An executable on PATH, or "".
std::string on_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string p = path ? path : "";
  for (std::size_t start = 0; start <= p.size();) {
    const auto end = std::min(p.find(':', start), p.size());
    const fs::path candidate = fs::path(p.substr(start, end - start)) / name;
    if (!candidate.empty() && ::access(candidate.c_str(), X_OK) == 0) return candidate.string();
    start = end + 1;
  }
  return "";
}

// The JSON lines the browser driver wrote so far, by phase.
std::map<std::string, json> phases(const Background& b) {
  std::map<std::string, json> out;
  for (const auto& line : b.lines()) {
    auto j = json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("phase")) out[j["phase"].get<std::string>()] = j;
  }
  return out;
}

// What a page snapshot's text must not show before the token was accepted.
void expect_nothing_but_the_login(const json& snap, const std::vector<std::string>& secrets, const std::string& what) {
  EXPECT_TRUE(snap.value("login_visible", false)) << what;
  EXPECT_TRUE(snap.value("main_hidden", false)) << what;
  EXPECT_EQ(snap.value("main_elements", -1), 0) << what;
  EXPECT_EQ(snap.value("agent_rows", -1), 0) << what;
  EXPECT_EQ(snap.value("job_rows", -1), 0) << what;
  EXPECT_EQ(snap.value("canvases", -1), 0) << what;
  EXPECT_EQ(snap.value("all_canvases", -1), 0) << what;
  const std::string text = snap.value("text", "");
  for (const auto& s : secrets) EXPECT_EQ(text.find(s), std::string::npos) << what << " shows \"" << s << "\":\n" << text;
}

// The CNN, long enough that worker 0 gets twice as far as a stopped worker 1 before it
// finishes (checked before the stop). (An MLP trains ~20x faster on OpenBLAS and ended
// before its straggler could be flagged.)
constexpr int kJobEpochs = 6;
const std::string kJob = "epochs = " + std::to_string(kJobEpochs) + "\n" + kCnn24000 + "[ps]\ntimeout = \"5s\"\n";

}  // namespace

TEST(Dashboard, InHeadlessChromiumShowsNothingWithoutTheTokenThenTheClusterAndAJobsLiveCurves) {
  const std::string chromium = on_path("chromium");
  const std::string node = on_path("node");
  ASSERT_FALSE(chromium.empty()) << "Debian's chromium is not installed (scripts/setup installs it)";
  ASSERT_FALSE(node.empty()) << "node is not installed (scripts/setup installs nodejs)";

  const fs::path root = dltrain::testing::make_temp_root("dltrain-dashboard");
  const char* shots_env = std::getenv("DLTRAIN_DASHBOARD_SCREENSHOTS");
  const fs::path shots = shots_env && *shots_env ? fs::path(shots_env)
                                                 : fs::path(dltrain::testing::kBinDir).parent_path() / "dashboard-screenshots";
  fs::create_directories(shots);
  for (const auto& e : fs::directory_iterator(shots)) {
    if (e.path().extension() == ".png") fs::remove(e.path());
  }
  std::cout << "dashboard screenshots: " << shots.string() << std::endl;
  RecordProperty("screenshots", shots.string());

  {
    // With the shared plan: it moves only elastic jobs, so the fixed and automatic jobs
    // run as without it, and the elastic one shows the plan's section.
    dltrain::testing::Standalone cluster(root / "state", root / "xdg", 3, {"--progress-interval", "1", "--shared-plan"});
    ASSERT_FALSE(cluster.client.empty()) << "the standalone cluster did not start; see " << root / "standalone.log";
    std::ifstream in(root / "state" / "client.json");
    const json cj = json::parse(in);
    const std::string leader = cj["leader"];  // ws://127.0.0.1:PORT
    const std::string token = cj["client_token"];
    ASSERT_EQ(leader.rfind("ws://", 0), 0u) << leader;
    const std::string url = "http://" + leader.substr(5) + "/";

    auto agents_r = run(cluster.client + " agents --json", 30);
    ASSERT_EQ(agents_r.code, 0) << agents_r.out;
    std::vector<std::string> agent_names;
    for (const auto& a : json::parse(agents_r.out).value("agents", nlohmann::json::array())) agent_names.push_back(a["agent"]);
    std::sort(agent_names.begin(), agent_names.end());
    ASSERT_EQ(agent_names.size(), 3u);

    const std::string job = dltrain::testing::submit_job(cluster.client, dltrain::testing::write_job_file(
                                                                             root, "dashboard", "data_dir = \"/usr/share/datasets/fashion-mnist\"\n" + kJob));
    ASSERT_FALSE(job.empty());
    // An automatic job (planner/ with no history: it explores, then is planned); it waits
    // in the queue until the first job has freed the cores. As in planner_cluster_test.
    const std::string auto_job = dltrain::testing::submit_job(
        cluster.client, dltrain::testing::write_job_file(root, "dashboard-auto", "data_dir = \"/usr/share/datasets/fashion-mnist\"\n" + kAutoMlp));
    ASSERT_FALSE(auto_job.empty());
    // A small elastic job, queued behind the others: the shared plan starts it.
    const std::string elastic_job = dltrain::testing::submit_job(
        cluster.client, dltrain::testing::write_job_file(
                            root, "dashboard-elastic",
                            "data_dir = \"/usr/share/datasets/fashion-mnist\"\nmodel = \"mlp\"\ndataset = \"fashion-mnist\"\n"
                            "epochs = 1\nworkers = 1\nps_shards = 1\nbatch_size = 64\ntrain_samples = 6000\n"
                            "test_samples = 1000\n[elastic]\nmin_workers = 1\nmax_workers = 2\n"));
    ASSERT_FALSE(elastic_job.empty());

    const fs::path cfg = root / "browser.json";
    std::ofstream(cfg) << json{{"url", url},         {"token", token},         {"job", job},
                               {"out", shots.string()}, {"chromium", chromium}, {"straggler", "worker-1"},
                               {"tmp", root.string()},  {"plan_job", auto_job}, {"epochs", kJobEpochs},
                               {"elastic_job", elastic_job}}
                              .dump();
    const fs::path log = root / "browser.log";
    Background browser(node + " " + DLTRAIN_SOURCE_DIR + "/tests/integration/dashboard_browser.mjs " + cfg.string(),
                       log.string());
    auto dump = [&] {
      std::string s = "browser log " + log.string() + ":\n";
      for (const auto& l : browser.lines()) s += l.substr(0, 2000) + "\n";
      return s;
    };
    auto wait_phase = [&](const std::string& phase, std::chrono::seconds limit) {
      wait_until(
          [&] {
            const auto p = phases(browser);
            return p.count(phase) || p.count("error");
          },
          limit, 200ms);
      return phases(browser);
    };

    // The curves grew while the job ran; then worker 1 is stopped until the page flags it.
    auto p = wait_phase("grown", 400s);
    ASSERT_TRUE(p.count("grown")) << dump();
    const auto pids = cluster.task_pids(job, "worker-1-g1");
    ASSERT_EQ(pids.size(), 1u) << "worker-1's process";
    // The premise, right before the act: worker 0 has enough left to get twice as far as
    // worker 1 (the straggler rule's factor), and worker 1 has work left.
    {
      const json st = dltrain::testing::job_status(cluster.client, job, true);
      ASSERT_TRUE(dltrain::testing::has_work_left(st, "worker-0", 0.55));
      ASSERT_TRUE(dltrain::testing::has_work_left(st, "worker-1", 0.55));
    }
    ASSERT_EQ(::kill(pids[0], SIGSTOP), 0);
    struct ContinueOnExit {  // a failed assertion must not leave the cluster a stopped task
      int pid;
      ~ContinueOnExit() {
        if (pid > 0) ::kill(pid, SIGCONT);
      }
    } cont{pids[0]};
    p = wait_phase("straggler", 300s);
    ::kill(pids[0], SIGCONT);
    cont.pid = 0;
    ASSERT_TRUE(p.count("straggler")) << dump();

    ASSERT_EQ(browser.wait(600), 0) << dump();
    p = phases(browser);
    const json st = dltrain::testing::job_status(cluster.client, job, true);
    const json auto_st = dltrain::testing::job_status(cluster.client, auto_job, true);

    // 1. Before the token, and with a wrong one: the login form only.
    const std::vector<std::string> secrets{job, auto_job, "127.0.0.1", agent_names[0], agent_names[1], agent_names[2], token};
    expect_nothing_but_the_login(p["login"]["before"], secrets, "before sign-in");
    expect_nothing_but_the_login(p["login"]["wrong"], secrets, "after a wrong token");
    EXPECT_EQ(p["login"]["wrong"].value("error", ""), "refused: wrong client token");
    EXPECT_FALSE(p["login"]["wrong"].value("token_stored", true));

    // 2. The agents table: one row per agent `dltrain agents` lists; the curves grow.
    const json& first = p["grown"]["first"];
    const json& second = p["grown"]["second"];
    EXPECT_EQ(first.value("agent_rows", 0), 3) << first.dump();
    auto shown = first["agent_names"].get<std::vector<std::string>>();
    std::sort(shown.begin(), shown.end());
    EXPECT_EQ(shown, agent_names);
    EXPECT_EQ(first.value("job_state", ""), "running");
    EXPECT_EQ(second.value("job_state", ""), "running");
    EXPECT_EQ(first.value("canvases", 0), 4);
    EXPECT_EQ(second["stragglers"], json::array()) << "flagged before worker-1 was stopped";
    for (const char* c : {"loss", "ips", "bytes"}) {
      EXPECT_GE(first["points"].value(c, 0), 2) << c;
      EXPECT_GT(second["points"].value(c, 0), first["points"].value(c, 0)) << c;
    }
    EXPECT_TRUE(first.value("token_stored", false));

    // 3. The stopped worker, and only it, is flagged.
    EXPECT_EQ(p["straggler"]["flagged"]["stragglers"], json::array({"worker-1"}));

    // 4. The finished job: the accuracy `dltrain status --json` reports, one point per epoch.
    ASSERT_EQ(st.value("state", ""), "succeeded") << st.dump();
    ASSERT_TRUE(st["test_accuracy"].is_number()) << st.dump();
    const json& done = p["done"]["done"];
    EXPECT_EQ(done.value("job_state", ""), "succeeded");
    EXPECT_EQ(done["accuracy_value"], st["test_accuracy"]) << done.dump();
    char text[32];
    std::snprintf(text, sizeof text, "%.2f %%", st["test_accuracy"].get<double>() * 100);
    EXPECT_EQ(done.value("accuracy_text", ""), text);
    EXPECT_EQ(done["points"].value("accuracy", 0), st.value("epochs", -1));
    EXPECT_GT(done.value("events", 0), 0);  // the event log
    // The trained model the leader kept, and the command that downloads it.
    ASSERT_TRUE(st.contains("models")) << st.dump();
    EXPECT_EQ(done.value("model_command", ""), "dltrain model get " + st.value("job", "") + " -o DIR");
    EXPECT_EQ(done.value("agent_rows", 0), 3);

    // 6. The planner's decision: its ranked table row by row, the chosen row marked.
    ASSERT_EQ(auto_st.value("state", ""), "succeeded") << auto_st.dump();
    ASSERT_TRUE(auto_st.contains("plan") && auto_st["plan"]["feasible"].get<bool>()) << auto_st.dump();
    const json& plan = auto_st["plan"];
    const json& shown_plan = p["done"]["plan"];
    ASSERT_TRUE(shown_plan.is_object()) << p["done"].dump();
    ASSERT_EQ(shown_plan["rows"].size(), plan["table"].size()) << shown_plan.dump() << "\n" << plan.dump();
    EXPECT_GE(plan["table"].size(), 2u);
    int chosen = 0;
    for (std::size_t i = 0; i < plan["table"].size(); ++i) {
      const json& want = plan["table"][i];
      const json& row = shown_plan["rows"][i];
      EXPECT_EQ(row["rank"], i + 1);
      EXPECT_EQ(row["workers"], want["workers"]) << i;
      EXPECT_EQ(row["batch_size"], want["batch_size"]) << i;
      EXPECT_EQ(row["feasible"], want["feasible"].get<bool>() ? "yes" : "no") << i;
      EXPECT_EQ(row["reason"], want["reason"]) << i;
      const bool is_choice =
          want["workers"] == plan["choice"]["workers"] && want["batch_size"] == plan["choice"]["batch_size"];
      EXPECT_EQ(row["chosen"], is_choice) << i;
      chosen += is_choice;
    }
    EXPECT_EQ(chosen, 1);
    EXPECT_NE(shown_plan.value("explanation", "").find(plan.value("explanation", "?")), std::string::npos)
        << shown_plan.dump();

    // 7. The shared plan's section shows the elastic job's start as the leader recorded it
    // (dltrain plan --cluster), and draws its workers.
    const json& shared = p["done"]["shared"];
    ASSERT_TRUE(shared.is_object()) << p["done"].dump();
    EXPECT_TRUE(shared.value("visible", false));
    auto cp_r = run(cluster.client + " plan --cluster --json", 30);
    ASSERT_EQ(cp_r.code, 0) << cp_r.out;
    const json cp = json::parse(cp_r.out);
    const json* start = nullptr;
    for (const auto& c : cp["changes"]) {
      if (c["job"] == elastic_job && c["from"] == 0) start = &c;
    }
    ASSERT_NE(start, nullptr) << cp.dump();
    const std::string want = elastic_job + " (admin) 0 → " + std::to_string((*start)["to"].get<int>()) + " workers: " +
                             (*start)["reason"].get<std::string>();
    ASSERT_FALSE(shared["changes"].empty()) << shared.dump();
    EXPECT_NE(shared["changes"].back().get<std::string>().find(want), std::string::npos) << shared.dump() << "\n" << want;
    EXPECT_GE(shared.value("chart_points", 0), 1);
    EXPECT_TRUE(shared.value("chart_canvas", false));

    // No script error, failed load or Content-Security-Policy violation on the way.
    EXPECT_EQ(p["done"]["page_errors"], json::array()) << p["done"]["page_errors"].dump(1);

    // 5. A reload stays signed in (sessionStorage).
    EXPECT_FALSE(p["done"]["reloaded"].value("login_visible", true));
    EXPECT_EQ(p["done"]["reloaded"].value("agent_rows", 0), 3);

    std::size_t pngs = 0;
    for (const auto& e : fs::directory_iterator(shots)) pngs += e.path().extension() == ".png";
    EXPECT_EQ(pngs, 8u) << "screenshots in " << shots;

    EXPECT_EQ(cluster.stop(), 0);
    EXPECT_TRUE(cluster.leftover_processes().empty());
  }
  EXPECT_TRUE(dltrain::testing::processes_mentioning(root.string()).empty()) << "Chromium or a task outlived the test";
  if (!::testing::Test::HasFailure()) fs::remove_all(root);
}
