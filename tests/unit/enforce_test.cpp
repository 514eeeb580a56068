// DLTRAIN_ENFORCE_* (common/enforce.h): the exact messages, the error types, and that the
// checked values are evaluated once and the context only on failure.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "common/enforce.h"
#include "common/errors.h"
#include "wire/frame.h"
#include "support/error_of.h"

using namespace dltrain;

using dltrain::testing::message_of;

TEST(Enforce, EqNamesTheContextTheExpectedAndTheFoundValue) {
  const std::uint32_t count = 512;
  const std::int64_t length = 1024;
  const int shard = 1, key = 3;
  EXPECT_EQ(message_of<ProtocolError>([&] {
              DLTRAIN_ENFORCE_EQ(count, length, ProtocolError, "PS shard ", shard, ": pull-reply of partition ", key,
                                 ": element count");
            }),
            "PS shard 1: pull-reply of partition 3: element count: expected 1024, got 512");
  // Equal values of different signedness pass; a negative value never equals a large
  // unsigned one (no wrap-around).
  EXPECT_NO_THROW(DLTRAIN_ENFORCE_EQ(std::uint32_t{1024}, std::int64_t{1024}, ProtocolError, "x"));
  EXPECT_EQ(message_of<IoError>([] { DLTRAIN_ENFORCE_EQ(-1, 0xFFFFFFFFu, IoError, "n"); }),
            "n: expected 4294967295, got -1");
}

TEST(Enforce, LeAndGeSayWhichBound) {
  EXPECT_NO_THROW(DLTRAIN_ENFORCE_LE(4u, 4, ProtocolError, "k"));
  EXPECT_EQ(message_of<ProtocolError>([] { DLTRAIN_ENFORCE_LE(5u, 4, ProtocolError, "sparse reply: count"); }),
            "sparse reply: count: expected at most 4, got 5");
  EXPECT_NO_THROW(DLTRAIN_ENFORCE_GE(32u, 32u, TimeoutError, "secret"));
  EXPECT_EQ(message_of<TimeoutError>([] { DLTRAIN_ENFORCE_GE(std::size_t{31}, 32, TimeoutError, "secret bytes"); }),
            "secret bytes: expected at least 32, got 31");
  EXPECT_EQ(message_of<ProtocolError>([] { DLTRAIN_ENFORCE_GE(-3, 0u, ProtocolError, "offset"); }),
            "offset: expected at least 0, got -3");
}

TEST(Enforce, EnumsPrintByTheirToStringOrTheirNumber) {
  // wire::MessageType has wire::to_string (found by ADL); wire::Codec has none.
  EXPECT_EQ(message_of<ProtocolError>([] {
              DLTRAIN_ENFORCE_EQ(wire::MessageType::kError, wire::MessageType::kPullReply, ProtocolError,
                                 "PS shard 0 (127.0.0.1:7000)");
            }),
            "PS shard 0 (127.0.0.1:7000): expected pull-reply, got error");
  EXPECT_EQ(message_of<ProtocolError>([] {
              DLTRAIN_ENFORCE_EQ(wire::Codec::kSparseF32, wire::Codec::kDenseF32, ProtocolError, "codec");
            }),
            "codec: expected 1, got 3");
  // Floating point and strings go through operator<<.
  EXPECT_EQ(message_of<Error>([] { DLTRAIN_ENFORCE_EQ(1.5, 2.25, Error, "lr"); }), "lr: expected 2.25, got 1.5");
  EXPECT_EQ(message_of<Error>([] { DLTRAIN_ENFORCE_EQ(std::string("b"), std::string("a"), Error, "name"); }),
            "name: expected a, got b");
}

TEST(Enforce, ValuesAreEvaluatedOnceAndTheContextOnlyOnFailure) {
  int reads = 0, contexts = 0;
  auto next = [&] { return ++reads; };
  auto context = [&] {
    ++contexts;
    return std::string("ctx");
  };
  DLTRAIN_ENFORCE_EQ(next(), 1, ProtocolError, context());
  EXPECT_EQ(reads, 1);
  EXPECT_EQ(contexts, 0);
  EXPECT_EQ(message_of<ProtocolError>([&] { DLTRAIN_ENFORCE_LE(next(), 1, ProtocolError, context()); }),
            "ctx: expected at most 1, got 2");
  EXPECT_EQ(reads, 2);
  EXPECT_EQ(contexts, 1);
  // The error thrown is of the named type (and a dltrain::Error), nothing broader.
  EXPECT_THROW(DLTRAIN_ENFORCE_EQ(1, 2, TimeoutError, "t"), TimeoutError);
  EXPECT_THROW(DLTRAIN_ENFORCE_EQ(1, 2, TimeoutError, "t"), Error);
}
