// CURVE authentication of the ZeroMQ links between routers and workers (docs/SECURITY.md).
// Workers are CURVE servers and accept only the router public keys they were given, through a
// ZAP handler; routers are CURVE clients that know the workers' public key. Every message on
// an authenticated link is encrypted, for the ROUTER/DEALER and the PUB/SUB sockets alike.
//
// Key files are text: '#' comment lines, then one line "public KEY" or "secret KEY", where KEY
// is 32 bytes in Z85 (40 characters, ZeroMQ's form) or base64 (44). Wherever a public key is
// read, a secret-key file is accepted too and stands for its public half.
//
//   ASSIGN_OR_RETURN(CurveKeyPair own, ReadCurveKeyPair("router.key"));
//   ASSIGN_OR_RETURN(std::string server, ReadCurvePublicKey("worker.pub"));
//   RETURN_IF_ERROR(MakeCurveClient(dealer, own, server));
#ifndef KVSERVE_COMMON_NET_CURVE_H_
#define KVSERVE_COMMON_NET_CURVE_H_

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "zmq.hpp"

namespace kvserve {

// Keys in Z85 (40 characters each).
struct CurveKeyPair {
  std::string public_key;
  std::string secret_key;
};

// A client's keys: its own pair and the public key of the servers it connects to.
struct CurveClientKeys {
  CurveKeyPair own;
  std::string server_key;
};

struct CurveKeyFile {
  bool secret = false;
  std::string key;  // Z85
};

absl::StatusOr<CurveKeyPair> GenerateCurveKeyPair();
// The public half of a Z85 secret key.
absl::StatusOr<std::string> CurvePublicKey(std::string_view secret_z85);

// Parses a key file's text; InvalidArgument saying what is wrong. FormatCurveKeyFile writes one
// (`comment` becomes a '#' line).
absl::StatusOr<CurveKeyFile> ParseCurveKeyFile(std::string_view text);
std::string FormatCurveKeyFile(const CurveKeyFile& key, std::string_view comment);

// Writes a new key file (never over an existing one): mode 0600 for a secret key, 0644 for a
// public one.
absl::Status WriteCurveKeyFile(const std::string& path, const CurveKeyFile& key,
                               std::string_view comment);

// A secret-key file's pair; a public key file is refused.
absl::StatusOr<CurveKeyPair> ReadCurveKeyPair(const std::string& path);
// A public key file, or a secret-key file's public half.
absl::StatusOr<std::string> ReadCurvePublicKey(const std::string& path);

struct AllowedClient {
  std::string name;        // the file name without its extension
  std::string public_key;  // Z85
};
// Every key file in `dir` (names starting with '.' are skipped: Kubernetes keeps its own
// bookkeeping there). InvalidArgument naming the file if one does not parse, and if none is there.
absl::StatusOr<std::vector<AllowedClient>> ReadAllowedClients(const std::string& dir);

// Whether `host` names the loopback interface only (127.0.0.0/8, ::1, localhost).
bool IsLoopbackHost(std::string_view host);

// A server socket: CURVE with `secret_key`; connections are checked by the context's
// ZapAuthenticator. Must be called before bind.
absl::Status MakeCurveServer(zmq::socket_t& socket, const std::string& secret_key);
// A client socket that authenticates as `own` and accepts only a server holding `server_key`.
// Must be called before connect.
absl::Status MakeCurveClient(zmq::socket_t& socket, const CurveKeyPair& own,
                             const std::string& server_key);

// The ZAP handler of one ZeroMQ context: accepts a CURVE client only if its public key is in
// the allowed directory, read again at most once a second (a Kubernetes Secret's update takes
// effect without a restart), or in `also_allowed` (keys the process made for itself, such as
// kvserve-worker --openai-port's link to its own worker). Runs a thread of its own until destroyed;
// must be started before any CURVE server socket of the context binds and destroyed before the
// context.
class ZapAuthenticator {
 public:
  static absl::StatusOr<std::unique_ptr<ZapAuthenticator>> Start(
      zmq::context_t& ctx, const std::string& allowed_dir,
      std::vector<AllowedClient> also_allowed = {});
  ~ZapAuthenticator();

  [[nodiscard]] int64_t accepted() const { return accepted_.load(); }
  [[nodiscard]] int64_t refused() const { return refused_.load(); }

 private:
  ZapAuthenticator(std::string dir, std::vector<AllowedClient> allowed,
                   std::vector<AllowedClient> also_allowed)
      : dir_(std::move(dir)), allowed_(std::move(allowed)), also_(std::move(also_allowed)) {}
  void Loop(zmq::socket_t& socket);
  // Answers one ZAP request (its frames); the reply's frames.
  std::vector<std::string> Answer(const std::vector<std::string>& request);
  void Reload();

  std::string dir_;
  std::vector<AllowedClient> allowed_;  // only the handler's thread uses it after Start
  const std::vector<AllowedClient> also_;
  std::chrono::steady_clock::time_point loaded_ = std::chrono::steady_clock::now();
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> accepted_{0}, refused_{0};
  std::thread thread_;
};

}  // namespace kvserve

#endif  // KVSERVE_COMMON_NET_CURVE_H_
