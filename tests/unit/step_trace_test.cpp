// The step timeline (wire/step_trace.h): the bounded ring, the file a worker writes
// and reads back, and the Chrome trace-event document, checked against values worked
// out by hand.
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/errors.h"
#include "wire/step_trace.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace dltrain::wire;

namespace {

// A step whose phases begin at t0 and last d[0..5] µs.
StepRecord step_at(std::int64_t step, std::int64_t t0, std::array<std::int64_t, kStepPhases> d) {
  StepRecord r;
  r.step = step;
  r.t[0] = t0;
  for (std::size_t i = 0; i < kStepPhases; ++i) r.t[i + 1] = r.t[i] + d[i];
  return r;
}

std::vector<std::int64_t> steps_of(const std::vector<StepRecord>& v) {
  std::vector<std::int64_t> out;
  for (const auto& r : v) out.push_back(r.step);
  return out;
}

// The complete events of process `pid` named `name`.
std::vector<json> events(const json& doc, int pid, const std::string& name) {
  std::vector<json> out;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "X" && e["pid"] == pid && e["name"] == name) out.push_back(e);
  }
  return out;
}

}  // namespace

TEST(StepTraceRing, KeepsTheLastCapacityStepsOldestFirst) {
  StepTraceRing ring(3);
  EXPECT_EQ(ring.capacity(), 3u);
  EXPECT_TRUE(ring.last(5).empty());
  ring.push(step_at(1, 0, {}));
  ring.push(step_at(2, 0, {}));
  EXPECT_EQ(steps_of(ring.last(5)), (std::vector<std::int64_t>{1, 2}));
  for (std::int64_t s = 3; s <= 5; ++s) ring.push(step_at(s, 0, {}));
  EXPECT_EQ(ring.size(), 3u);
  EXPECT_EQ(steps_of(ring.last(10)), (std::vector<std::int64_t>{3, 4, 5}));
  EXPECT_EQ(steps_of(ring.last(2)), (std::vector<std::int64_t>{4, 5}));
  EXPECT_EQ(steps_of(ring.last(0)), (std::vector<std::int64_t>{}));
  // Seven more pushes wrap it twice more: still the last three.
  for (std::int64_t s = 6; s <= 12; ++s) ring.push(step_at(s, 0, {}));
  EXPECT_EQ(steps_of(ring.last(3)), (std::vector<std::int64_t>{10, 11, 12}));
  EXPECT_THROW(StepTraceRing(0), dltrain::InvalidArgument);
}

TEST(StepTrace, PhaseNamesInStepOrder) {
  EXPECT_EQ(phase_name(StepPhase::kData), "data");
  EXPECT_EQ(phase_name(StepPhase::kForward), "forward");
  EXPECT_EQ(phase_name(StepPhase::kBackward), "backward");
  EXPECT_EQ(phase_name(StepPhase::kCompress), "compress");
  EXPECT_EQ(phase_name(StepPhase::kPushPull), "push_pull");
  EXPECT_EQ(phase_name(StepPhase::kApply), "apply");
}

TEST(StepTrace, FileIsReplacedAtomicallyAndReadsBack) {
  const fs::path dir = fs::temp_directory_path() / ("dltrain-step-trace-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "step_trace.json").string();
  const std::vector<StepRecord> steps{step_at(7, 1'000'000, {10, 20, 40, 5, 100, 5}),
                                      step_at(8, 1'000'200, {1, 2, 3, 4, 5, 6})};
  write_step_trace(path, step_trace_json("worker-1", {steps[0]}));
  write_step_trace(path, step_trace_json("worker-1", steps));  // replaces the first
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  const json doc = json::parse(text.str());
  EXPECT_EQ(doc["phases"], json({"data", "forward", "backward", "compress", "push_pull", "apply"}));
  // The second step by hand: 1000200, +1, +2, +3, +4, +5, +6.
  EXPECT_EQ(doc["steps"][1], json({8, 1000200, 1000201, 1000203, 1000206, 1000210, 1000215, 1000221}));
  const auto back = parse_step_trace(text.str(), path);
  EXPECT_EQ(back.task, "worker-1");
  ASSERT_EQ(back.steps.size(), 2u);
  EXPECT_EQ(back.steps[0].step, 7);
  EXPECT_EQ(back.steps[0].t, steps[0].t);
  EXPECT_EQ(back.steps[1].t, steps[1].t);
  fs::remove_all(dir);
  EXPECT_THROW(write_step_trace((dir / "missing" / "x.json").string(), doc), dltrain::IoError);
}

TEST(StepTrace, BadFilesNameTheProblem) {
  auto error_of = [](const std::string& text) {
    try {
      parse_step_trace(text, "trace.json");
    } catch (const dltrain::ProtocolError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of("{nope"), "trace.json: the step trace is not a JSON object");
  EXPECT_EQ(error_of(R"({"format":"other","version":1,"steps":[]})"),
            "trace.json: not a dltrain-step-trace version 1 file");
  EXPECT_EQ(error_of(R"({"format":"dltrain-step-trace","version":1,"steps":[[1,2,3]]})"),
            "trace.json: step 1: expected [step, 7 timestamps]");
  EXPECT_EQ(error_of(R"({"format":"dltrain-step-trace","version":1,"steps":[[1,10,11,12,13,14,15,16],[2,20,21,19,22,23,24,25]]})"),
            "trace.json: step 2: timestamps decrease");
}

TEST(StepTrace, ChromeTraceEventsHaveTheHandComputedTimesAndDurations) {
  // worker-0: two steps; worker-1: one step that began 50 µs before worker-0's last.
  TaskTrace w0{"worker-0", {step_at(1, 5'000, {10, 20, 40, 5, 100, 5}), step_at(2, 5'180, {1, 2, 3, 4, 5, 6})}};
  TaskTrace w1{"worker-1", {step_at(1, 5'130, {2, 4, 6, 8, 10, 12})}};
  const json doc = chrome_trace({w0, w1}, 1);  // the last step of each
  // The document's time 0 is the earliest step shown: worker-1's at 5130 µs.
  EXPECT_EQ(doc["otherData"]["start_unix_us"], 5130);
  EXPECT_EQ(doc["displayTimeUnit"], "ms");
  // Metadata: process names and the thread's.
  int named = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "process_name") {
      EXPECT_EQ(e["args"]["name"], e["pid"] == 1 ? "worker-0" : "worker-1");
      ++named;
    }
  }
  EXPECT_EQ(named, 2);
  // worker-0's step 2: starts at 5180 − 5130 = 50 µs, lasts 1+2+3+4+5+6 = 21 µs.
  const auto s0 = events(doc, 1, "step");
  ASSERT_EQ(s0.size(), 1u);
  EXPECT_EQ(s0[0]["ts"], 50);
  EXPECT_EQ(s0[0]["dur"], 21);
  EXPECT_EQ(s0[0]["args"]["step"], 2);
  const auto pp = events(doc, 1, "push_pull");  // after 1+2+3+4 = 10 µs, 5 µs long
  ASSERT_EQ(pp.size(), 1u);
  EXPECT_EQ(pp[0]["ts"], 60);
  EXPECT_EQ(pp[0]["dur"], 5);
  EXPECT_EQ(pp[0]["tid"], 1);
  EXPECT_EQ(pp[0]["cat"], "phase");
  // worker-1's step: ts 0, backward after 2+4 = 6 µs, 6 µs long; the step 42 µs.
  const auto bw = events(doc, 2, "backward");
  ASSERT_EQ(bw.size(), 1u);
  EXPECT_EQ(bw[0]["ts"], 6);
  EXPECT_EQ(bw[0]["dur"], 6);
  EXPECT_EQ(events(doc, 2, "step").at(0)["dur"], 42);
  // Per task: 3 metadata events and 7 complete events per step shown.
  EXPECT_EQ(doc["traceEvents"].size(), 2u * (3 + 7));

  // Every step when more are asked for than there are: worker-0's first starts at 0.
  const json all = chrome_trace({w0}, 100);
  EXPECT_EQ(events(all, 1, "step").size(), 2u);
  EXPECT_EQ(events(all, 1, "data").at(0)["ts"], 0);
  EXPECT_EQ(events(all, 1, "apply").at(0)["ts"], 175);  // 10+20+40+5+100
  EXPECT_EQ(events(all, 1, "apply").at(0)["dur"], 5);
}
