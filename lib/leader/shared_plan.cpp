#include "leader/shared_plan.h"

#include <algorithm>
#include <optional>

namespace dltrain::leader {

namespace {

struct Slot {
  const ShareJob* job;
  int workers;
  std::string reason;
  bool admitted;
  int floor;  ///< steps 2, 4 and 6 never take it below this: min_workers, or its deadline's size
};

double speedup(const ShareJob& j, int w) { return speedup_at(j.speedup, w); }
double left_at(const Slot& s, int w) { return s.job->remaining / speedup(*s.job, w); }
double cost_of(const Slot& s, const SharePlanOptions& o) { return s.job->resize_cost_s >= 0 ? s.job->resize_cost_s : o.resize_cost_s; }
bool has_slack(const Slot& s) { return s.admitted && s.workers > s.floor; }

/// The fewest workers in [min, max] that finish `s` before its deadline; none if no size does.
std::optional<int> deadline_size(const Slot& s) {
  if (!s.job->deadline_left_s) return std::nullopt;
  for (int w = s.job->min_workers; w <= s.job->max_workers; ++w) {
    if (left_at(s, w) <= *s.job->deadline_left_s) return w;
  }
  return std::nullopt;
}

/// Of the slots with slack, the one with the most time left (nullptr if none).
Slot* longest_with_slack(std::vector<Slot>& plan, const Slot* besides) {
  Slot* d = nullptr;
  for (auto& s : plan) {
    if (&s != besides && has_slack(s) && (d == nullptr || left_at(s, s.workers) > left_at(*d, d->workers))) d = &s;
  }
  return d;
}

}  // namespace

double speedup_at(const std::vector<double>& curve, int workers) {
  workers = std::max(1, workers);
  if (curve.empty()) return workers;
  return curve[std::min<std::size_t>(static_cast<std::size_t>(workers), curve.size()) - 1];
}

std::map<std::string, ShareDecision> plan_shares(const std::vector<ShareJob>& jobs, int slots,
                                                 const SharePlanOptions& o) {
  std::vector<Slot> plan;
  plan.reserve(jobs.size());
  int used = 0;
  // 1. Running jobs keep their workers; one with a deadline keeps, as its floor, what of
  // its deadline's size it holds, so that admitting a job (step 2) cannot break it.
  for (const auto& j : jobs) {
    if (j.workers > 0) {
      const int w = std::clamp(j.workers, j.min_workers, j.max_workers);
      plan.push_back(Slot{&j, w, "keeps its workers", true, j.min_workers});
      if (const auto need = deadline_size(plan.back())) plan.back().floor = std::min(w, *need);
      used += w;
    }
  }
  // 2. Queued jobs at min_workers, by priority, deadline, arrival, shrinking the running ones.
  std::vector<const ShareJob*> queued;
  for (const auto& j : jobs) {
    if (j.workers <= 0) queued.push_back(&j);
  }
  std::stable_sort(queued.begin(), queued.end(), [](auto* a, auto* b) {
    if (a->priority != b->priority) return a->priority > b->priority;
    if (a->deadline_left_s.has_value() != b->deadline_left_s.has_value()) return a->deadline_left_s.has_value();
    return a->deadline_left_s.value_or(0) < b->deadline_left_s.value_or(0);
  });
  for (const auto* q : queued) {
    int spare = slots - used;
    for (const auto& s : plan) spare += has_slack(s) ? s.workers - s.floor : 0;
    if (spare < q->min_workers) {
      plan.push_back(Slot{q, 0, "waits: " + std::to_string(q->min_workers) + " workers do not fit", false, q->min_workers});
      continue;
    }
    while (slots - used < q->min_workers) {
      Slot* d = longest_with_slack(plan, nullptr);
      --d->workers;
      d->reason = "gives workers to " + q->id;
      --used;
    }
    plan.push_back(Slot{q, q->min_workers, "admitted at min_workers", true, q->min_workers});
    used += q->min_workers;
  }
  // 3. Deadlines, earliest first: grow each to the fewest workers that meet it (its floor).
  std::vector<Slot*> by_deadline;
  for (auto& s : plan) {
    if (s.admitted && s.job->deadline_left_s) by_deadline.push_back(&s);
  }
  std::stable_sort(by_deadline.begin(), by_deadline.end(),
                   [](auto* a, auto* b) { return *a->job->deadline_left_s < *b->job->deadline_left_s; });
  for (Slot* s : by_deadline) {
    const auto need = deadline_size(*s);
    if (!need || s->workers >= *need) {
      if (need) s->floor = *need;
      continue;
    }
    // Enough free slots and slack elsewhere to reach it? Else take nothing: a partial
    // grow would cost the others without meeting the deadline.
    int spare = slots - used;
    for (const auto& x : plan) spare += (&x != s && has_slack(x)) ? x.workers - x.floor : 0;
    if (spare < *need - s->workers) continue;
    while (s->workers < *need) {
      if (used >= slots) {
        Slot* d = longest_with_slack(plan, s);
        --d->workers;
        d->reason = "gives a worker to " + s->job->id + "'s deadline";
        --used;
      }
      ++s->workers;
      ++used;
    }
    s->floor = *need;
    s->reason = "its deadline needs " + std::to_string(*need) + " workers";
  }
  // 4. Fair shares: users below slots / users take from users above it.
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
        if (used >= slots) {
          Slot* give = nullptr;
          for (auto& s : plan) {
            if (has_slack(s) && held[s.job->owner] > share &&
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
  // 5. Spare slots: priority, then the shortest time left, while it saves more than a resize costs.
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
  // 6. Shortest-remaining-time first among the admitted jobs: a worker moves from the job
  // with the most time left (above its floor, and whose user keeps its fair share) to the
  // one with the least (below its max) while the short one stays the shorter after the
  // move, gains more than a resize costs, and the worker adds at least the rate it took
  // away. Bounded: each move lowers the short job's
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
      if (&s != shortest && has_slack(s) && keeps_share &&
          (longest == nullptr || left_at(s, s.workers) > left_at(*longest, longest->workers))) {
        longest = &s;
      }
    }
    if (longest == nullptr) break;
    const double gain = left_at(*shortest, shortest->workers) - left_at(*shortest, shortest->workers + 1);
    // The worker must do at least as much at the short job as it did at the long one:
    // a move never lowers the cluster's throughput (with linear scaling both are 1).
    const double adds = speedup(*shortest->job, shortest->workers + 1) - speedup(*shortest->job, shortest->workers);
    const double takes = speedup(*longest->job, longest->workers) - speedup(*longest->job, longest->workers - 1);
    if (!(left_at(*shortest, shortest->workers + 1) < left_at(*longest, longest->workers - 1)) ||
        gain <= cost_of(*shortest, o) || adds < takes) {
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
  for (const auto& s : plan) {
    ShareDecision d{s.admitted ? s.workers : 0, s.reason};
    if (s.admitted) d.finish_s = left_at(s, s.workers);
    d.misses_deadline = s.job->deadline_left_s && (!s.admitted || d.finish_s > *s.job->deadline_left_s);
    out[s.job->id] = d;
  }
  return out;
}

}  // namespace dltrain::leader
