#include "leader/job_series.h"

namespace dltrain::leader {

using json = nlohmann::json;

void JobSeries::add_progress(const std::string& task, const SeriesPoint& p) {
  workers_.try_emplace(task, capacity_).first->second.add(p);
}

void JobSeries::add_epoch(const EpochPoint& p) { epochs_.add(p); }

void JobSeries::clear() {
  workers_.clear();
  epochs_ = BoundedSeries<EpochPoint>(capacity_);
}

json JobSeries::to_json() const {
  json workers = json::array();
  for (const auto& [task, s] : workers_) {
    json t = json::array(), step = json::array(), epoch = json::array(), loss = json::array(),
         ips = json::array(), up = json::array(), down = json::array();
    for (const auto& p : s.points()) {
      t.push_back(p.t);
      step.push_back(p.global_step);
      epoch.push_back(p.epoch);
      loss.push_back(p.loss);
      ips.push_back(p.images_per_sec);
      up.push_back(p.bytes_pushed);
      down.push_back(p.bytes_pulled);
    }
    workers.push_back({{"task", task}, {"t", t}, {"global_step", step}, {"epoch", epoch}, {"loss", loss},
                       {"images_per_sec", ips}, {"bytes_pushed", up}, {"bytes_pulled", down}});
  }
  json et = json::array(), ee = json::array(), el = json::array(), ea = json::array();
  for (const auto& p : epochs_.points()) {
    et.push_back(p.t);
    ee.push_back(p.epoch);
    el.push_back(p.train_loss);
    ea.push_back(p.test_accuracy ? json(*p.test_accuracy) : json(nullptr));
  }
  return {{"workers", workers},
          {"epochs", {{"t", et}, {"epoch", ee}, {"train_loss", el}, {"test_accuracy", ea}}},
          {"capacity", capacity_}};
}

}  // namespace dltrain::leader
