// The task events' one definition (wire/task_events.h): each builder writes exactly the
// JSON the protocol documents (docs/protocol.md), written out here by hand, and each
// reader takes it back, keeping defaults for what is absent.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "wire/leader_events.h"
#include "wire/task_events.h"

using nlohmann::json;
namespace events = dltrain::wire::events;

TEST(TaskEvents, StartedAndProgressAreWrittenAsDocumented) {
  const events::Started s{.rank = 1, .train_examples = 30000, .steps_per_epoch = 469, .parameters = 26474,
                          .partitions = 1, .load_seconds = 0.5, .resume_epoch = 2};
  EXPECT_EQ(s.to_json(), json::parse(R"({"event":"started","rank":1,"train_examples":30000,"steps_per_epoch":469,
      "parameters":26474,"partitions":1,"load_seconds":0.5,"resume_epoch":2})"));
  const events::Progress p{.rank = 0, .epoch = 3, .step = 10, .steps_per_epoch = 20, .global_step = 50, .loss = 0.25,
                           .lr = 0.05, .images_per_sec = 1000, .bytes_pushed = 7, .bytes_pulled = 9, .density = 0.01,
                           .skipped_steps = 0};
  // Nothing sent yet: the ratio is null, not absent.
  EXPECT_EQ(p.to_json(), json::parse(R"({"event":"progress","rank":0,"epoch":3,"step":10,"steps_per_epoch":20,
      "global_step":50,"loss":0.25,"lr":0.05,"images_per_sec":1000.0,"bytes_pushed":7,"bytes_pulled":9,
      "density":0.01,"compression_ratio":null,"skipped_steps":0})"));
  const auto back = events::Progress::from_json(p.to_json());
  EXPECT_EQ(back.global_step, 50);
  EXPECT_FALSE(back.compression_ratio.has_value());
}

TEST(TaskEvents, OptionalFieldsAreLeftOutAndNullablesAreNull) {
  events::EpochEnd e;
  e.rank = 1;
  e.epoch = 2;
  e.epochs = 6;
  json j = e.to_json();
  EXPECT_FALSE(j.contains("test_accuracy"));  // only rank 0 evaluates
  e.test_accuracy = 0.9;
  EXPECT_EQ(e.to_json()["test_accuracy"], 0.9);
  events::Done d;
  EXPECT_TRUE(d.to_json()["test_accuracy"].is_null());
  events::WorkerStopped w;
  w.rank = 3;
  // A worker's "stopped" always carries "replica" (null here): it tells it from a PS
  // shard's "stopped".
  EXPECT_EQ(w.to_json(), json::parse(R"({"event":"stopped","rank":3,"replica":null})"));
  w.replica = events::Replica{};
  w.replica->error = "disk full";
  EXPECT_EQ(w.to_json()["replica"], json::parse(R"({"error":"disk full"})"));
}

TEST(TaskEvents, ReadersKeepDefaultsAndIgnoreUnknownFields) {
  const auto l = events::Listening::from_json(json::parse(
      R"({"event":"listening","port":4242,"shard":1,"address":"10.0.0.2","task":"ps-1",
          "checkpoint":{"restored":true,"partitions":3,"workers_done":1,"pushes":77}})"));
  EXPECT_EQ(l.port, 4242);
  EXPECT_EQ(l.address.value(), "10.0.0.2");
  ASSERT_TRUE(l.checkpoint.has_value());
  EXPECT_TRUE(l.checkpoint->restored);
  EXPECT_EQ(l.checkpoint->pushes.value(), 77u);
  const auto bare = events::Listening::from_json(json::parse(R"({"event":"listening"})"));
  EXPECT_EQ(bare.port, 0);
  EXPECT_FALSE(bare.checkpoint.has_value());
  EXPECT_EQ(events::kind_of(json::parse(R"({"event":"epoch_end"})")), "epoch_end");
  EXPECT_EQ(events::kind_of(json::parse(R"({"event":3})")), "");
  EXPECT_EQ(events::kind_of(json::parse("[1]")), "");
  EXPECT_THROW(events::Started::from_json(json::parse(R"({"rank":"zero"})")), json::type_error);
}

TEST(TaskEvents, TrafficRatiosAreDenseOverActualBytes) {
  events::Traffic t;
  EXPECT_FALSE(t.ratio().has_value());  // nothing sent
  t.up = 100;
  t.down = 300;
  t.dense_up = 4000;
  t.dense_down = 8000;
  EXPECT_DOUBLE_EQ(*t.ratio(), 12000.0 / 400.0);
  events::Summary s;
  s.set_ratios(t, false);
  EXPECT_DOUBLE_EQ(**s.compression_ratio, 30.0);
  EXPECT_DOUBLE_EQ(**s.compression_ratio_up, 40.0);
  EXPECT_DOUBLE_EQ(**s.compression_ratio_down, 8000.0 / 300.0);
  EXPECT_FALSE(s.compression_ratio_after_warmup.has_value());
  const json j = s.to_json();
  EXPECT_EQ(j["compression_ratio"], 30.0);
  EXPECT_FALSE(j.contains("compression_ratio_after_warmup"));
  EXPECT_TRUE(j["test_accuracy"].is_null());
}

TEST(TaskEvents, ReassignedListsTheMovesAndTheReplica) {
  events::Reassigned r;
  r.generation = 2;
  r.moved = {{{}, "worker-1", "a", "b"}};
  r.reason = "agent a was lost";
  EXPECT_EQ(r.to_json(), json::parse(R"({"event":"reassigned","generation":2,
      "moved":[{"task":"worker-1","from":"a","to":"b"}],"reason":"agent a was lost"})"));
  r.replica_from = "worker-0";
  const auto back = events::Reassigned::from_json(r.to_json());
  ASSERT_EQ(back.moved.size(), 1u);
  EXPECT_EQ(back.moved[0].to, "b");
  EXPECT_EQ(back.replica_from.value(), "worker-0");
}
