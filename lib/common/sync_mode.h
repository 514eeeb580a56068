// The consistency models of a job's PS shards (the job file's `sync`). Declared here, in
// common/, so that the job specification (job/job_spec.h) names them without depending on
// the PS code above it (ps/sync.h implements them); the name stays in namespace ps, as
// compress::Method does in common/compression_spec.h.
#pragma once

#include <array>

#include "common/enum_names.h"

namespace dltrain::ps {

/// How a shard orders the workers' steps (docs/training.md, "Consistency models").
enum class SyncMode {
  kAsync,  ///< "async", ASGD: every push is applied as it arrives, every pull answered at once
  kSsp,    ///< "ssp", stale synchronous parallel (Ho et al., NIPS 2013): pushes applied as they
           ///< arrive; a pull waits while its worker is more than `staleness` steps ahead
           ///< of the slowest live worker
  kBsp,    ///< "sync", bulk-synchronous: a step's pushes are summed and applied once every live
           ///< worker's (all but `backup_workers`) have arrived; pulls wait for the step
};

}  // namespace dltrain::ps

namespace dltrain {
template <>
struct EnumNames<ps::SyncMode> {
  static constexpr std::array<EnumName<ps::SyncMode>, 3> kNames{
      {{ps::SyncMode::kAsync, "async"}, {ps::SyncMode::kSsp, "ssp"}, {ps::SyncMode::kBsp, "sync"}}};
};
}  // namespace dltrain
