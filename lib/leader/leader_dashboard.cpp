// What the dashboard (dashboard/, served by control/server.cpp) asks of the leader
// beyond the client protocol: a job's curves (`series`) and its event log (`events`);
// docs/protocol.md, "Dashboard". Everything else it shows comes from list, agents,
// status and follow, like the CLI's.
#include <algorithm>

#include "leader/leader_impl.h"

namespace dltrain::leader {

using json = nlohmann::json;
using SessionPtr = Leader::Impl::SessionPtr;
namespace events = wire::events;

namespace {

/// Finished jobs whose curves the leader keeps (the most recent ones); older ones answer
/// `series` with empty curves. Bounds the memory: at most this many finished jobs ×
/// their workers × kSeriesCapacity points.
constexpr std::size_t kKeptSeries = 32;

double since_submit(const JobRec& j) {
  return std::chrono::duration<double>(JobRec::Clock::now() - j.submitted).count();
}

}  // namespace

void Leader::Impl::record_series(JobRec& j, const TaskRec& t, const events::Progress& p) {
  j.series.add_progress(t.name, SeriesPoint{since_submit(j), p.global_step, p.epoch, p.loss, p.images_per_sec,
                                            p.bytes_pushed, p.bytes_pulled});
}

void Leader::Impl::record_series(JobRec& j, const TaskRec& t, const events::EpochEnd& e) {
  if (t.index == 0) j.series.add_epoch(EpochPoint{since_submit(j), e.epoch, e.train_loss, e.test_accuracy});
}

void Leader::Impl::on_series(const SessionPtr& s, const wire::Envelope& env) {
  const auto b = wire::parse_body<wire::JobQueryBody>(env);
  if (!b.job) return reply_error(s, env.id, wire::error_code::kBadRequest, "series needs \"job\" (string)", "job");
  const auto it = jobs.find(*b.job);
  if (it == jobs.end()) return reply_error(s, env.id, wire::error_code::kNotFound, "no job \"" + *b.job + "\"", "job");
  json r = it->second.series.to_json();
  r["job"] = it->first;
  r["state"] = to_string(it->second.state());
  reply(s, env.id, r);
}

void Leader::Impl::on_events(const SessionPtr& s, const wire::Envelope& env) {
  const auto b = wire::parse_body<wire::EventsBody>(env);
  const auto it = jobs.find(b.job);
  if (it == jobs.end()) return reply_error(s, env.id, wire::error_code::kNotFound, "no job \"" + b.job + "\"", "job");
  json out = json::array();
  std::size_t total = 0;
  if (db) {
    auto all = db->events(it->second.num);
    total = all.size();
    const std::size_t from = all.size() > static_cast<std::size_t>(b.limit) ? all.size() - b.limit : 0;
    for (std::size_t i = from; i < all.size(); ++i) out.push_back(std::move(all[i]));
  }
  reply(s, env.id, {{"job", b.job}, {"events", out}, {"total", total}, {"persistent", db != nullptr}});
}

void Leader::Impl::trim_series() {
  std::size_t kept = 0;
  for (auto it = job_order.rbegin(); it != job_order.rend(); ++it) {
    auto& j = jobs.at(*it);
    if (!j.terminal() || j.series.empty()) continue;
    if (++kept > kKeptSeries) j.series.clear();
  }
}

void Leader::Impl::retire_jobs() {
  // A read-only store could not forget them: they would come back with the next restart.
  if (db && db->read_only()) return;
  // The finished jobs, the most recently ended first (restored ones, whose end time this
  // process did not see, rank as older, in submission order).
  struct Finished {
    Clock::time_point ended;
    std::size_t position;
    const JobRec* job;
  };
  std::vector<Finished> finished;
  for (std::size_t i = 0; i < job_order.size(); ++i) {
    const JobRec& j = jobs.at(job_order[i]);
    if (j.terminal()) finished.push_back({j.ended.value_or(Clock::time_point{}), i, &j});
  }
  const auto keep = static_cast<std::size_t>(opt.job_retention);
  if (finished.size() <= keep) return;
  std::sort(finished.begin(), finished.end(), [](const Finished& a, const Finished& b) {
    return a.ended != b.ended ? a.ended > b.ended : a.position > b.position;
  });
  std::vector<std::string> gone;
  for (std::size_t k = keep; k < finished.size(); ++k) {
    const JobRec& j = *finished[k].job;
    if (!j.explore.profile_of.empty()) {
      const auto parent = jobs.find(j.explore.profile_of);
      if (parent != jobs.end() && !parent->second.terminal()) continue;
    }
    gone.push_back(j.id);
  }
  if (gone.empty()) return;
  for (const auto& id : gone) {
    persist("removing a retired job", [&] { db->delete_job(jobs.at(id).num); });
    jobs.erase(id);
  }
  job_order.erase(std::remove_if(job_order.begin(), job_order.end(), [&](const std::string& id) { return !jobs.count(id); }),
                  job_order.end());
  spdlog::info("job retention ({} finished jobs kept): removed {} older finished job{} ({}{})", opt.job_retention,
               gone.size(), gone.size() == 1 ? "" : "s", gone.front(), gone.size() > 1 ? ", …" : "");
}

}  // namespace dltrain::leader
