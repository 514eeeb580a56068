#include "commands.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <thread>
#include <unordered_set>

#include "common/errors.h"
#include "common/toml_fields.h"
#include "models.h"
#include "output.h"
#include "wire/step_trace.h"
#include "wire/control_bodies.h"
#include "wire/task_events.h"

namespace dltrain::client {

namespace fs = std::filesystem;
using json = nlohmann::json;

json job_request(const std::string& job_file, bool follow) {
  std::error_code fec;
  if (!fs::is_regular_file(job_file, fec)) {
    throw ConfigError("", "job file \"" + job_file + "\" " +
                              (fs::exists(job_file, fec) ? "is not a regular file" : "does not exist"));
  }
  std::ifstream in(job_file);
  if (!in) throw ConfigError("", "cannot read job file \"" + job_file + "\"");
  std::stringstream ss;
  ss << in.rdbuf();
  return {{"job_toml", ss.str()},
          {"base_dir", fs::absolute(fs::path(job_file)).parent_path().string()},
          {"follow", follow}};
}

int exit_for_state(const std::string& state) {
  return state == "succeeded" ? kExitOk : kExitJobFailed;
}

namespace {

// An event as the leader stores it and as it sends it live, without what differs between
// the two (the stored copy's "time", the live copy's "job").
std::string event_key(json ev) {
  ev.erase("time");
  ev.erase("job");
  return ev.dump();
}

// The time of the latest event the leader stores for `job` (0 when none): what a
// follower that reconnects has seen of the stored log.
double stored_watermark(control::BlockingControlClient& c, const std::string& job, std::chrono::seconds timeout) {
  const auto r = c.request("events", {{"job", job}, {"limit", 1}}, timeout);
  const auto evs = r.value("events", json::array());
  return evs.empty() ? 0.0 : evs.back().value("time", 0.0);
}

}  // namespace

int follow_job(control::BlockingControlClient& c, const std::string& job, bool as_json,
               wire::events::Summary* summary, const std::function<bool()>& stop, const Reconnect& reconnect,
               std::chrono::seconds timeout) {
  const auto wait = stop ? std::chrono::seconds(1) : std::chrono::seconds(30);
  control::BlockingControlClient* cur = &c;
  std::unique_ptr<control::BlockingControlClient> replaced;
  // With reconnect: what was printed (bounded: progress lines are never stored, so only
  // their count grows), and how far the stored log went when this follow began.
  std::unordered_set<std::string> printed;
  const double since = reconnect ? stored_watermark(c, job, timeout) : 0.0;
  // Prints one event; the job's exit code once it is the summary.
  const auto emit = [&](const json& ev) -> std::optional<int> {
    if (reconnect && printed.size() < 200000 && !printed.insert(event_key(ev)).second) return std::nullopt;
    if (as_json) {
      std::cout << ev.dump() << std::endl;
    } else {
      print_event(std::cout, ev);
    }
    if (wire::events::kind_of(ev) != wire::events::Summary::kKind) return std::nullopt;
    auto sum = wire::events::Summary::from_json(ev);
    const int rc = exit_for_state(sum.state);
    if (summary != nullptr) *summary = std::move(sum);
    return rc;
  };
  for (;;) {
    if (stop && stop()) return kFollowStopped;
    std::optional<json> ev;
    try {
      ev = cur->next_event(wait);
    } catch (const IoError&) {
      if (!reconnect) throw;
      replaced = reconnect();
      cur = replaced.get();
      // Subscribe first, then read the stored log: an event stored in between comes
      // both ways and is printed once.
      cur->request("follow", {{"job", job}}, timeout);
      const auto stored = cur->request("events", {{"job", job}, {"limit", wire::EventsBody::kMaxLimit}}, timeout);
      for (auto s : stored.value("events", json::array())) {
        if (s.value("time", 0.0) <= since) continue;
        s["job"] = job;
        if (const auto rc = emit(s)) return *rc;
      }
      continue;
    }
    if (!ev) continue;  // WebSocket keep-alive pings close the session if the leader goes silent
    if (ev->value("job", "") != job) continue;
    if (const auto rc = emit(*ev)) return *rc;
  }
}

int submit(control::BlockingControlClient& c, const json& request, const CommandOptions& opt, bool as_json) {
  const std::string id = submit_and_print(c, request, opt, as_json);
  return opt.follow ? follow_job(c, id, as_json, nullptr, {}, opt.reconnect, opt.timeout) : kExitOk;
}

std::string submit_and_print(control::BlockingControlClient& c, const json& request, const CommandOptions& opt,
                             bool as_json) {
  auto r = c.request("submit", with_uploaded_model(c, request, opt, false), opt.timeout);
  const std::string id = r.value("job", "");
  if (as_json) {
    json line{{"event", "submitted"}, {"job", id}, {"state", r.value("state", "")}};
    if (r.contains("warning")) line["warning"] = r["warning"];
    if (r.contains("shared_plan")) line["shared_plan"] = r["shared_plan"];
    std::cout << line.dump() << std::endl;
  } else {
    std::cout << id << " submitted (" << r.value("state", "") << ") to " << opt.leader << std::endl;
    if (const auto f = r.find("shared_plan"); f != r.end() && f->is_object()) {
      // The shared plan's size for it now and, once it has workers, its predicted run time.
      std::cout << "  shared plan: " << f->value("workers", 0) << " workers (" << f->value("reason", "") << ")";
      if (f->contains("predicted_seconds")) {
        std::cout << ", about " << rough_duration(f->value("predicted_seconds", 0.0)) << " to its end";
      }
      std::cout << std::endl;
    }
    if (r.contains("warning")) std::cerr << "dltrain: warning: " << id << " " << r.value("warning", "") << std::endl;
  }
  return id;
}

int resume(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json) {
  auto r = c.request("resume", {{"job", opt.job_id}, {"follow", opt.follow}}, opt.timeout);
  const std::string id = r.value("job", "");
  if (as_json) {
    json line{{"event", "submitted"}, {"job", id}, {"state", r.value("state", "")}};
    for (const char* k : {"resumed_from", "checkpoint", "resume_epoch", "warning"}) {
      if (r.contains(k)) line[k] = r[k];
    }
    std::cout << line.dump() << std::endl;
  } else {
    std::cout << id << " submitted (" << r.value("state", "") << ") to " << opt.leader << ": resumes "
              << r.value("resumed_from", opt.job_id) << " from its checkpoint " << r.value("checkpoint", "?")
              << " at epoch " << r.value("resume_epoch", 0) + 1 << std::endl;
    if (r.contains("warning")) std::cerr << "dltrain: warning: " << id << " " << r.value("warning", "") << std::endl;
  }
  return opt.follow ? follow_job(c, id, as_json, nullptr, {}, opt.reconnect, opt.timeout) : kExitOk;
}

int plan(control::BlockingControlClient& c, const json& request, const CommandOptions& opt, bool as_json) {
  auto r = c.request("plan", with_uploaded_model(c, request, opt, true), opt.timeout);
  if (as_json) {
    std::cout << r.dump() << std::endl;
    return kExitOk;
  }
  print_plan(std::cout, r);
  return r.value("feasible", false) ? kExitOk : kExitJobFailed;
}

int cluster_plan(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json) {
  const auto r = c.request("cluster_plan", json::object(), opt.timeout);
  if (as_json) {
    std::cout << r.dump() << std::endl;
    return kExitOk;
  }
  if (!r.value("shared_plan", false)) {
    std::cout << "the leader runs without the shared plan (shared_plan = false): jobs keep the sizes they ask for"
              << std::endl;
    return kExitOk;
  }
  const auto span = [](double t) { return rough_duration(t); };
  const auto& rows = r["jobs"];
  std::cout << "shared plan: " << rows.size() << " elastic jobs on " << r.value("slots", 0) << " cores";
  if (r.value("gpu_slots", 0) > 0) std::cout << " and " << r.value("gpu_slots", 0) << " GPUs";
  std::cout << std::endl;
  for (const auto& j : rows) {
    std::cout << "  " << j.value("job", "") << "  " << j.value("owner", "") << "  " << j.value("state", "") << "  "
              << j.value("workers", 0) << " -> " << j.value("planned_workers", 0) << " workers ["
              << j.value("min_workers", 0) << ", " << j.value("max_workers", 0) << "]";
    if (j.value("slots_per_worker", 1) > 1 || j.value("resource", "cores") != "cores") {
      std::cout << " of " << j.value("slots_per_worker", 1) << " " << j.value("resource", "cores") << " each";
    }
    if (j.contains("predicted_seconds")) std::cout << "  about " << span(j.value("predicted_seconds", 0.0)) << " left";
    if (j.contains("deadline_left_seconds")) {
      std::cout << "  deadline in " << span(std::max(0.0, j.value("deadline_left_seconds", 0.0)))
                << (j.value("misses_deadline", false) ? " (missed)" : "");
    }
    std::cout << "  " << j.value("reason", "") << std::endl;
  }
  const auto& changes = r["changes"];
  if (!changes.empty()) {
    std::cout << "latest changes (oldest first):" << std::endl;
    const std::size_t from = changes.size() > 20 ? changes.size() - 20 : 0;
    const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    for (std::size_t i = from; i < changes.size(); ++i) {
      const auto& ch = changes[i];
      std::cout << "  " << span(std::max(0.0, now - ch.value("t", now))) << " ago  " << ch.value("job", "") << "  "
                << ch.value("from", 0) << " -> " << ch.value("to", 0) << "  " << ch.value("reason", "") << std::endl;
    }
  }
  return kExitOk;
}

int history(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json) {
  json body = json::object();
  if (!opt.model_filter.empty()) body["model"] = opt.model_filter;
  if (!opt.dataset_filter.empty()) body["dataset"] = opt.dataset_filter;
  auto r = c.request("history", body, opt.timeout);
  if (as_json) {
    std::cout << r["observations"].dump() << std::endl;
    return kExitOk;
  }
  print_history(std::cout, r);
  return kExitOk;
}

int follow(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json) {
  c.request("follow", {{"job", opt.job_id}}, opt.timeout);
  return follow_job(c, opt.job_id, as_json, nullptr, {}, opt.reconnect, opt.timeout);
}

int status(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json) {
  if (opt.job_id.empty()) return list(c, opt, as_json);
  auto r = c.request("status", {{"job", opt.job_id}}, opt.timeout);
  if (as_json) {
    std::cout << r.dump() << std::endl;
  } else {
    print_job_status(std::cout, r);
  }
  return kExitOk;
}

int list(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json) {
  auto r = c.request("list", {{"limit", opt.list_limit}}, opt.timeout);
  if (as_json) {
    // The reply as it is: {leader, jobs, total, omitted, size_bound}, the leader line with it.
    std::cout << r.dump() << std::endl;
  } else {
    print_leader(std::cout, r.value("leader", json::object()));
    print_job_list(std::cout, r["jobs"]);
  }
  // On stderr, so that --json output stays one JSON document.
  const auto omitted = r.value("omitted", std::int64_t{0});
  if (omitted > 0) {
    std::cerr << "(the latest " << r["jobs"].size() << " of " << r.value("total", std::int64_t{0})
              << " jobs the leader keeps; "
              << (r.value("size_bound", false) ? "the others do not fit in one reply; dltrain status JOB shows any one"
                                               : "--limit N shows more")
              << ")" << std::endl;
  }
  return kExitOk;
}

int cancel(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json) {
  auto r = c.request("cancel", {{"job", opt.job_id}}, opt.timeout);
  if (as_json) {
    std::cout << r.dump() << std::endl;
  } else {
    std::cout << opt.job_id << ": " << r.value("state", "") << std::endl;
  }
  return kExitOk;
}

int scale(control::BlockingControlClient& c, const CommandOptions& opt, int workers, bool as_json) {
  auto r = c.request("scale", {{"job", opt.job_id}, {"workers", workers}}, opt.timeout);
  if (as_json) {
    std::cout << r.dump() << std::endl;
    return kExitOk;
  }
  std::cout << opt.job_id << ": " << r.value("from", 0) << " -> " << r.value("to", 0) << " workers";
  const auto list = [&](const char* key, const char* what) {
    const auto v = r.value(key, json::array());
    if (v.empty()) return;
    std::cout << "; " << what << " ";
    for (std::size_t i = 0; i < v.size(); ++i) std::cout << (i ? ", " : "") << v[i].get<std::string>();
  };
  list("started", "started");
  list("leaving", "leaving after their step:");
  std::cout << std::endl;
  return kExitOk;
}

int agents(control::BlockingControlClient& c, const CommandOptions& opt, bool as_json) {
  auto r = c.request("agents", json::object(), opt.timeout);
  if (as_json) {
    std::cout << r.dump() << std::endl;  // {leader, agents}
  } else {
    print_leader(std::cout, r.value("leader", json::object()));
    print_agents(std::cout, r["agents"]);
  }
  return kExitOk;
}

int logs(control::BlockingControlClient& c, const CommandOptions& opt, const LogsOptions& lo, bool as_json) {
  json body{{"job", opt.job_id}, {"task", lo.task}, {"tail", lo.tail}};
  control::BlockingControlClient* cur = &c;
  std::unique_ptr<control::BlockingControlClient> replaced;
  // With --follow and the HA candidates, a lost leader is replaced by the one that serves
  // next, and the same window asked again: the log lives on the task's agent, and the
  // offsets are the file's, whichever leader relays them.
  // A new leader answers `unavailable` until the task's agent has registered with it
  // again: asked again every poll interval, for up to a minute (or --timeout if longer).
  const auto read = [&]() {
    std::optional<std::chrono::steady_clock::time_point> waiting_since;
    for (;;) {
      try {
        return cur->request("logs", body, opt.timeout);
      } catch (const IoError&) {
        if (!lo.follow || !opt.reconnect) throw;
        replaced = opt.reconnect();
        cur = replaced.get();
      } catch (const control::RemoteError& e) {
        if (!lo.follow || !replaced || e.code() != wire::error_code::kUnavailable) throw;
        const auto now = std::chrono::steady_clock::now();
        if (!waiting_since) {
          waiting_since = now;
          std::cerr << "dltrain: " << e.what() << "; asking again" << std::endl;
        } else if (now - *waiting_since > std::max<std::chrono::steady_clock::duration>(opt.timeout, std::chrono::seconds(60))) {
          throw;
        }
        std::this_thread::sleep_for(lo.poll);
      }
    }
  };
  for (;;) {
    const auto chunk = wire::LogChunkBody::from_json(read());
    if (as_json) {
      std::cout << chunk.to_json().dump() << std::endl;
    } else {
      if (chunk.rotated) std::cerr << "dltrain: the log was rotated; continuing from its start" << std::endl;
      std::cout << chunk.text << std::flush;
    }
    if (!chunk.exists && !chunk.running && !as_json) {
      std::cerr << "dltrain: " << lo.task << " of " << opt.job_id << " has no log on agent " << chunk.agent << std::endl;
    }
    const bool drained = chunk.next_offset >= chunk.size;
    if (!lo.follow || (!chunk.running && drained)) return kExitOk;
    body["offset"] = chunk.next_offset;
    body["max_bytes"] = wire::LogRequestBody::kMaxBytes;
    if (drained) std::this_thread::sleep_for(lo.poll);
  }
}

int trace(control::BlockingControlClient& c, const CommandOptions& opt, const TraceOptions& to) {
  std::vector<std::string> names;
  if (!to.task.empty()) {
    names.push_back(to.task);
  } else {
    const auto st = c.request("status", {{"job", opt.job_id}}, opt.timeout);
    for (const auto& t : st.value("tasks", json::array())) {
      const std::string name = t.value("task", "");
      if (name.rfind("worker-", 0) == 0) names.push_back(name);
    }
  }
  std::vector<wire::TaskTrace> traces;
  for (const auto& name : names) {
    // The whole file in one reply: the worker bounds it well below kMaxBytes (4096 steps
    // at most, ~130 bytes each), and it is replaced atomically, never appended to.
    json body{{"job", opt.job_id}, {"task", name}, {"file", wire::LogRequestBody::kTraceFile}, {"offset", 0},
              {"max_bytes", wire::LogRequestBody::kMaxBytes}};
    const auto chunk = wire::LogChunkBody::from_json(c.request("logs", body, opt.timeout));
    if (!chunk.exists || chunk.text.empty()) {
      std::cerr << "dltrain: " << name << " of " << opt.job_id << " has no step timeline on agent " << chunk.agent
                << (chunk.running ? " yet (its worker writes one every 5 s once it trains)" : "") << std::endl;
      continue;
    }
    if (chunk.next_offset < chunk.size) {
      throw ProtocolError("the step timeline of " + name + " is " + std::to_string(chunk.size) +
                          " bytes, more than one reply holds");
    }
    auto t = wire::parse_step_trace(chunk.text, "the step timeline of " + name + " on agent " + chunk.agent);
    t.task = name;
    traces.push_back(std::move(t));
  }
  if (traces.empty()) {
    std::cerr << "dltrain: no step timeline for " << (to.task.empty() ? "any worker" : to.task) << " of "
              << opt.job_id << std::endl;
    return kExitBadInput;
  }
  std::cout << wire::chrome_trace(traces, to.steps).dump() << std::endl;
  return kExitOk;
}

}  // namespace dltrain::client
