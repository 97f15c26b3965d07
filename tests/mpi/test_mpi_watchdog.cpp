// SPDX-License-Identifier: MIT
// The MPI watchdog, run under mpirun on 3 processes with a short NAMEDAX_MPI_TIMEOUT: the last
// process misbehaves as the scenario (the first argument) says, and the others must each end
// with a collective_error that names the collective, the call and the missing process,
// within the deadline, instead of waiting forever.
//   early_return   the last process returns from main without calling the process map
//   stuck          the last process hangs in its own code inside the map, before a psum
//   stuck_matmul   the same, before an all_gather_matmul: the messages name it as well as
//                  the exchange inside it that waited
//   stuck_late     the same, and process 1 comes to the psum late (after 0.6 of the timeout):
//                  process 0 gives up first, and process 1 ends with its report
//   killed         the last process is killed by a signal inside the map (mpirun must keep
//                  the job running: --enable-recovery)
//   fault          every process runs process maps of a psum in a loop, each result checked,
//                  until a fault injected from outside on the last process ends it (killed
//                  by a signal, stopped, its host's link taken down: scripts/hosts_apart.sh);
//                  after the first map each process writes its PID to
//                  NAMEDAX_WATCHDOG_PID_FILE.<rank>. No fault within 20 s fails.
//   slow           the same loop, 12 maps of a 256 KiB psum, with no fault: every sum must be
//                  right and no error come (over a slowed link: slow is not failed)
// The survivors check their messages and the time they took; rank 0 gathers the verdicts and
// prints "watchdog passed" or "watchdog FAILED: ..." (what CTest looks for), then the
// environment ends the program with MPI_Abort, as it does after a timeout (slow: it ends
// normally).
#include <namedax/collective_matmul.hpp>
#include <namedax/mpi.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <exception>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>

using namespace namedax::literals;

namespace {

/// What is wrong with this survivor's outcome, or "" when it is what the watchdog promises.
std::string verdict(const std::string& scenario, const std::string& text, double seconds, int rank) {
  const double limit = namedax::mpi::timeout().count();
  auto expect = [&](const std::string& part) {
    return text.find(part) != std::string::npos ? std::string() : "no \"" + part + "\" in: " + text;
  };
  if (scenario == "stuck_late" && rank == 1)
    if (auto wrong = expect("on process i=1 (rank 1): process i=0 (rank 0) waited "); !wrong.empty()) return wrong;
  for (const std::string& part :
       {std::string(scenario == "early_return"   ? "namedax::mpi::pmap"
                    : scenario == "fault"        ? "namedax::"  // the fault may come in the map's own agreements
                    : scenario == "stuck_matmul" ? " (in namedax::all_gather_matmul) on process "
                                                 : "namedax::psum over ('i',)"),
        std::string(" on process "),
        std::string(" s in collective call "), std::string(") and gave up; "),
        std::string("processes that did not arrive: rank 2 (no answer: returned, died, or busy outside namedax's calls)")})
    if (auto wrong = expect(part); !wrong.empty()) return wrong;
  // The deadline, the census (at most 2 s) and a loaded machine's slack.
  if (seconds > limit + 20) return "took " + std::to_string(seconds) + " s with a timeout of " + std::to_string(limit) + " s";
  // The flight record, where the test asks for one: this process's last calls.
  if (const char* record = std::getenv("NAMEDAX_MPI_FLIGHT_RECORD")) {
    std::ifstream file(std::string(record) + "." + std::to_string(rank));
    std::stringstream contents;
    contents << file.rdbuf();
    if (contents.str().find("namedax flight record of process ") == std::string::npos ||
        contents.str().find("then: ") == std::string::npos)
      return "no flight record in " + std::string(record) + "." + std::to_string(rank) + ": " + contents.str();
  }
  return "";
}

double since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Rank 1 tells rank 0 what is wrong with its outcome (point to point: the collectives wait
/// for rank 2), and rank 0 prints both verdicts, with `said` after a pass.
void conclude(int rank, const std::string& scenario, const std::string& wrong, const std::string& said) {
  if (rank == 1) {
    MPI_Send(wrong.data(), static_cast<int>(wrong.size()), MPI_CHAR, 0, 99, MPI_COMM_WORLD);
    char done = 0;
    MPI_Recv(&done, 1, MPI_CHAR, 0, 98, MPI_COMM_WORLD, MPI_STATUS_IGNORE);  // until rank 0 has printed
  } else if (rank == 0) {
    MPI_Status status;
    MPI_Probe(1, 99, MPI_COMM_WORLD, &status);
    int length = 0;
    MPI_Get_count(&status, MPI_CHAR, &length);
    std::string other(static_cast<std::size_t>(length), '\0');
    MPI_Recv(other.data(), length, MPI_CHAR, 1, 99, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (wrong.empty() && other.empty())
      std::printf("watchdog passed (%s): %s\n", scenario.c_str(), said.c_str());
    else
      std::printf("watchdog FAILED (%s): rank 0: %s | rank 1: %s\n", scenario.c_str(), wrong.c_str(), other.c_str());
    std::fflush(stdout);
    const char done = 1;
    MPI_Send(&done, 1, MPI_CHAR, 1, 98, MPI_COMM_WORLD);
  }
}

/// fault and slow: process maps of a psum of each process's own slice in a loop, each result
/// checked, until rank 0 asks the others to stop (a flag in the last element of its slice) or
/// an error ends it.
void loop(int rank, const std::string& scenario) {
  const bool slow = scenario == "slow";
  const std::size_t n = slow ? 65536 : 16;  // floats per process
  const auto begin = std::chrono::steady_clock::now();
  auto call = begin;
  std::string wrong, text;
  double longest = 0;
  int maps = 0;
  try {
    for (bool stop = false; !stop; ++maps) {
      const float k = static_cast<float>(maps % 7 + 1);
      xt::xarray<float> mine = xt::ones<float>({std::size_t{1}, n}) * (k * static_cast<float>(rank + 1));
      mine(0, n - 1) = rank == 0 && (slow ? maps == 11 : since(begin) > 20) ? 1.f : 0.f;
      call = std::chrono::steady_clock::now();
      const xt::xarray<float> sum = namedax::mpi::pmap<"i">([](auto x) { return namedax::psum(x, "i"_ax); })(mine);
      longest = std::max(longest, since(call));
      if (sum.shape() != mine.shape()) {
        wrong = "map " + std::to_string(maps) + ": a result of the wrong shape";
        break;
      }
      for (std::size_t j = 0; j + 1 < n && wrong.empty(); ++j)
        if (sum(0, j) != 6 * k)
          wrong = "map " + std::to_string(maps) + ": element " + std::to_string(j) + " is " + std::to_string(sum(0, j)) +
                  ", not " + std::to_string(6 * k);
      if (!wrong.empty()) break;
      stop = sum(0, n - 1) != 0;
      if (maps == 0)
        if (const char* file = std::getenv("NAMEDAX_WATCHDOG_PID_FILE"))
          std::ofstream(std::string(file) + "." + std::to_string(rank)) << getpid() << "\n";
      if (!slow) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the processes' own work
    }
  } catch (const namedax::collective_error& e) {
    text = e.what();
  } catch (const std::exception& e) {
    wrong = std::string("not a collective_error: ") + e.what();
  }
  const double failing = since(call);  // the call an error ended: from its start to the error
  std::string said;
  if (rank == 2) return;  // slow: it ends normally (fault: the others end it)
  if (slow) {
    if (wrong.empty() && !text.empty()) wrong = "an error over a slow link: " + text;
    said = std::to_string(maps) + " maps of a psum of " + std::to_string(n * 4 / 1024) + " KiB per process, each right, in " +
           std::to_string(since(begin)) + " s (the longest " + std::to_string(longest) + " s)";
  } else if (wrong.empty()) {
    if (text.empty())
      wrong = "no fault came in 20 s (" + std::to_string(maps) + " maps ran)";
    else
      wrong = verdict(scenario, text, failing, rank);
    // A later process map fails at once, naming the timeout.
    try {
      const xt::xarray<float> mine = xt::ones<float>({std::size_t{1}, std::size_t{1}});
      (void)namedax::mpi::pmap<"i">([](auto x) { return namedax::psum(x, "i"_ax); })(mine);
      wrong += " a process map after the timeout ran";
    } catch (const namedax::collective_error& e) {
      if (std::string(e.what()).find("timed out earlier in this program") == std::string::npos)
        wrong += std::string(" a process map after the timeout said: ") + e.what();
    }
    said = "after " + std::to_string(maps) + " maps, the failing call ended in " + std::to_string(failing) +
           " s; rank 0 said: " + text;
  }
  conclude(rank, scenario, wrong, said);
}

}  // namespace

int main(int argc, char** argv) {
  namedax::mpi::environment env(argc, argv);
  const std::string scenario = argc > 1 ? argv[1] : "";
  const int rank = env.rank(), last = env.size() - 1;
  if (env.size() != 3 || (scenario != "early_return" && scenario != "stuck" && scenario != "stuck_matmul" &&
                          scenario != "stuck_late" && scenario != "killed" && scenario != "fault" && scenario != "slow")) {
    if (rank == 0)
      std::printf("watchdog FAILED: run on 3 processes with early_return, stuck, stuck_matmul, stuck_late, killed, "
                  "fault or slow\n");
    return 1;
  }
  if (scenario == "fault" || scenario == "slow") {
    loop(rank, scenario);
    return 0;  // fault: the environment aborts the program
  }
  if (rank == last && scenario == "early_return") return 0;  // never calls the map

  // The scenario's misbehaviour, then `collective`.
  auto misbehaving = [&](auto collective) {
    return [&, collective](auto x) {
      if (rank == last && scenario == "killed") std::raise(SIGKILL);
      if (rank == last) std::this_thread::sleep_for(std::chrono::minutes(5));  // stuck in its own code
      if (rank == 1 && scenario == "stuck_late") std::this_thread::sleep_for(0.6 * namedax::mpi::timeout());
      return collective(x);
    };
  };
  auto psum = [](auto x) { return namedax::psum(x, "i"_ax); };
  const xt::xarray<float> w = 2.f * xt::ones<float>({1, 1});
  auto matmul = [&w](auto x) { return namedax::all_gather_matmul(x, w, "i"_ax); };
  auto run = [&] {
    const xt::xarray<float> blocks = xt::ones<float>({3, 1, 1});
    if (scenario == "stuck_matmul") (void)namedax::mpi::pmap<"i">(misbehaving(matmul))(blocks);
    else (void)namedax::mpi::pmap<"i">(misbehaving(psum))(blocks);
  };
  const auto start = std::chrono::steady_clock::now();
  std::string text = "no error";
  try {
    run();
  } catch (const namedax::collective_error& e) {
    text = e.what();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::string wrong = verdict(scenario, text, seconds, rank);
  // A later process map fails at once, naming the timeout.
  try {
    run();
    wrong += " a process map after the timeout ran";
  } catch (const namedax::collective_error& e) {
    if (std::string(e.what()).find("timed out earlier in this program") == std::string::npos)
      wrong += std::string(" a process map after the timeout said: ") + e.what();
  }

  conclude(rank, scenario, wrong, "rank 0 said: " + text);
  return 0;  // the environment aborts the program: MPI cannot finalize with rank 2 missing
}
