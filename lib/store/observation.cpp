#include "store/observation.h"

namespace dltrain::store {

void to_json(nlohmann::json& j, const Observation& o) {
  j = {{"model", o.model},
       {"dataset", o.dataset},
       {"hardware_class", o.hardware_class},
       {"job", o.job},
       {"workers", o.workers},
       {"ps_shards", o.ps_shards},
       {"batch_size", o.batch_size},
       {"epoch", o.epoch},
       {"epoch_seconds", o.epoch_seconds},
       {"images_per_sec", o.images_per_sec},
       {"bytes_per_epoch", o.bytes_per_epoch},
       {"final_accuracy", o.final_accuracy},
       {"eval_seconds", o.eval_seconds},
       {"timestamp", o.timestamp},
       {"source", o.source},
       {"compression", o.compression},
       {"compression_setting", o.compression_setting},
       {"link_bytes_per_sec", o.link_bytes_per_sec}};
}

void from_json(const nlohmann::json& j, Observation& o) {
  o.model = j.value("model", "");
  o.dataset = j.value("dataset", "");
  o.hardware_class = j.value("hardware_class", "cpu");
  o.job = j.value("job", "");
  o.workers = j.value("workers", 1);
  o.ps_shards = j.value("ps_shards", 1);
  o.batch_size = j.value("batch_size", 1);
  o.epoch = j.value("epoch", 0);
  o.epoch_seconds = j.value("epoch_seconds", 0.0);
  o.images_per_sec = j.value("images_per_sec", 0.0);
  o.bytes_per_epoch = j.value("bytes_per_epoch", 0.0);
  o.final_accuracy = j.value("final_accuracy", -1.0);
  o.eval_seconds = j.value("eval_seconds", 0.0);
  o.timestamp = j.value("timestamp", 0.0);
  o.source = j.value("source", "job");
  o.compression = j.value("compression", "none");
  o.compression_setting = j.value("compression_setting", 0.0);
  o.link_bytes_per_sec = j.value("link_bytes_per_sec", 0.0);
}

}  // namespace dltrain::store
