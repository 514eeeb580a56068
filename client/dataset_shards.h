// `dltrain dataset pack` and `dltrain dataset inspect` of a sharded data set (docs/data.md):
// what the client shows of data/pack.h's report and of a manifest read from its location.
#pragma once

#include <ostream>
#include <string>

#include <nlohmann/json.hpp>

namespace dltrain::client {

/// True when `where` names a sharded data set: a URL (http, https, s3, file) or a
/// directory holding manifest.json.
bool is_sharded_location(const std::string& where);

/// Reads and checks the manifest at `where` (S3 settings from the environment:
/// AWS_ENDPOINT_URL, AWS_REGION, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); with `verify`
/// also fetches every shard, checks its size and SHA-256 against the manifest, reads its
/// samples and decodes each image. The report: {"data", "classes", "splits": {split:
/// {"samples", "shards", "bytes"}}, "stats", "source", "skipped", "verified": {"shards",
/// "samples", "unreadable": [{"sample", "error"}], "bad_shards": [{"shard", "error"}]}}.
/// Throws ConfigError("data", …) for a bad manifest, data::FetchError when it cannot be read.
nlohmann::json inspect_shards(const std::string& where, bool verify);

/// Prints inspect_shards' report for a person.
void print_shards_report(std::ostream& out, const nlohmann::json& report);
/// Prints data::pack_dataset's report for a person.
void print_pack_report(std::ostream& out, const nlohmann::json& report);

}  // namespace dltrain::client
