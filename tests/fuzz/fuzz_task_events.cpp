// Fuzzes the task events (wire/task_events.h): a line of a task's standard output as its
// agent turns it into an event (events::event_of_line), the one parse of it into a
// TaskEvent (parse_task_event) and every event kind's reader (from_json) on it, and the
// trip to the leader inside a task_event message.
//
// Input: one line. Checks, beyond "no crash" and "only nlohmann::json::type_error escapes
// a reader, as documented":
//   - event_of_line never throws and always gives an object;
//   - an event that a kind's reader accepts, written with to_json() and read again, gives
//     the same JSON;
//   - the event, sent as the agent sends it (make_request of a TaskEventBody) and read as
//     the leader reads it (parse_envelope, parse_body), arrives unchanged (bytes that are
//     not UTF-8 become U+FFFD on the way, as make_request promises).
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "common/errors.h"
#include "fuzz_check.h"
#include "wire/control.h"
#include "wire/control_bodies.h"
#include "wire/task_event.h"
#include "wire/leader_events.h"
#include "wire/task_events.h"

using namespace dltrain;
using nlohmann::json;
namespace events = wire::events;

namespace {

template <typename E>
void round_trip(const json& ev) {
  E e;
  try {
    e = E::from_json(ev);
  } catch (const json::type_error&) {
    return;
  }
  const json once = e.to_json();
  json twice;
  try {
    twice = E::from_json(once).to_json();
  } catch (const json::type_error& err) {
    std::fprintf(stderr, "%s refused after a round trip: %s\n", once.dump().c_str(), err.what());
    FUZZ_CHECK(false, "an event that was read is not read again after to_json()");
  }
  FUZZ_CHECK(twice == once, "to_json(from_json(to_json(e))) != to_json(e)");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string line(reinterpret_cast<const char*>(data), size);
  const json ev = events::event_of_line(line);
  FUZZ_CHECK(ev.is_object(), "event_of_line gave something other than an object");
  (void)events::kind_of(ev);
  // The one parse the agent and the leader make of it (TaskEvent): only a type_error escapes.
  for (const auto from : {wire::TaskKind::kWorker, wire::TaskKind::kPs}) {
    try {
      (void)events::parse_task_event(ev, from);
    } catch (const json::type_error&) {
    }
  }

  // The reader of the kind the event names, as the agent and the leader pick it, and the
  // byte counters the leader reads from every worker event; an event of no known kind
  // goes to a reader picked by its size, so that every reader meets foreign events too.
  using Reader = void (*)(const json&);
  static const std::vector<std::pair<std::string, Reader>> readers = {
      {events::Started::kKind, round_trip<events::Started>},
      {events::Progress::kKind, round_trip<events::Progress>},
      {events::EpochEnd::kKind, round_trip<events::EpochEnd>},
      {events::Done::kKind, round_trip<events::Done>},
      {events::SkippedStep::kKind, round_trip<events::SkippedStep>},
      {events::DataInfo::kKind, round_trip<events::DataInfo>},
      {events::SkippedImage::kKind, round_trip<events::SkippedImage>},
      {events::WorkerStopped::kKind, round_trip<events::WorkerStopped>},
      {events::Profile::kKind, round_trip<events::Profile>},
      {events::ReplicaLoaded::kKind, round_trip<events::ReplicaLoaded>},
      {events::PsResync::kKind, round_trip<events::PsResync>},
      {events::TaskError::kKind, round_trip<events::TaskError>},
      {events::Listening::kKind, round_trip<events::Listening>},
      {events::PsStats::kKind, round_trip<events::PsStats>},
      {events::PsStopped::kKind, round_trip<events::PsStopped>},  // "stopped", as WorkerStopped
      {events::Restarting::kKind, round_trip<events::Restarting>},
      {events::LogLine::kKind, round_trip<events::LogLine>},
      {events::StateChanged::kKind, round_trip<events::StateChanged>},
      {events::PlanDecided::kKind, round_trip<events::PlanDecided>},
      {events::Recovering::kKind, round_trip<events::Recovering>},
      {events::Waiting::kKind, round_trip<events::Waiting>},
      {events::WaitingForAgent::kKind, round_trip<events::WaitingForAgent>},
      {events::Reassigned::kKind, round_trip<events::Reassigned>},
      {events::PsRecovered::kKind, round_trip<events::PsRecovered>},
      {events::LeaderRestarted::kKind, round_trip<events::LeaderRestarted>},
      {events::Summary::kKind, round_trip<events::Summary>},
  };
  const std::string kind = events::kind_of(ev);
  bool known = false;
  for (const auto& [k, read] : readers) {
    if (k == kind) {
      read(ev);
      known = true;
    }
  }
  if (!known) readers[size % readers.size()].second(ev);
  round_trip<events::ByteCounters>(ev);

  // Agent → leader, as agent.cpp sends it and leader_agents.cpp reads it.
  const std::string text = wire::make_request("a1", "task_event", wire::TaskEventBody{{}, "job-1", "worker-0", 1, ev}.to_json());
  wire::Envelope env;
  try {
    env = wire::parse_envelope(text);
  } catch (const ProtocolError& e) {
    // The envelope adds two levels to the event's own.
    FUZZ_CHECK(fuzz::depth_of(ev) + 2 > wire::kMaxJsonDepth, e.what());
    return 0;
  }
  const auto body = wire::parse_body<wire::TaskEventBody>(env);
  const json sent = json::parse(ev.dump(-1, ' ', false, json::error_handler_t::replace));
  FUZZ_CHECK(body.event == sent && body.job == "job-1" && body.task == "worker-0" && body.generation == 1,
             "a task event changed on its way to the leader");
  return 0;
}
