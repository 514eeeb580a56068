// The trace-driven cluster simulation (docs/benchmarks/sched.md, "At 16 to 256 workers"):
// one workload of jobs (arrivals, sizes, work and scaling curves; bench/sched/trace.py
// draws them) run through one scheduling policy on a cluster of `slots` worker slots
// (GPUs), event by event, with the leader's own shared plan (leader/shared_plan.h) for
// the "shared" policy. A job's rate at w workers is its speedup(w) (from the calibrated
// scale model) times its rate at one worker; a resize pauses the job for `resize_pause_s`.
//
// Policies:
//   fifo           the leader's queue without the shared plan: first come, first served,
//                  nobody overtakes the head (scheduler.h); each job runs at the size its
//                  trace record asked for, until it ends;
//   fifo-backfill  the same sizes, but any queued job that fits starts (for reference: the
//                  leader does not backfill);
//   planner        the per-job planner's objective (planner/planner.h: the cheapest
//                  (workers + 1 PS shard) × time that meets the job's deadline; the
//                  fastest size if none does) chosen once at arrival, then FIFO as above;
//   shared         plan_shares on every arrival and end, its resizes applied;
//   shared-capped  the same with each job's max_workers cut to the size it asked for:
//                  the gain of sharing alone, without growing a job past its request.
//
// Input (JSON, --workload): {"slots": N, "resize_pause_s": s, "jobs": [{"id", "user",
// "arrival" (s), "requested", "min", "max" (workers), "work" (s at one worker),
// "speedup" [at 1..max], "deadline" (s from arrival; optional)}]}. Output (stdout, JSON):
// the policy's average, median and p99 job completion time (JCT: end − arrival),
// makespan, deadlines met, resizes and utilisation (worker-seconds held, pauses included,
// ÷ slots × makespan).
//
// Unlike the leader, which refuses to resize a job whose last resize is still under way,
// the simulation may resize a paused job again; each resize adds its pause.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "leader/shared_plan.h"

namespace {

using nlohmann::json;
constexpr double kInf = std::numeric_limits<double>::infinity();

struct Job {
  std::string id, user;
  double arrival = 0;
  int requested = 1, min = 1, max = 1;
  double work = 0;  // seconds at one worker
  std::vector<double> speedup;
  std::optional<double> deadline;
  // Simulation state.
  int workers = 0;     // 0: not running
  double left = 0;     // work left, seconds at one worker
  double paused_until = 0;
  double start = -1, end = -1;
  int size = 0;        // the fixed size of fifo / planner
  int resizes = 0;
  double worker_seconds = 0;
};

double speedup(const Job& j, int w) { return w <= 0 ? 0 : dltrain::leader::speedup_at(j.speedup, w); }

double finish_at(const Job& j, double now) {
  return std::max(now, j.paused_until) + j.left / speedup(j, j.workers);
}

/// The per-job planner's size: the cheapest (w + 1) × time(w) meeting the deadline, else the fastest.
int planner_size(const Job& j, int slots) {
  int best = -1, fastest = j.min;
  double best_cost = kInf;
  for (int w = j.min; w <= std::min(j.max, slots); ++w) {
    const double t = j.work / speedup(j, w);
    if (t < j.work / speedup(j, fastest)) fastest = w;
    if (j.deadline && t > *j.deadline) continue;
    if (const double cost = (w + 1) * t; cost < best_cost) best_cost = cost, best = w;
  }
  return best > 0 ? best : fastest;
}

json run(std::vector<Job> jobs, int slots, double pause, const std::string& policy) {
  std::sort(jobs.begin(), jobs.end(), [](const Job& a, const Job& b) { return a.arrival < b.arrival; });
  const bool shared = policy == "shared" || policy == "shared-capped";
  for (auto& j : jobs) {
    if (policy == "shared-capped") j.max = std::max(j.min, std::min(j.max, j.requested));
    j.left = j.work;
    j.size = policy == "planner" ? planner_size(j, slots) : std::min(j.requested, slots);
  }
  std::vector<std::size_t> queue;  // arrived, not started (fifo / planner), in arrival order
  std::size_t next = 0, done = 0;
  double now = 0;
  int free = slots;
  // Every pass handles at least one arrival or one end, so twice the jobs suffice; the
  // bound, with room to spare, only catches a defect.
  for (std::size_t pass = 0; done < jobs.size(); ++pass) {
    if (pass > 4 * jobs.size() + 4) throw std::runtime_error("simulation did not converge");
    double t = next < jobs.size() ? jobs[next].arrival : kInf;
    for (const auto& j : jobs) {
      if (j.workers > 0) t = std::min(t, finish_at(j, now));
    }
    // Progress up to t.
    for (auto& j : jobs) {
      if (j.workers == 0) continue;
      const double ran = std::max(0.0, t - std::max(now, j.paused_until));
      j.worker_seconds += j.workers * (t - now);
      if (finish_at(j, now) <= t * (1 + 1e-12)) {
        j.left = 0;
        j.end = t;
        free += j.workers;
        j.workers = 0;
        ++done;
      } else {
        j.left -= ran * speedup(j, j.workers);
      }
    }
    now = t;
    while (next < jobs.size() && jobs[next].arrival <= now) queue.push_back(next++);
    if (shared) {
      std::vector<dltrain::leader::ShareJob> in;
      std::vector<std::size_t> index;
      for (std::size_t i = 0; i < jobs.size(); ++i) {
        const auto& j = jobs[i];
        if (j.arrival > now || j.end >= 0) continue;
        dltrain::leader::ShareJob s;
        s.id = j.id;
        s.owner = j.user;
        s.min_workers = j.min;
        s.max_workers = j.max;
        s.workers = j.workers;
        s.remaining = std::max(j.left, 1e-9);
        s.resize_cost_s = pause;
        s.speedup = j.speedup;
        if (j.deadline) s.deadline_left_s = *j.deadline - (now - j.arrival);
        in.push_back(std::move(s));
        index.push_back(i);
      }
      const auto plan = dltrain::leader::plan_shares(in, slots);
      // Shrinks first, then starts and grows (the leader's order; free never goes below 0).
      for (int phase = 0; phase < 2; ++phase) {
        for (std::size_t i : index) {
          auto& j = jobs[i];
          const int w = plan.at(j.id).workers;
          if (w == j.workers || (phase == 0) != (w < j.workers)) continue;
          if (j.workers > 0) {
            ++j.resizes;
            // A resize pauses the job (a new worker starts, a leaver finishes its step).
            j.paused_until = std::max(now, j.paused_until) + pause;
          } else {
            j.start = now;
          }
          free += j.workers - w;
          j.workers = w;
        }
      }
      if (free < 0) throw std::runtime_error("the shared plan gave out more slots than there are");
      queue.clear();
    } else {
      for (auto it = queue.begin(); it != queue.end();) {
        auto& j = jobs[*it];
        if (j.size <= free) {
          j.workers = j.size;
          j.start = now;
          free -= j.size;
          it = queue.erase(it);
        } else if (policy == "fifo-backfill") {
          ++it;
        } else {
          break;  // nobody overtakes the head
        }
      }
    }
  }
  std::vector<double> jct;
  double first = kInf, last = 0, used = 0;
  int with_deadline = 0, met = 0, resizes = 0;
  for (const auto& j : jobs) {
    jct.push_back(j.end - j.arrival);
    first = std::min(first, j.arrival);
    last = std::max(last, j.end);
    used += j.worker_seconds;
    resizes += j.resizes;
    if (j.deadline) {
      ++with_deadline;
      met += (j.end - j.arrival) <= *j.deadline * (1 + 1e-9) ? 1 : 0;
    }
  }
  std::sort(jct.begin(), jct.end());
  const auto pct = [&](double p) { return jct[std::min(jct.size() - 1, static_cast<std::size_t>(std::ceil(p * jct.size())) - 1)]; };
  double sum = 0;
  for (double x : jct) sum += x;
  return {{"policy", policy},
          {"jobs", jobs.size()},
          {"avg_jct_s", sum / jct.size()},
          {"median_jct_s", pct(0.5)},
          {"p99_jct_s", pct(0.99)},
          {"makespan_s", last - first},
          {"deadline_jobs", with_deadline},
          {"deadlines_met", met},
          {"resizes", resizes},
          {"utilisation", used / (slots * (last - first))}};
}

Job parse_job(const json& x, std::size_t n) {
  Job j;
  const auto where = "job " + std::to_string(n);
  try {
    j.id = x.at("id").get<std::string>();
    j.user = x.at("user").get<std::string>();
    j.arrival = x.at("arrival").get<double>();
    j.requested = x.at("requested").get<int>();
    j.min = x.at("min").get<int>();
    j.max = x.at("max").get<int>();
    j.work = x.at("work").get<double>();
    j.speedup = x.at("speedup").get<std::vector<double>>();
    if (x.contains("deadline")) j.deadline = x.at("deadline").get<double>();
  } catch (const json::exception& e) {
    throw std::runtime_error(where + ": " + e.what());
  }
  if (j.min < 1 || j.max < j.min || j.requested < j.min || j.requested > j.max || !(j.work > 0) || j.arrival < 0 ||
      j.speedup.size() < static_cast<std::size_t>(j.max) ||
      std::any_of(j.speedup.begin(), j.speedup.end(), [](double s) { return !(s > 0); })) {
    throw std::runtime_error(where + " (" + j.id + "): needs 1 <= min <= requested <= max, work > 0, arrival >= 0 "
                             "and a positive speedup for every size up to max");
  }
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Runs one workload through FIFO, backfilled FIFO, the per-job planner and the shared plan (also capped at "
               "each job's request) "
               "(docs/benchmarks/sched.md); prints one JSON line per policy"};
  std::string workload;
  std::vector<std::string> policies{"fifo", "fifo-backfill", "planner", "shared", "shared-capped"};
  app.add_option("--workload", workload, "the workload JSON (bench/sched/trace.py)")->required()->check(CLI::ExistingFile);
  app.add_option("--policy", policies, "policies to run")->check(CLI::IsMember({"fifo", "fifo-backfill", "planner", "shared", "shared-capped"}));
  CLI11_PARSE(app, argc, argv);
  try {
    std::ifstream in(workload);
    const json w = json::parse(in);
    const int slots = w.at("slots").get<int>();
    const double pause = w.value("resize_pause_s", 30.0);
    if (slots < 1 || pause < 0) throw std::runtime_error("slots must be >= 1 and resize_pause_s >= 0");
    std::vector<Job> jobs;
    for (const auto& x : w.at("jobs")) jobs.push_back(parse_job(x, jobs.size()));
    if (jobs.empty()) throw std::runtime_error("the workload has no jobs");
    for (const auto& j : jobs) {
      if (j.min > slots) {
        throw std::runtime_error("job " + j.id + ": min " + std::to_string(j.min) + " is more than the " +
                                 std::to_string(slots) + " slots: it could never run");
      }
    }
    for (const auto& p : policies) std::cout << run(jobs, slots, pause, p).dump() << std::endl;
  } catch (const std::exception& e) {
    std::cerr << "sched_sim: " << workload << ": " << e.what() << std::endl;
    return 1;
  }
}
