// PartitionTracker (ps/overlap.h): which partitions backward has completed, on a
// hand-made layout whose answers follow from the offsets by hand.
#include <gtest/gtest.h>

#include "ps/overlap.h"

namespace {

// Tensors of 3, 5 and 2 floats (offsets 0, 3, 8) over partitions [0,4) [4,8) [8,10).
dltrain::ps::PartitionLayout layout() {
  dltrain::ps::PartitionLayout l;
  l.partitions = {{0, 0, 4, 0}, {1, 4, 4, 0}, {2, 8, 2, 0}};
  l.total_floats = 10;
  return l;
}

TEST(PartitionTracker, APartitionIsCompleteWhenTheLastTensorItCoversArrives) {
  dltrain::ps::PartitionTracker t({3, 5, 2}, layout());
  EXPECT_EQ(t.offset(0), 0);
  EXPECT_EQ(t.offset(1), 3);
  EXPECT_EQ(t.offset(2), 8);
  // Backward produces the last layers first.
  EXPECT_EQ(t.arrived(2), (std::vector<std::uint32_t>{2}));
  EXPECT_TRUE(t.arrived(0).empty());                          // partition 0 still lacks float 3
  EXPECT_EQ(t.arrived(1), (std::vector<std::uint32_t>{0, 1}));  // tensor 1 spans floats 3..7
  EXPECT_TRUE(t.claim(1));
  EXPECT_FALSE(t.claim(1));
  EXPECT_TRUE(t.claimed(1));
  EXPECT_FALSE(t.claimed(0));
  t.begin_step();
  EXPECT_FALSE(t.claimed(1));
  EXPECT_TRUE(t.arrived(0).empty());
}

TEST(PartitionTracker, FloatsOfTensorsWithoutAGradientAreZeroedInTheirPartitionOnly) {
  dltrain::ps::PartitionTracker t({3, 5, 2}, layout());
  t.arrived(0);  // tensor 1 (floats 3..7) and tensor 2 got none
  std::vector<float> g(10, 1.0f);
  t.zero_missing(layout().partitions[0], g);
  EXPECT_EQ(g, (std::vector<float>{1, 1, 1, 0, 1, 1, 1, 1, 1, 1}));
  t.zero_missing(layout().partitions[2], g);
  EXPECT_EQ(g, (std::vector<float>{1, 1, 1, 0, 1, 1, 1, 1, 0, 0}));
}

}  // namespace
