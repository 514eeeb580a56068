// The NCCL local-group backend with one rank (a group of one member: no socket), on a
// CUDA device; skipped, saying "no CUDA device", where there is none. The logic of groups
// with several members is tested over the CPU backend (tests/unit/local_group_test.cpp).
#include <vector>

#include <gtest/gtest.h>

#include "gpu/device.h"
#include "gpu/nccl_group.h"
#include "group/local_group.h"

using namespace dltrain;

TEST(NcclGroup, OneRankSumsAndBroadcastsItsOwnValues) {
  std::string why;
  if (gpu::device_count(&why) == 0) GTEST_SKIP() << "no CUDA device (" << why << ")";
  group::LocalGroupOptions o;
  o.members = {"worker-0"};
  auto group = group::LocalGroup::join(o);
  gpu::NcclGroup nccl(*group, 0, std::chrono::milliseconds(60000));
  const std::vector<float> x{1.5f, -2.0f, 3.25f, 0.0f};
  gpu::DeviceArray<float> d;
  d.upload(x);
  nccl.allreduce_sum(d.data(), x.size());
  EXPECT_EQ(d.download(), x);  // the sum over one member is its own
  nccl.broadcast(d.data(), x.size());
  EXPECT_EQ(d.download(), x);
}
