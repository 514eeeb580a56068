#include "data/shards.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstring>
#include <set>

#include <openssl/evp.h>

#include "common/errors.h"
#include "common/file_transfer.h"
#include "data/sharding.h"

namespace dltrain::data {
namespace {

constexpr std::size_t kBlock = 512;

[[noreturn]] void bad(const std::string& where, const std::string& field, const std::string& what) {
  throw ConfigError("data", where + ": " + field + ": " + what);
}

bool plain_name(const std::string& s) {
  if (s.empty() || s.size() > 100 || s == "." || s == "..") return false;
  // Letters, digits, '.', '_' and '-': safe in a path, a URL and an S3 key as they are.
  return std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isalnum(c) || c == '.' || c == '_' || c == '-'; });
}

std::int64_t get_int(const nlohmann::json& j, const char* key, const std::string& where, const std::string& field,
                     std::int64_t lo, std::int64_t hi) {
  const auto it = j.find(key);
  if (it == j.end()) bad(where, field, "missing");
  if (!it->is_number_integer()) bad(where, field, "not an integer");
  const auto v = it->get<std::int64_t>();
  if (v < lo || v > hi) bad(where, field, std::to_string(v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return v;
}

std::string get_string(const nlohmann::json& j, const char* key, const std::string& where, const std::string& field) {
  const auto it = j.find(key);
  if (it == j.end()) bad(where, field, "missing");
  if (!it->is_string()) bad(where, field, "not a string");
  return it->get<std::string>();
}

ShardSplit parse_split(const nlohmann::json& m, const char* split, const std::string& where) {
  const std::string f = std::string("splits.") + split;
  const auto s = m.find("splits");
  if (s == m.end() || !s->is_object()) bad(where, "splits", "missing or not an object");
  const auto it = s->find(split);
  if (it == s->end() || !it->is_object()) bad(where, f, "missing or not an object");
  const auto sh = it->find("shards");
  if (sh == it->end() || !sh->is_array()) bad(where, f + ".shards", "missing or not an array");
  if (sh->empty()) bad(where, f + ".shards", "empty");
  if (sh->size() > kMaxShards) bad(where, f + ".shards", std::to_string(sh->size()) + " shards, more than " + std::to_string(kMaxShards));
  ShardSplit out;
  std::set<std::string> names;
  for (std::size_t i = 0; i < sh->size(); ++i) {
    const auto& e = (*sh)[i];
    const std::string fi = f + ".shards[" + std::to_string(i) + "]";
    if (!e.is_object()) bad(where, fi, "not an object");
    ShardInfo info;
    info.name = get_string(e, "name", where, fi + ".name");
    if (!plain_name(info.name)) bad(where, fi + ".name", "\"" + info.name + "\" is not a plain file name");
    if (!names.insert(info.name).second) bad(where, fi + ".name", "\"" + info.name + "\" is listed twice");
    info.samples = get_int(e, "samples", where, fi + ".samples", 1, std::int64_t{1} << 40);
    info.bytes = get_int(e, "bytes", where, fi + ".bytes", 1024, kMaxShardBytes);
    info.sha256 = get_string(e, "sha256", where, fi + ".sha256");
    if (!is_sha256_hex(info.sha256)) bad(where, fi + ".sha256", "not 64 lowercase hex digits");
    out.samples += info.samples;
    out.bytes += info.bytes;
    out.shards.push_back(std::move(info));
  }
  if (it->contains("samples")) {
    const auto total = get_int(*it, "samples", where, f + ".samples", 0, std::int64_t{1} << 50);
    if (total != out.samples) {
      bad(where, f + ".samples", std::to_string(total) + " is not the sum of its shards' samples (" + std::to_string(out.samples) + ")");
    }
  }
  return out;
}

std::vector<float> get_floats(const nlohmann::json& j, const char* key, const std::string& where, std::size_t n, bool positive) {
  const auto it = j.find(key);
  const std::string field = std::string("stats.") + key;
  if (it == j.end() || !it->is_array()) bad(where, field, "missing or not an array");
  if (it->size() != n) bad(where, field, std::to_string(it->size()) + " values for " + std::to_string(n) + " channels");
  std::vector<float> out;
  for (const auto& v : *it) {
    if (!v.is_number()) bad(where, field, "not a number");
    const double d = v.get<double>();
    if (!(d >= 0 && d <= 1) || (positive && d <= 0)) bad(where, field, "value " + v.dump() + " outside " + (positive ? "(0, 1]" : "[0, 1]"));
    out.push_back(static_cast<float>(d));
  }
  return out;
}

nlohmann::json split_json(const ShardSplit& s) {
  auto shards = nlohmann::json::array();
  for (const auto& i : s.shards) shards.push_back({{"name", i.name}, {"samples", i.samples}, {"bytes", i.bytes}, {"sha256", i.sha256}});
  return {{"samples", s.samples}, {"bytes", s.bytes}, {"shards", shards}};
}

// Octal field of a ustar header (NUL-terminated, zero-padded).
void put_octal(char* field, std::size_t width, std::uint64_t v) {
  std::string s(width - 1, '0');
  for (std::size_t i = width - 1; i-- > 0 && v > 0; v >>= 3) s[i] = static_cast<char>('0' + (v & 7));
  if (v > 0) throw InvalidArgument("tar: value too large for a " + std::to_string(width) + "-byte field");
  std::memcpy(field, s.data(), width - 1);
  field[width - 1] = '\0';
}

// An octal (or GNU base-256) number field of a header; -1 when malformed.
std::int64_t get_octal(const std::uint8_t* field, std::size_t width) {
  if (field[0] & 0x80) {  // GNU base-256: big-endian, top bit set
    std::uint64_t v = 0;
    for (std::size_t i = 1; i < width; ++i) {
      if (v >> 55) return -1;
      v = (v << 8) | field[i];
    }
    return (field[0] & 0x40) ? -1 : static_cast<std::int64_t>(v);
  }
  std::size_t i = 0;
  while (i < width && field[i] == ' ') ++i;
  std::uint64_t v = 0;
  for (; i < width && field[i] >= '0' && field[i] <= '7'; ++i) {
    if (v >> 60) return -1;
    v = v * 8 + (field[i] - '0');
  }
  for (; i < width; ++i) {
    if (field[i] != ' ' && field[i] != '\0') return -1;
  }
  return static_cast<std::int64_t>(v);
}

std::string field_string(const std::uint8_t* field, std::size_t width) {
  std::size_t n = 0;
  while (n < width && field[n] != 0) ++n;
  return {reinterpret_cast<const char*>(field), n};
}

bool image_ext(const std::string& ext) { return ext == "png" || ext == "jpg" || ext == "jpeg"; }

}  // namespace

Manifest parse_manifest(const std::string& text, const std::string& where) {
  if (static_cast<std::int64_t>(text.size()) > kMaxManifestBytes) bad(where, "manifest", "larger than 16 MiB");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw ConfigError("data", where + ": not JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object()) throw ConfigError("data", where + ": not a JSON object");
  const auto format = get_string(j, "format", where, "format");
  if (format != kManifestFormat) bad(where, "format", "\"" + format + "\", expected \"" + kManifestFormat + "\"");
  Manifest m;
  const auto cls = j.find("classes");
  if (cls == j.end() || !cls->is_array()) bad(where, "classes", "missing or not an array");
  if (cls->size() < 2 || cls->size() > 100000) bad(where, "classes", std::to_string(cls->size()) + " classes, need 2 to 100000");
  for (const auto& c : *cls) {
    if (!c.is_string()) bad(where, "classes", "a name that is not a string");
    m.classes.push_back(c.get<std::string>());
  }
  m.train = parse_split(j, "train", where);
  m.test = parse_split(j, "test", where);
  const auto st = j.find("stats");
  if (st == j.end() || !st->is_object()) bad(where, "stats", "missing or not an object");
  m.channels = static_cast<int>(get_int(*st, "channels", where, "stats.channels", 1, 3));
  if (m.channels == 2) bad(where, "stats.channels", "2 is neither 1 nor 3");
  m.image_size = static_cast<int>(get_int(*st, "image_size", where, "stats.image_size", 1, 16384));
  m.mean = get_floats(*st, "mean", where, static_cast<std::size_t>(m.channels), false);
  m.std = get_floats(*st, "std", where, static_cast<std::size_t>(m.channels), true);
  if (j.contains("source") && j["source"].is_string()) m.source = j["source"].get<std::string>();
  if (j.contains("skipped")) m.skipped = get_int(j, "skipped", where, "skipped", 0, std::int64_t{1} << 50);
  return m;
}

nlohmann::json manifest_json(const Manifest& m) {
  return {{"format", kManifestFormat},
          {"classes", m.classes},
          {"splits", {{"train", split_json(m.train)}, {"test", split_json(m.test)}}},
          {"stats", {{"channels", m.channels}, {"image_size", m.image_size}, {"mean", m.mean}, {"std", m.std}}},
          {"source", m.source},
          {"skipped", m.skipped}};
}

// ---------------------------------------------------------------- tar

struct TarWriter::Hash {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  ~Hash() { EVP_MD_CTX_free(ctx); }
};

TarWriter::TarWriter(const std::string& path) : path_(path), out_(path, std::ios::binary | std::ios::trunc), hash_(std::make_unique<Hash>()) {
  if (!out_) throw IoError("cannot create \"" + path + "\"");
  if (hash_->ctx == nullptr || EVP_DigestInit_ex(hash_->ctx, EVP_sha256(), nullptr) != 1) throw IoError("SHA-256: OpenSSL failed");
}

TarWriter::~TarWriter() = default;

void TarWriter::write(const void* p, std::size_t n) {
  out_.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
  if (!out_) throw IoError("cannot write \"" + path_ + "\" (disk full?)");
  EVP_DigestUpdate(hash_->ctx, p, n);
  bytes_ += static_cast<std::int64_t>(n);
}

void TarWriter::add(const std::string& name, std::span<const std::uint8_t> bytes) {
  if (finished_) throw InvalidArgument("TarWriter: add after finish");
  if (name.empty() || name.size() > 99 || name.find('/') != std::string::npos) {
    throw InvalidArgument("tar member name \"" + name + "\" must be 1 to 99 bytes without '/'");
  }
  char h[kBlock] = {};
  std::memcpy(h, name.data(), name.size());
  put_octal(h + 100, 8, 0644);
  put_octal(h + 108, 8, 0);
  put_octal(h + 116, 8, 0);
  put_octal(h + 124, 12, bytes.size());
  put_octal(h + 136, 12, 0);
  std::memset(h + 148, ' ', 8);
  h[156] = '0';
  std::memcpy(h + 257, "ustar", 6);  // magic "ustar\0"
  std::memcpy(h + 263, "00", 2);     // version
  unsigned sum = 0;
  for (char c : h) sum += static_cast<unsigned char>(c);
  put_octal(h + 148, 7, sum);  // six digits, NUL, then the space already there
  write(h, kBlock);
  if (!bytes.empty()) write(bytes.data(), bytes.size());
  const std::size_t pad = (kBlock - bytes.size() % kBlock) % kBlock;
  static const char zeros[kBlock] = {};
  if (pad) write(zeros, pad);
}

std::int64_t TarWriter::finish(std::string& sha256) {
  if (!finished_) {
    static const char zeros[2 * kBlock] = {};
    write(zeros, sizeof zeros);
    out_.close();
    if (!out_) throw IoError("cannot close \"" + path_ + "\"");
    finished_ = true;
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned len = 0;
  EVP_MD_CTX* copy = EVP_MD_CTX_new();
  EVP_MD_CTX_copy_ex(copy, hash_->ctx);
  EVP_DigestFinal_ex(copy, md, &len);
  EVP_MD_CTX_free(copy);
  static const char* hex = "0123456789abcdef";
  sha256.clear();
  for (unsigned i = 0; i < len; ++i) {
    sha256.push_back(hex[md[i] >> 4]);
    sha256.push_back(hex[md[i] & 15]);
  }
  return bytes_;
}

std::vector<TarMember> read_tar(std::span<const std::uint8_t> bytes, const std::string& name) {
  std::vector<TarMember> out;
  std::size_t pos = 0;
  for (;;) {
    if (pos + kBlock > bytes.size()) {
      if (pos == bytes.size()) return out;  // no end blocks: accepted, as tar does
      throw ProtocolError(name + ": truncated tar header at byte " + std::to_string(pos));
    }
    const std::uint8_t* h = bytes.data() + pos;
    if (std::all_of(h, h + kBlock, [](std::uint8_t c) { return c == 0; })) return out;  // end of archive
    unsigned sum = 0;
    for (std::size_t i = 0; i < kBlock; ++i) sum += (i >= 148 && i < 156) ? ' ' : h[i];
    const auto stored = get_octal(h + 148, 8);
    if (stored < 0 || static_cast<unsigned>(stored) != sum) {
      throw ProtocolError(name + ": tar header at byte " + std::to_string(pos) + " has a bad checksum (not a tar file, or corrupt)");
    }
    const auto size = get_octal(h + 124, 12);
    if (size < 0) throw ProtocolError(name + ": tar header at byte " + std::to_string(pos) + " has an invalid size field");
    const std::size_t data = pos + kBlock;
    if (static_cast<std::uint64_t>(size) > bytes.size() - data) {
      throw ProtocolError(name + ": tar member at byte " + std::to_string(pos) + " runs past the end (" + std::to_string(size) +
                          " bytes, " + std::to_string(bytes.size() - data) + " left)");
    }
    const char type = static_cast<char>(h[156]);
    if (type == '0' || type == '\0' || type == '7') {
      std::string member = field_string(h, 100);
      if (std::memcmp(h + 257, "ustar\0" "00", 8) == 0) {  // POSIX ustar (GNU tar keeps times there)
        const std::string prefix = field_string(h + 345, 155);
        if (!prefix.empty()) member = prefix + "/" + member;
      }
      out.push_back({std::move(member), std::vector<std::uint8_t>(bytes.begin() + static_cast<std::ptrdiff_t>(data),
                                                                  bytes.begin() + static_cast<std::ptrdiff_t>(data + size))});
    }
    pos = data + (static_cast<std::size_t>(size) + kBlock - 1) / kBlock * kBlock;
    if (pos > bytes.size()) pos = bytes.size();
  }
}

std::vector<ShardSample> read_shard_samples(std::span<const std::uint8_t> bytes, int classes, const std::string& name) {
  auto members = read_tar(bytes, name);
  std::vector<ShardSample> out;
  std::map<std::string, std::size_t> index;  // key → position in out
  std::vector<bool> has_image, has_label;
  for (auto& m : members) {
    const auto slash = m.name.rfind('/');
    const std::string base = slash == std::string::npos ? m.name : m.name.substr(slash + 1);
    const auto dot = base.find('.');
    if (dot == std::string::npos || dot == 0) continue;  // not a sample's member
    const std::string key = m.name.substr(0, m.name.size() - (base.size() - dot));
    std::string ext = base.substr(dot + 1);
    std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    auto [it, fresh] = index.emplace(key, out.size());
    if (fresh) {
      out.push_back({key, {}, -1});
      has_image.push_back(false);
      has_label.push_back(false);
    }
    const std::size_t i = it->second;
    if (image_ext(ext)) {
      out[i].image = std::move(m.bytes);
      has_image[i] = true;
    } else if (ext == "cls") {
      std::string s(m.bytes.begin(), m.bytes.end());
      while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
      int v = -1;
      const auto r = std::from_chars(s.data(), s.data() + s.size(), v);
      if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() || v < 0 || v >= classes) {
        throw ProtocolError(name + ": sample " + key + ": label \"" + s.substr(0, 20) + "\" is not a class index in [0, " +
                            std::to_string(classes) + ")");
      }
      out[i].label = v;
      has_label[i] = true;
    }
  }
  std::vector<ShardSample> kept;
  kept.reserve(out.size());
  for (std::size_t i = 0; i < out.size(); ++i) {
    if (!has_image[i] && !has_label[i]) continue;  // only other members (e.g. a __key__ file)
    if (!has_image[i]) throw ProtocolError(name + ": sample " + out[i].key + " has no image (.png, .jpg or .jpeg)");
    if (!has_label[i]) throw ProtocolError(name + ": sample " + out[i].key + " has no label (.cls)");
    kept.push_back(std::move(out[i]));
  }
  return kept;
}

std::vector<ShardSlice> deal_shards(const std::vector<std::int64_t>& samples, int rank, int workers, std::uint64_t seed,
                                    std::int64_t epoch) {
  if (workers < 1 || rank < 0 || rank >= workers) {
    throw InvalidArgument("deal_shards: rank " + std::to_string(rank) + " of " + std::to_string(workers) + " workers");
  }
  std::int64_t n = 0;
  for (const auto c : samples) {
    if (c < 1) throw InvalidArgument("deal_shards: a shard of " + std::to_string(c) + " samples");
    n += c;
  }
  // This rank's run [lo, hi) of the n samples: the ranks before it take shard_size each.
  const std::int64_t w = workers, q = n / w, r = n % w;
  const std::int64_t lo = rank * q + std::min<std::int64_t>(rank, r);
  const std::int64_t hi = lo + shard_size(n, rank, workers);
  std::vector<ShardSlice> out;
  std::int64_t at = 0;  // where the current shard starts in the sequence
  for (const auto s : epoch_permutation(static_cast<std::int64_t>(samples.size()), seed, 0)) {
    const std::int64_t len = samples[static_cast<std::size_t>(s)];
    const std::int64_t b = std::max(lo, at), e = std::min(hi, at + len);
    if (b < e) out.push_back({s, b - at, e - at});
    at += len;
    if (at >= hi) break;
  }
  std::vector<ShardSlice> shuffled;
  shuffled.reserve(out.size());
  const std::uint64_t mine = mix64(seed ^ mix64(static_cast<std::uint64_t>(rank) + 0x5bd1e995ULL));
  for (const auto i : epoch_permutation(static_cast<std::int64_t>(out.size()), mine, epoch)) {
    shuffled.push_back(out[static_cast<std::size_t>(i)]);
  }
  return shuffled;
}

std::vector<std::int64_t> shard_windows(std::int64_t shards, std::int64_t window) {
  std::vector<std::int64_t> out;
  if (shards <= 0) return out;
  out.push_back(1);
  for (std::int64_t left = shards - 1; left > 0;) {
    const auto w = std::min(left, std::max<std::int64_t>(1, window));
    out.push_back(w);
    left -= w;
  }
  return out;
}

std::string join_url(const std::string& prefix, const std::string& name) {
  if (prefix.empty()) return name;
  return prefix.back() == '/' ? prefix + name : prefix + "/" + name;
}

bool is_local_url(const std::string& url) {
  return url.rfind("file://", 0) == 0 || url.find("://") == std::string::npos;
}

void check_data_url(const std::string& url) {
  if (url.empty()) throw ConfigError("data", "empty");
  if (url.size() > 4096) throw ConfigError("data", "longer than 4096 bytes");
  for (unsigned char c : url) {
    if (c < 32 || c == 127) throw ConfigError("data", "\"" + url + "\" holds a control character");
  }
  if (url.rfind("s3://", 0) == 0) {
    const auto bucket = url.substr(5, url.find('/', 5) == std::string::npos ? std::string::npos : url.find('/', 5) - 5);
    if (bucket.empty()) throw ConfigError("data", "\"" + url + "\" names no bucket (s3://bucket/prefix)");
    return;
  }
  if (url.rfind("http://", 0) == 0 || url.rfind("https://", 0) == 0) {
    if (url.find("://") + 3 >= url.size()) throw ConfigError("data", "\"" + url + "\" names no host");
    return;
  }
  if (url.rfind("file://", 0) == 0) {
    if (url.size() <= 7 || url[7] != '/') throw ConfigError("data", "\"" + url + "\": file:// takes an absolute path (file:///srv/data)");
    return;
  }
  if (url.find("://") != std::string::npos) {
    throw ConfigError("data", "\"" + url + "\": unknown scheme (use a path, file://, http://, https:// or s3://)");
  }
  if (url[0] != '/') throw ConfigError("data", "\"" + url + "\" is not an absolute path");
}

}  // namespace dltrain::data
