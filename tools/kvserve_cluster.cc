// kvserve-cluster: a local cluster on one machine: N kvserve-worker processes and one
// kvserve-router in front, on loopback. Supervises them (a worker that dies is restarted on
// its ports) and stops them all on SIGINT/SIGTERM. Prints the router URL once it is ready.
//
//   kvserve-cluster --model DIR --workers 2 --port 8000 [-- worker flags...]
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/init.h"

ABSL_FLAG(std::string, model, "models/kvserve-tiny-llama3",
          "Model directory; the default is made on first use with kvserve-make-model from "
          "--tokenizer (the real Llama 3 tokenizer, scripts/fetch-tokenizer.sh puts it there)");
ABSL_FLAG(std::string, tokenizer, "models/llama3-tokenizer",
          "Tokenizer for the generated default model");
ABSL_FLAG(int32_t, workers, 2, "Worker processes");
ABSL_FLAG(int32_t, tensor_parallel_size, 1, "Ranks per worker");
ABSL_FLAG(int32_t, port, 8000, "Router HTTP port");
ABSL_FLAG(int32_t, base_port, 5570, "First worker port; each worker takes 3 consecutive ports");
ABSL_FLAG(std::string, policy, "prefix", "Router policy: prefix, round_robin, least_load, session");
ABSL_FLAG(std::string, worker_args, "",
          "Extra flags for every worker, space-separated (e.g. \"--kv-cache-dtype int8\")");
ABSL_FLAG(std::string, router_args, "",
          "Extra flags for the router, space-separated (e.g. \"--admin-token T --w-load 0.5\")");
ABSL_FLAG(int32_t, max_model_len, 2048, "Passed to the workers and the router");

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

pid_t Spawn(const std::vector<std::string>& args, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    std::vector<char*> argv;
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Whether `log` comes to hold `needle` within timeout_s; false at once when `pid` exits first
// (it is reaped) or on a stop signal.
bool WaitForLine(const std::string& log, const std::string& needle, int timeout_s, pid_t pid) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline && !g_stop) {
    const bool exited = waitpid(pid, nullptr, WNOHANG) == pid;
    if (kvserve::ReadFileToString(log).value_or("").find(needle) != std::string::npos) return true;
    if (exited) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return false;
}

// The last non-empty line of `log`: what a process that failed to start said last.
std::string LastLine(const std::string& log) {
  std::string text = kvserve::ReadFileToString(log).value_or("");
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text.substr(text.rfind('\n') + 1);
}

}  // namespace

int main(int argc, char** argv) {
  // Arguments after "--" are worker flags, passed through to every worker as they are.
  const std::vector<char*> positional = kvserve::InitProgram(
      argc, argv, "kvserve-cluster [--model DIR] [--workers N] [--port 8000] [-- worker flags...]");
  namespace fs = std::filesystem;
  const std::string bin = fs::canonical("/proc/self/exe").parent_path().string();
  std::string model = absl::GetFlag(FLAGS_model);
  if (!fs::exists(fs::path(model) / "config.json")) {
    const std::string tok = absl::GetFlag(FLAGS_tokenizer);
    if (!fs::exists(fs::path(tok) / "tokenizer.json")) {
      std::cerr << "kvserve-cluster: no model at " << model << " and no tokenizer at " << tok
                << " to make one (run scripts/fetch-tokenizer.sh)\n";
      return 1;
    }
    std::cerr << "kvserve-cluster: making " << model << " (random weights, Llama 3 tokenizer)\n";
    const std::string cmd =
        absl::StrCat(bin, "/kvserve-make-model --tokenizer '", tok, "' --out '", model, "'");
    if (std::system(cmd.c_str()) != 0) {
      std::cerr << "kvserve-cluster: kvserve-make-model failed\n";
      return 1;
    }
  }
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  const std::string logs =
      (fs::temp_directory_path() / absl::StrCat("kvserve-cluster-", getpid())).string();
  fs::create_directories(logs);
  const int n = absl::GetFlag(FLAGS_workers);
  const int base = absl::GetFlag(FLAGS_base_port);
  const std::string max_len = std::to_string(absl::GetFlag(FLAGS_max_model_len));
  std::vector<std::string> extra(positional.begin() + 1, positional.end());
  for (absl::string_view a :
       absl::StrSplit(absl::GetFlag(FLAGS_worker_args), ' ', absl::SkipEmpty()))
    extra.emplace_back(a);
  auto worker_args = [&](int i) {
    std::vector<std::string> a = {bin + "/kvserve-worker",
                                  "--model",
                                  model,
                                  "--host",
                                  "127.0.0.1",
                                  "--port",
                                  std::to_string(base + 3 * i),
                                  "--events-port",
                                  std::to_string(base + 3 * i + 1),
                                  "--metrics-port",
                                  std::to_string(base + 3 * i + 2),
                                  "--worker-id",
                                  absl::StrCat("worker-", i),
                                  "--max-model-len",
                                  max_len,
                                  "--tensor-parallel-size",
                                  std::to_string(absl::GetFlag(FLAGS_tensor_parallel_size))};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  std::vector<pid_t> workers(n);
  std::vector<std::string> endpoints;
  for (int i = 0; i < n; ++i) {
    const std::string log = absl::StrCat(logs, "/worker-", i, ".log");
    workers[i] = Spawn(worker_args(i), log);
    endpoints.push_back(absl::StrCat("127.0.0.1:", base + 3 * i, ":", base + 3 * i + 1));
  }
  bool failed = false;
  for (int i = 0; i < n && !g_stop; ++i) {
    const std::string log = absl::StrCat(logs, "/worker-", i, ".log");
    if (!WaitForLine(log, "kvserve-worker ready", 120, workers[i])) {
      std::cerr << "kvserve-cluster: worker " << i << " did not start: " << LastLine(log)
                << " (logs in " << logs << ")\n";
      failed = g_stop = true;
    }
  }
  const std::string router_log = logs + "/router.log";
  pid_t router = -1;
  if (!g_stop) {
    std::vector<std::string> router_args = {bin + "/kvserve-router",
                                            "--model",
                                            model,
                                            "--host",
                                            "127.0.0.1",
                                            "--port",
                                            std::to_string(absl::GetFlag(FLAGS_port)),
                                            "--workers",
                                            absl::StrJoin(endpoints, ","),
                                            "--policy",
                                            absl::GetFlag(FLAGS_policy),
                                            "--max-model-len",
                                            max_len};
    for (absl::string_view a :
         absl::StrSplit(absl::GetFlag(FLAGS_router_args), ' ', absl::SkipEmpty())) {
      router_args.emplace_back(a);
    }
    router = Spawn(router_args, router_log);
    // Ready once the router routes to every worker (their first heartbeats reached it).
    if (WaitForLine(router_log, "kvserve-router ready", 60, router) &&
        WaitForLine(router_log, absl::StrCat("kvserve-router: ", n, "/", n, " workers ready"), 60,
                    router)) {
      std::cout << "kvserve-cluster ready: http://127.0.0.1:" << absl::GetFlag(FLAGS_port) << " ("
                << n << " workers, logs in " << logs << ")" << std::endl;
    } else {
      std::cerr << "kvserve-cluster: the router did not start: " << LastLine(router_log) << " (log "
                << router_log << ")\n";
      failed = g_stop = true;
    }
  }
  // Supervise: restart a worker that exits.
  while (!g_stop) {
    int status;
    pid_t pid = waitpid(-1, &status, WNOHANG);
    for (int i = 0; pid > 0 && i < n; ++i) {
      if (pid != workers[i]) continue;
      std::cerr << "kvserve-cluster: worker " << i << " exited; restarting\n";
      workers[i] = Spawn(worker_args(i), absl::StrCat(logs, "/worker-", i, ".log"));
    }
    if (pid > 0 && pid == router) {
      std::cerr << "kvserve-cluster: the router exited; stopping\n";
      failed = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (router > 0) kill(router, SIGTERM);
  for (pid_t p : workers) kill(p, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return failed ? 1 : 0;
}
