// What a router pays to hear its workers (docs/ROUTING.md, "What the worker link costs"): one
// request out, kReplies replies back kGapMicros apart (as a worker's decode steps send them), over
//   zmq: a DEALER to a ROUTER, read as kvserve-router's WorkerPool reads it: poll(2) on the
//        socket's ZMQ_FD, then receives until one finds nothing (and after a send, receives
//        before polling: a send may take the signal of a message that came meanwhile);
//   tcp: one TCP connection carrying length-prefixed frames, read with poll(2) and recv(2).
// The worker is a child process; both processes run on CPU 0, as router_cpu_trace.sh runs the
// cluster. Prints the router process's CPU (user + system, ZeroMQ's I/O thread included) per
// request for each, alternating. Not built by CMake (nothing runs it in CI):
//
//   g++ -O2 -std=c++20 -pthread tests/bench/link_costs.cc -lzmq -o /tmp/link_costs
//   /tmp/link_costs [requests per run, 2000]
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zmq.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kReplies = 5;
constexpr int kGapMicros = 200;
constexpr size_t kRequestBytes = 3000;  // ~1,000 token ids as protobuf varints
constexpr size_t kReplyBytes = 120;     // one token's GenerateResponse
constexpr int kZmqPort = 47311, kTcpPort = 47312;

void PinToCpu0() {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

double CpuMicros() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e6 + u.ru_utime.tv_usec + u.ru_stime.tv_usec;
}

// --- the worker (child process) ---

void ZmqWorker(int requests) {
  void* ctx = zmq_ctx_new();
  void* s = zmq_socket(ctx, ZMQ_ROUTER);
  zmq_bind(s, ("tcp://127.0.0.1:" + std::to_string(kZmqPort)).c_str());
  std::vector<char> id(256), body(1 << 16), reply(kReplyBytes, 'r');
  for (int r = 0; r < requests; ++r) {
    const int n = zmq_recv(s, id.data(), id.size(), 0);
    zmq_recv(s, body.data(), body.size(), 0);
    for (int k = 0; k < kReplies; ++k) {
      std::this_thread::sleep_for(std::chrono::microseconds(kGapMicros));
      zmq_send(s, id.data(), n, ZMQ_SNDMORE);
      zmq_send(s, reply.data(), reply.size(), 0);
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  zmq_close(s);
  zmq_ctx_term(ctx);
}

bool ReadFully(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t got = recv(fd, p, n, 0);
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

int Listen(int port) {
  const int l = socket(AF_INET, SOCK_STREAM, 0);
  const int one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || listen(l, 4) != 0) {
    perror("tcp worker");
    std::exit(1);
  }
  return l;
}

void TcpWorker(int requests, int listener) {
  const int fd = accept(listener, nullptr, nullptr);
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::vector<char> body(1 << 16);
  std::string frame(4 + kReplyBytes, 'r');
  const uint32_t len = kReplyBytes;
  std::memcpy(frame.data(), &len, 4);
  for (int r = 0; r < requests; ++r) {
    uint32_t n = 0;
    if (!ReadFully(fd, reinterpret_cast<char*>(&n), 4) || !ReadFully(fd, body.data(), n)) break;
    for (int k = 0; k < kReplies; ++k) {
      std::this_thread::sleep_for(std::chrono::microseconds(kGapMicros));
      send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
    }
  }
  close(fd);
}

// --- the router (this process) ---

// CPU microseconds per request over `requests` round trips on ZeroMQ.
double ZmqRouter(int requests) {
  void* ctx = zmq_ctx_new();
  void* s = zmq_socket(ctx, ZMQ_DEALER);
  zmq_connect(s, ("tcp://127.0.0.1:" + std::to_string(kZmqPort)).c_str());
  int fd = -1;
  size_t fd_size = sizeof(fd);
  zmq_getsockopt(s, ZMQ_FD, &fd, &fd_size);
  const std::string request(kRequestBytes, 'q');
  std::vector<char> buf(1 << 16);
  const double start = CpuMicros();
  for (int r = 0; r < requests; ++r) {
    zmq_send(s, request.data(), request.size(), 0);
    bool unread = true;  // the send may have taken a signal
    for (int got = 0; got < kReplies;) {
      if (!unread) {
        pollfd p{fd, POLLIN, 0};
        poll(&p, 1, -1);
      }
      unread = true;
      while (zmq_recv(s, buf.data(), buf.size(), ZMQ_DONTWAIT) >= 0) ++got;
      unread = false;
    }
  }
  const double per = (CpuMicros() - start) / requests;
  zmq_close(s);
  zmq_ctx_term(ctx);
  return per;
}

double TcpRouter(int requests) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(kTcpPort);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  while (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  std::string frame(4 + kRequestBytes, 'q');
  const uint32_t len = kRequestBytes;
  std::memcpy(frame.data(), &len, 4);
  std::vector<char> buf(1 << 16);
  size_t have = 0;
  const double start = CpuMicros();
  for (int r = 0; r < requests; ++r) {
    send(fd, frame.data(), frame.size(), MSG_NOSIGNAL);
    for (int got = 0; got < kReplies;) {
      pollfd p{fd, POLLIN, 0};
      poll(&p, 1, -1);
      const ssize_t n = recv(fd, buf.data() + have, buf.size() - have, MSG_DONTWAIT);
      if (n <= 0) continue;
      have += static_cast<size_t>(n);
      size_t at = 0;  // whole frames out; a partial one stays at the front
      while (have - at >= 4) {
        uint32_t flen = 0;
        std::memcpy(&flen, buf.data() + at, 4);
        if (have - at < 4 + flen) break;
        at += 4 + flen;
        ++got;
      }
      std::memmove(buf.data(), buf.data() + at, have - at);
      have -= at;
    }
  }
  const double per = (CpuMicros() - start) / requests;
  close(fd);
  return per;
}

double Run(bool zmq, int requests) {
  const int listener = zmq ? -1 : Listen(kTcpPort);
  const pid_t child = fork();
  if (child == 0) {
    if (zmq) {
      ZmqWorker(requests);
    } else {
      TcpWorker(requests, listener);
    }
    _exit(0);
  }
  if (listener >= 0) close(listener);
  const double per = zmq ? ZmqRouter(requests) : TcpRouter(requests);
  waitpid(child, nullptr, 0);
  return per;
}

}  // namespace

int main(int argc, char** argv) {
  const int requests = argc > 1 ? std::atoi(argv[1]) : 2000;
  PinToCpu0();
  std::printf("%d requests a run, %d replies each %d us apart; router CPU us per request\n",
              requests, kReplies, kGapMicros);
  for (int i = 0; i < 3; ++i) {
    const double z = Run(true, requests), t = Run(false, requests);
    std::printf("zmq %.1f  tcp %.1f  (tcp/zmq %.2f)\n", z, t, t / z);
  }
}
