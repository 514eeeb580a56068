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
  int cost() const { return std::max(1, job->slots_per_worker); }
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

/// Of the slots with slack (and, when `keeps` is given, passing it), the one with the most
/// time left (nullptr if none), `besides` excluded.
template <typename Keep>
Slot* longest_with_slack(std::vector<Slot>& plan, const Slot* besides, Keep keeps) {
  Slot* d = nullptr;
  for (auto& s : plan) {
    if (&s != besides && has_slack(s) && keeps(s) && (d == nullptr || left_at(s, s.workers) > left_at(*d, d->workers))) {
      d = &s;
    }
  }
  return d;
}
Slot* longest_with_slack(std::vector<Slot>& plan, const Slot* besides) {
  return longest_with_slack(plan, besides, [](const Slot&) { return true; });
}

/// Slots the jobs other than `besides` could give up without going below their floors.
int slack_slots(const std::vector<Slot>& plan, const Slot* besides) {
  int n = 0;
  for (const auto& s : plan) n += (&s != besides && has_slack(s)) ? (s.workers - s.floor) * s.cost() : 0;
  return n;
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
  int used = 0;  // slots, not workers: a worker of a job takes its slots_per_worker
  // 1. Running jobs keep their workers; one with a deadline keeps, as its floor, what of
  // its deadline's size it holds, so that admitting a job (step 2) cannot break it.
  for (const auto& j : jobs) {
    if (j.workers > 0) {
      const int w = std::clamp(j.workers, j.min_workers, j.max_workers);
      plan.push_back(Slot{&j, w, "keeps its workers", true, j.min_workers});
      if (const auto need = deadline_size(plan.back())) plan.back().floor = std::min(w, *need);
      used += w * plan.back().cost();
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
    const int need = q->min_workers * std::max(1, q->slots_per_worker);
    if (slots - used + slack_slots(plan, nullptr) < need) {
      plan.push_back(Slot{q, 0, "waits: " + std::to_string(q->min_workers) + " workers do not fit", false, q->min_workers});
      continue;
    }
    while (slots - used < need) {
      Slot* d = longest_with_slack(plan, nullptr);
      --d->workers;
      d->reason = "gives workers to " + q->id;
      used -= d->cost();
    }
    plan.push_back(Slot{q, q->min_workers, "admitted at min_workers", true, q->min_workers});
    used += need;
  }
  // Slots the running jobs hold beyond `slots` (the slots of a queued job's PS shards are
  // taken out of them) are the queue's to free, not the later steps': those see no free
  // slot, and trade worker for worker.
  slots = std::max(slots, used);
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
    if (slots - used + slack_slots(plan, s) < (*need - s->workers) * s->cost()) continue;
    while (s->workers < *need) {
      while (slots - used < s->cost()) {
        Slot* d = longest_with_slack(plan, s);
        --d->workers;
        d->reason = "gives a worker to " + s->job->id + "'s deadline";
        used -= d->cost();
      }
      ++s->workers;
      used += s->cost();
    }
    s->floor = *need;
    s->reason = "its deadline needs " + std::to_string(*need) + " workers";
  }
  // 4. Fair shares, in slots: users below slots / users take from users above it.
  std::map<std::string, int> held;
  for (const auto& s : plan) {
    if (s.admitted) held[s.job->owner] += s.workers * s.cost();
  }
  const int share = held.empty() ? slots : slots / static_cast<int>(held.size());
  if (held.size() > 1) {
    // Each move raises a user below the share and keeps every giver at or above it:
    // bounded by the slots.
    for (int round = 0, moved = 1; moved && round <= slots; ++round) {
      moved = 0;
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
        // From free slots, else from users who stay at their share without a worker: the
        // job with the most time left.
        const auto keeps_share = [&](const Slot& s) {
          return s.job->owner != user && held[s.job->owner] - s.cost() >= share;
        };
        // Enough to place the worker? Else nobody gives: a give that cannot be used only
        // leaves slots idle. (Counted greedily, as the gives below go.)
        {
          int can = slots - used;
          std::map<std::string, int> left_of = held;
          std::vector<std::pair<double, const Slot*>> givers;
          for (const auto& s : plan) {
            if (&s != take && has_slack(s) && s.job->owner != user) givers.emplace_back(-left_at(s, s.workers), &s);
          }
          std::sort(givers.begin(), givers.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
          for (const auto& [neg_left, s] : givers) {
            for (int w = s->workers; can < take->cost() && w > s->floor && left_of[s->job->owner] - s->cost() >= share; --w) {
              can += s->cost();
              left_of[s->job->owner] -= s->cost();
            }
          }
          if (can < take->cost()) continue;
        }
        while (slots - used < take->cost()) {
          Slot* give = longest_with_slack(plan, take, keeps_share);
          if (give == nullptr) break;
          --give->workers;
          held[give->job->owner] -= give->cost();
          used -= give->cost();
          give->reason = "gives a worker to user " + user + "'s fair share";
        }
        if (slots - used < take->cost()) continue;
        ++take->workers;
        used += take->cost();
        have += take->cost();
        take->reason = "user " + user + "'s fair share (" + std::to_string(share) + " slots)";
        moved = 1;
      }
    }
  }
  // 5. Spare slots: priority, then the shortest time left, while it saves more than a
  // resize costs. Again after step 6, whose moves between jobs of different
  // slots_per_worker may leave slots free.
  const auto spare_slots = [&] {
    for (;;) {
      Slot* best = nullptr;
      for (auto& s : plan) {
        if (!s.admitted || s.workers >= s.job->max_workers || slots - used < s.cost()) continue;
        const double saves = left_at(s, s.workers) - left_at(s, s.workers + 1);
        if (saves <= cost_of(s, o)) continue;
        if (best == nullptr || s.job->priority > best->job->priority ||
            (s.job->priority == best->job->priority && left_at(s, s.workers) < left_at(*best, best->workers))) {
          best = &s;
        }
      }
      if (best == nullptr) break;
      ++best->workers;
      used += best->cost();
      held[best->job->owner] += best->cost();
      best->reason = "spare slots: shortest time left";
    }
  };
  spare_slots();
  // 6. Shortest-remaining-time first among the admitted jobs: a worker moves from the job
  // with the most time left (above its floor, and whose user keeps its fair share) to the
  // one with the least (below its max) while the short one stays the shorter after the
  // move, gains more than a resize costs, the slots freed (with the free ones) hold the
  // new worker, and the worker adds at least the rate per slot it took away. Bounded:
  // each move lowers the short job's time left.
  // The move for `shortest` if there is one: from the job with the most time left, more
  // than the taker's, above its floor, whose user keeps its share, whose worker's slots
  // (with the free ones) hold the new worker; nullptr when none qualifies.
  const auto donor_for = [&](const Slot* shortest) -> Slot* {
    Slot* longest = nullptr;
    for (auto& s : plan) {
      const bool keeps_share = s.job->owner == shortest->job->owner || held[s.job->owner] - s.cost() >= share;
      if (&s != shortest && has_slack(s) && keeps_share && slots - used + s.cost() >= shortest->cost() &&
          left_at(s, s.workers) > left_at(*shortest, shortest->workers) &&
          (longest == nullptr || left_at(s, s.workers) > left_at(*longest, longest->workers))) {
        longest = &s;
      }
    }
    if (longest == nullptr) return nullptr;
    const double gain = left_at(*shortest, shortest->workers) - left_at(*shortest, shortest->workers + 1);
    // The worker must do at least as much per slot at the short job as it did at the long
    // one: a move never lowers the cluster's throughput (with linear scaling and equal
    // slots both are 1).
    const double adds = (speedup(*shortest->job, shortest->workers + 1) - speedup(*shortest->job, shortest->workers)) /
                        shortest->cost();
    const double takes = (speedup(*longest->job, longest->workers) - speedup(*longest->job, longest->workers - 1)) /
                         longest->cost();
    if (!(left_at(*shortest, shortest->workers + 1) < left_at(*longest, longest->workers - 1)) ||
        gain <= cost_of(*shortest, o) || adds < takes) {
      return nullptr;
    }
    return longest;
  };
  for (std::size_t round = 0; round < static_cast<std::size_t>(std::max(1, slots)) * plan.size() + 1; ++round) {
    // The takers, shortest time left first: the first with a move makes it.
    std::vector<Slot*> takers;
    for (auto& s : plan) {
      if (s.admitted && s.workers < s.job->max_workers) takers.push_back(&s);
    }
    std::stable_sort(takers.begin(), takers.end(),
                     [](const Slot* a, const Slot* b) { return left_at(*a, a->workers) < left_at(*b, b->workers); });
    Slot *shortest = nullptr, *longest = nullptr;
    for (Slot* t : takers) {
      if ((longest = donor_for(t)) != nullptr) {
        shortest = t;
        break;
      }
    }
    if (shortest == nullptr) break;
    ++shortest->workers;
    --longest->workers;
    used += shortest->cost() - longest->cost();
    held[shortest->job->owner] += shortest->cost();
    held[longest->job->owner] -= longest->cost();
    shortest->reason = "shortest time left: takes a worker from " + longest->job->id;
    longest->reason = "gives a worker to " + shortest->job->id + ", which has less time left";
  }
  spare_slots();
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
