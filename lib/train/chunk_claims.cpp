#include "train/chunk_claims.h"

#include <algorithm>

namespace dltrain::train {

ChunkClaims::ChunkClaims(std::unique_ptr<ps::ChunkClient> client, std::uint32_t chunks_per_epoch, std::uint32_t ahead)
    : client_(std::move(client)), per_epoch_(std::max<std::uint32_t>(1, chunks_per_epoch)),
      ahead_(std::clamp<std::uint32_t>(ahead, 1, 1024)) {}

std::optional<ps::Chunk> ChunkClaims::hand(std::uint32_t epoch) {
  if (queue_.empty()) {
    for (const auto& [e, i] : client_->claim(epoch, ahead_, finished_, per_epoch_)) queue_.push_back(ps::Chunk{e, i});
    finished_ = 0;
    // A reconnect gave back the chunk of the batch in progress too: nothing of it to acknowledge.
    if (client_->reconnected()) in_batch_ = false;
  }
  if (queue_.empty()) return std::nullopt;
  const auto c = queue_.front();
  queue_.pop_front();
  return c;
}

void ChunkClaims::batch_begins() {
  if (in_batch_) ++finished_;
  in_batch_ = true;
}

void ChunkClaims::epoch_ends() {
  if (in_batch_) ++finished_;
  in_batch_ = false;
}

void ChunkClaims::release() {
  if (released_) return;
  epoch_ends();
  client_->claim(0, 0, finished_, per_epoch_, true);
  finished_ = 0;
  queue_.clear();
  released_ = true;
}

}  // namespace dltrain::train
