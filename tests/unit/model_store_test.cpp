// The trained model's way to the user: checksums, base64, file windows, the writer that
// keeps a file only whole and checked (common/file_transfer.h), and the leader's model
// store (leader/model_store.h): commit through staging, listing, reopening, retention.
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "common/errors.h"
#include "common/file_transfer.h"
#include "leader/model_store.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "wire/control_bodies.h"

namespace dltrain {
namespace {

namespace fs = std::filesystem;
using dltrain::testing::message_of;

std::span<const std::uint8_t> bytes_of(const std::string& s) {
  return {reinterpret_cast<const std::uint8_t*>(s.data()), s.size()};
}

std::string text_of(const std::vector<std::uint8_t>& b) { return std::string(b.begin(), b.end()); }

using TempDir = dltrain::testing::TempDir;

void write(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

std::string read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// FIPS 180-2, Appendix B.1 and B.2.
TEST(FileTransfer, Sha256MatchesThePublishedExamples) {
  EXPECT_EQ(sha256_hex(bytes_of("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(bytes_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  TempDir d;
  // A file larger than one 1 MiB read block: the same digest as the bytes in memory.
  std::string big(3 * (1 << 20) + 17, '\0');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 31 % 251);
  write(d.path / "big", big);
  EXPECT_EQ(sha256_file_hex((d.path / "big").string()), sha256_hex(bytes_of(big)));
  EXPECT_THROW(sha256_file_hex((d.path / "missing").string()), IoError);
}

// RFC 4648 §10's test vectors, both ways.
TEST(FileTransfer, Base64MatchesRfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {{"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},
                                                         {"foo", "Zm9v"}, {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="},
                                                         {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(base64_encode(bytes_of(plain)), encoded) << plain;
    EXPECT_EQ(text_of(base64_decode(encoded)), plain) << encoded;
  }
  EXPECT_EQ(message_of<ProtocolError>([] { base64_decode("Zm9"); }),
            "data is not base64: its length 3 is not a multiple of 4");
  EXPECT_EQ(message_of<ProtocolError>([] { base64_decode("Zm9*"); }), "data is not base64: a character outside the alphabet");
}

TEST(FileTransfer, WindowsOfAFileAreCutAtItsEnd) {
  TempDir d;
  write(d.path / "f", "0123456789");
  auto w = read_file_window((d.path / "f").string(), 4, 4);
  EXPECT_EQ(text_of(w.bytes), "4567");
  EXPECT_EQ(w.size, 10);
  w = read_file_window((d.path / "f").string(), 8, 4);
  EXPECT_EQ(text_of(w.bytes), "89");
  w = read_file_window((d.path / "f").string(), 10, 4);
  EXPECT_TRUE(w.bytes.empty());
  EXPECT_THROW(read_file_window((d.path / "f").string(), -1, 4), InvalidArgument);
  EXPECT_THROW(read_file_window((d.path / "nope").string(), 0, 4), IoError);
}

TEST(FileTransfer, WriterKeepsTheFileOnlyWholeAndChecked) {
  TempDir d;
  const std::string text = "the trained model's bytes";
  const auto sha = sha256_hex(bytes_of(text));
  const auto out = (d.path / "state_dict.pt").string();
  {
    ChunkedFileWriter w(out, static_cast<std::int64_t>(text.size()), sha, 1 << 20);
    w.append(0, bytes_of(text.substr(0, 10)));
    EXPECT_EQ(w.offset(), 10);
    // A window out of order, and bytes beyond the announced size, are refused.
    EXPECT_EQ(message_of<ProtocolError>([&] { w.append(12, bytes_of("x")); }),
              out + ": a window at offset 12, expected 10");
    EXPECT_THROW(w.append(10, bytes_of(text)), ProtocolError);
    w.append(10, bytes_of(text.substr(10)));
    EXPECT_TRUE(w.complete());
    EXPECT_FALSE(fs::exists(out));  // only the part file until finish()
    w.finish();
  }
  EXPECT_EQ(read(out), text);
  EXPECT_FALSE(fs::exists(out + ".part"));

  // A file whose bytes do not match the sender's checksum is not kept.
  const auto bad = (d.path / "model.pt").string();
  {
    ChunkedFileWriter w(bad, 3, sha, 1 << 20);
    w.append(0, bytes_of("abc"));
    EXPECT_EQ(message_of<ProtocolError>([&] { w.finish(); }),
              bad + ": checksum mismatch: sha256 ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad "
                    "received, " + sha + " sent");
  }
  EXPECT_FALSE(fs::exists(bad));
  EXPECT_FALSE(fs::exists(bad + ".part"));
  // An unfinished writer leaves nothing behind; announced sizes and checksums are checked.
  { ChunkedFileWriter w(bad, 3, sha, 1 << 20); }
  EXPECT_FALSE(fs::exists(bad + ".part"));
  EXPECT_THROW(ChunkedFileWriter(bad, 2 << 20, sha, 1 << 20), ProtocolError);
  EXPECT_THROW(ChunkedFileWriter(bad, 3, "not-a-checksum", 1 << 20), ProtocolError);
}

TEST(ModelFileRequest, NamesOnlyTheModelsFiles) {
  wire::Envelope env;
  env.type = "model_read";
  env.body = {{"job", "job-1"}, {"file", "state_dict.pt"}, {"offset", 5}};
  const auto b = wire::parse_body<wire::ModelFileRequestBody>(env);
  EXPECT_EQ(b.checkpoint, "last");
  EXPECT_EQ(b.offset, 5);
  env.body["file"] = "../../etc/passwd";
  EXPECT_EQ(message_of<wire::BodyError>([&] { wire::parse_body<wire::ModelFileRequestBody>(env); }),
            "model_read field \"file\": expected metadata.json, state_dict.pt or model.pt, got \"../../etc/passwd\"");
  env.body["file"] = "model.pt";
  env.body["checkpoint"] = "..";
  EXPECT_THROW(wire::parse_body<wire::ModelFileRequestBody>(env), wire::BodyError);
  env.body["checkpoint"] = "last";
  env.body["max_bytes"] = (1 << 20) + 1;
  EXPECT_THROW(wire::parse_body<wire::ModelFileRequestBody>(env), wire::BodyError);
}

TEST(ResumeRequest, NamesOneJob) {
  wire::Envelope env;
  env.type = "resume";
  env.body = {{"job", "job-4"}};
  const auto b = wire::parse_body<wire::ResumeBody>(env);
  EXPECT_EQ(b.job, "job-4");
  EXPECT_FALSE(b.follow);
  env.body = nlohmann::json::object();
  EXPECT_THROW(wire::parse_body<wire::ResumeBody>(env), wire::BodyError);
  env.body = {{"job", "../job-4"}, {"follow", true}};
  EXPECT_EQ(message_of<wire::BodyError>([&] { wire::parse_body<wire::ResumeBody>(env); }),
            "resume field \"job\": \"../job-4\" is not a valid name (letters, digits, '-', '_' and '.'; not \".\" or \"..\")");
  env.body = {{"job", 4}};
  EXPECT_THROW(wire::parse_body<wire::ResumeBody>(env), wire::BodyError);
}

leader::ModelManifest manifest(const std::string& job, double created, const std::string& staging) {
  leader::ModelManifest m;
  m.job = job;
  m.model = "cnn";
  m.dataset = "fashion-mnist";
  m.test_accuracy = 0.9;
  m.epochs = 3;
  m.created_unix = created;
  m.agent = "a1";
  const auto path = fs::path(staging) / "metadata.json";
  write(path, "{\"job\": \"" + job + "\"}");
  m.files.push_back({"metadata.json", static_cast<std::int64_t>(fs::file_size(path)), sha256_file_hex(path.string())});
  return m;
}

TEST(ModelStore, CommitListsReopensAndKeepsTheLatestJobs) {
  TempDir d;
  const auto root = (d.path / "models").string();
  {
    leader::ModelStore store(root, 2);
    EXPECT_TRUE(store.list().empty());
    for (int i = 1; i <= 3; ++i) {
      const std::string job = "job-" + std::to_string(i);
      store.commit(manifest(job, 100.0 + i, store.staging_dir(job, "last")));
      ASSERT_TRUE(store.find(job, "last"));
      EXPECT_EQ(read(store.file_path(job, "last", "metadata.json")), "{\"job\": \"" + job + "\"}");
    }
    // model_retention = 2: job-1's model went when job-3's came.
    const auto list = store.list();
    ASSERT_EQ(list.size(), 2u);
    EXPECT_EQ(list[0].job, "job-3");
    EXPECT_EQ(list[1].job, "job-2");
    EXPECT_FALSE(store.find("job-1", "last"));
    EXPECT_FALSE(fs::exists(fs::path(root) / "job-1"));
    EXPECT_EQ(store.list("job-2").size(), 1u);
    EXPECT_EQ(store.list("job-2")[0].bytes(), 16);  // {"job": "job-2"}
    // An interrupted collection: staged, never committed.
    store.staging_dir("job-4", "last");
  }
  // A damaged model (no manifest) is removed when the store is opened again; the staged
  // files of an interrupted collection too; the rest is as it was, newest first.
  fs::create_directories(fs::path(root) / "job-9" / "last");
  leader::ModelStore again(root, 2);
  const auto list = again.list();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].job, "job-3");
  EXPECT_EQ(*list[0].test_accuracy, 0.9);
  EXPECT_EQ(list[0].files[0].name, "metadata.json");
  EXPECT_FALSE(fs::exists(fs::path(root) / "job-9"));
  EXPECT_FALSE(fs::exists(fs::path(root) / ".staging"));
}

TEST(UploadStore, TwoClientsShareOneUploadAndAFileIsKeptOnlyWhole) {
  TempDir d;
  leader::UploadStore store((d.path / "uploads").string(), 2);
  const std::string text(3000, 'x');
  const auto sha = sha256_hex(bytes_of(text));
  const auto window = [&](std::int64_t at, std::int64_t n) { return bytes_of(text).subspan(static_cast<std::size_t>(at), static_cast<std::size_t>(n)); };
  EXPECT_EQ(store.put(sha, 3000, 0, {}), 0);           // a new upload
  EXPECT_EQ(store.put(sha, 3000, 0, window(0, 1000)), 1000);
  EXPECT_EQ(store.put(sha, 3000, 0, {}), 1000);        // a second client joins where it is
  EXPECT_EQ(store.put(sha, 3000, 0, window(0, 1000)), 1000);  // a window it has: not taken
  EXPECT_FALSE(store.find(sha));
  EXPECT_EQ(store.put(sha, 3000, 1000, window(1000, 2000)), 3000);
  ASSERT_TRUE(store.find(sha));
  EXPECT_EQ(read(*store.find(sha)), text);
  EXPECT_EQ(store.put(sha, 3000, 0, {}), 3000);        // stored: nothing more to send
  // Bytes that do not match the announced SHA-256 are dropped with the upload.
  const std::string other = std::string(10, 'y');
  EXPECT_EQ(store.put(sha256_hex(bytes_of("something else")), 10, 0, {}), 0);
  EXPECT_THROW(store.put(sha256_hex(bytes_of("something else")), 10, 0, bytes_of(other)), ProtocolError);
  EXPECT_THROW(store.put(sha256_hex(bytes_of("something else")), 10, 0, bytes_of(other)), ProtocolError);  // gone
  EXPECT_FALSE(store.find(sha256_hex(bytes_of("something else"))));
  // Retention 2: the least recently used file goes, unless a live job pins it.
  for (const std::string t : {"a", "b", "c"}) {
    const auto h = sha256_hex(bytes_of(t));
    store.put(h, 1, 0, {});
    store.put(h, 1, 0, bytes_of(t), {sha});
  }
  EXPECT_TRUE(store.find(sha));                         // pinned while "c" came
  EXPECT_FALSE(store.find(sha256_hex(bytes_of("a"))));  // the oldest unpinned
  EXPECT_TRUE(store.find(sha256_hex(bytes_of("c"))));
}

}  // namespace
}  // namespace dltrain
