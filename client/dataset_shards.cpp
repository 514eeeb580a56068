#include "dataset_shards.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "common/errors.h"
#include "common/file_transfer.h"
#include "data/fetch.h"
#include "data/image.h"
#include "data/shards.h"

namespace dltrain::client {
namespace fs = std::filesystem;

bool is_sharded_location(const std::string& where) {
  if (where.find("://") != std::string::npos) return true;
  std::error_code ec;
  return fs::exists(fs::path(where) / data::kManifestName, ec);
}

nlohmann::json inspect_shards(const std::string& where_in, bool verify) {
  std::string where = where_in;
  if (where.find("://") == std::string::npos) where = fs::absolute(where).lexically_normal().string();
  data::check_data_url(where);
  data::FetchOptions fo;
  fo.attempts = 3;
  fo.log = [](const std::string& line) { std::fprintf(stderr, "dltrain: %s\n", line.c_str()); };
  const auto url = data::join_url(where, data::kManifestName);
  const auto m = data::parse_manifest(data::fetch_text(url, data::kMaxManifestBytes, fo), url);
  nlohmann::json splits;
  for (const auto& [name, s] : {std::pair<std::string, const data::ShardSplit*>{"train", &m.train}, {"test", &m.test}}) {
    splits[name] = {{"samples", s->samples}, {"shards", s->shards.size()}, {"bytes", s->bytes}};
  }
  nlohmann::json report{{"data", where},
                        {"classes", m.classes},
                        {"splits", splits},
                        {"stats", {{"channels", m.channels}, {"image_size", m.image_size}, {"mean", m.mean}, {"std", m.std}}},
                        {"source", m.source},
                        {"skipped", m.skipped}};
  if (!verify) return report;
  nlohmann::json unreadable = nlohmann::json::array(), bad = nlohmann::json::array();
  std::int64_t shards = 0, samples = 0;
  const auto tmp = (fs::temp_directory_path() / ("dltrain-verify-" + std::to_string(::getpid()) + ".tar")).string();
  for (const auto* split : {&m.train, &m.test}) {
    for (const auto& info : split->shards) {
      const auto shard_url = data::join_url(where, info.name);
      try {
        const auto n = data::fetch_to_file(shard_url, tmp, info.bytes, fo);
        if (n != info.bytes) throw Error(std::to_string(n) + " bytes, the manifest says " + std::to_string(info.bytes));
        const auto sha = sha256_file_hex(tmp);
        if (sha != info.sha256) throw Error("SHA-256 " + sha + ", the manifest says " + info.sha256);
        const auto bytes = data::read_file_bytes(tmp, data::kMaxShardBytes);
        const auto got = data::read_shard_samples(bytes, static_cast<int>(m.classes.size()), shard_url);
        if (static_cast<std::int64_t>(got.size()) != info.samples) {
          throw Error(std::to_string(got.size()) + " samples, the manifest says " + std::to_string(info.samples));
        }
        for (const auto& s : got) {
          try {
            data::decode_image(s.image, 0, shard_url + " sample " + s.key);
          } catch (const data::CorruptImage& e) {
            unreadable.push_back({{"sample", shard_url + " " + s.key}, {"error", e.what()}});
          }
        }
        ++shards;
        samples += info.samples;
      } catch (const std::exception& e) {
        bad.push_back({{"shard", shard_url}, {"error", e.what()}});
      }
    }
  }
  std::error_code ec;
  fs::remove(tmp, ec);
  report["verified"] = {{"shards", shards}, {"samples", samples}, {"unreadable", unreadable}, {"bad_shards", bad}};
  return report;
}

namespace {
std::string mib(std::int64_t b) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  return s;
}
void print_splits(std::ostream& out, const nlohmann::json& splits) {
  for (const auto& name : {"train", "test"}) {
    const auto& s = splits.at(name);
    out << "  " << name << ": " << s.at("samples").get<std::int64_t>() << " samples in " << s.at("shards").get<std::int64_t>()
        << " shards, " << mib(s.at("bytes").get<std::int64_t>()) << "\n";
  }
}
}  // namespace

void print_shards_report(std::ostream& out, const nlohmann::json& r) {
  out << "sharded data set " << r.at("data").get<std::string>() << " (packed from " << r.value("source", std::string("?"))
      << ")\n";
  print_splits(out, r.at("splits"));
  out << "  classes (" << r.at("classes").size() << "):";
  for (const auto& c : r.at("classes")) out << " " << c.get<std::string>();
  out << "\n  images: " << r.at("stats").at("channels").get<int>() << " channel(s), mostly "
      << r.at("stats").at("image_size").get<int>() << " px; mean " << r.at("stats").at("mean").dump() << ", std "
      << r.at("stats").at("std").dump() << "\n";
  if (r.value("skipped", 0) > 0) out << "  " << r.at("skipped").get<std::int64_t>() << " source images were left out when packing\n";
  if (r.contains("verified")) {
    const auto& v = r.at("verified");
    out << "verified: " << v.at("shards").get<std::int64_t>() << " shards, " << v.at("samples").get<std::int64_t>()
        << " samples\n";
    for (const auto& b : v.at("bad_shards")) out << "  BAD " << b.at("shard").get<std::string>() << ": " << b.at("error").get<std::string>() << "\n";
    for (const auto& u : v.at("unreadable")) out << "  unreadable " << u.at("sample").get<std::string>() << ": " << u.at("error").get<std::string>() << "\n";
  }
}

void print_pack_report(std::ostream& out, const nlohmann::json& r) {
  out << "packed " << r.at("dataset").get<std::string>() << " into " << r.at("dest").get<std::string>() << "\n";
  print_splits(out, r.at("splits"));
  out << "  classes (" << r.at("classes").size() << "):";
  for (const auto& c : r.at("classes")) out << " " << c.get<std::string>();
  out << "\n";
  const auto& skipped = r.at("skipped");
  if (!skipped.empty()) {
    out << skipped.size() << " unreadable images left out:\n";
    for (const auto& s : skipped) out << "  " << s.at("path").get<std::string>() << ": " << s.at("error").get<std::string>() << "\n";
  }
  out << "train with:  data = \"" << r.at("dest").get<std::string>() << "\"  (or the URL you serve it from; docs/data.md)\n";
}

}  // namespace dltrain::client
