// The data dispatch of an elastic job (ps/dispatch.h): chunks handed out once per epoch,
// given back by a leaver or a new process and handed out again first. Expected values
// are worked by hand from the rules in the header.
#include <vector>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "ps/dispatch.h"

using namespace dltrain;
using namespace dltrain::ps;

namespace {
std::vector<Chunk> C(std::initializer_list<std::pair<std::uint32_t, std::uint32_t>> l) {
  std::vector<Chunk> v;
  for (auto [e, i] : l) v.push_back(Chunk{e, i});
  return v;
}
}  // namespace

// 5 chunks an epoch, two workers claiming 2 at a time: fresh chunks in order, the epoch
// ends (an empty claim) once all 5 are out, the next epoch starts again at 0.
TEST(ChunkDispatch, HandsOutEveryChunkOfAnEpochOnce) {
  ChunkDispatch d;
  EXPECT_EQ(d.claim(0, 0, 2, 0, ChunkDispatch::kFresh, 5), C({{0, 0}, {0, 1}}));
  EXPECT_EQ(d.claim(1, 0, 2, 0, ChunkDispatch::kFresh, 5), C({{0, 2}, {0, 3}}));
  EXPECT_EQ(d.claim(0, 0, 2, 2, 0, 5), C({{0, 4}}));
  EXPECT_TRUE(d.claim(1, 0, 2, 2, 0, 5).empty());
  EXPECT_EQ(d.claim(1, 1, 2, 0, 0, 5), C({{1, 0}, {1, 1}}));
  EXPECT_EQ(d.held(0), 1u);
  EXPECT_EQ(d.held(1), 2u);
  EXPECT_EQ(d.stats().served, 7u);
  EXPECT_EQ(d.stats().returned, 0u);
}

// Worker 1 holds (0,2), (0,3) and leaves after training (0,2): (0,3) goes back and is the
// next chunk worker 0 gets, before any fresh one, even from a claim for a later epoch.
TEST(ChunkDispatch, ALeaversUnfinishedChunksAreHandedOutAgainFirst) {
  ChunkDispatch d;
  d.claim(0, 0, 2, 0, ChunkDispatch::kFresh, 5);  // (0,0), (0,1)
  d.claim(1, 0, 2, 0, ChunkDispatch::kFresh, 5);  // (0,2), (0,3)
  EXPECT_TRUE(d.claim(1, 0, 0, 1, ChunkDispatch::kRelease, 5).empty());
  EXPECT_EQ(d.held(1), 0u);
  EXPECT_EQ(d.claim(0, 0, 2, 2, 0, 5), C({{0, 3}, {0, 4}}));
  EXPECT_TRUE(d.claim(0, 0, 2, 2, 0, 5).empty());
  // Given back after the others moved on: a claim for epoch 1 takes it before epoch 1's.
  d.claim(2, 1, 1, 0, ChunkDispatch::kFresh, 5);  // (1,0)
  d.claim(2, 1, 0, 0, ChunkDispatch::kRelease, 5);
  EXPECT_EQ(d.claim(0, 2, 2, 0, 0, 5), C({{1, 0}, {2, 0}}));
  const auto s = d.stats();
  EXPECT_EQ(s.returned, 2u);
  EXPECT_EQ(s.reissued, 2u);
  EXPECT_EQ(s.served - s.reissued, 7u) << "fresh: (0,0..4), (1,0), (2,0)";
}

// A new process of a rank (its predecessor crashed) gives back what the predecessor held
// unacknowledged: trained again by someone, never lost.
TEST(ChunkDispatch, ANewProcessGivesBackItsPredecessorsChunks) {
  ChunkDispatch d;
  d.claim(0, 0, 3, 0, ChunkDispatch::kFresh, 4);  // (0,0), (0,1), (0,2)
  d.claim(0, 0, 0, 1, 0, 4);                      // acknowledges (0,0)
  EXPECT_EQ(d.claim(0, 0, 3, 0, ChunkDispatch::kFresh, 4), C({{0, 1}, {0, 2}, {0, 3}}));
  EXPECT_EQ(d.stats().returned, 2u);
}

// Malformed claims change nothing.
TEST(ChunkDispatch, RefusesMalformedClaims) {
  ChunkDispatch d;
  d.claim(0, 0, 2, 0, ChunkDispatch::kFresh, 5);
  EXPECT_THROW(d.claim(0, 0, 2, 3, 0, 5), ProtocolError) << "acknowledges more than it holds";
  EXPECT_THROW(d.claim(0, 0, 2, 0, 0, 6), ProtocolError) << "another chunk count";
  EXPECT_THROW(d.claim(0, 0, 2, 0, 0, 0), ProtocolError);
  EXPECT_THROW(d.claim(0, 0, 2000, 0, 0, 5), ProtocolError);
  EXPECT_THROW(d.claim(0, 0, 2, 0, 8, 5), ProtocolError);
  // A new process holds nothing yet: it cannot acknowledge (and its predecessor's stay).
  EXPECT_THROW(d.claim(0, 0, 2, 1, ChunkDispatch::kFresh, 5), ProtocolError);
  EXPECT_EQ(d.held(0), 2u);
  EXPECT_EQ(d.stats().served, 2u);
}

// A gone member's chunks (the claim's `gone`, StepBarrier::gone) go back whole,
// acknowledged ones excepted, before the claim is served; an unknown rank holds nothing.
TEST(ChunkDispatch, AGoneMembersChunksGoBack) {
  ChunkDispatch d;
  d.claim(1, 0, 3, 0, ChunkDispatch::kFresh, 6);  // (0,0), (0,1), (0,2)
  d.claim(1, 0, 0, 1, 0, 6);                      // (0,0) trained
  const auto gone = [] { return std::vector<std::uint32_t>{1, 7}; };
  EXPECT_EQ(d.claim(0, 0, 3, 0, ChunkDispatch::kFresh, 6, gone), C({{0, 1}, {0, 2}, {0, 3}}));
  EXPECT_EQ(d.held(1), 0u);
  EXPECT_EQ(d.stats().returned, 2u);
}
