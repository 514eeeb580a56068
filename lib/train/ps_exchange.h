// A worker's exchange with its job's PS shards (internal to lib/train): the connection,
// the step's push and pull (dense or compressed, encoded on the host or on the GPU),
// overlap's pushes from backward's hooks and its pipelined pulls, recovery from a lost
// shard (docs/compression.md; docs/training.md, "Overlap"). WorkerLoop owns one.
// Not thread-safe: the training thread owns it (with a CUDA model, overlap's hooks run
// on autograd's device thread, which backward() orders with the training thread). An
// overlapped push and a pipelined pull run on a thread of their own (ps::PsWork, one at
// a time) and touch only the client and their own buffers (a partition of the gradient
// and its encoded push; the pull's target), which nothing else writes until they are
// awaited; the client's byte counts are read from a snapshot while a pull runs.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include <torch/torch.h>

#include "ps/client.h"
#include "ps/exchange.h"
#include "ps/overlap.h"
#include "train/backends.h"
#include "train/model_replica.h"
#include "train/step_reporter.h"
#include "train/trainer.h"

namespace dltrain::train::detail {

/// The exchange of one worker with the PS shards over `replica` (ModelReplica: it pushes
/// replica.grads and pulls into replica.params), counting its seconds in `reporter`.
class PsExchange {
 public:
  /// `cfg`, `replica` and `reporter` must outlive the exchange; nothing is connected
  /// before connect().
  PsExchange(const WorkerConfig& cfg, ModelReplica& replica, StepReporter& reporter)
      : cfg_(cfg), spec_(cfg.spec), replica_(replica), rep_(reporter) {}

  /// Connects to every shard, offers replica.params as their initial values and pulls
  /// theirs into it; then sets up the encoders (host, and `device`'s where it selects on
  /// the GPU), the traffic meter and the resyncer (whose events go to `sink`). Throws the
  /// PS client's errors (ps/client.h), StopRequested among them.
  void connect(torch::Device device, const ProgressSink& sink);
  /// Overlap: a hook on every parameter copies its gradient into replica.grads as
  /// backward produces it and pushes each partition once all its floats are in.
  void install_push_hooks();

  /// True when the step's gradient is gathered and encoded on the GPU (train/backends.h).
  bool device_encoder_active() const { return device_encoder_ != nullptr; }
  /// After backward: the gradient into replica.grads, or, on the device, into the device
  /// encoder with `weight_decay` added there.
  void take_gradient(float weight_decay);
  /// Whether the gradient the last take_gradient() or overlapped backward saw holds a
  /// NaN/Inf where the host cannot look (the device encoder's, overlap's partitions).
  bool gradient_nonfinite() const { return device_nonfinite_ || hook_.nonfinite; }
  /// Overlap: backward with learning rate `lr` and uplink density `density` is about to
  /// run (the pull in flight is awaited first: the hooks push through the client).
  void begin_backward(float lr, double density);
  /// Overlap: backward ended; `ran` false when it did not run (a NaN/Inf loss: nothing
  /// of the step is pushed).
  void end_backward(bool ran);
  /// The downlink density of the step at training position `pos` (fractional epochs):
  /// the "auto" setting follows the uplink's (compress::downlink_density).
  double downlink_density(double pos) const;

  /// Pushes the step's gradient (learning rate `lr`, uplink density `density`) and
  /// pulls (downlink density `downlink`) into replica.params; `pos` places the step's
  /// traffic. A lost shard drops the step's gradient and leaves replica.params holding
  /// the PS's values. Throws the client's other errors, and a push that failed in a hook.
  void exchange(float lr, double density, double downlink, double pos);
  /// An epoch begins from replica.params; the traffic counted from here.
  void begin_epoch();
  /// The pipelined pull in flight, if any, awaited and taken into replica.params and the
  /// model (the end of an epoch).
  void drain_pull();
  /// Asked to stop: the push in flight, if any, is awaited (an error other than the stop
  /// is logged), then the pull in flight, whose values are taken when it completed (the
  /// stop may have ended it too). Never throws.
  void settle_for_stop() noexcept;
  /// A dense pull of the PS's current parameters into replica.params (an evaluation),
  /// recovering from a lost shard.
  void pull_dense();
  /// Tells the shards this worker is done; rank 0 then waits (at most cfg.finish_timeout,
  /// calling `check_stop` between polls) until every worker has (an elastic job: until
  /// no member is still training). Throws TimeoutError.
  void finish(const std::function<void()>& check_stop);
  /// Elastic jobs: after the push in flight and the pending pull, tells the shards this
  /// worker leaves (PsClient::leave). Returns the members still training.
  std::uint32_t leave();

  /// Bytes written to / read from the shards (PsClient::bytes_pushed / bytes_pulled);
  /// while the pipelined pull runs (its thread counts them), as of the exchange before it.
  std::uint64_t bytes_pushed() const { return pending_pull_.active() ? meter_up0_ : client_->bytes_pushed(); }
  std::uint64_t bytes_pulled() const { return pending_pull_.active() ? meter_down0_ : client_->bytes_pulled(); }
  /// The step traffic against its dense equivalent (ps/exchange.h).
  const ps::TrafficMeter& meter() const { return *meter_; }
  /// Resyncs after a lost shard, this process.
  int resyncs() const { return resyncer_ ? resyncer_->resyncs() : 0; }

 private:
  void on_gradient(std::size_t i, const torch::Tensor& grad);
  void push_partition(std::uint32_t key, bool in_backward);
  std::span<const ps::PartitionPush> encode_pushes(double density);
  void start_pull(double downlink);
  /// Waits for the overlapped push in flight; false, its error in hook_.error (unless one
  /// is there already), when it failed. Counts it as overlapped when it was started from
  /// backward and succeeded.
  bool finish_push();
  /// finish_push() outside an exchange, and the push error kept from the step, if any: a
  /// lost shard is recovered from; other errors thrown.
  void await_push();
  void await_pull();
  /// After a lost connection: the resync (replica.params and the model hold the PS's
  /// values) and the pull's target reset to them.
  void recover(const ps::PsConnectionLost& lost);

  const WorkerConfig& cfg_;
  const JobSpec& spec_;
  ModelReplica& replica_;
  StepReporter& rep_;
  std::unique_ptr<ps::PsClient> client_;
  std::unique_ptr<ps::PushEncoder> encoder_;  // the host's pushes (ps/exchange.h)
  std::unique_ptr<DeviceEncoder> device_encoder_;  // a GPU worker's pushes, selected on its GPU
  bool device_nonfinite_ = false;  // the device encoder's gathered gradient holds a NaN/Inf
  std::unique_ptr<ps::TrafficMeter> meter_;
  std::unique_ptr<ps::PsResyncer> resyncer_;
  double always_sent_fraction_ = 0;  // floats sent in full every step ÷ all (the "auto" downlink)
  bool plain_ = true;  // dense both ways: push_pull of the raw gradient
  // Overlap: which partitions backward has completed (ps/overlap.h), and the step in
  // progress.
  std::unique_ptr<ps::PartitionTracker> tracker_;
  std::vector<ps::PartitionPush> plain_pushes_;
  struct {
    bool active = false;     // backward of a training step is running
    float lr = 0;
    double density = 1;
    bool nonfinite = false;  // a NaN/Inf loss or partition: the rest of the step is not pushed
    std::exception_ptr error;  // a push that failed, seen in a hook, rethrown by exchange()
  } hook_;
  // The client's byte counts when the last step's traffic was counted (overlap) or when
  // the epoch began: the next step's traffic is what they grew by.
  std::uint64_t meter_up0_ = 0, meter_down0_ = 0;
  double last_pos_ = 0;  // the training position of the last step counted
  // Overlap in async and ssp: this step's pull runs during the next step's forward.
  bool pipelined_ = false;
  std::vector<float> pulled_;  // the pipelined pull's target (see start_pull)
  ps::PsWork pending_pull_;  // the pipelined pull in flight (ps/client.h)
  // Overlap: the push of the last partition backward completed, writing while backward
  // goes on; awaited before the next push or the pull.
  ps::PsWork push_work_;
  bool push_in_backward_ = false;  // push_work_ was started from a backward hook
};

}  // namespace dltrain::train::detail
