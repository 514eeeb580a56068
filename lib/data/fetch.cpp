#include "data/fetch.h"

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include <curl/curl.h>
#include <unistd.h>

namespace dltrain::data {
namespace fs = std::filesystem;
namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

struct Credentials {
  std::string key, secret, token;
};

// The credentials of an s3:// URL: the agent's file, else the environment.
Credentials s3_credentials(const S3Settings& s, const std::string& url) {
  Credentials c;
  if (!s.credentials_file.empty()) {
    std::ifstream in(s.credentials_file);
    if (!in) {
      throw FetchError(url + ": cannot read the S3 credentials file \"" + s.credentials_file +
                           "\" (s3_credentials_file in the agent's configuration)",
                       true);
    }
    const std::string want = s.profile.empty() ? (env("AWS_PROFILE").empty() ? "default" : env("AWS_PROFILE")) : s.profile;
    std::string line, section;
    while (std::getline(in, line)) {
      line = trim(line);
      if (line.empty() || line[0] == '#' || line[0] == ';') continue;
      if (line.front() == '[' && line.back() == ']') {
        section = trim(line.substr(1, line.size() - 2));
        continue;
      }
      if (section != want) continue;
      const auto eq = line.find('=');
      if (eq == std::string::npos) continue;
      const auto k = trim(line.substr(0, eq)), v = trim(line.substr(eq + 1));
      if (k == "aws_access_key_id") c.key = v;
      if (k == "aws_secret_access_key") c.secret = v;
      if (k == "aws_session_token") c.token = v;
    }
    if (c.key.empty() || c.secret.empty()) {
      throw FetchError(url + ": the S3 credentials file \"" + s.credentials_file + "\" has no aws_access_key_id and " +
                           "aws_secret_access_key in section [" + want + "]",
                       true);
    }
    return c;
  }
  c.key = env("AWS_ACCESS_KEY_ID");
  c.secret = env("AWS_SECRET_ACCESS_KEY");
  c.token = env("AWS_SESSION_TOKEN");
  if (c.key.empty() || c.secret.empty()) {
    throw FetchError(url + ": no S3 credentials: set s3_credentials_file in the agent's configuration, or "
                           "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in its environment",
                     true);
  }
  return c;
}

std::string s3_region(const S3Settings& s) {
  if (!s.region.empty()) return s.region;
  if (!env("AWS_REGION").empty()) return env("AWS_REGION");
  if (!env("AWS_DEFAULT_REGION").empty()) return env("AWS_DEFAULT_REGION");
  return "us-east-1";
}

// One request's setup: the URL curl fetches and what signs it.
struct Request {
  std::string http_url;
  std::string sigv4;     // CURLOPT_AWS_SIGV4, empty when unsigned
  std::string userpwd;   // key:secret
  std::string token;
};

Request make_request(const std::string& url, const S3Settings& s3) {
  Request r;
  if (url.rfind("s3://", 0) == 0) {
    std::string endpoint = s3.endpoint.empty() ? env("AWS_ENDPOINT_URL") : s3.endpoint;
    const auto region = s3_region(s3);
    if (endpoint.empty()) endpoint = "https://s3." + region + ".amazonaws.com";
    while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
    r.http_url = endpoint + "/" + url.substr(5);  // path style: ENDPOINT/bucket/key
    const auto c = s3_credentials(s3, url);
    r.sigv4 = "aws:amz:" + region + ":s3";
    r.userpwd = c.key + ":" + c.secret;
    r.token = c.token;
  } else {
    r.http_url = url;
  }
  return r;
}

// What an HTTP status means for a data URL.
std::string status_text(long code) {
  switch (code) {
    case 400: return "400 Bad Request";
    case 401: return "401 Unauthorized";
    case 403: return "403 Forbidden (the credentials are missing, wrong, or not allowed to read it)";
    case 404: return "404 Not Found";
    case 416: return "416 Range Not Satisfiable";
    case 429: return "429 Too Many Requests";
    default: return std::to_string(code);
  }
}

struct Sink {
  std::FILE* file = nullptr;
  std::string* text = nullptr;
  std::int64_t written = 0, max = 0;
  bool too_big = false;
  int write_errno = 0;
};

std::size_t on_data(char* p, std::size_t size, std::size_t n, void* user) {
  auto* s = static_cast<Sink*>(user);
  const std::size_t len = size * n;
  if (s->written + static_cast<std::int64_t>(len) > s->max) {
    s->too_big = true;
    return 0;
  }
  if (s->file) {
    if (std::fwrite(p, 1, len, s->file) != len) {
      s->write_errno = errno;
      return 0;
    }
  } else {
    s->text->append(p, len);
  }
  s->written += static_cast<std::int64_t>(len);
  return len;
}

// One try: GET from `offset`. Returns the HTTP status (0 for a local copy); sets `error`
// to curl's message when the transfer failed.
long one_try(const Request& r, Sink& sink, std::int64_t offset, const FetchOptions& o, std::string& error, bool& resumed) {
  CURL* h = curl_easy_init();
  if (!h) throw IoError("curl_easy_init failed");
  char errbuf[CURL_ERROR_SIZE] = {};
  curl_slist* headers = nullptr;
  curl_easy_setopt(h, CURLOPT_URL, r.http_url.c_str());
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
  curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(o.connect_timeout_s * 1000));
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, static_cast<long>(std::max(1.0, o.stall_timeout_s)));
  curl_easy_setopt(h, CURLOPT_FAILONERROR, 1L);  // an error status's body is not the data
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(h, CURLOPT_USERAGENT, "dltrain-agent");
  if (offset > 0) curl_easy_setopt(h, CURLOPT_RESUME_FROM_LARGE, static_cast<curl_off_t>(offset));
  if (o.cancel) {
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, o.cancel);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, +[](void* p, curl_off_t, curl_off_t, curl_off_t, curl_off_t) -> int {
      return static_cast<const std::atomic<bool>*>(p)->load() ? 1 : 0;
    });
  }
  if (!r.sigv4.empty()) {
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, r.sigv4.c_str());
    curl_easy_setopt(h, CURLOPT_USERPWD, r.userpwd.c_str());
    // libcurl 7.88 signs the empty payload's hash but does not send it; radosgw (and
    // AWS) require the header. A GET's payload is empty: its SHA-256.
    headers = curl_slist_append(headers, "x-amz-content-sha256: e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    if (!r.token.empty()) headers = curl_slist_append(headers, ("x-amz-security-token: " + r.token).c_str());
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
  }
  const CURLcode rc = curl_easy_perform(h);
  long code = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &code);
  resumed = offset > 0 && code == 206;
  if (rc != CURLE_OK) error = errbuf[0] ? errbuf : curl_easy_strerror(rc);
  curl_slist_free_all(headers);
  curl_easy_cleanup(h);
  return code;
}

// The retry loop of fetch_to_file and fetch_text.
std::int64_t fetch(const std::string& url, Sink& sink, const std::string* path, const FetchOptions& o) {
  global_init();
  const Request r = make_request(url, o.s3);  // throws for a missing credential
  double backoff = o.first_backoff_s;
  std::string last;
  const int attempts = std::max(1, o.attempts);
  for (int attempt = 1; attempt <= attempts; ++attempt) {
    if (o.cancel && o.cancel->load()) throw FetchError("GET " + url + ": cancelled (the agent is stopping)", true);
    std::string error;
    bool resumed = false;
    const std::int64_t offset = sink.written;
    const long code = one_try(r, sink, offset, o, error, resumed);
    if (sink.write_errno != 0) {
      throw IoError("cannot write \"" + (path ? *path : std::string("?")) + "\": " + std::strerror(sink.write_errno) +
                    (sink.write_errno == ENOSPC ? " (the cache's disk is full: lower cache_bytes or free the disk)" : ""));
    }
    if (sink.too_big) throw FetchError("GET " + url + ": larger than " + std::to_string(sink.max) + " bytes", true);
    if (code >= 400) {  // an error status (its body was not written: CURLOPT_FAILONERROR)
      error.clear();
    }
    if (offset > 0 && code == 200) {  // the server ignored the Range: start over
      if (sink.file) {
        std::fflush(sink.file);
        if (::ftruncate(fileno(sink.file), 0) != 0 || std::fseek(sink.file, 0, SEEK_SET) != 0) throw IoError("cannot truncate \"" + *path + "\"");
      } else {
        sink.text->clear();
      }
      sink.written = 0;
      error = "the server does not resume with Range; starting over";
    } else if (error.empty() && (code == 200 || code == 206)) {
      return sink.written;
    }
    if (error.empty()) {
      last = "HTTP " + status_text(code);
      const bool permanent = code >= 400 && code < 500 && code != 408 && code != 429;
      if (permanent) throw FetchError("GET " + url + ": " + last, true);
    } else {
      last = error;
    }
    if (attempt == attempts) break;
    if (o.log) {
      char secs[32];
      std::snprintf(secs, sizeof secs, "%.1f", backoff);
      o.log("GET " + url + " failed (" + last + "); retry " + std::to_string(attempt + 1) + " of " +
            std::to_string(attempts) + " in " + secs + " s" +
            (sink.written > 0 ? " from byte " + std::to_string(sink.written) : ""));
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff = std::min(o.max_backoff_s, backoff * 2);
  }
  throw FetchError("GET " + url + ": " + last + " (gave up after " + std::to_string(attempts) + " tries)", false);
}

// A local or file:// URL's path, after checking that it exists and holds at most max_bytes;
// its size. Throws FetchError (permanent) naming the path.
std::string local_file(const std::string& url, std::int64_t max_bytes, std::int64_t& size) {
  const std::string from = url.rfind("file://", 0) == 0 ? url.substr(7) : url;
  std::error_code ec;
  size = static_cast<std::int64_t>(fs::file_size(from, ec));
  if (ec) throw FetchError("\"" + from + "\": " + ec.message(), true);
  if (size > max_bytes) throw FetchError("\"" + from + "\": larger than " + std::to_string(max_bytes) + " bytes", true);
  return from;
}

}  // namespace

std::int64_t fetch_to_file(const std::string& url, const std::string& path, std::int64_t max_bytes, const FetchOptions& o) {
  if (is_local_url(url)) {
    std::int64_t size = 0;
    const auto from = local_file(url, max_bytes, size);
    std::error_code ec;
    fs::copy_file(from, path, fs::copy_options::overwrite_existing, ec);
    if (ec) {
      throw IoError("cannot copy \"" + from + "\" to \"" + path + "\": " + ec.message() +
                    (ec == std::errc::no_space_on_device ? " (the cache's disk is full: lower cache_bytes or free the disk)" : ""));
    }
    return size;
  }
  std::FILE* f = std::fopen(path.c_str(), "wb+");
  if (!f) throw IoError("cannot create \"" + path + "\": " + std::strerror(errno));
  Sink sink;
  sink.file = f;
  sink.max = max_bytes;
  try {
    const auto n = fetch(url, sink, &path, o);
    // Written through to the disk before the caller renames it into place, so that a
    // crash never leaves a shard that is only partly there under its final name.
    const bool synced = std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
    const int e = synced ? 0 : errno;
    const bool closed = std::fclose(f) == 0;
    f = nullptr;
    if (!synced || !closed) {
      const int err = e != 0 ? e : errno;
      throw IoError("cannot write \"" + path + "\": " + std::strerror(err) +
                    (err == ENOSPC ? " (the cache's disk is full: lower cache_bytes or free the disk)" : ""));
    }
    return n;
  } catch (...) {
    if (f) std::fclose(f);
    std::error_code ec;
    fs::remove(path, ec);
    throw;
  }
}

std::string fetch_text(const std::string& url, std::int64_t max_bytes, const FetchOptions& o) {
  if (is_local_url(url)) {
    std::int64_t size = 0;
    const auto from = local_file(url, max_bytes, size);
    std::ifstream in(from, std::ios::binary);
    std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in && !in.eof()) throw FetchError("\"" + from + "\": cannot be read", true);
    return s;
  }
  std::string text;
  Sink sink;
  sink.text = &text;
  sink.max = max_bytes;
  fetch(url, sink, nullptr, o);
  return text;
}

}  // namespace dltrain::data
