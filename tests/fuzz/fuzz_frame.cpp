// Fuzzes the data-plane frame: the 48-byte header (wire::decode_header, what both a PS
// shard and a worker run on every frame they read) and the payloads behind it — a hello,
// a push in each push codec (dense fp32 / fp16, sparse fp32 / fp16, seeded, low rank), applied to a
// PS shard's state as the shard does, and a sparse pull reply added to a worker's replica.
//
// Input: a frame as it comes off the socket, header then payload (cut or zero-padded to
// the header's payload_bytes). Checks, beyond "no crash":
//   - a header that decodes encodes back to the same 48 bytes;
//   - decode_push refuses exactly what the protocol refuses, and what it accepts equals
//     a reference decoding written here (fp16 by its IEEE definition);
//   - a push is applied exactly when its values are finite and its indices strictly
//     ascending inside the partition, then x = x0 − lr·g coordinate by coordinate, else
//     the state is untouched; the downlink's top-k that follows returns k ascending
//     indices whose |x − x_seen| no unselected coordinate exceeds;
//   - a low-rank push is decoded exactly when its block header tiles the partition and its
//     values are what the blocks need, into what P·Qᵀ and the full blocks say;
//   - a sparse pull reply is added exactly when its indices are valid, else nothing is.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include "common/errors.h"
#include "compress/topk.h"
#include "fuzz_check.h"
#include "ps/payload.h"
#include "ps/shard_state.h"
#include "wire/frame.h"

using namespace dltrain;
using dltrain::fuzz::same_float;

namespace {

// Small enough to keep an execution fast (the payload behind a header is padded to its
// length), large enough for every code path, the limit checks included.
constexpr wire::FrameLimits kLimits{1u << 14, 1u << 16};

template <typename T>
T load(const std::vector<std::uint8_t>& b, std::size_t off) {
  T v;
  std::memcpy(&v, b.data() + off, sizeof v);
  return v;
}

// IEEE 754 binary16 by its definition (sign, 5-bit exponent bias 15, 10-bit fraction),
// independently of compress::half_to_float's bit manipulation.
float reference_half(std::uint16_t h) {
  const int e = (h >> 10) & 0x1F;
  const int m = h & 0x3FF;
  float v;
  if (e == 0) {
    v = std::ldexp(static_cast<float>(m), -24);
  } else if (e == 31) {
    v = m != 0 ? NAN : INFINITY;
  } else {
    v = std::ldexp(1.0f + static_cast<float>(m) / 1024.0f, e - 15);
  }
  return (h & 0x8000) != 0 ? -v : v;
}

bool is_push_codec(wire::Codec c) {
  return c == wire::Codec::kDenseF32 || c == wire::Codec::kDenseF16 || c == wire::Codec::kSparseF32 ||
         c == wire::Codec::kSparseF16 || c == wire::Codec::kSeededF32;
}

void fuzz_hello(const wire::FrameHeader& h, std::span<const float> words, const std::vector<std::uint8_t>& bytes) {
  const bool ok_ref = h.codec == wire::Codec::kBytes && h.count == 8 &&
                      load<std::uint32_t>(bytes, 4) >= 1 && load<std::uint32_t>(bytes, 0) < load<std::uint32_t>(bytes, 4);
  try {
    const auto hello = ps::decode_hello(h, words);
    FUZZ_CHECK(ok_ref, "decode_hello accepted a hello the protocol refuses");
    FUZZ_CHECK(hello.rank == load<std::uint32_t>(bytes, 0) && hello.workers == load<std::uint32_t>(bytes, 4),
               "decode_hello read other numbers");
  } catch (const ProtocolError&) {
    FUZZ_CHECK(!ok_ref, "decode_hello refused a valid hello");
  }
}

// A low-rank push (codec 7, compress::lowrank_decode) to a partition of 1 + key % 4096
// floats, checked against the protocol's rules and a reconstruction written here.
void fuzz_lowrank_push(const wire::FrameHeader& h, std::span<const float> words,
                       const std::vector<std::uint8_t>& bytes) {
  const std::size_t c = h.count, len = 1 + h.key % 4096;
  bool ok_ref = std::isfinite(h.scale) && c >= 1;
  const std::uint64_t nb = ok_ref ? load<std::uint32_t>(bytes, 0) : 0;
  ok_ref = ok_ref && nb >= 1 && 1 + 3 * nb <= c;
  std::uint64_t floats = 0, sent = 0;
  for (std::uint64_t b = 0; ok_ref && b < nb; ++b) {
    const std::uint64_t rows = load<std::uint32_t>(bytes, 4 * (1 + 3 * b)), cols = load<std::uint32_t>(bytes, 4 * (2 + 3 * b)),
                        rank = load<std::uint32_t>(bytes, 4 * (3 + 3 * b));
    ok_ref = rows >= 1 && cols >= 1 && rank <= std::min({rows, cols, std::uint64_t{64}});
    floats += rows * cols;
    sent += rank == 0 ? rows * cols : (rows + cols) * rank;
    ok_ref = ok_ref && floats <= len;
  }
  ok_ref = ok_ref && floats == len && sent == c - 1 - 3 * nb;
  std::vector<float> want(len, 0.0f);
  if (ok_ref) {
    std::size_t at = 1 + 3 * nb, off = 0;  // in words, in floats of the partition
    for (std::uint64_t b = 0; b < nb; ++b) {
      const std::size_t rows = load<std::uint32_t>(bytes, 4 * (1 + 3 * b)), cols = load<std::uint32_t>(bytes, 4 * (2 + 3 * b)),
                        r = load<std::uint32_t>(bytes, 4 * (3 + 3 * b));
      for (std::size_t i = 0; i < rows; ++i) {
        for (std::size_t j = 0; j < cols; ++j) {
          float s = 0;
          if (r == 0) {
            s = load<float>(bytes, 4 * (at + i * cols + j));
          } else {
            for (std::size_t k = 0; k < r; ++k) s += load<float>(bytes, 4 * (at + i * r + k)) * load<float>(bytes, 4 * (at + rows * r + j * r + k));
          }
          want[off + i * cols + j] = s;
        }
      }
      at += r == 0 ? rows * cols : (rows + cols) * r;
      off += rows * cols;
    }
  }
  ps::PayloadScratch scratch;
  ps::PushView view;
  try {
    view = ps::decode_push(h, words, len, scratch);
    FUZZ_CHECK(ok_ref, "decode_push accepted a low-rank push the protocol refuses");
  } catch (const ProtocolError&) {
    FUZZ_CHECK(!ok_ref, "decode_push refused a valid low-rank push");
    return;
  }
  FUZZ_CHECK(!view.sparse && view.values.size() == len, "low-rank push: not decoded to the whole partition");
  for (std::size_t i = 0; i < len; ++i) FUZZ_CHECK(same_float(view.values[i], want[i]), "low-rank push: a value differs");
}

void fuzz_push(const wire::FrameHeader& h, std::span<const float> words, const std::vector<std::uint8_t>& bytes) {
  if (h.codec == wire::Codec::kLowRankF32) return fuzz_lowrank_push(h, words, bytes);
  const std::size_t c = h.count;
  const bool dense = h.codec == wire::Codec::kDenseF32 || h.codec == wire::Codec::kDenseF16;
  // The partition: the push's length for dense codecs (one more, to see it refused, when
  // the key is odd), else a length from the key.
  std::size_t len = 1 + h.key % 4096;
  if (dense) len = std::max<std::size_t>(1, c + (h.key & 1));
  if (!dense && ((h.key >> 12) & 1) != 0) len = std::max(len, c);
  const double momentum = ((h.key >> 13) & 1) != 0 ? 0.9 : 0.0;

  ps::ShardState st(momentum);
  std::vector<float> x0(len);
  for (std::size_t i = 0; i < len; ++i) x0[i] = static_cast<float>(static_cast<int>(i % 17) - 8) * 0.25f;
  st.init(h.key, x0);
  std::vector<float> seen(len);
  st.pull(h.key, seen, 0);  // worker 0's x_seen, the base of the top-k pull below

  // The reference decoding.
  const bool refuse_ref = !is_push_codec(h.codec) || !std::isfinite(h.scale) ||
                          (h.codec == wire::Codec::kSeededF32 && c > len);
  ps::PayloadScratch scratch;
  ps::PushView view;
  try {
    view = ps::decode_push(h, words, len, scratch);
    FUZZ_CHECK(!refuse_ref, "decode_push accepted a push the protocol refuses");
  } catch (const ProtocolError&) {
    FUZZ_CHECK(refuse_ref, "decode_push refused a push with a push codec, a finite scale and a fitting count");
    return;
  }
  std::vector<std::uint32_t> idx;
  std::vector<float> val(c);
  switch (h.codec) {
    case wire::Codec::kDenseF32:
      for (std::size_t j = 0; j < c; ++j) val[j] = load<float>(bytes, 4 * j);
      break;
    case wire::Codec::kDenseF16:
      for (std::size_t j = 0; j < c; ++j) val[j] = reference_half(load<std::uint16_t>(bytes, 2 * j));
      break;
    case wire::Codec::kSparseF32:
    case wire::Codec::kSparseF16:
      for (std::size_t j = 0; j < c; ++j) idx.push_back(load<std::uint32_t>(bytes, 4 * j));
      for (std::size_t j = 0; j < c; ++j) {
        val[j] = h.codec == wire::Codec::kSparseF32 ? load<float>(bytes, 4 * (c + j))
                                                    : reference_half(load<std::uint16_t>(bytes, 4 * c + 2 * j));
      }
      break;
    case wire::Codec::kSeededF32:
      // The indices are the seed's: they must be c distinct ascending ones inside the partition.
      for (std::size_t j = 0; j < c; ++j) val[j] = load<float>(bytes, 4 * j);
      FUZZ_CHECK(view.indices.size() == c, "seeded push: wrong number of indices");
      for (std::size_t j = 0; j < c; ++j) {
        FUZZ_CHECK(view.indices[j] < len && (j == 0 || view.indices[j] > view.indices[j - 1]),
                   "seeded push: indices not ascending inside the partition");
      }
      idx.assign(view.indices.begin(), view.indices.end());
      break;
    default:
      break;
  }
  FUZZ_CHECK(view.sparse == !dense, "decode_push: dense/sparse mixed up");
  FUZZ_CHECK(view.values.size() == c, "decode_push: wrong number of values");
  for (std::size_t j = 0; j < c; ++j) FUZZ_CHECK(same_float(view.values[j], val[j]), "decode_push: a value differs");
  if (!dense) {
    FUZZ_CHECK(view.indices.size() == c, "decode_push: wrong number of indices");
    for (std::size_t j = 0; j < c; ++j) FUZZ_CHECK(view.indices[j] == idx[j], "decode_push: an index differs");
  }

  // Applied exactly when it is acceptable; then x = x0 − lr·g (a fresh momentum buffer
  // is 0, so momentum changes nothing in the first push).
  bool ok_ref = std::all_of(val.begin(), val.end(), [](float v) { return std::isfinite(v); });
  if (dense) {
    ok_ref = ok_ref && c == len;
  } else {
    ok_ref = ok_ref && c <= len;
    for (std::size_t j = 0; j < c && ok_ref; ++j) ok_ref = idx[j] < len && (j == 0 || idx[j] > idx[j - 1]);
  }
  bool applied = true;
  try {
    if (view.sparse) {
      st.push_sparse(h.key, view.indices, view.values, h.scale);
    } else {
      st.push(h.key, view.values, h.scale);
    }
  } catch (const ProtocolError&) {
    applied = false;
  }
  FUZZ_CHECK(applied == ok_ref, applied ? "a push the PS must refuse was applied" : "a valid push was refused");
  std::vector<float> g(len, 0.0f);
  if (applied) {
    if (dense) {
      std::copy(val.begin(), val.end(), g.begin());
    } else {
      for (std::size_t j = 0; j < c; ++j) g[idx[j]] = val[j];
    }
  }
  std::vector<float> x(len);
  st.pull(h.key, x, -1);
  for (std::size_t i = 0; i < len; ++i) {
    const float want = applied ? x0[i] - h.scale * g[i] : x0[i];
    FUZZ_CHECK(same_float(x[i], want), "the PS state after the push is not x0 - lr * g");
  }

  // The downlink: the top-k of |x − x_seen| for worker 0.
  const std::size_t k = 1 + h.seq % len;
  std::vector<std::uint32_t> sent;
  std::vector<float> d;
  st.pull_diff(h.key, 0, k, sent, d);
  FUZZ_CHECK(sent.size() == k && d.size() == k, "pull_diff did not return k pairs");
  std::vector<bool> chosen(len, false);
  float least = INFINITY;
  for (std::size_t j = 0; j < k; ++j) {
    FUZZ_CHECK(sent[j] < len && (j == 0 || sent[j] > sent[j - 1]), "pull_diff: indices not ascending");
    FUZZ_CHECK(same_float(d[j], x[sent[j]] - seen[sent[j]]), "pull_diff: a value is not x - x_seen");
    chosen[sent[j]] = true;
    if (!std::isnan(d[j])) least = std::min(least, std::fabs(d[j]));
  }
  for (std::size_t i = 0; i < len; ++i) {
    const float m = std::fabs(x[i] - seen[i]);
    FUZZ_CHECK(chosen[i] || std::isnan(m) || m <= least, "pull_diff: an unselected coordinate is larger");
  }
}

void fuzz_pull_reply(const wire::FrameHeader& h, std::span<const float> words,
                     const std::vector<std::uint8_t>& bytes) {
  // A worker refuses other codecs and counts above the partition's length before it
  // reads the payload (ps/client.cpp, PullReplies::check).
  const std::size_t len = 1 + h.key % 4096;
  if (h.codec != wire::Codec::kSparseF32 || h.count > len) return;
  const std::size_t c = h.count;
  std::vector<float> r0(len);
  for (std::size_t i = 0; i < len; ++i) r0[i] = static_cast<float>(i) * 0.5f;
  std::vector<float> r = r0;
  bool ok_ref = true;
  for (std::size_t j = 0; j < c && ok_ref; ++j) {
    const auto i = load<std::uint32_t>(bytes, 4 * j);
    ok_ref = i < len && (j == 0 || i > load<std::uint32_t>(bytes, 4 * (j - 1)));
  }
  bool ok = true;
  try {
    ps::apply_sparse_reply(words, h.count, r);
  } catch (const ProtocolError&) {
    ok = false;
  }
  FUZZ_CHECK(ok == ok_ref, ok ? "a sparse pull reply with bad indices was added" : "a valid sparse pull reply was refused");
  std::vector<float> want = r0;
  if (ok) {
    for (std::size_t j = 0; j < c; ++j) want[load<std::uint32_t>(bytes, 4 * j)] += load<float>(bytes, 4 * (c + j));
  }
  for (std::size_t i = 0; i < len; ++i) FUZZ_CHECK(same_float(r[i], want[i]), "the replica after a pull reply differs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < wire::kHeaderSize) return 0;
  std::array<std::byte, wire::kHeaderSize> raw;
  std::memcpy(raw.data(), data, raw.size());
  wire::FrameHeader h;
  try {
    h = wire::decode_header(raw, kLimits);
  } catch (const ProtocolError&) {
    return 0;
  }
  FUZZ_CHECK(h.count <= kLimits.max_count && h.payload_bytes <= kLimits.max_payload_bytes,
             "decode_header let a frame past its limits");
  std::uint32_t want = 0;
  FUZZ_CHECK(wire::expected_payload_bytes(h.codec, h.count, want) && want == h.payload_bytes,
             "decode_header let payload_bytes disagree with codec and count");
  std::array<std::byte, wire::kHeaderSize> again;
  wire::encode_header(h, again);
  FUZZ_CHECK(std::memcmp(raw.data(), again.data(), raw.size()) == 0, "encode_header(decode_header(b)) != b");

  // The payload as the receiver holds it: payload_bytes bytes in 4-byte words.
  std::vector<std::uint8_t> bytes(h.payload_bytes + 8, 0);
  std::memcpy(bytes.data(), data + wire::kHeaderSize, std::min<std::size_t>(size - wire::kHeaderSize, h.payload_bytes));
  std::vector<float> buf((h.payload_bytes + 3) / 4);
  if (!buf.empty()) std::memcpy(buf.data(), bytes.data(), h.payload_bytes);
  const std::span<const float> words(buf);
  switch (h.type) {
    case wire::MessageType::kHello: fuzz_hello(h, words, bytes); break;
    case wire::MessageType::kPush: fuzz_push(h, words, bytes); break;
    case wire::MessageType::kPullReply: fuzz_pull_reply(h, words, bytes); break;
    default: break;
  }
  return 0;
}
