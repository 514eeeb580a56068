// The dashboard's requests and the curves they read (leader/dashboard.h).
#include "leader/dashboard.h"

#include <algorithm>
#include <chrono>

#include "leader/states.h"
#include "wire/control.h"

namespace dltrain::leader {

using json = nlohmann::json;
namespace events = wire::events;

namespace {

double since_submit(const JobRec& j) {
  return std::chrono::duration<double>(JobRec::Clock::now() - j.submitted).count();
}

}  // namespace

void record_series(JobRec& j, const TaskRec& t, const events::Progress& p) {
  j.series.add_progress(t.name, SeriesPoint{since_submit(j), p.global_step, p.epoch, p.loss, p.images_per_sec,
                                            p.bytes_pushed, p.bytes_pulled});
}

void record_series(JobRec& j, const TaskRec& t, const events::EpochEnd& e) {
  if (t.index == 0) j.series.add_epoch(EpochPoint{since_submit(j), e.epoch, e.train_loss, e.test_accuracy});
}

json series_reply(const JobTable& jobs, const wire::JobQueryBody& b) {
  if (!b.job) throw wire::Refused(wire::error_code::kBadRequest, "series needs \"job\" (string)", "job");
  const auto it = jobs.find(*b.job);
  if (it == jobs.end()) throw wire::Refused(wire::error_code::kNotFound, "no job \"" + *b.job + "\"", "job");
  json r = it->second.series.to_json();
  r["job"] = it->first;
  r["state"] = to_string(it->second.state());
  return r;
}

json events_reply(const JobTable& jobs, const store::Store* db, const wire::EventsBody& b) {
  const auto it = jobs.find(b.job);
  if (it == jobs.end()) throw wire::Refused(wire::error_code::kNotFound, "no job \"" + b.job + "\"", "job");
  json out = json::array();
  std::size_t total = 0;
  if (db) {
    auto all = db->events(it->second.num);
    total = all.size();
    const std::size_t from = all.size() > static_cast<std::size_t>(b.limit) ? all.size() - b.limit : 0;
    for (std::size_t i = from; i < all.size(); ++i) out.push_back(std::move(all[i]));
  }
  return {{"job", b.job}, {"events", out}, {"total", total}, {"persistent", db != nullptr}};
}

void trim_series(JobTable& jobs) {
  std::size_t kept = 0;
  const auto all = jobs.in_order();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {  // the newest first
    auto& j = **it;
    if (!j.terminal() || j.series.empty()) continue;
    if (++kept > kKeptSeries) j.series.clear();
  }
}

}  // namespace dltrain::leader
