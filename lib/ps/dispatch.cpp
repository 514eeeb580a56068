#include "ps/dispatch.h"

#include <algorithm>
#include <string>

#include "common/errors.h"

namespace dltrain::ps {

namespace {
bool before(const Chunk& a, const Chunk& b) { return a.epoch != b.epoch ? a.epoch < b.epoch : a.index < b.index; }
}  // namespace

void ChunkDispatch::give_back(std::deque<Chunk>& held) {
  stats_.returned += held.size();
  for (const auto& c : held) again_.insert(std::upper_bound(again_.begin(), again_.end(), c, before), c);
  held.clear();
}

std::vector<Chunk> ChunkDispatch::claim(std::uint32_t rank, std::uint32_t epoch, std::uint32_t want,
                                        std::uint32_t acked, std::uint32_t flags, std::uint32_t chunks_per_epoch,
                                        const std::function<std::vector<std::uint32_t>()>& gone) {
  std::lock_guard lock(mu_);
  if ((flags & ~(kFresh | kRelease)) != 0) throw ProtocolError("claim: unknown flags " + std::to_string(flags));
  if (want > 1024) throw ProtocolError("claim: " + std::to_string(want) + " chunks wanted, at most 1024");
  if (chunks_per_epoch == 0) throw ProtocolError("claim: 0 chunks per epoch");
  if (per_epoch_ != 0 && chunks_per_epoch != per_epoch_) {
    throw ProtocolError("claim: worker " + std::to_string(rank) + " counts " + std::to_string(chunks_per_epoch) +
                        " chunks per epoch, the job's first claim " + std::to_string(per_epoch_));
  }
  auto& held = held_[rank];
  // Checked before anything changes: a new process holds nothing of its predecessor's.
  const std::size_t holds = (flags & kFresh) != 0 ? 0 : held.size();
  if (acked > holds) {
    throw ProtocolError("claim: worker " + std::to_string(rank) + " acknowledges " + std::to_string(acked) +
                        " chunks but holds " + std::to_string(holds));
  }
  per_epoch_ = chunks_per_epoch;
  if (gone) {
    for (const auto r : gone()) {
      if (r == rank) continue;  // claiming: it is back
      if (auto it = held_.find(r); it != held_.end()) give_back(it->second);
    }
  }
  if ((flags & kFresh) != 0) give_back(held);
  held.erase(held.begin(), held.begin() + acked);
  std::vector<Chunk> out;
  if ((flags & kRelease) != 0) {
    give_back(held);
    return out;
  }
  while (out.size() < want && !again_.empty() && again_.front().epoch <= epoch) {
    out.push_back(again_.front());
    again_.erase(again_.begin());
    ++stats_.reissued;
  }
  auto& next = next_[epoch];
  while (out.size() < want && next < per_epoch_) out.push_back(Chunk{epoch, next++});
  stats_.served += out.size();
  held.insert(held.end(), out.begin(), out.end());
  return out;
}

std::size_t ChunkDispatch::held(std::uint32_t rank) const {
  std::lock_guard lock(mu_);
  auto it = held_.find(rank);
  return it == held_.end() ? 0 : it->second.size();
}

DispatchStats ChunkDispatch::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace dltrain::ps
