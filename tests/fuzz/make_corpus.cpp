// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/) from the
// real encoders: frames as a worker's PushEncoder path and a PS shard write them (the
// gradient compressor in each method, the shard's top-k downlink), handshake messages
// with real MACs, control messages from their builders and body structs, task events
// from their structs, PS checkpoints and worker replicas from encode_checkpoint, tiny
// IDX files (plain and gzip), PNG/JPEG files from libpng and libjpeg-turbo and CIFAR-10
// records; plus the repository's example job files and agent
// configurations. Deterministic: the same sources give the same files.
//
// Usage: fuzz_make_corpus SOURCE_DIR OUT_DIR   (scripts/fuzz --make-corpus runs it with
// OUT_DIR = tests/fuzz/corpus)
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/compression_spec.h"
#include "job/job_spec.h"
#include "compress/compressor.h"
#include "compress/fp16.h"
#include "compress/topk.h"
#include "data/cifar10.h"
#include "data/shards.h"
#include "data/image.h"
#include "ps/checkpoint.h"
#include "ps/shard_state.h"
#include "wire/auth.h"
#include "wire/control.h"
#include "wire/control_bodies.h"
#include "wire/frame.h"
#include "wire/leader_events.h"
#include "wire/task_events.h"

using namespace dltrain;
namespace fs = std::filesystem;
using nlohmann::json;
namespace events = wire::events;

namespace {

fs::path out_root;

void write(const std::string& target, const std::string& name, std::span<const std::uint8_t> bytes) {
  const fs::path dir = out_root / target;
  fs::create_directories(dir);
  std::ofstream out(dir / name, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw IoError("cannot write " + (dir / name).string());
}

void write_text(const std::string& target, const std::string& name, const std::string& text) {
  write(target, name, {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()});
}

template <typename T>
void append(std::vector<std::uint8_t>& out, std::span<const T> v) {
  const auto* b = reinterpret_cast<const std::uint8_t*>(v.data());
  out.insert(out.end(), b, b + v.size_bytes());
}

std::vector<std::uint8_t> frame(wire::FrameHeader h, const std::vector<std::uint8_t>& payload) {
  h.payload_bytes = static_cast<std::uint32_t>(payload.size());
  std::vector<std::uint8_t> out(wire::kHeaderSize);
  wire::encode_header(h, std::span<std::byte, wire::kHeaderSize>(reinterpret_cast<std::byte*>(out.data()), wire::kHeaderSize));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

wire::FrameHeader header(wire::MessageType type, std::uint32_t key, wire::Codec codec, std::uint32_t count) {
  wire::FrameHeader h;
  h.type = type;
  h.job = 3;
  h.seq = 17;
  h.key = key;
  h.codec = codec;
  h.count = count;
  h.scale = 0.05f;
  h.generation = 1;
  return h;
}

// A gradient with a few large coordinates, as backward produces.
std::vector<float> gradient(std::size_t n, float scale) {
  std::vector<float> g(n);
  for (std::size_t i = 0; i < n; ++i) g[i] = scale * static_cast<float>((static_cast<int>(i * 37 % 101) - 50)) / 50.0f;
  return g;
}

void frames() {
  // Keys as fuzz_frame.cpp reads them: even keys give dense pushes the partition's exact
  // length; key 999 a partition of 1000 floats for sparse ones (8192 + 999 with momentum).
  std::vector<std::uint8_t> hello(8);
  const std::uint32_t rw[2] = {1, 2};
  std::memcpy(hello.data(), rw, 8);
  write("frame", "hello", frame(header(wire::MessageType::kHello, 0, wire::Codec::kBytes, 8), hello));
  for (const char* method : {"none", "fp16", "topk", "randomk", "dgc", "powersgd"}) {
    compress::CompressionSpec spec;
    spec.method = parse_enum<compress::Method>(method, "compression.method");
    spec.ratio = 0.01;
    const std::size_t n = std::string(method) == "none" || std::string(method) == "fp16" ? 64 : 1000;
    compress::GradientCompressor comp(spec, {static_cast<std::int64_t>(n)}, 7);
    // powersgd: the 1000 floats as a 20 x 50 matrix at rank 4.
    comp.set_lowrank_blocks(compress::lowrank_blocks(std::vector<compress::TensorRows>{{1000, 20}},
                                                     std::vector<std::int64_t>{1000}, 4, 0));
    const auto g = gradient(n, 0.5f);
    const auto& e = comp.encode(0, g, std::string(method) == "none" || std::string(method) == "fp16" ? 1.0 : 0.01, 3);
    const std::uint32_t key = n == 64 ? 0 : 999;
    std::vector<std::uint8_t> p;
    wire::Codec codec = wire::Codec::kDenseF32;
    switch (e.encoding) {
      case compress::Encoding::kDense: append<float>(p, e.values); break;
      case compress::Encoding::kDenseF16: codec = wire::Codec::kDenseF16; append<std::uint16_t>(p, e.half); break;
      case compress::Encoding::kSparse:
        codec = wire::Codec::kSparseF32;
        append<std::uint32_t>(p, e.indices);
        append<float>(p, e.values);
        break;
      case compress::Encoding::kSeeded: codec = wire::Codec::kSeededF32; append<float>(p, e.values); break;
      case compress::Encoding::kLowRank:
        codec = wire::Codec::kLowRankF32;
        append<std::uint32_t>(p, e.indices);
        append<float>(p, e.values);
        break;
    }
    auto h = header(wire::MessageType::kPush, key, codec, static_cast<std::uint32_t>(e.count()));
    if (codec == wire::Codec::kSeededF32) h.seq = e.seed;
    write("frame", std::string("push-") + method, frame(h, p));
    h.key = key + 8192;  // the PS applies momentum
    write("frame", std::string("push-") + method + "-momentum", frame(h, p));
    if (e.encoding == compress::Encoding::kSparse) {
      // The same pairs with fp16 values (the sparse fp16 codec).
      std::vector<std::uint8_t> q;
      append<std::uint32_t>(q, e.indices);
      std::vector<std::uint16_t> half(e.values.size());
      compress::to_half(e.values, half);
      append<std::uint16_t>(q, half);
      write("frame", std::string("push-") + method + "-f16",
            frame(header(wire::MessageType::kPush, key, wire::Codec::kSparseF16, static_cast<std::uint32_t>(e.count())), q));
    }
  }
  // A PS shard's sparse pull reply: the top-k of what changed since the worker's pull.
  ps::ShardState st(0.0);
  st.init(999, std::vector<float>(1000, 0.0f));
  std::vector<float> seen(1000);
  st.pull(999, seen, 0);
  st.push(999, gradient(1000, 1.0f), 0.1f);
  std::vector<std::uint32_t> idx;
  std::vector<float> val;
  st.pull_diff(999, 0, 10, idx, val);
  std::vector<std::uint8_t> reply;
  append<std::uint32_t>(reply, idx);
  append<float>(reply, val);
  write("frame", "pull-reply-sparse",
        frame(header(wire::MessageType::kPullReply, 999, wire::Codec::kSparseF32, static_cast<std::uint32_t>(idx.size())), reply));
  std::vector<std::uint8_t> dense;
  append<float>(dense, std::span<const float>(seen).first(16));
  write("frame", "pull-reply-dense", frame(header(wire::MessageType::kPullReply, 2, wire::Codec::kDenseF32, 16), dense));
  write("frame", "init", frame(header(wire::MessageType::kInit, 2, wire::Codec::kDenseF32, 16), dense));
  write("frame", "pull", frame(header(wire::MessageType::kPull, 999, wire::Codec::kNone, 1), {}));
  write("frame", "pull-sparse", frame(header(wire::MessageType::kPullSparse, 999, wire::Codec::kNone, 10), {}));
  write("frame", "pull-fp16", frame(header(wire::MessageType::kPullHalf, 999, wire::Codec::kNone, 0), {}));
  write("frame", "done", frame(header(wire::MessageType::kDone, 1, wire::Codec::kNone, 0), {}));
  write("frame", "query", frame(header(wire::MessageType::kQuery, 0, wire::Codec::kNone, 0), {}));
  const std::string why = "frame generation: expected 2, got 1 (a stale task?)";
  write("frame", "error",
        frame(header(wire::MessageType::kError, 0, wire::Codec::kBytes, static_cast<std::uint32_t>(why.size())),
              std::vector<std::uint8_t>(why.begin(), why.end())));
}

void handshakes() {
  // The secret and shard nonce fuzz_handshake.cpp checks MACs with.
  const std::array<std::uint8_t, 32> secret = {
      0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe,
      0x0f, 0x1e, 0x2d, 0x3c, 0x4b, 0x5a, 0x69, 0x78, 0x87, 0x96, 0xa5, 0xb4, 0xc3, 0xd2, 0xe1, 0xf0};
  const wire::Nonce shard_nonce = {0x5a};
  wire::Nonce worker_nonce{};
  for (std::size_t i = 0; i < worker_nonce.size(); ++i) worker_nonce[i] = static_cast<std::uint8_t>(i * 7 + 1);
  std::array<std::uint8_t, wire::kChallengeSize> c{};
  wire::encode_challenge(shard_nonce, c);
  write("handshake", "challenge", c);
  wire::AuthAnswer a;
  a.job = 3;
  a.generation = 1;
  a.nonce = worker_nonce;
  a.mac = wire::auth_mac(secret, shard_nonce, a.job, a.generation, wire::kWorkerContext);
  std::array<std::uint8_t, wire::kAnswerSize> ans{};
  wire::encode_answer(a, ans);
  write("handshake", "answer", ans);
  std::array<std::uint8_t, wire::kProofSize> proof{};
  wire::encode_proof(wire::auth_mac(secret, worker_nonce, a.job, a.generation, wire::kShardContext), proof);
  write("handshake", "proof", proof);
}

void control_messages() {
  const json spec = JobSpec{};
  wire::RegisterBody reg;
  reg.name = "agent-1";
  reg.cores = 4;
  reg.memory_mb = 8192;
  reg.tasks = {{{}, "job-1", "ps-0", 1, false}, {{}, "job-1", "worker-1", 1, true}};
  wire::GpuInfo gpu;
  gpu.name = "NVIDIA H200";
  gpu.uuid = "GPU-00000000-0000-0000-0000-000000000000";
  gpu.memory_mb = 143771;
  reg.gpus = {gpu};
  write_text("control", "register", wire::make_request("register", "register", reg.to_json()));
  write_text("control", "heartbeat", wire::make_request("a2", "heartbeat", {{"running_tasks", 2}}));
  events::Progress progress;
  progress.rank = 1;
  progress.epoch = 2;
  progress.step = 40;
  progress.loss = 0.4;
  write_text("control", "task-event",
             wire::make_request("a3", "task_event", wire::TaskEventBody{{}, "job-1", "worker-1", 1, progress.to_json()}.to_json()));
  wire::TaskExitBody exit;
  exit.job = "job-1";
  exit.task = "worker-1";
  exit.generation = 1;
  exit.exit_code = 1;
  exit.describe = "exit code 1";
  exit.last_error = "worker 1: PS shard 0 went away";
  write_text("control", "task-exit", wire::make_request("a4", "task_exit", exit.to_json()));
  wire::SubmitBody sub;
  sub.job_toml = "name = \"x\"\nmodel = \"mlp\"\nworkers = 2\nepochs = 1\n";
  sub.follow = true;
  write_text("control", "submit", wire::make_request("c1", "submit", sub.to_json()));
  write_text("control", "plan", wire::make_request("c2", "plan", sub.to_json()));
  write_text("control", "status", wire::make_request("c3", "status", wire::JobQueryBody{{}, "job-1"}.to_json()));
  write_text("control", "cancel", wire::make_request("c4", "cancel", wire::JobQueryBody{{}, "job-1"}.to_json()));
  write_text("control", "list", wire::make_request("c5", "list", {{"limit", 100}}));
  write_text("control", "history", wire::make_request("c6", "history", wire::HistoryBody{{}, "cnn", "fashion-mnist"}.to_json()));
  write_text("control", "series", wire::make_request("d1", "series", wire::JobQueryBody{{}, "job-1"}.to_json()));
  write_text("control", "events", wire::make_request("d2", "events", wire::EventsBody{{}, "job-1", 100}.to_json()));
  write_text("control", "auth", wire::make_request("auth", "auth", wire::AuthBody{{}, "client-token"}.to_json()));
  wire::StartTaskBody st;
  st.job = "job-1";
  st.job_num = 1;
  st.task = "worker-1";
  st.kind = wire::TaskKind::kWorker;
  st.index = 1;
  st.generation = 2;
  st.secret = std::string(64, 'a');
  st.threads = 1;
  st.spec = spec;
  st.ps = {"10.0.0.2:40123"};
  st.resume_epoch = 2;
  st.init_replica_generation = 1;
  write_text("control", "start-task-worker", wire::make_request("l1", "start_task", st.to_json()));
  st.task = "ps-0";
  st.kind = wire::TaskKind::kPs;
  st.index = 0;
  st.ps.clear();
  st.restore_generation = 1;
  st.workers_done = {0};
  write_text("control", "start-task-ps", wire::make_request("l2", "start_task", st.to_json()));
  write_text("control", "stop-task", wire::make_request("l3", "stop_task", wire::TaskRefBody{{}, "job-1", "ps-0", 2, {}, 0}.to_json()));
  write_text("control", "reply", wire::make_reply("register", {{"agent_id", "agent-1"}, {"heartbeat_interval_ms", 1000}}));
  write_text("control", "error", wire::make_error("c1", wire::error_code::kInvalidJob, "batch_size: expected ...", "batch_size"));
  write_text("control", "event", wire::make_event(events::StateChanged{{}, "running"}.to_json()));
}

void task_events() {
  events::Started s;
  s.rank = 1;
  s.train_examples = 30000;
  events::EpochEnd e;
  e.epoch = 1;
  e.epochs = 3;
  e.test_accuracy = 0.87;
  events::Done d;
  d.test_accuracy = 0.9;
  d.traffic = events::Traffic{{}, 100, 200, 1000, 2000};
  events::WorkerStopped ws;
  ws.epochs_done = 2;
  events::Replica r;
  r.path = "replica.ckpt";
  r.steps = 40;
  ws.replica = r;
  events::Listening l;
  l.port = 40123;
  events::CheckpointLoad cl;
  cl.restored = true;
  cl.partitions = 3;
  l.checkpoint = cl;
  events::Reassigned ra;
  ra.generation = 2;
  ra.moved = {events::Move{{}, "ps-0", "agent-1", "agent-2"}};
  events::Summary sum;
  sum.job = "job-1";
  sum.state = "succeeded";
  sum.compression_ratio = json_fields::Nullable<double>(12.5);
  const std::vector<std::pair<std::string, json>> all = {
      {"started", s.to_json()},
      {"epoch-end", e.to_json()},
      {"done", d.to_json()},
      {"stopped-worker", ws.to_json()},
      {"listening", l.to_json()},
      {"ps-stopped", events::PsStopped{{}, 0, 120, 1000, 2000, 1, 2, std::nullopt, 3}.to_json()},
      {"data", events::DataInfo{{}, 0, "imagefolder", 10, 2500, 500, 32, 1, {0.286}, {0.353}, "sample", 512, 1, 2}.to_json()},
      {"skipped-image", events::SkippedImage{{}, 1, "train/shirt/000123.png: not a PNG or JPEG file", 3}.to_json()},
      {"ps-stats", events::PsStats{{}, 0, 640, 1280, 0.25, 5242880, 2621440, 2, 1, 1, 3, 1764547200.5}.to_json()},
      {"restarting", events::Restarting{{}, "worker", 1, 3, "killed by signal 9", "", 2, std::nullopt}.to_json()},
      {"ps-resync", events::PsResync{{}, 1, 0, "connection reset", 0.4, 1}.to_json()},
      {"error", events::TaskError{{}, "worker 1: out of memory"}.to_json()},
      {"reassigned", ra.to_json()},
      {"waiting", events::Waiting{{}, 1, 4, 2, 8, true, 600.0}.to_json()},
      {"summary", sum.to_json()},
  };
  for (const auto& [name, ev] : all) write_text("task_events", name, ev.dump() + "\n");
  write_text("task_events", "log-line", "Epoch 1: loss 0.42 (not JSON)\n");
}

std::vector<std::uint8_t> as_bytes(const std::vector<std::byte>& b) {
  return {reinterpret_cast<const std::uint8_t*>(b.data()), reinterpret_cast<const std::uint8_t*>(b.data()) + b.size()};
}

void checkpoints() {
  // The first byte is fuzz_checkpoint.cpp's mode: 0 reads the file as it is.
  const auto with_mode = [](std::uint8_t mode, const std::vector<std::byte>& file) {
    std::vector<std::uint8_t> out{mode};
    const auto b = as_bytes(file);
    out.insert(out.end(), b.begin(), b.end());
    return out;
  };
  ps::ShardState st(0.9);
  st.init(0, gradient(8, 1.0f));
  st.init(3, gradient(5, 2.0f));
  st.push(0, gradient(8, 0.1f), 0.05f);
  st.mark_done(1);
  write("checkpoint", "shard-momentum", with_mode(0, ps::encode_checkpoint(st.snapshot(), 3, 0)));
  ps::ShardState plain(0.0);
  plain.init(1, gradient(4, 1.0f));
  write("checkpoint", "shard-plain", with_mode(0, ps::encode_checkpoint(plain.snapshot(), 3, 1)));
  write("checkpoint", "shard-plain-crc-fixed", with_mode(1, ps::encode_checkpoint(plain.snapshot(), 3, 1)));
  ps::ShardSnapshot replica;
  replica.pushes = 120;
  replica.partitions = {{0, gradient(6, 1.0f), {}}, {1, gradient(3, 1.0f), {}}};
  write("checkpoint", "replica", with_mode(0, ps::encode_checkpoint(replica, 3, ps::kWorkerReplicaShard)));
}

std::vector<std::uint8_t> be32(std::initializer_list<std::uint32_t> v) {
  std::vector<std::uint8_t> out;
  for (auto x : v) {
    for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<std::uint8_t>(x >> s));
  }
  return out;
}

void idx_files() {
  auto images = be32({0x803, 2, 3, 4});
  for (int i = 0; i < 24; ++i) images.push_back(static_cast<std::uint8_t>(i * 10));
  write("idx", "images", images);
  auto labels = be32({0x801, 5});
  for (std::uint8_t l : {3, 1, 4, 1, 5}) labels.push_back(l);
  write("idx", "labels", labels);
  // The same images gzip-compressed, as the data sets ship.
  const fs::path gz = out_root / "idx" / "images.gz";
  gzFile f = gzopen(gz.c_str(), "wb9");
  if (f == nullptr || gzwrite(f, images.data(), static_cast<unsigned>(images.size())) != static_cast<int>(images.size()) ||
      gzclose(f) != Z_OK) {
    throw IoError("cannot write " + gz.string());
  }
}

// Small PNG and JPEG files (gray and RGB, as libpng and libjpeg-turbo write them), a
// truncated one, and CIFAR-10 files of whole and partial records.
void image_files() {
  data::Image gray;
  gray.height = 5;
  gray.width = 7;
  gray.channels = 1;
  for (int i = 0; i < 35; ++i) gray.pixels.push_back(static_cast<std::uint8_t>(i * 7));
  data::Image rgb;
  rgb.height = 4;
  rgb.width = 3;
  rgb.channels = 3;
  for (int i = 0; i < 36; ++i) rgb.pixels.push_back(static_cast<std::uint8_t>(255 - i * 5));
  write("image", "gray.png", data::encode_png(gray));
  write("image", "rgb.png", data::encode_png(rgb));
  write("image", "gray.jpg", data::encode_jpeg(gray, 90));
  write("image", "rgb.jpg", data::encode_jpeg(rgb, 75));
  auto cut = data::encode_jpeg(rgb, 75);
  cut.resize(cut.size() / 2);
  write("image", "truncated.jpg", cut);
  std::vector<std::uint8_t> rec;
  for (int r = 0; r < 2; ++r) {
    rec.push_back(static_cast<std::uint8_t>(r * 7 % 10));
    for (int p = 0; p < 3072; ++p) rec.push_back(static_cast<std::uint8_t>((p * 3 + r) % 256));
  }
  write("cifar10", "two-records", rec);
  rec.resize(data::kCifar10RecordBytes + 100);
  write("cifar10", "partial-record", rec);
}

// A shard of two samples written by TarWriter and a manifest (a leading byte picks the
// parser: 0 a shard, 1 a manifest).
void shard_files() {
  const auto path = (std::filesystem::temp_directory_path() / "dltrain-corpus-shard.tar").string();
  {
    data::TarWriter w(path);
    data::Image gray{2, 2, 1, {0, 64, 128, 255}};
    const auto png = data::encode_png(gray);
    for (const char* key : {"00000000", "00000001"}) {
      w.add(std::string(key) + ".png", png);
      w.add(std::string(key) + ".cls", std::vector<std::uint8_t>{'3'});
    }
    std::string sha;
    w.finish(sha);
  }
  std::ifstream in(path, std::ios::binary);
  std::vector<std::uint8_t> bytes{0};
  bytes.insert(bytes.end(), std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  std::filesystem::remove(path);
  write("shards", "two-samples.tar", bytes);
  data::Manifest m;
  m.classes = {"a", "b"};
  m.train.shards = {{"train-000000.tar", 2, 4096, std::string(64, 'a')}};
  m.train.samples = 2;
  m.train.bytes = 4096;
  m.test = m.train;
  m.test.shards[0].name = "test-000000.tar";
  m.channels = 1;
  m.image_size = 2;
  m.mean = {0.5f};
  m.std = {0.4f};
  write_text("shards", "manifest.json", "\x01" + data::manifest_json(m).dump());
}

// Inputs that triggered a bug found while writing the targets (each has a regression
// test in tests/unit), so that every run tries them again.
void regressions() {
  auto nan_push = header(wire::MessageType::kPush, 0, wire::Codec::kDenseF32, 4);
  nan_push.scale = std::numeric_limits<float>::quiet_NaN();
  std::vector<std::uint8_t> four;
  append<float>(four, std::vector<float>{1, 2, 3, 4});
  write("frame", "regress-push-nan-scale", frame(nan_push, four));
  write_text("control", "logs", R"({"v":1,"id":"c7","type":"logs","body":{"job":"job-3","task":"worker-1","tail":50}})");
  write_text("control", "read-log-reply",
             R"({"v":1,"id":"l9","type":"reply","ok":true,"body":{"job":"job-3","task":"worker-1","agent":"a1",)"
             R"("text":"epoch 1\n","offset":0,"next_offset":8,"size":8,"rotated":false,"exists":true,"running":true}})");
  write_text("control", "regress-number-overflow", R"({"v":1,"id":"r1","type":"heartbeat","body":{"x":1e400}})");
  write_text("control", "regress-version-wraps", R"({"v":4294967297,"id":"r1","type":"list"})");
  write_text("control", "regress-register-cores-1e300", R"({"v":1,"id":"r","type":"register","body":{"name":"a","cores":1e300}})");
  write_text("control", "regress-start-task-job-number",
             R"({"v":1,"id":"l1","type":"start_task","body":{"job":5,"task":"ps-0","kind":"ps"}})");
  write_text("control", "regress-start-task-path",
             R"({"v":1,"id":"l1","type":"start_task","body":{"job":"../..","task":"ps-0","kind":"ps"}})");
  write_text("control", "regress-error-message-number",
             R"({"v":1,"id":"register","type":"reply","ok":false,"error":{"message":5}})");
  write_text("task_events", "regress-rank-1e300", R"({"event":"started","rank":1e300})" "\n");
  write_text("task_events", "regress-not-utf8", "loss \xff\xfe\n");
  write_text("job_toml", "regress-duration-dot", "model = \"mlp\"\ndeadline = \".s\"\n");
  write_text("job_toml", "regress-quote-after-value", "a=0\"\xce\x82");
  write_text("agent_toml", "regress-quote-after-value", "x =9a8=\"p:t\xc3\xa9s\"\"\n");
  write_text("job_toml", "regress-duration-overflow", "model = \"mlp\"\ndeadline = \"" + std::string(305, '9') + "d\"\n");
  write_text("agent_toml", "regress-duration-overflow", "agent_token = \"t\"\nheartbeat_timeout = \"99999999999d\"\n");
  auto huge = be32({0x803, 1u << 24, 16, 16});
  huge.push_back(1);
  write("idx", "regress-header-claims-4GiB", huge);
}

void copy_configs(const fs::path& src) {
  for (const auto& e : fs::directory_iterator(src / "configs" / "jobs")) {
    fs::create_directories(out_root / "job_toml");
    fs::copy_file(e.path(), out_root / "job_toml" / e.path().filename(), fs::copy_options::overwrite_existing);
  }
  fs::create_directories(out_root / "agent_toml");
  for (const char* f : {"agent.toml", "leader.toml"}) {
    fs::copy_file(src / "configs" / f, out_root / "agent_toml" / f, fs::copy_options::overwrite_existing);
    // The examples read their tokens from /etc/dltrain; the same with the tokens inline.
    std::ifstream in(src / "configs" / f);
    std::string text, line;
    while (std::getline(in, line)) {
      if (line.rfind("agent_token_file", 0) == 0) line = "agent_token = \"agent-secret\"";
      if (line.rfind("client_token_file", 0) == 0) line = "client_token = \"client-secret\"";
      text += line + "\n";
    }
    write_text("agent_toml", std::string("inline-tokens-") + f, text);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: " << argv[0] << " SOURCE_DIR OUT_DIR\n";
    return 2;
  }
  try {
    out_root = argv[2];
    frames();
    handshakes();
    control_messages();
    task_events();
    checkpoints();
    idx_files();
    image_files();
    shard_files();
    regressions();
    copy_configs(argv[1]);
  } catch (const std::exception& e) {
    std::cerr << "fuzz_make_corpus: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
