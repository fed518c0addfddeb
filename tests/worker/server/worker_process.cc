#include "tests/worker/server/worker_process.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"
#include "tests/testing/net.h"
#include "tests/testing/paths.h"

namespace kvserve::testing {

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

absl::StatusOr<std::unique_ptr<WorkerProcess>> WorkerProcess::Start(
    const std::vector<std::string>& args) {
  // Free ports are found by binding and closing, so another process can take one before the
  // worker binds it; a worker that exits while starting is retried on new ports.
  absl::Status last;
  for (int attempt = 0; attempt < 3; ++attempt) {
    auto w = std::make_unique<WorkerProcess>();
    w->port_ = FreePort();
    w->events_port_ = FreePort();
    w->metrics_port_ = FreePort();
    w->ports_file_ = MakeTempDir() + "/ports.json";
    std::vector<std::string> full = {KVSERVE_WORKER_BINARY,
                                     "--host",
                                     "127.0.0.1",
                                     "--port",
                                     std::to_string(w->port_),
                                     "--events-port",
                                     std::to_string(w->events_port_),
                                     "--metrics-port",
                                     std::to_string(w->metrics_port_),
                                     "--ports-file",
                                     w->ports_file_,
                                     "--heartbeat-ms",
                                     "50"};
    full.insert(full.end(), args.begin(), args.end());
    w->pid_ = fork();
    if (w->pid_ == 0) {
      std::vector<char*> argv;
      for (std::string& a : full) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(argv[0], argv.data());
      _exit(127);
    }
    absl::StatusOr<uint64_t> id = w->WaitForNewInstance(0, 60);
    if (id.ok()) return w;
    last = id.status();
  }
  return last;
}

absl::StatusOr<uint64_t> WorkerProcess::WaitForNewInstance(uint64_t old_instance, int timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    std::ifstream in(ports_file_);
    nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
    if (!j.is_discarded() && j.contains("instance_id") &&
        (old_instance == 0 || j["instance_id"].get<uint64_t>() != old_instance)) {
      instance_id_ = j["instance_id"].get<uint64_t>();
      link_port_ = j.value("link_port", 0);
      return instance_id_;
    }
    if (!Alive()) return absl::InternalError("kvserve-worker exited while starting");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return absl::DeadlineExceededError("kvserve-worker did not become ready");
}

bool WorkerProcess::Alive() {
  if (pid_ <= 0) return false;
  int status;
  return waitpid(pid_, &status, WNOHANG) == 0;
}

int WorkerProcess::Terminate(int timeout_s) {
  if (pid_ <= 0) return 0;
  kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    pid_t r = waitpid(pid_, &status, WNOHANG);
    if (r == pid_) {
      pid_ = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return -1000;
}

WorkerProcess::~WorkerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status;
    waitpid(pid_, &status, 0);
  }
}

std::pair<int, std::string> RunWorkerToExit(const std::vector<std::string>& args) {
  std::string command = KVSERVE_WORKER_BINARY;
  for (const std::string& a : args) command += " '" + a + "'";  // test arguments: no quotes
  FILE* out = popen((command + " 2>&1").c_str(), "r");
  if (out == nullptr) return {-1, "popen failed"};
  std::string said;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), out)) > 0;) said.append(buf, n);
  const int status = pclose(out);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, said};
}

absl::StatusOr<std::pair<int, std::string>> HttpGet(int port, const std::string& path) {
  const int fd = ConnectLoopback(port);
  if (fd < 0) return absl::UnavailableError("connect failed");
  const std::string req =
      absl::StrCat("GET ", path, " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
  if (write(fd, req.data(), req.size()) < 0) {
    close(fd);
    return absl::UnavailableError("write failed");
  }
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) out.append(buf, n);
  close(fd);
  const size_t sp = out.find(' ');
  const size_t body = out.find("\r\n\r\n");
  if (sp == std::string::npos || body == std::string::npos)
    return absl::InternalError("bad HTTP response");
  return std::make_pair(std::stoi(out.substr(sp + 1, 3)), out.substr(body + 4));
}

Client::Client(zmq::context_t& ctx, int port, const CurveClientKeys* curve, bool small_buffers)
    : socket_(ctx, zmq::socket_type::dealer) {
  socket_.set(zmq::sockopt::linger, 0);
  if (small_buffers) {
    socket_.set(zmq::sockopt::rcvhwm, 1);
    socket_.set(zmq::sockopt::rcvbuf, 4096);
  }
  if (curve != nullptr) CHECK(MakeCurveClient(socket_, curve->own, curve->server_key).ok());
  socket_.connect(absl::StrCat("tcp://127.0.0.1:", port));
}

absl::Status Client::Send(const google::protobuf::Message& m) {
  return SendMessage(socket_, "", m);
}

std::optional<ReceivedMessage> Client::Receive(int timeout_ms) {
  zmq::pollitem_t items[] = {{socket_.handle(), 0, ZMQ_POLLIN, 0}};
  zmq::poll(items, 1, std::chrono::milliseconds(timeout_ms));
  if (!(items[0].revents & ZMQ_POLLIN)) return std::nullopt;
  auto m = ReceiveMessage(socket_, false, zmq::recv_flags::dontwait);
  if (!m.ok() || !m->has_value()) return std::nullopt;
  return **m;
}

kvserve::v1::GenerateRequest MakeRequest(const std::string& id, const std::vector<int32_t>& prompt,
                                         int max_tokens, bool stream) {
  kvserve::v1::GenerateRequest r;
  r.set_request_id(id);
  for (int32_t t : prompt) r.add_prompt_token_ids(t);
  r.set_max_tokens(max_tokens);
  r.set_stream(stream);
  r.mutable_sampling()->set_ignore_eos(true);
  return r;
}

}  // namespace kvserve::testing
