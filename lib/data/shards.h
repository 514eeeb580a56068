// Sharded data sets (docs/data.md): tar shards in WebDataset's layout (Aizman et al.,
// "High performance I/O for large scale deep learning", 2019; webdataset.github.io): each
// sample is two consecutive members KEY.png|jpg (the encoded image) and KEY.cls (its class
// index in decimal), so Python's `webdataset` and `tarfile` read them too; and a manifest
// (manifest.json beside the shards) with the classes, each shard's sample count, bytes and
// SHA-256, and the images' statistics. Plus the deal of shards to workers per epoch.
//
// The tar format is POSIX ustar (IEEE Std 1003.1-2001, "pax" Archive/Interchange File
// Format, ustar Interchange Format): 512-byte headers with octal fields, members padded to
// 512 bytes, two zero blocks at the end. It is written and read here rather than through
// libarchive because the worker reads shards and must build where only header-only and
// small dependencies are carried (DLTRAIN_WORKER_ONLY; docs/data.md says why). The reader
// accepts what Python's tarfile and GNU tar write for such files (ustar and GNU magic,
// regular files; directories and pax/GNU extended headers are skipped, not interpreted).
// Plain C++, no LibTorch. Thread-safety: free functions are thread-safe; a TarWriter is
// used by one thread.
#pragma once

#include <cstdint>
#include <fstream>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace dltrain::data {

/// The manifest's file name inside a sharded data set's directory or URL prefix.
inline constexpr const char* kManifestName = "manifest.json";
/// The manifest's "format" value.
inline constexpr const char* kManifestFormat = "dltrain-shards/1";
/// Longest manifest accepted, bytes.
inline constexpr std::int64_t kMaxManifestBytes = 16 << 20;
/// Most shards a split may list.
inline constexpr std::size_t kMaxShards = 100000;
/// Largest shard accepted, bytes (64 GiB).
inline constexpr std::int64_t kMaxShardBytes = std::int64_t{64} << 30;

/// One shard of a split, as the manifest lists it.
struct ShardInfo {
  std::string name;          ///< file name relative to the manifest ("train-000003.tar"), a plain path component
  std::int64_t samples = 0;  ///< samples in the shard, >= 1
  std::int64_t bytes = 0;    ///< the file's size, bytes, in [1024, kMaxShardBytes]
  std::string sha256;        ///< 64 lowercase hex digits
};

/// A split ("train" or "test") of a sharded data set.
struct ShardSplit {
  std::vector<ShardInfo> shards;
  std::int64_t samples = 0;  ///< sum of the shards' samples
  std::int64_t bytes = 0;    ///< sum of the shards' bytes
};

/// A sharded data set's manifest (manifest.json).
struct Manifest {
  std::vector<std::string> classes;  ///< class names by label, >= 2
  ShardSplit train, test;            ///< both non-empty
  int channels = 3;                  ///< 1 or 3: the images' channels (the most common)
  int image_size = 0;                ///< side of the most common image size (its larger side), pixels
  std::vector<float> mean, std;      ///< per channel, of pixel/255 over the training images (std > 0)
  std::string source;                ///< what it was packed from (informational)
  std::int64_t skipped = 0;          ///< source images left out as unreadable when packing
};

/// Parses and checks a manifest's text. `where` names it in messages (its URL or path).
/// Throws ConfigError("data", "<where>: <field>: <problem>") when it is not JSON, has
/// another format, or a field is missing, of the wrong type, out of range or inconsistent
/// (a shard name that is not a plain file name or repeats, a split's sample total that is
/// not the sum of its shards', a SHA-256 that is not 64 hex digits, mean/std of the wrong
/// length).
Manifest parse_manifest(const std::string& text, const std::string& where);
/// The manifest as JSON (what parse_manifest reads back).
nlohmann::json manifest_json(const Manifest& m);

/// One member of a tar archive: its name and contents.
struct TarMember {
  std::string name;
  std::vector<std::uint8_t> bytes;
};

/// Writes a ustar archive of regular files to `path` (created or truncated) and hashes it
/// as it goes. Members are written with mode 0644, uid/gid 0, mtime 0, so the same
/// members give the same bytes. Throws IoError naming the path when it cannot be written;
/// InvalidArgument for a member name over 100 bytes or with a '/' in it.
class TarWriter {
 public:
  explicit TarWriter(const std::string& path);
  ~TarWriter();
  TarWriter(const TarWriter&) = delete;
  TarWriter& operator=(const TarWriter&) = delete;
  /// Appends a regular file `name` holding `bytes`.
  void add(const std::string& name, std::span<const std::uint8_t> bytes);
  /// Writes the end-of-archive blocks and closes the file; returns its size in bytes and
  /// sets `sha256` to its SHA-256 (hex). Idempotent; the destructor closes an unfinished
  /// archive without the end blocks.
  std::int64_t finish(std::string& sha256);
  /// Bytes written so far (headers and padding included).
  std::int64_t bytes() const { return bytes_; }

 private:
  void write(const void* p, std::size_t n);
  std::string path_;
  std::ofstream out_;
  struct Hash;
  std::unique_ptr<Hash> hash_;
  std::int64_t bytes_ = 0;
  bool finished_ = false;
};

/// The regular-file members of the tar archive in `bytes`, in order. `name` names it in
/// messages. Throws ProtocolError("<name>: …") for a truncated archive, a header whose
/// checksum or size field is invalid, or a member that runs past the end.
std::vector<TarMember> read_tar(std::span<const std::uint8_t> bytes, const std::string& name);

/// One sample of a shard: its key, encoded image (PNG or JPEG bytes, not decoded here)
/// and label.
struct ShardSample {
  std::string key;
  std::vector<std::uint8_t> image;
  int label = 0;
};

/// The samples of a shard's tar bytes: members grouped by key (the name up to its first
/// '.'), each with one image (.png, .jpg or .jpeg) and one .cls holding a decimal label in
/// [0, classes). Other members of a sample (.json, .txt, ...) are ignored. Throws
/// ProtocolError("<name>: sample KEY: …") for a sample without an image or a label, a
/// label that is not a number in range, or a tar error (read_tar).
std::vector<ShardSample> read_shard_samples(std::span<const std::uint8_t> bytes, int classes, const std::string& name);

/// A run of samples of one shard: samples [begin, end) in the shard's own order.
struct ShardSlice {
  std::int64_t shard = 0;  ///< index into the split's shards
  std::int64_t begin = 0, end = 0;
};

/// What worker `rank` of `workers` reads in `epoch`. The deal: the split's shards (their
/// sample counts in `samples`) in the order of epoch_permutation(shards, seed, 0), their
/// samples laid end to end, cut into `workers` consecutive runs whose sizes are those of
/// data::shard_size (⌈(n − rank)/workers⌉: they differ by at most one); this rank's run,
/// as slices of whole or partial shards. The order of the slices is then shuffled per
/// epoch (epoch_permutation of them, from seed, rank and epoch). So over the ranks of an
/// epoch every sample is read exactly once, and a rank reads the same shards every epoch:
/// a machine fetches its workers' part of the data set once per job, not all of it over
/// the epochs, and a second job with the same seed and worker count finds it cached
/// (docs/data.md, "How workers read shards", says why this is the deal). A pure function
/// of its arguments, so every worker computes it without coordination; a job resized to
/// another worker count is dealt again. Throws InvalidArgument unless 0 <= rank < workers
/// and every count is >= 1.
std::vector<ShardSlice> deal_shards(const std::vector<std::int64_t>& samples, int rank, int workers,
                                    std::uint64_t seed, std::int64_t epoch);

/// Sizes, in slices, of the windows a worker reads an epoch's slices in (the samples of
/// one window are shuffled together): 1 first, so that training starts once the first
/// shard is there, then `window` at a time. Sums to `shards`. Pure.
std::vector<std::int64_t> shard_windows(std::int64_t shards, std::int64_t window);

// ---------------------------------------------------------------- data URLs

/// `prefix` joined with the file `name` ("s3://b/p" + "x.tar" → "s3://b/p/x.tar"; a
/// local directory gives a path).
std::string join_url(const std::string& prefix, const std::string& name);

/// True when `url` names a local or shared path (no scheme, or file://).
bool is_local_url(const std::string& url);

/// Checks the form of a data URL: an absolute path, file://, http://, https:// or
/// s3://bucket[/prefix]. Throws ConfigError("data", …) naming what is wrong.
void check_data_url(const std::string& url);

}  // namespace dltrain::data
