// Fuzzes an elastic job's data dispatch (ps/dispatch.h) with claims as PS shard 0 takes
// them off the wire: each 8 bytes of the input are one claim — worker rank (0..3), epoch
// (0..3), chunks wanted, chunks acknowledged, flags (any value: unknown flags must be
// refused) and, rarely, another chunk count (the first accepted claim fixes the job's) — from a set of workers that
// train every chunk they are given, in order, as the worker's ChunkClaims does.
//
// Checks, beyond "no crash", against a model kept here:
//   - a refused claim (ProtocolError) changes nothing: held() and the counters as before;
//   - an accepted one acknowledges the first `acked` chunks the rank held and returns
//     chunks of epochs <= the claim's, at most `want`, none an epoch's index out of range;
//   - no chunk is ever out in two places: a fresh chunk (epoch, index) is handed out once
//     in the whole run, and a chunk is handed out again only after it was given back;
//   - nothing is lost: every chunk handed out is, at every moment, trained (acknowledged),
//     held by exactly one rank, or given back and not yet handed out again, and
//     served − reissued counts the fresh chunks.
#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "fuzz_check.h"
#include "ps/dispatch.h"

using namespace dltrain;

namespace {
using Key = std::pair<std::uint32_t, std::uint32_t>;  // (epoch, index)
constexpr std::uint32_t kChunks = 5;                   // per epoch
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ps::ChunkDispatch d;
  std::map<std::uint32_t, std::deque<Key>> held;  // the model: per rank, in hand-out order
  std::set<Key> fresh_seen, trained, back;        // handed out fresh ever; acknowledged; given back
  std::uint64_t fresh = 0;
  std::uint32_t fixed = 0;  // the chunk count the first accepted claim fixed
  for (std::size_t off = 0; off + 8 <= size; off += 8) {
    const std::uint8_t* c = data + off;
    const std::uint32_t rank = c[0] % 4, epoch = c[1] % 4;
    const std::uint32_t want = c[2] % 8 == 7 ? 2000u + c[2] : c[2] % 8;  // now and then too many
    std::uint32_t acked = c[3] % 6;
    const std::uint32_t flags = c[4] % 16 < 12 ? c[4] % 4 : c[4];  // mostly the known flags
    const std::uint32_t per_epoch = c[5] == 0xFF ? kChunks + 1 : kChunks;
    const auto before = d.stats();
    const auto held_before = d.held(rank);
    std::vector<ps::Chunk> got;
    try {
      got = d.claim(rank, epoch, want, acked, flags, per_epoch);
    } catch (const ProtocolError&) {
      const auto after = d.stats();
      FUZZ_CHECK(after.served == before.served && after.returned == before.returned && after.reissued == before.reissued,
                 "a refused claim changed the counters");
      FUZZ_CHECK(d.held(rank) == held_before, "a refused claim changed what the rank holds");
      continue;
    }
    FUZZ_CHECK((flags & ~3u) == 0 && want <= 1024 && (fixed == 0 || per_epoch == fixed),
               "a malformed claim was accepted");
    fixed = per_epoch;
    auto& mine = held[rank];
    if ((flags & ps::ChunkDispatch::kFresh) != 0) {
      for (const auto& k : mine) back.insert(k);
      mine.clear();
    }
    FUZZ_CHECK(acked <= mine.size(), "acknowledged more than it held, and accepted");
    for (std::uint32_t i = 0; i < acked; ++i) {
      trained.insert(mine.front());
      mine.pop_front();
    }
    if ((flags & ps::ChunkDispatch::kRelease) != 0) {
      for (const auto& k : mine) back.insert(k);
      mine.clear();
      FUZZ_CHECK(got.empty(), "a release handed chunks out");
    }
    FUZZ_CHECK(got.size() <= want, "more chunks than wanted");
    for (const auto& ch : got) {
      const Key k{ch.epoch, ch.index};
      FUZZ_CHECK(ch.epoch <= epoch && ch.index < fixed, "a chunk of a later epoch or out of range");
      if (back.erase(k) == 0) {
        FUZZ_CHECK(fresh_seen.insert(k).second, "a fresh chunk handed out twice");
        FUZZ_CHECK(ch.epoch == epoch, "a fresh chunk of another epoch");
        ++fresh;
      }
      mine.push_back(k);
    }
    // Conservation: each chunk ever handed out is exactly one of: trained, held by one
    // rank, given back (and not handed out again yet).
    std::set<Key> out;
    for (const auto& [r, q] : held) {
      FUZZ_CHECK(d.held(r) == q.size(), "held() disagrees with the model");
      for (const auto& k : q) FUZZ_CHECK(out.insert(k).second, "a chunk held twice");
    }
    for (const auto& k : back) FUZZ_CHECK(out.insert(k).second, "a chunk both held and given back");
    for (const auto& k : trained) FUZZ_CHECK(out.insert(k).second, "a trained chunk out again");
    FUZZ_CHECK(out == fresh_seen, "a chunk was lost, or one appeared from nowhere");
    const auto s = d.stats();
    FUZZ_CHECK(s.served - s.reissued == fresh, "served − reissued is not the fresh chunks");
  }
  return 0;
}
