// The planner and the store through a real standalone cluster: an "auto" job with no
// history explores, is planned and runs; `dltrain plan` then decides from the recorded
// history; jobs and history survive a leader restart.
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "support/cluster.h"
#include "support/process.h"
#include "support/jobs.h"
#include "support/names.h"

TEST(PlannerCluster, AutoJobExploresPlansRunsAndHistorySurvivesARestart) {
  std::string tmpl = (fs::temp_directory_path() / "dltrain-planner-XXXXXX").string();
  const fs::path root = mkdtemp(tmpl.data());
  const fs::path job = root / "auto.toml";
  std::ofstream(job) << "name = \"auto-mlp\"\ndata_dir = \"/usr/share/datasets/fashion-mnist\"\n" << kAutoMlp;
  std::string job_id;
  {
    Standalone c(root / "state", root / "xdg");
    ASSERT_FALSE(c.client.empty()) << "standalone cluster did not start";
    // No history: `plan` says which configurations a submit would profile.
    auto [prc, pout] = run(c.client + " plan " + job.string() + " --json");
    auto plan = json::parse(pout);
    EXPECT_FALSE(plan["explore"].empty()) << pout;

    auto [rc, out] = run(c.client + " submit " + job.string() + " --follow --json", 300);
    ASSERT_EQ(rc, 0) << out;
    auto summary = json::parse(last_line(out));
    EXPECT_EQ(summary["state"], "succeeded");
    job_id = summary["job"];
    auto [src, sout] = run(c.client + " status " + job_id + " --json");
    auto st = json::parse(sout);
    ASSERT_TRUE(st.contains("plan")) << sout;
    EXPECT_TRUE(st["plan"]["feasible"].get<bool>()) << st["plan"].dump();
    // Without accuracy history only the smallest global batch is assumed to reach the
    // target: 1 worker × 32.
    EXPECT_EQ(st["workers"], 1);
    EXPECT_EQ(st["batch_size"], 32);

    // The exploration runs are jobs of their own, and they finished.
    auto [lrc, lout] = run(c.client + " list --json");
    int profiles = 0;
    for (const auto& j : json::parse(lout).value("jobs", nlohmann::json::array())) {
      if (j.value("profile_of", "") == job_id) {
        ++profiles;
        EXPECT_EQ(j["state"], "succeeded") << j.dump();
      }
    }
    EXPECT_GE(profiles, 2);

    auto [hrc, hout] = run(c.client + " history --model mlp --json");
    auto hist = json::parse(hout);
    int prof_rows = 0, epoch_rows = 0, final_rows = 0;
    for (const auto& o : hist) {
      if (o["source"] == "profile") ++prof_rows;
      else if (o["final_accuracy"].get<double>() >= 0) ++final_rows;
      else ++epoch_rows;
    }
    EXPECT_EQ(prof_rows, profiles);
    EXPECT_EQ(epoch_rows, 1);
    EXPECT_EQ(final_rows, 1);

    // With that history, `plan` decides without exploring.
    auto [p2rc, p2out] = run(c.client + " plan " + job.string() + " --json");
    auto plan2 = json::parse(p2out);
    EXPECT_TRUE(plan2["explore"].empty()) << p2out;
    EXPECT_TRUE(plan2["feasible"].get<bool>()) << p2out;
    EXPECT_EQ(c.stop(), 0);
  }
  {
    // A new leader process on the same state directory has the jobs and the history.
    Standalone c(root / "state", root / "xdg");
    ASSERT_FALSE(c.client.empty());
    auto [src, sout] = run(c.client + " status " + job_id + " --json");
    ASSERT_EQ(src, 0) << sout;
    EXPECT_EQ(json::parse(sout)["state"], "succeeded");
    auto [hrc, hout] = run(c.client + " history --json");
    EXPECT_GE(json::parse(hout).size(), 4u);
    auto [lrc, lout] = run(c.client + " list --json");
    EXPECT_GE(json::parse(lout)["jobs"].size(), 3u);
    // The restarted leader plans from the history the first one recorded.
    auto [prc, pout] = run(c.client + " plan " + job.string() + " --json");
    auto plan = json::parse(pout);
    EXPECT_TRUE(plan["explore"].empty()) << pout;
    EXPECT_TRUE(plan["feasible"].get<bool>()) << pout;
    EXPECT_EQ(plan["choice"]["workers"], 1);
    EXPECT_EQ(plan["choice"]["batch_size"], 32);
    EXPECT_EQ(c.stop(), 0);
  }
  fs::remove_all(root);
}
