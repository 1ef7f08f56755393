// Fault injection for the failure tests: a rank that exits, aborts, crashes or hangs at a step.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "hetrain/base/error.h"
#include "hetrain/distributed/mpi.h"

namespace hetrain::distributed {

std::optional<Fault> fault_from_env() {
  const char* v = std::getenv("HETRAIN_FAULT_INJECT");
  if (!v || !*v) return std::nullopt;
  const std::string s(v);
  const auto bad = [&]() -> std::optional<Fault> {
    fail("[fault] HETRAIN_FAULT_INJECT='", s,
         "' is not RANK:STEP:KIND[@POINT] (KIND: exit, abort, segv, hang or kill; POINT: "
         "shard or commit), e.g. 1:5:hang or 1:10:kill@shard");
  };
  const auto c1 = s.find(':'), c2 = s.find(':', c1 == std::string::npos ? c1 : c1 + 1);
  if (c1 == std::string::npos || c2 == std::string::npos) return bad();
  Fault f;
  try {
    size_t used = 0;
    f.rank = std::stoi(s.substr(0, c1), &used);
    if (used != c1) return bad();
    f.step = std::stoll(s.substr(c1 + 1, c2 - c1 - 1), &used);
    if (used != c2 - c1 - 1) return bad();
  } catch (const std::exception&) {
    return bad();
  }
  std::string kind = s.substr(c2 + 1);
  if (const auto at = kind.find('@'); at != std::string::npos) {
    f.point = kind.substr(at + 1);
    kind = kind.substr(0, at);
    if (f.point != "shard" && f.point != "commit") return bad();
  }
  if (kind == "exit")
    f.kind = Fault::Kind::exit;
  else if (kind == "abort")
    f.kind = Fault::Kind::abort;
  else if (kind == "segv")
    f.kind = Fault::Kind::segv;
  else if (kind == "hang")
    f.kind = Fault::Kind::hang;
  else if (kind == "kill")
    f.kind = Fault::Kind::kill;
  else
    return bad();
  if (f.rank < 0 || f.step < 0) return bad();
  return f;
}

void inject_fault(const Fault& f, int rank, int64_t step) {
  if (f.rank != rank || f.step != step) return;
  static const char* const names[] = {"exit", "abort", "segv", "hang", "kill"};
  if (f.point.empty())
    std::fprintf(stderr, "[fault] rank %d: injected %s at step %lld\n", rank,
                 names[static_cast<int>(f.kind)], static_cast<long long>(step + 1));
  else
    std::fprintf(
        stderr, "[fault] rank %d: injected %s at the %s point of the checkpoint of step %lld\n",
        rank, names[static_cast<int>(f.kind)], f.point.c_str(), static_cast<long long>(step));
  std::fflush(stderr);
  switch (f.kind) {
    case Fault::Kind::exit:
      std::_Exit(5);
    case Fault::Kind::abort:
      std::abort();
    case Fault::Kind::segv:
      std::raise(SIGSEGV);
      std::_Exit(139);
    case Fault::Kind::hang:
      while (true) std::this_thread::sleep_for(std::chrono::seconds(1));
    case Fault::Kind::kill:
      std::raise(SIGKILL);
      std::_Exit(137);
  }
}

}  // namespace hetrain::distributed
