// PsExchange (train/ps_exchange.h): a worker's push and pull, dense or compressed, on the
// host or from the GPU; overlap's pushes from the backward hooks and its pipelined pulls
// (docs/training.md, "Overlap").
#include "train/ps_exchange.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>

#include <spdlog/spdlog.h>
#include <torch/torch.h>

#include "common/errors.h"
#include "wire/frame.h"

namespace dltrain::train::detail {

void PsExchange::connect(torch::Device device, const ProgressSink& sink) {
  const auto& layout = replica_.layout;
  const auto& flat = *replica_.flat;
  ps::PsClientOptions popt;
  popt.job = cfg_.job;
  popt.generation = cfg_.generation;
  popt.secret = cfg_.secret;
  popt.rank = static_cast<std::uint32_t>(cfg_.rank);
  // An elastic job's ranks go up to its max_workers (ps/sync.h, SyncOptions::elastic).
  popt.num_workers = static_cast<std::uint32_t>(spec_.elastic.on() ? spec_.elastic.max_workers : spec_.workers);
  popt.timeout = cfg_.ps_timeout;
  popt.reconnect_timeout = cfg_.ps_timeout;
  popt.sparse_downlink = compress::keeps_x_seen(spec_.compression);
  popt.half_downlink = compress::half_downlink(spec_.compression);
  popt.lowrank_downlink = ps::lowrank_pull_headers(spec_.compression, layout, flat.sizes(), flat.rows());
  popt.stop_requested = cfg_.stop_requested;
  client_ = std::make_unique<ps::PsClient>(cfg_.shards, layout, popt);
  client_->connect();
  client_->init(replica_.params);
  client_->pull(replica_.params);
  replica_.pulled_at = unix_now();
  replica_.write_model();
  const auto seed = static_cast<std::uint64_t>(spec_.seed) * 7919ULL + static_cast<std::uint64_t>(cfg_.rank);
  encoder_ = std::make_unique<ps::PushEncoder>(spec_.compression, layout, seed, flat.sizes(), flat.rows());
  if (encoder_->always_sent_floats() > 0 && cfg_.rank == 0) {
    spdlog::info("compression: {} of {} floats (the tensors below min_compress_bytes = {}, or no matrix for powersgd) "
                 "are sent in full every step",
                 encoder_->always_sent_floats(), layout.total_floats, spec_.compression.min_compress_bytes);
  }
  // A GPU worker selects its pushes on the GPU where it can (train/backends.h).
  device_encoder_ =
      make_device_encoder(spec_.compression, layout, seed, device, spec_.overlap, cfg_.local_group.has_value());
  meter_ = std::make_unique<ps::TrafficMeter>(layout, wire::kHeaderSize);
  resyncer_ = std::make_unique<ps::PsResyncer>(
      *client_, std::span<float>(replica_.params), cfg_.rank, [this] { replica_.write_model(); }, sink);
  always_sent_fraction_ = static_cast<double>(encoder_->always_sent_floats()) /
                          static_cast<double>(std::max<std::int64_t>(1, layout.total_floats));
  plain_ = spec_.compression.method == compress::Method::kNone && spec_.compression.downlink_ratio >= 1.0;
  pipelined_ = spec_.overlap && spec_.sync != ps::SyncMode::kBsp;
  pulled_ = replica_.params;
}

double PsExchange::downlink_density(double pos) const {
  return compress::downlink_density(spec_.compression, pos, spec_.workers, always_sent_fraction_);
}

void PsExchange::take_gradient(float weight_decay) {
  if (device_encoder_) {
    device_nonfinite_ = !device_encoder_->gather(replica_.flat->tensors(), weight_decay);
  } else {
    replica_.flat->read_grads(replica_.grads);
  }
}

// Overlap (docs/training.md, "Overlap"): a hook on every parameter copies its gradient
// into replica.grads when backward has produced it; a partition whose floats are all in
// is pushed from the hook, on a thread of its own (ps::PsWork, PsClient::start_push),
// while backward goes on with the layers before it.
void PsExchange::install_push_hooks() {
  tracker_ = std::make_unique<ps::PartitionTracker>(replica_.flat->sizes(), replica_.layout);
  auto& tensors = replica_.flat->tensors();
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    tensors[i].register_hook([this, i](torch::Tensor grad) { on_gradient(i, grad); });
  }
}

void PsExchange::on_gradient(std::size_t i, const torch::Tensor& grad) {
  if (!hook_.active) return;
  const auto c = grad.to(torch::kCPU).contiguous();
  std::memcpy(replica_.grads.data() + tracker_->offset(i), c.data_ptr<float>(), sizeof(float) * c.numel());
  for (const auto key : tracker_->arrived(i)) push_partition(key, true);
}

// Once the previous push has been written (the client serves one call at a time; a push
// that failed stops the step's pushes, before this partition's compressor state
// changes): weight decay, the finiteness check and the encoding of partition `key` of
// the gradient, then its push. A non-finite partition is not pushed and marks the step
// skipped (the partitions already pushed stay applied); a failed push is kept for
// exchange().
void PsExchange::push_partition(std::uint32_t key, bool in_backward) {
  if (hook_.error || hook_.nonfinite || !tracker_->claim(key)) return;
  if (!finish_push()) return;
  const auto& p = replica_.layout.partitions[key];
  auto g = std::span<float>(replica_.grads)
               .subspan(static_cast<std::size_t>(p.offset), static_cast<std::size_t>(p.length));
  const auto x = std::span<const float>(replica_.params).subspan(static_cast<std::size_t>(p.offset), g.size());
  if (std::any_of(g.begin(), g.end(), [](float v) { return !std::isfinite(v); })) {
    hook_.nonfinite = true;
    return;
  }
  const auto wd = static_cast<float>(spec_.optimizer.weight_decay);
  if (wd > 0) {
    for (std::size_t j = 0; j < g.size(); ++j) g[j] += wd * x[j];
  }
  try {
    std::span<const ps::PartitionPush> pushes;
    if (plain_) {
      auto& pp = plain_pushes_[key];
      pp.codec = wire::Codec::kDenseF32;
      pp.count = static_cast<std::uint32_t>(g.size());
      pp.first = std::as_bytes(std::span<const float>(g));
      pushes = plain_pushes_;
    } else {
      const auto t0 = Clock::now();
      pushes = encoder_->encode_partition(key, g, hook_.density, static_cast<std::uint64_t>(replica_.global_step));
      rep_.counters().compress_seconds += seconds_since(t0);
    }
    const std::uint32_t keys[] = {key};
    push_work_ = client_->start_push(pushes, keys, hook_.lr);
    push_in_backward_ = in_backward;
  } catch (...) {
    hook_.error = std::current_exception();
  }
}

bool PsExchange::finish_push() {
  if (!push_work_.active()) return true;
  try {
    push_work_.wait();
  } catch (...) {
    if (!hook_.error) hook_.error = std::current_exception();
    return false;
  }
  if (push_in_backward_) ++rep_.counters().overlapped_pushes;
  return true;
}

void PsExchange::recover(const ps::PsConnectionLost& lost) {
  const auto t0 = Clock::now();
  resyncer_->recover(lost);  // replica.params and the model now hold the PS's values
  pulled_ = replica_.params;  // what the shards think this worker holds after the dense pull
  rep_.counters().exchange_seconds += seconds_since(t0);
}

void PsExchange::begin_backward(float lr, double density) {
  await_pull();  // the hooks push through the client
  tracker_->begin_step();
  hook_.lr = lr;
  hook_.density = density;
  hook_.nonfinite = false;
  hook_.error = nullptr;
  if (plain_pushes_.size() != replica_.layout.partitions.size()) plain_pushes_.resize(replica_.layout.partitions.size());
  hook_.active = true;
}

void PsExchange::end_backward(bool ran) {
  hook_.active = false;
  if (!ran) hook_.nonfinite = true;
  // A skipped step (no exchange follows): its pushes so far stay applied; the one in
  // flight ends now, before the next forward.
  if (hook_.nonfinite) await_push();
}

// Push this step's gradient and pull; a lost shard drops the step's gradient and leaves
// replica.params holding the PS's values.
void PsExchange::exchange(float lr, double density, double downlink, double pos) {
  auto& params = replica_.params;
  // With overlap the step's bytes count from the end of the previous step's exchange:
  // they include the pushes backward's hooks wrote and the pipelined pull's replies.
  const auto up0 = spec_.overlap ? meter_up0_ : client_->bytes_pushed();
  const auto down0 = spec_.overlap ? meter_down0_ : client_->bytes_pulled();
  bool pull_ahead = false;
  try {
    if (spec_.overlap) {
      // The partitions backward did not complete (parameters without a gradient: zero),
      // then the pull. A push that failed in a hook fails the step here.
      const auto t0 = Clock::now();
      rep_.mark(wire::StepPhase::kPushPull, t0);
      for (const auto& p : replica_.layout.partitions) {
        if (tracker_->claimed(p.key)) continue;
        tracker_->zero_missing(p, replica_.grads);
        push_partition(p.key, false);
      }
      finish_push();
      if (hook_.error) std::rethrow_exception(hook_.error);
      if (pipelined_) {
        // The values the pull issued after the previous step brought (awaited before
        // backward) go into the model now; this step's pull runs while the next
        // step's data and forward do.
        params = pulled_;
        pull_ahead = true;
      } else {
        client_->pull(params, downlink);
      }
      rep_.counters().exchange_seconds += seconds_since(t0);
    } else if (plain_) {
      const auto t0 = Clock::now();
      rep_.mark(wire::StepPhase::kPushPull, t0);
      client_->push_pull(replica_.grads, lr, params);
      rep_.counters().exchange_seconds += seconds_since(t0);
    } else {
      const auto t0 = Clock::now();
      const auto pushes = encode_pushes(density);
      const auto t1 = Clock::now();
      rep_.mark(wire::StepPhase::kPushPull, t1);
      client_->push_pull(pushes, lr, downlink, params);
      rep_.counters().compress_seconds += std::chrono::duration<double>(t1 - t0).count();
      rep_.counters().exchange_seconds += seconds_since(t1);
    }
    resyncer_->succeeded();
  } catch (const ps::PsConnectionLost& lost) {
    recover(lost);
  }
  replica_.pulled_at = unix_now();
  meter_->add_step(client_->bytes_pushed() - up0, client_->bytes_pulled() - down0, pos,
                   spec_.compression.warmup_epochs);
  last_pos_ = pos;
  meter_up0_ = client_->bytes_pushed();  // before the pipelined pull: no other thread uses the client
  meter_down0_ = client_->bytes_pulled();
  if (pull_ahead) start_pull(downlink);
}

// The step's pushes: the compressor's on the host, or on the GPU for a GPU worker.
std::span<const ps::PartitionPush> PsExchange::encode_pushes(double density) {
  const auto step = static_cast<std::uint64_t>(replica_.global_step);
  if (device_encoder_) {
    const double clip = spec_.compression.clip_norm > 0
                            ? spec_.compression.clip_norm / std::sqrt(static_cast<double>(std::max(1, spec_.workers)))
                            : 0.0;
    return device_encoder_->encode(density, step, clip);
  }
  return encoder_->encode(replica_.grads, spec_.workers, density, step);
}

void PsExchange::begin_epoch() {
  await_push();
  pulled_ = replica_.params;  // after worker 0's dense pull for its evaluation, too
  meter_up0_ = client_->bytes_pushed();  // that pull is not a step's traffic
  meter_down0_ = client_->bytes_pulled();
}

// Pipelined pulls (overlap in async and ssp): the pull runs on a thread of its own into
// pulled_ (dense: overwritten; sparse: the top-k of what changed added to it, pulled_
// being what the shards think this worker holds) while the main thread takes the next
// batch and runs forward, which touch neither the client nor pulled_.
void PsExchange::start_pull(double downlink) { pending_pull_ = client_->start_pull(pulled_, downlink); }

// Waits for the overlapped push in flight, if any: one of a step that was then skipped
// (a NaN/Inf partition after it), before anything else uses the client. A push that
// failed, now or earlier in that step, fails the worker or, for a lost connection,
// resyncs, as in exchange().
void PsExchange::await_push() {
  finish_push();
  const auto error = std::exchange(hook_.error, nullptr);
  if (!error) return;
  try {
    std::rethrow_exception(error);
  } catch (const ps::PsConnectionLost& lost) {
    recover(lost);
  }
}

// Waits for the pull in flight, if any (before anything else uses the client). A lost
// connection is recovered as in exchange(); the pull's target then holds the PS's values.
void PsExchange::await_pull() {
  await_push();
  if (!pending_pull_.active()) return;
  try {
    pending_pull_.wait();
    resyncer_->succeeded();
  } catch (const ps::PsConnectionLost& lost) {
    recover(lost);
  }
}

void PsExchange::drain_pull() {
  await_push();
  if (!pending_pull_.active()) return;
  await_pull();
  // Its replies belong to the epoch's last step, whose traffic was counted before them.
  meter_->add_bytes(client_->bytes_pushed() - meter_up0_, client_->bytes_pulled() - meter_down0_, last_pos_,
                    spec_.compression.warmup_epochs);
  meter_up0_ = client_->bytes_pushed();
  meter_down0_ = client_->bytes_pulled();
  replica_.params = pulled_;
  replica_.write_model();
}

void PsExchange::settle_for_stop() noexcept {
  try {
    push_work_.wait();
  } catch (const ps::StopRequested&) {
    // the stop ended the push too; the replica is what the last pull brought
  } catch (const std::exception& e) {
    spdlog::warn("worker {}: the push in flight when it was asked to stop failed: {}", cfg_.rank, e.what());
  }
  if (!pending_pull_.active()) return;
  try {
    pending_pull_.wait();
    replica_.params = pulled_;  // the newest values this worker got
  } catch (...) {
    // the stop ended the pull in flight too: replica.params keeps the last complete one
  }
}

void PsExchange::pull_dense() {
  await_push();
  try {
    client_->pull(replica_.params);
  } catch (const ps::PsConnectionLost& lost) {
    resyncer_->recover(lost);  // ends with a dense pull too
  }
}

std::uint32_t PsExchange::leave() {
  await_push();
  drain_pull();
  std::uint32_t members = 0;
  resyncer_->run([&] { members = client_->leave(); });
  return members;
}

void PsExchange::finish(const std::function<void()>& check_stop) {
  await_push();
  resyncer_->run([&] { client_->done(); });
  resyncer_->set_done_sent();
  if (cfg_.rank != 0) return;
  const auto deadline = Clock::now() + cfg_.finish_timeout;
  for (;;) {
    std::uint32_t finished = 0;
    if (spec_.elastic.on()) {
      // Whoever is a member now, however many joined or left on the way.
      std::uint32_t training = 0;
      resyncer_->run([&] { training = client_->members_training(); });
      if (training == 0) return;
    } else {
      resyncer_->run([&] { finished = client_->workers_done(); });
      if (finished >= static_cast<std::uint32_t>(spec_.workers)) return;
    }
    if (Clock::now() >= deadline) {
      throw TimeoutError("worker 0: the other workers did not finish within " +
                         std::to_string(cfg_.finish_timeout.count()) + " s");
    }
    check_stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace dltrain::train::detail
