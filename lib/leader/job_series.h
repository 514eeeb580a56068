// A job's curves for the dashboard (docs/protocol.md, "Dashboard"): per worker, the
// figures of its progress events over time (training loss, images/s, bytes on the wire,
// global step); per epoch, worker 0's test accuracy and training loss. Kept by the
// leader in memory with a bounded number of points, so that a page opened in the middle
// of a job (or after it) sees the whole run, not only what arrives while it watches.
// Not stored: a restarted leader starts its running jobs' curves afresh. Plain values,
// not thread-safe (the leader's io thread owns them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dltrain::leader {

/// Points kept per worker (and of the epoch series) before the series is thinned.
inline constexpr std::size_t kSeriesCapacity = 512;

/// One progress report of a worker.
struct SeriesPoint {
  double t = 0;                     ///< seconds since the job was submitted (leader's clock)
  std::int64_t global_step = 0;     ///< steps since the job started (all epochs)
  int epoch = 0;                    ///< 1-based epoch in progress
  double loss = 0;                  ///< mean training loss since the previous report
  double images_per_sec = 0;        ///< this worker, since the previous report
  std::uint64_t bytes_pushed = 0;   ///< cumulative, this task process (a restart starts at 0)
  std::uint64_t bytes_pulled = 0;   ///< cumulative, this task process
};

/// The end of an epoch as worker 0 reported it.
struct EpochPoint {
  double t = 0;                          ///< seconds since the job was submitted
  int epoch = 0;                         ///< 1-based epoch just finished
  double train_loss = 0;                 ///< mean over the epoch's steps
  std::optional<double> test_accuracy;   ///< of the PS's parameters, in [0, 1]
};

/// A sequence of points of at most `capacity` (>= 2): appending to a full one first
/// drops every second point (the oldest is kept), so the series always spans the whole
/// run, its recent part at full resolution and older parts at 1/2, 1/4, ... of it.
template <typename P>
class BoundedSeries {
 public:
  explicit BoundedSeries(std::size_t capacity = kSeriesCapacity) : capacity_(capacity < 2 ? 2 : capacity) {}
  void add(const P& p) {
    if (points_.size() >= capacity_) {
      std::size_t kept = 0;
      for (std::size_t i = 0; i < points_.size(); i += 2) points_[kept++] = points_[i];
      points_.resize(kept);
    }
    points_.push_back(p);
  }
  const std::vector<P>& points() const { return points_; }
  std::size_t capacity() const { return capacity_; }

 private:
  std::size_t capacity_;
  std::vector<P> points_;
};

/// A job's curves.
class JobSeries {
 public:
  explicit JobSeries(std::size_t capacity = kSeriesCapacity) : capacity_(capacity), epochs_(capacity) {}
  /// A progress report of the worker task `task` ("worker-1").
  void add_progress(const std::string& task, const SeriesPoint& p);
  void add_epoch(const EpochPoint& p);
  /// Forgets every point (an old finished job's, to bound the leader's memory).
  void clear();
  bool empty() const { return workers_.empty() && epochs_.points().empty(); }
  const std::map<std::string, BoundedSeries<SeriesPoint>>& workers() const { return workers_; }
  const BoundedSeries<EpochPoint>& epochs() const { return epochs_; }
  /// Columnar JSON, one array per figure (uPlot's data layout): {"workers": [{"task",
  /// "t", "global_step", "epoch", "loss", "images_per_sec", "bytes_pushed",
  /// "bytes_pulled"}], "epochs": {"t", "epoch", "train_loss", "test_accuracy" (null where
  /// absent)}, "capacity"}. Workers in task-name order.
  nlohmann::json to_json() const;

 private:
  std::size_t capacity_;
  std::map<std::string, BoundedSeries<SeriesPoint>> workers_;
  BoundedSeries<EpochPoint> epochs_;
};

}  // namespace dltrain::leader
