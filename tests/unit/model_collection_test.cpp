// The leader's model collection (leader/model_collection.h) without sockets: the agent
// is played by the test through the collection's hooks (the orders it would send) and the
// replies it gets. A succeeding job's model is asked for file by file, checked against
// its SHA-256, kept and served back byte for byte; a file whose bytes do not match, or an
// agent that goes away, ends the collection with the reason and lets the job end; the
// requests that need a kept model are refused with the leader's code and field.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/file_transfer.h"
#include "leader/model_collection.h"
#include "support/session_double.h"
#include "support/temp_dir.h"
#include "wire/control.h"

using namespace dltrain;
using namespace dltrain::leader;
using json = nlohmann::json;

namespace {


struct Order {
  std::string id;
  wire::ControlType type;
  json body;
};

std::vector<std::uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }

// worker-0's agent answers order `o` with the whole of `content` as file `o.body.file`,
// announcing `sha256` (the content's own unless given).
wire::Envelope whole_file(const Order& o, const std::string& content, std::string sha256 = "") {
  const auto b = bytes_of(content);
  wire::ModelFileChunkBody c;
  c.job = o.body.at("job");
  c.file = o.body.at("file");
  c.offset = 0;
  c.size = static_cast<std::int64_t>(b.size());
  c.sha256 = sha256.empty() ? sha256_hex(b) : sha256;
  c.data = base64_encode(b);
  return wire::parse_envelope(wire::make_reply(o.id, c.to_json()));
}

class ModelCollectionTest : public ::testing::Test {
 protected:
  ModelCollectionTest()
      : models(jobs, agents, {[this](const ModelCollection::SessionPtr&, const std::string& id, wire::ControlType type,
                                     const json& body) {
                                orders.push_back({id, type, body});
                                return true;
                              },
                              [this](JobRec& j) { ended.push_back(j.id); }}) {
    models.open(dir.path.string(), 5);
    agents["agent-a"].session = session;
  }

  // A job whose tasks have all exited, succeeding: worker-0 ran on agent-a.
  JobRec& succeeding_job() {
    JobRec j;
    jobs.number(j);
    j.spec.model = ModelKind::kCnn;
    j.life = JobLifecycle::restored(JobState::kFinishing, JobState::kSucceeded);
    j.test_accuracy = 0.9;
    j.epochs_done = 2;
    TaskRec t;
    t.name = "worker-0";
    t.agent = "agent-a";
    j.tasks.push_back(t);
    return jobs.add(std::move(j));
  }

  dltrain::testing::TempDir dir;
  JobTable jobs;
  AgentRegistry agents;
  std::shared_ptr<control::Session> session = std::make_shared<dltrain::testing::SessionDouble>();
  std::vector<Order> orders;
  std::vector<std::string> ended;
  ModelCollection models;
};

}  // namespace

TEST_F(ModelCollectionTest, ASucceedingJobsModelIsFetchedFileByFileCheckedKeptAndServed) {
  JobRec& j = succeeding_job();
  ASSERT_TRUE(models.collect(j));
  EXPECT_TRUE(models.collecting(j.id));
  ASSERT_EQ(orders.size(), 1u);
  EXPECT_EQ(orders[0].type, wire::ControlType::kReadModelFile);
  EXPECT_EQ(orders[0].body["file"], "metadata.json");
  EXPECT_EQ(orders[0].body["checkpoint"], "last");
  EXPECT_EQ(orders[0].body["task"], "worker-0");

  const std::string meta = json{{"files", {"metadata.json", "state_dict.pt"}}, {"checkpoints", json::array()}}.dump();
  ASSERT_TRUE(models.on_reply(whole_file(orders[0], meta)));
  ASSERT_EQ(orders.size(), 2u);  // then the file the metadata names
  EXPECT_EQ(orders[1].body["file"], "state_dict.pt");
  const std::string weights = "not really a state_dict, but 43 bytes long.";
  ASSERT_TRUE(models.on_reply(whole_file(orders[1], weights)));

  EXPECT_EQ(ended, std::vector<std::string>{j.id});
  EXPECT_FALSE(models.collecting(j.id));
  EXPECT_TRUE(j.model.done);
  EXPECT_EQ(j.model.checkpoint, "last");
  EXPECT_EQ(j.model.error, "");
  const json kept = models.models_json(j.id);
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0]["checkpoint"], "last");
  EXPECT_EQ(kept[0]["model"], "cnn");
  EXPECT_EQ(kept[0]["test_accuracy"], 0.9);
  EXPECT_EQ(kept[0]["bytes"], static_cast<std::int64_t>(meta.size() + weights.size()));

  // Read back as a client would, byte for byte, with the checksum the agent announced.
  wire::ModelFileRequestBody read;
  read.job = j.id;
  read.checkpoint = "last";
  read.file = "state_dict.pt";
  read.max_bytes = 1 << 20;
  const auto chunk = models.on_model_read(read);
  EXPECT_EQ(base64_decode(chunk["data"]), bytes_of(weights));
  EXPECT_EQ(chunk["sha256"], sha256_hex(bytes_of(weights)));
  // A reply nobody asked for is not the collection's.
  EXPECT_FALSE(models.on_reply(wire::parse_envelope(wire::make_reply("model-99", json::object()))));
}

TEST_F(ModelCollectionTest, AFileThatDoesNotMatchItsChecksumEndsTheCollectionWithTheReason) {
  JobRec& j = succeeding_job();
  ASSERT_TRUE(models.collect(j));
  const std::string meta = json{{"files", {"metadata.json"}}}.dump();
  ASSERT_TRUE(models.on_reply(whole_file(orders[0], meta, std::string(64, 'a'))));
  EXPECT_EQ(ended, std::vector<std::string>{j.id});
  EXPECT_TRUE(j.model.done);
  EXPECT_EQ(j.model.checkpoint, "");
  EXPECT_NE(j.model.error.find("collecting the model from agent agent-a"), std::string::npos) << j.model.error;
  EXPECT_NE(j.model.error.find("checksum mismatch"), std::string::npos) << j.model.error;
  EXPECT_TRUE(models.models_json(j.id).empty());
  wire::ModelFileRequestBody read;
  read.job = j.id;
  read.checkpoint = "last";
  read.file = "metadata.json";
  try {
    models.on_model_read(read);
    ADD_FAILURE() << "a model that was not kept was served";
  } catch (const wire::Refused& e) {
    EXPECT_STREQ(e.code(), wire::error_code::kNotFound);
    EXPECT_EQ(e.field(), "job");
    EXPECT_NE(std::string(e.what()).find("no model \"last\" of " + j.id + " is kept"), std::string::npos) << e.what();
  }
}

TEST_F(ModelCollectionTest, AnAgentLostMidwayEndsTheCollectionAndAnAgentAwayMeansNoneStarts) {
  JobRec& j = succeeding_job();
  ASSERT_TRUE(models.collect(j));
  agents["agent-a"].lost = true;
  models.expire(ModelCollection::Clock::now());
  EXPECT_EQ(ended, std::vector<std::string>{j.id});
  EXPECT_EQ(j.model.error, "agent agent-a was lost while its model was collected");
  // The next job's worker-0 agent is gone before collection starts: nothing is asked.
  JobRec& k = succeeding_job();
  EXPECT_FALSE(models.collect(k));
  EXPECT_TRUE(k.model.done);
  EXPECT_EQ(k.model.error, "agent agent-a, which has worker-0's model, is not connected");
  EXPECT_EQ(orders.size(), 1u);
}

// Replication to the standby candidates (docs/ha.md "Artifacts"): the job ends only once
// the standby acknowledged the model, its replicate requests are answered with what it
// lacks at once and otherwise wait for a change; a standby that never comes costs the
// timeout, said in the job's record.
class ModelReplicationTest : public ModelCollectionTest {
 protected:
  ModelReplicationTest()
      : replicated(jobs, agents,
                   {[this](const ModelCollection::SessionPtr&, const std::string& id, wire::ControlType type,
                           const json& body) {
                      orders.push_back({id, type, body});
                      return true;
                    },
                    [this](JobRec& j) { ended.push_back(j.id); }, [this] { return standbys; }}) {
    replicated.open((dir.path / "replicated").string(), 5);
    replicated.set_replication_timeout(std::chrono::seconds(60));
  }

  // Collects `j`'s model (metadata.json and state_dict.pt) through `replicated`.
  void collect(JobRec& j, const std::string& weights) {
    ASSERT_TRUE(replicated.collect(j));
    const std::string meta = json{{"files", {"metadata.json", "state_dict.pt"}}, {"checkpoints", json::array()}}.dump();
    ASSERT_TRUE(replicated.on_reply(whole_file(orders.back(), meta)));
    ASSERT_TRUE(replicated.on_reply(whole_file(orders.back(), weights)));
    meta_sha = sha256_hex(bytes_of(meta));
  }

  void replicate(const std::string& id, std::vector<std::string> models_held) {
    wire::ReplicateBody b;
    b.candidate = "cand-b";
    b.models = std::move(models_held);
    replicated.on_replicate(standby, id, b,
                            [this](const ModelCollection::SessionPtr&, const std::string& rid, const json& body) {
                              replies.emplace_back(rid, body);
                            });
  }

  std::vector<std::string> standbys{"cand-b"};
  std::shared_ptr<control::Session> standby =
      std::make_shared<dltrain::testing::SessionDouble>(control::PeerKind::kAgent, 7);
  std::vector<std::pair<std::string, json>> replies;
  std::string meta_sha;
  ModelCollection replicated;
};

TEST_F(ModelReplicationTest, AJobEndsOnlyOnceTheStandbyHoldsItsModelAndAnInSyncRequestWaitsForAChange) {
  // The standby connects: its first request, holding nothing, is answered at once.
  replicate("r0", {});
  ASSERT_EQ(replies.size(), 1u);
  EXPECT_EQ(replies[0].second["models"], json::array());
  EXPECT_TRUE(replicated.is_replica(standby));

  JobRec& j = succeeding_job();
  const std::string weights = "the weights of the first job";
  collect(j, weights);
  EXPECT_TRUE(ended.empty());  // stored, but the standby holds nothing yet
  EXPECT_FALSE(j.model.done);
  EXPECT_TRUE(replicated.collecting(j.id));

  // It asks again (still holding nothing): the inventory changed, so it is answered at once.
  replicate("r1", {});
  ASSERT_EQ(replies.size(), 2u);
  EXPECT_EQ(replies[1].first, "r1");
  const json& inv = replies[1].second;
  ASSERT_EQ(inv["models"].size(), 1u);
  EXPECT_EQ(inv["models"][0]["job"], j.id);
  EXPECT_EQ(inv["jobs"], json::array({j.id}));
  // The key it must report: the files' names and SHA-256s, hashed (ModelManifest::key).
  const std::string files = "metadata.json:" + meta_sha + ";state_dict.pt:" + sha256_hex(bytes_of(weights)) + ";";
  const std::string key = j.id + "/last/" + sha256_hex(bytes_of(files));
  EXPECT_EQ(ModelManifest::from_json(inv["models"][0]).key(), key);
  EXPECT_TRUE(ended.empty());

  // Having copied it, it asks again: the acknowledgement ends the job; the request waits.
  replicate("r2", {key});
  EXPECT_EQ(ended, std::vector<std::string>{j.id});
  EXPECT_TRUE(j.model.done);
  EXPECT_EQ(j.model.replicas, std::vector<std::string>{"cand-b"});
  EXPECT_EQ(j.model.replication, "");
  EXPECT_EQ(replies.size(), 2u);

  // A second job's model stored: the waiting request is answered with both.
  JobRec& k = succeeding_job();
  collect(k, "the weights of the second job");
  ASSERT_EQ(replies.size(), 3u);
  EXPECT_EQ(replies[2].first, "r2");
  EXPECT_EQ(replies[2].second["models"].size(), 2u);
  // A request that still lacks what the answer it had listed (its copy failed) is not
  // answered again at once, which would spin: it waits, at most ReplicateBody::kHold.
  replicate("r3", {key});
  EXPECT_EQ(replies.size(), 3u);
  replicated.expire(std::chrono::steady_clock::now() + wire::ReplicateBody::kHold + std::chrono::seconds(1));
  ASSERT_EQ(replies.size(), 4u);
  EXPECT_EQ(replies[3].first, "r3");
  // Its session closes: the waiting request is dropped, and the second job, which waited
  // for it, ends with that said.
  replicate("r4", {key});
  EXPECT_TRUE(std::find(ended.begin(), ended.end(), k.id) == ended.end());
  replicated.on_replica_closed(standby);
  replicated.expire(std::chrono::steady_clock::now() + wire::ReplicateBody::kHold + std::chrono::seconds(1));
  EXPECT_EQ(replies.size(), 4u);
  EXPECT_EQ(ended.back(), k.id);
}

TEST_F(ModelReplicationTest, AStandbyThatDoesNotCopyCostsTheTimeoutAndOneThatIsNotConnectedNothing) {
  // Standing by but never connected (no state_dir, say): the job ends at once, saying so.
  JobRec& j = succeeding_job();
  collect(j, "weights");
  EXPECT_EQ(ended, std::vector<std::string>{j.id});
  EXPECT_TRUE(j.model.replicas.empty());
  EXPECT_NE(j.model.replication.find("not copied yet to cand-b (standing by, not copying now)"), std::string::npos)
      << j.model.replication;

  // Connected but never acknowledging: the job waits the timeout, then ends, saying why.
  replicate("r0", {});
  JobRec& k = succeeding_job();
  collect(k, "other weights");
  EXPECT_EQ(ended.size(), 1u);
  replicated.expire(std::chrono::steady_clock::now() + std::chrono::seconds(30));
  EXPECT_EQ(ended.size(), 1u);  // within the timeout it waits
  replicated.expire(std::chrono::steady_clock::now() + std::chrono::seconds(61));
  EXPECT_EQ(ended.back(), k.id);
  EXPECT_TRUE(k.model.done);
  EXPECT_TRUE(k.model.replicas.empty());
  EXPECT_NE(k.model.replication.find("not copied to cand-b (1 model(s) or upload(s) still to copy)"), std::string::npos)
      << k.model.replication;

  // Without standbys (a single leader, or none standing by) a job ends at once, saying nothing.
  standbys.clear();
  JobRec& l = succeeding_job();
  collect(l, "more weights");
  EXPECT_EQ(ended.back(), l.id);
  EXPECT_TRUE(l.model.replication.empty());
}
