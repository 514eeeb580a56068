#include "leader/shared_plan.h"

#include <algorithm>
#include <set>

namespace dltrain::leader {

namespace {

struct Slot {
  const ShareJob* job;
  int workers;
  std::string reason;
  bool admitted;
};

double left_at(const Slot& s, int w) { return s.job->remaining / std::max(1, w); }
double cost_of(const Slot& s, const SharePlanOptions& o) { return s.job->resize_cost_s >= 0 ? s.job->resize_cost_s : o.resize_cost_s; }

}  // namespace

std::map<std::string, ShareDecision> plan_shares(const std::vector<ShareJob>& jobs, int slots,
                                                 const SharePlanOptions& o) {
  std::vector<Slot> plan;
  plan.reserve(jobs.size());
  int used = 0;
  // 1. Running jobs keep their workers.
  for (const auto& j : jobs) {
    if (j.workers > 0) {
      const int w = std::clamp(j.workers, j.min_workers, j.max_workers);
      plan.push_back(Slot{&j, w, "keeps its workers", true});
      used += w;
    }
  }
  // 2. Queued jobs at min_workers, by priority then arrival, shrinking the running ones.
  std::vector<const ShareJob*> queued;
  for (const auto& j : jobs) {
    if (j.workers <= 0) queued.push_back(&j);
  }
  std::stable_sort(queued.begin(), queued.end(), [](auto* a, auto* b) { return a->priority > b->priority; });
  for (const auto* q : queued) {
    int free = slots - used;
    std::vector<Slot*> donors;
    for (auto& s : plan) {
      if (s.admitted && s.job->workers > 0 && s.workers > s.job->min_workers) donors.push_back(&s);
    }
    int spare = 0;
    for (auto* d : donors) spare += d->workers - d->job->min_workers;
    if (free + spare < q->min_workers) {
      plan.push_back(Slot{q, 0, "waits: " + std::to_string(q->min_workers) + " workers do not fit", false});
      continue;
    }
    while (free < q->min_workers) {
      auto* d = *std::max_element(donors.begin(), donors.end(), [](auto* a, auto* b) {
        const bool ca = a->workers > a->job->min_workers, cb = b->workers > b->job->min_workers;
        if (ca != cb) return !ca;
        return left_at(*a, a->workers) < left_at(*b, b->workers);
      });
      --d->workers;
      d->reason = "gives workers to " + q->id;
      ++free;
      --used;
    }
    plan.push_back(Slot{q, q->min_workers, "admitted at min_workers", true});
    used += q->min_workers;
  }
  // 3. Fair shares: users below slots / users take from users above it.
  std::map<std::string, int> held;
  for (const auto& s : plan) {
    if (s.admitted) held[s.job->owner] += s.workers;
  }
  if (held.size() > 1) {
    const int share = slots / static_cast<int>(held.size());
    for (bool moved = true; moved;) {
      moved = false;
      for (auto& [user, have] : held) {
        if (have >= share) continue;
        // The user's job that gains most from one more worker (the shortest time left).
        Slot* take = nullptr;
        for (auto& s : plan) {
          if (s.admitted && s.job->owner == user && s.workers < s.job->max_workers &&
              (take == nullptr || left_at(s, s.workers) < left_at(*take, take->workers))) {
            take = &s;
          }
        }
        if (take == nullptr) continue;  // its jobs want no more
        // From a free slot, else from a user above the share: its job with the most left.
        Slot* give = nullptr;
        if (used >= slots) {
          for (auto& s : plan) {
            if (s.admitted && held[s.job->owner] > share && s.workers > s.job->min_workers &&
                (give == nullptr || left_at(s, s.workers) > left_at(*give, give->workers))) {
              give = &s;
            }
          }
          if (give == nullptr) continue;
          --give->workers;
          --held[give->job->owner];
          give->reason = "gives a worker to user " + user + "'s fair share";
        } else {
          ++used;
        }
        ++take->workers;
        ++have;
        take->reason = "user " + user + "'s fair share (" + std::to_string(share) + " slots)";
        moved = true;
      }
    }
  }
  // 4. Spare slots: priority, then the shortest time left, while it saves more than a resize costs.
  while (used < slots) {
    Slot* best = nullptr;
    for (auto& s : plan) {
      if (!s.admitted || s.workers >= s.job->max_workers) continue;
      const double saves = left_at(s, s.workers) - left_at(s, s.workers + 1);
      if (saves <= cost_of(s, o)) continue;
      if (best == nullptr || s.job->priority > best->job->priority ||
          (s.job->priority == best->job->priority && left_at(s, s.workers) < left_at(*best, best->workers))) {
        best = &s;
      }
    }
    if (best == nullptr) break;
    ++best->workers;
    ++used;
    best->reason = "spare slots: shortest time left";
  }
  // 5. Shortest-remaining-time first among the admitted jobs: a worker moves from the job
  // with the most time left (above its min, and whose user keeps its fair share) to the
  // one with the least (below its max) while the short one stays the shorter after the
  // move and gains more than a resize costs. Bounded: each move lowers the short job's
  // time left.
  const int share = held.empty() ? slots : slots / static_cast<int>(held.size());
  for (std::size_t round = 0; round < static_cast<std::size_t>(slots) * plan.size() + 1; ++round) {
    Slot *shortest = nullptr, *longest = nullptr;
    for (auto& s : plan) {
      if (!s.admitted) continue;
      if (s.workers < s.job->max_workers && (shortest == nullptr || left_at(s, s.workers) < left_at(*shortest, shortest->workers))) {
        shortest = &s;
      }
    }
    if (shortest == nullptr) break;
    for (auto& s : plan) {
      const bool keeps_share = s.job->owner == shortest->job->owner || held[s.job->owner] - 1 >= share;
      if (s.admitted && &s != shortest && s.workers > s.job->min_workers && keeps_share &&
          (longest == nullptr || left_at(s, s.workers) > left_at(*longest, longest->workers))) {
        longest = &s;
      }
    }
    if (longest == nullptr) break;
    const double gain = left_at(*shortest, shortest->workers) - left_at(*shortest, shortest->workers + 1);
    if (!(left_at(*shortest, shortest->workers + 1) < left_at(*longest, longest->workers - 1)) ||
        gain <= cost_of(*shortest, o)) {
      break;
    }
    ++shortest->workers;
    --longest->workers;
    ++held[shortest->job->owner];
    --held[longest->job->owner];
    shortest->reason = "shortest time left: takes a worker from " + longest->job->id;
    longest->reason = "gives a worker to " + shortest->job->id + ", which has less time left";
  }
  std::map<std::string, ShareDecision> out;
  for (const auto& s : plan) out[s.job->id] = ShareDecision{s.admitted ? s.workers : 0, s.reason};
  return out;
}

}  // namespace dltrain::leader
