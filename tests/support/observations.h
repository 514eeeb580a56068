// A performance observation with the figures the store tests write and read back.
#pragma once

#include <string>

#include "store/observation.h"

namespace dltrain::testing {

/// One epoch row of job "job-<workers>": 64 images per worker, 20.5 s, 2926.8 images/s.
inline store::Observation observation(const std::string& model, const std::string& dataset, double timestamp,
                                      int workers) {
  store::Observation o;
  o.model = model;
  o.dataset = dataset;
  o.job = "job-" + std::to_string(workers);
  o.workers = workers;
  o.batch_size = 64;
  o.epoch = 1;
  o.epoch_seconds = 20.5;
  o.images_per_sec = 2926.8;
  o.timestamp = timestamp;
  return o;
}

}  // namespace dltrain::testing
