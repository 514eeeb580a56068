// An elastic job's training chunks as a worker consumes them (docs/training.md, "Elastic
// jobs"): claimed from PS shard 0's dispatch (ps/dispatch.h) a few at a time, handed to
// the data feed one by one, acknowledged once their batch's step is over. Plain C++.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>

#include "ps/client.h"
#include "ps/dispatch.h"

namespace dltrain::train {

/// One worker's claims. Not thread-safe: the training thread owns it.
class ChunkClaims {
 public:
  /// `client` claims for this worker's rank; every epoch has `chunks_per_epoch` (>= 1)
  /// chunks (⌈n / B⌉ for n training examples and batch size B); claims ask for `ahead`
  /// (>= 1) chunks at a time.
  ChunkClaims(std::unique_ptr<ps::ChunkClient> client, std::uint32_t chunks_per_epoch, std::uint32_t ahead);

  std::uint32_t chunks_per_epoch() const { return per_epoch_; }

  /// The next chunk for a worker in `epoch` (an earlier epoch's given-back chunk, or one
  /// of `epoch`), claiming more when none is at hand; nullopt when the epoch has none left.
  /// PS errors propagate (ps/client.h).
  std::optional<ps::Chunk> hand(std::uint32_t epoch);
  /// The batch of the oldest handed chunk whose batch has not begun begins: the batch
  /// before it is over (its step done), so its chunk is acknowledged with the next claim.
  void batch_begins();
  /// The epoch's batches are over: the last begun batch's chunk is done.
  void epoch_ends();
  /// Leaving (or finishing): the last begun batch is done; acknowledges what is done and
  /// gives every other chunk this worker holds back to the dispatch. Idempotent.
  void release();

 private:
  std::unique_ptr<ps::ChunkClient> client_;
  std::uint32_t per_epoch_;
  std::uint32_t ahead_;
  std::deque<ps::Chunk> queue_;  ///< claimed, not handed yet
  std::uint32_t finished_ = 0;   ///< done, not yet acknowledged
  bool in_batch_ = false;        ///< a begun batch's chunk is not done yet
  bool released_ = false;
};

}  // namespace dltrain::train
