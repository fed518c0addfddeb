// kvserve-cluster: a local cluster on one machine: N kvserve-worker processes and one
// kvserve-router in front, on loopback, their links authenticated with CURVE keys made at
// start (--curve=false: plain). Supervises them (a worker that dies is restarted on
// its ports) and stops them all on SIGINT/SIGTERM. Prints the router URL once it is ready.
//
//   kvserve-cluster --model DIR --workers 2 --port 8000 [-- worker flags...]
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "boost/asio/connect.hpp"
#include "boost/asio/ip/tcp.hpp"
#include "boost/beast/core.hpp"
#include "boost/beast/http.hpp"
#include "common/file_util.h"
#include "common/init.h"
#include "common/net/curve.h"

ABSL_FLAG(std::string, model, "models/kvserve-tiny-llama3",
          "Model directory; the default is made on first use with kvserve-make-model from "
          "--tokenizer (the real Llama 3 tokenizer, scripts/fetch-tokenizer.sh puts it there)");
ABSL_FLAG(std::string, tokenizer, "models/llama3-tokenizer",
          "Tokenizer for the generated default model");
ABSL_FLAG(int32_t, workers, 2, "Worker processes");
ABSL_FLAG(int32_t, tensor_parallel_size, 1, "Ranks per worker");
ABSL_FLAG(int32_t, port, 8000, "Router HTTP port");
ABSL_FLAG(int32_t, base_port, 5570, "First worker port; each worker takes 3 consecutive ports");
ABSL_FLAG(std::string, policy, "cost",
          "Router policy: cost, prefix, round_robin, least_load, session");
ABSL_FLAG(std::string, worker_args, "",
          "Extra flags for every worker, space-separated (e.g. \"--kv-cache-dtype int8\")");
ABSL_FLAG(
    std::string, router_args, "",
    "Extra flags for the router, space-separated (e.g. \"--admin-token T --route-miss-weight 2\")");
ABSL_FLAG(int32_t, max_model_len, 2048, "Passed to the workers and the router");
ABSL_FLAG(bool, curve, true,
          "Authenticate and encrypt the router-worker links with fresh CURVE keys (kept in the "
          "log directory); false: plain ZeroMQ on loopback");

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

// Starts args[0] with exactly these arguments (no shell), its output appended to `log` (kept
// private: 0600), or to ours when `log` is empty.
pid_t Spawn(const std::vector<std::string>& args, const std::string& log) {
  pid_t pid = fork();
  if (pid == 0) {
    int fd = log.empty() ? -1 : ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0600);
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

// The status of GET http://127.0.0.1:PORT/TARGET, or 0 when nothing answers within a second.
int HttpGetStatus(int port, const std::string& target) {
  namespace asio = boost::asio;
  namespace http = boost::beast::http;
  asio::io_context io;
  asio::ip::tcp::socket socket(io);
  boost::system::error_code ec;
  socket.connect({asio::ip::address_v4::loopback(), static_cast<unsigned short>(port)}, ec);
  if (ec) return 0;
  const timeval timeout{.tv_sec = 1, .tv_usec = 0};
  setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  http::request<http::empty_body> request{http::verb::get, target, 11};
  request.set(http::field::host, "127.0.0.1");
  http::write(socket, request, ec);
  boost::beast::flat_buffer buffer;
  http::response<http::string_body> response;
  if (!ec) http::read(socket, buffer, response, ec);
  return ec ? 0 : response.result_int();
}

// Whether process `pid` becomes ready within timeout_s: it wrote `ports_file` (so the port is
// its own, not another process's) and GET TARGET on `port` answers 200. False at once when
// `pid` exits first (it is reaped) or on a stop signal.
bool WaitUntilReady(pid_t pid, const std::string& ports_file, int port, const std::string& target,
                    int timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline && !g_stop) {
    const bool exited = waitpid(pid, nullptr, WNOHANG) == pid;
    if (exited) return false;
    if (std::filesystem::exists(ports_file) && HttpGetStatus(port, target) == 200) return true;
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

// Makes the default model on first use (random weights around --tokenizer); false after
// saying why it could not.
bool EnsureModel(const std::string& bin, const std::string& model) {
  namespace fs = std::filesystem;
  if (fs::exists(fs::path(model) / "config.json")) return true;
  const std::string tok = absl::GetFlag(FLAGS_tokenizer);
  if (!fs::exists(fs::path(tok) / "tokenizer.json")) {
    std::cerr << "kvserve-cluster: no model at " << model << " and no tokenizer at " << tok
              << " to make one (run scripts/fetch-tokenizer.sh)\n";
    return false;
  }
  std::cerr << "kvserve-cluster: making " << model << " (random weights, Llama 3 tokenizer)\n";
  const pid_t pid =
      Spawn({bin + "/kvserve-make-model", "--tokenizer", tok, "--out", model}, /*log=*/"");
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status) ||
      WEXITSTATUS(status) != 0) {
    std::cerr << "kvserve-cluster: kvserve-make-model failed\n";
    return false;
  }
  return true;
}

// A new directory only we can read (mkdtemp: mode 0700) for the logs and ports files.
std::string MakePrivateDir() {
  std::string dir = (std::filesystem::temp_directory_path() / "kvserve-cluster-XXXXXX").string();
  if (mkdtemp(dir.data()) == nullptr) {
    std::cerr << "kvserve-cluster: cannot make a log directory " << dir << ": "
              << std::strerror(errno) << "\n";
    std::exit(1);
  }
  return dir;
}

// Fresh router and worker key pairs under dir/keys: router.key, worker.key, worker.pub and
// clients/router.pub (the worker's allowed clients). Exits saying why if it cannot.
void MakeClusterKeys(const std::string& dir) {
  const auto write = [&](const std::string& name, const kvserve::CurveKeyFile& key) {
    if (absl::Status s = kvserve::WriteCurveKeyFile(dir + "/keys/" + name, key,
                                                    "kvserve-cluster's key, made at start");
        !s.ok()) {
      std::cerr << "kvserve-cluster: " << s.message() << "\n";
      std::exit(1);
    }
  };
  std::filesystem::create_directories(dir + "/keys/clients");
  absl::StatusOr<kvserve::CurveKeyPair> router = kvserve::GenerateCurveKeyPair();
  absl::StatusOr<kvserve::CurveKeyPair> worker = kvserve::GenerateCurveKeyPair();
  if (!router.ok() || !worker.ok()) {
    std::cerr << "kvserve-cluster: no CURVE keys (" << router.status() << "); try --curve=false\n";
    std::exit(1);
  }
  write("router.key", {true, router->secret_key});
  write("clients/router.pub", {false, router->public_key});
  write("worker.key", {true, worker->secret_key});
  write("worker.pub", {false, worker->public_key});
}

// The processes of one local cluster: worker i on ports base + 3i (requests), + 1 (events) and
// + 2 (metrics and probes), the router in front; logs and ports files in `logs`.
class Cluster {
 public:
  Cluster(std::string bin, std::string model, std::vector<std::string> worker_flags)
      : bin_(std::move(bin)),
        model_(std::move(model)),
        worker_flags_(std::move(worker_flags)),
        logs_(MakePrivateDir()),
        n_(absl::GetFlag(FLAGS_workers)),
        base_(absl::GetFlag(FLAGS_base_port)),
        max_len_(std::to_string(absl::GetFlag(FLAGS_max_model_len))),
        curve_(absl::GetFlag(FLAGS_curve)) {
    if (curve_) MakeClusterKeys(logs_);
  }

  // Starts the workers, then the router once every worker is ready; false after saying which
  // process did not start and why. A stop signal ends it early (true).
  bool Start() {
    for (int i = 0; i < n_; ++i) workers_.push_back(Spawn(WorkerArgs(i), WorkerFile(i, "log")));
    for (int i = 0; i < n_ && !g_stop; ++i) {
      if (!WaitUntilReady(workers_[i], WorkerFile(i, "ports"), base_ + 3 * i + 2, "/ready", 120)) {
        if (g_stop) return true;
        std::cerr << "kvserve-cluster: worker " << i
                  << " did not start: " << LastLine(WorkerFile(i, "log")) << " (logs in " << logs_
                  << ")\n";
        return false;
      }
    }
    if (g_stop) return true;
    const int port = absl::GetFlag(FLAGS_port);
    router_ = Spawn(RouterArgs(), logs_ + "/router.log");
    // Ready once the router routes to every worker (their first heartbeats reached it).
    if (!WaitUntilReady(router_, logs_ + "/router.ports", port,
                        absl::StrCat("/ready?min_workers=", n_), 60)) {
      if (g_stop) return true;
      std::cerr << "kvserve-cluster: the router did not start: " << LastLine(logs_ + "/router.log")
                << " (log " << logs_ << "/router.log)\n";
      return false;
    }
    std::cout << "kvserve-cluster ready: http://127.0.0.1:" << port << " (" << n_
              << " workers, logs in " << logs_ << ")" << std::endl;
    return true;
  }

  // Restarts a worker that exits, until a stop signal; false when the router exits.
  bool Supervise() {
    while (!g_stop) {
      int status;
      const pid_t pid = waitpid(-1, &status, WNOHANG);
      for (int i = 0; pid > 0 && i < n_; ++i) {
        if (pid != workers_[i]) continue;
        std::cerr << "kvserve-cluster: worker " << i << " exited; restarting\n";
        workers_[i] = Spawn(WorkerArgs(i), WorkerFile(i, "log"));
      }
      if (pid > 0 && pid == router_) {
        std::cerr << "kvserve-cluster: the router exited; stopping\n";
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return true;
  }

  // SIGTERM to every process, then up to 30 s for them to drain and exit.
  void Stop() {
    if (router_ > 0) kill(router_, SIGTERM);
    for (pid_t p : workers_) kill(p, SIGTERM);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      if (waitpid(-1, nullptr, WNOHANG) < 0 && errno == ECHILD) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

 private:
  [[nodiscard]] std::string WorkerFile(int i, const char* kind) const {
    return absl::StrCat(logs_, "/worker-", i, ".", kind);
  }

  [[nodiscard]] std::vector<std::string> WorkerArgs(int i) const {
    std::vector<std::string> a = {bin_ + "/kvserve-worker",
                                  "--model",
                                  model_,
                                  "--host",
                                  "127.0.0.1",
                                  "--port",
                                  std::to_string(base_ + 3 * i),
                                  "--events-port",
                                  std::to_string(base_ + 3 * i + 1),
                                  "--metrics-port",
                                  std::to_string(base_ + 3 * i + 2),
                                  "--worker-id",
                                  absl::StrCat("worker-", i),
                                  "--max-model-len",
                                  max_len_,
                                  "--tensor-parallel-size",
                                  std::to_string(absl::GetFlag(FLAGS_tensor_parallel_size)),
                                  "--ports-file",
                                  WorkerFile(i, "ports")};
    if (curve_) {
      a.insert(a.end(), {"--curve-secret-key-file", logs_ + "/keys/worker.key",
                         "--curve-allowed-clients-dir", logs_ + "/keys/clients"});
    }
    a.insert(a.end(), worker_flags_.begin(), worker_flags_.end());
    return a;
  }

  [[nodiscard]] std::vector<std::string> RouterArgs() const {
    std::vector<std::string> endpoints;
    for (int i = 0; i < n_; ++i) {
      endpoints.push_back(absl::StrCat("127.0.0.1:", base_ + 3 * i, ":", base_ + 3 * i + 1));
    }
    std::vector<std::string> a = {bin_ + "/kvserve-router",
                                  "--model",
                                  model_,
                                  "--host",
                                  "127.0.0.1",
                                  "--port",
                                  std::to_string(absl::GetFlag(FLAGS_port)),
                                  "--workers",
                                  absl::StrJoin(endpoints, ","),
                                  "--policy",
                                  absl::GetFlag(FLAGS_policy),
                                  "--max-model-len",
                                  max_len_,
                                  "--ports-file",
                                  logs_ + "/router.ports"};
    if (curve_) {
      a.insert(a.end(), {"--curve-secret-key-file", logs_ + "/keys/router.key",
                         "--curve-server-key-file", logs_ + "/keys/worker.pub"});
    }
    for (absl::string_view f :
         absl::StrSplit(absl::GetFlag(FLAGS_router_args), ' ', absl::SkipEmpty())) {
      a.emplace_back(f);
    }
    return a;
  }

  const std::string bin_, model_;
  const std::vector<std::string> worker_flags_;
  const std::string logs_;
  const int n_, base_;
  const std::string max_len_;
  const bool curve_;
  std::vector<pid_t> workers_;
  pid_t router_ = -1;
};

}  // namespace

int main(int argc, char** argv) {
  // Arguments after "--" are worker flags, passed through to every worker as they are.
  const std::vector<char*> positional = kvserve::InitProgram(
      argc, argv, "kvserve-cluster [--model DIR] [--workers N] [--port 8000] [-- worker flags...]");
  const std::string bin = std::filesystem::canonical("/proc/self/exe").parent_path().string();
  const std::string model = absl::GetFlag(FLAGS_model);
  if (!EnsureModel(bin, model)) return 1;
  std::signal(SIGINT, OnSignal);
  std::signal(SIGTERM, OnSignal);
  std::vector<std::string> worker_flags(positional.begin() + 1, positional.end());
  for (absl::string_view a :
       absl::StrSplit(absl::GetFlag(FLAGS_worker_args), ' ', absl::SkipEmpty())) {
    worker_flags.emplace_back(a);
  }
  Cluster cluster(bin, model, std::move(worker_flags));
  const bool ok = cluster.Start() && cluster.Supervise();
  cluster.Stop();
  return ok ? 0 : 1;
}
