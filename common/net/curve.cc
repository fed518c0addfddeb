#include "common/net/curve.h"

#include <fcntl.h>
#include <unistd.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/file_util.h"
#include "common/net/zmq_framing.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "glog/logging.h"

namespace kvserve {
namespace {

constexpr size_t kKeyBytes = 32, kZ85Chars = 40, kBase64Chars = 44;
constexpr char kZapEndpoint[] = "inproc://zeromq.zap.01";
constexpr char kZapDomain[] = "kvserve";

// 32 binary bytes from Z85 or base64; InvalidArgument otherwise.
absl::StatusOr<std::string> DecodeKey(std::string_view text) {
  std::string bytes;
  if (text.size() == kZ85Chars) {
    bytes.resize(kKeyBytes);
    const std::string z(text);
    if (zmq_z85_decode(reinterpret_cast<uint8_t*>(bytes.data()), z.c_str()) == nullptr) {
      return absl::InvalidArgumentError("the key is 40 characters but not Z85");
    }
    return bytes;
  }
  if (text.size() == kBase64Chars && absl::Base64Unescape(Sv(text), &bytes) &&
      bytes.size() == kKeyBytes) {
    return bytes;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("a key is 32 bytes in Z85 (40 characters) or base64 (44); this one has ",
                   text.size(), " characters"));
}

std::string EncodeZ85(std::string_view bytes) {
  char z85[kZ85Chars + 1] = {};
  zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  return z85;
}

absl::Status SetOptions(zmq::socket_t& socket, const char* what, auto&& set) {
  try {
    set();
  } catch (const zmq::error_t& e) {
    return absl::InternalError(
        absl::StrCat(what, ": ", e.what(), " (is libzmq built with CURVE? zmq_has(\"curve\"))"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CurveKeyPair> GenerateCurveKeyPair() {
  char pub[kZ85Chars + 1] = {}, sec[kZ85Chars + 1] = {};
  if (zmq_curve_keypair(pub, sec) != 0) {
    return absl::InternalError(absl::StrCat("zmq_curve_keypair: ", zmq_strerror(zmq_errno())));
  }
  return CurveKeyPair{pub, sec};
}

absl::StatusOr<std::string> CurvePublicKey(std::string_view secret_z85) {
  ASSIGN_OR_RETURN(std::string bytes, DecodeKey(secret_z85));
  const std::string secret = EncodeZ85(bytes);
  char pub[kZ85Chars + 1] = {};
  if (zmq_curve_public(pub, secret.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("zmq_curve_public: ", zmq_strerror(zmq_errno())));
  }
  return std::string(pub);
}

absl::StatusOr<CurveKeyFile> ParseCurveKeyFile(std::string_view text) {
  std::vector<absl::string_view> lines;
  for (absl::string_view line : absl::StrSplit(Sv(text), '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty() && line[0] != '#') lines.push_back(line);
  }
  if (lines.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a key file holds one line \"public KEY\" or \"secret KEY\" besides '#' comments; found ",
        lines.size(), " lines"));
  }
  std::vector<absl::string_view> words =
      absl::StrSplit(lines[0], absl::ByAnyChar(" \t"), absl::SkipEmpty());
  if (words.size() != 2 || (words[0] != "public" && words[0] != "secret")) {
    return absl::InvalidArgumentError(
        "a key file's line is \"public KEY\" or \"secret KEY\" (kvserve-keygen writes them)");
  }
  ASSIGN_OR_RETURN(std::string bytes, DecodeKey(StdSv(words[1])));
  return CurveKeyFile{words[0] == "secret", EncodeZ85(bytes)};
}

std::string FormatCurveKeyFile(const CurveKeyFile& key, std::string_view comment) {
  std::string out;
  for (absl::string_view line : absl::StrSplit(Sv(comment), '\n', absl::SkipEmpty())) {
    absl::StrAppend(&out, "# ", line, "\n");
  }
  absl::StrAppend(&out, key.secret ? "secret " : "public ", key.key, "\n");
  return out;
}

absl::Status WriteCurveKeyFile(const std::string& path, const CurveKeyFile& key,
                               std::string_view comment) {
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, key.secret ? 0600 : 0644);
  if (fd < 0) return absl::InvalidArgumentError(absl::StrCat(path, ": ", std::strerror(errno)));
  const std::string text = FormatCurveKeyFile(key, comment);
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  const int saved = errno;
  close(fd);
  if (!ok) return absl::InternalError(absl::StrCat(path, ": ", std::strerror(saved)));
  return absl::OkStatus();
}

namespace {

absl::StatusOr<CurveKeyFile> ReadKeyFile(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  absl::StatusOr<CurveKeyFile> key = ParseCurveKeyFile(text);
  if (!key.ok())
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", key.status().message()));
  return key;
}

}  // namespace

absl::StatusOr<CurveKeyPair> ReadCurveKeyPair(const std::string& path) {
  ASSIGN_OR_RETURN(CurveKeyFile key, ReadKeyFile(path));
  if (!key.secret) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " holds a public key; a secret key is needed here"));
  }
  ASSIGN_OR_RETURN(std::string pub, CurvePublicKey(key.key));
  return CurveKeyPair{pub, key.key};
}

absl::StatusOr<std::string> ReadCurvePublicKey(const std::string& path) {
  ASSIGN_OR_RETURN(CurveKeyFile key, ReadKeyFile(path));
  if (key.secret) return CurvePublicKey(key.key);
  return key.key;
}

absl::StatusOr<std::vector<AllowedClient>> ReadAllowedClients(const std::string& dir) {
  std::vector<AllowedClient> allowed;
  std::error_code ec;
  std::filesystem::directory_iterator it(dir, ec);
  if (ec) return absl::InvalidArgumentError(absl::StrCat(dir, ": ", ec.message()));
  for (const std::filesystem::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    if (name.starts_with('.') || !e.is_regular_file(ec)) continue;  // follows symlinks
    ASSIGN_OR_RETURN(std::string key, ReadCurvePublicKey(e.path().string()));
    allowed.push_back({e.path().stem().string(), key});
  }
  if (allowed.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(dir, " holds no client key"));
  }
  std::sort(allowed.begin(), allowed.end(),
            [](const AllowedClient& a, const AllowedClient& b) { return a.name < b.name; });
  return allowed;
}

bool IsLoopbackHost(std::string_view host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || host.starts_with("127.");
}

absl::Status MakeCurveServer(zmq::socket_t& socket, const std::string& secret_key) {
  return SetOptions(socket, "CURVE server", [&] {
    socket.set(zmq::sockopt::zap_domain, kZapDomain);
    socket.set(zmq::sockopt::curve_server, 1);
    socket.set(zmq::sockopt::curve_secretkey, secret_key);
  });
}

absl::Status MakeCurveClient(zmq::socket_t& socket, const CurveKeyPair& own,
                             const std::string& server_key) {
  return SetOptions(socket, "CURVE client", [&] {
    socket.set(zmq::sockopt::curve_serverkey, server_key);
    socket.set(zmq::sockopt::curve_publickey, own.public_key);
    socket.set(zmq::sockopt::curve_secretkey, own.secret_key);
  });
}

absl::StatusOr<std::unique_ptr<ZapAuthenticator>> ZapAuthenticator::Start(
    zmq::context_t& ctx, const std::string& allowed_dir, std::vector<AllowedClient> also_allowed) {
  ASSIGN_OR_RETURN(std::vector<AllowedClient> allowed, ReadAllowedClients(allowed_dir));
  std::unique_ptr<ZapAuthenticator> z(
      new ZapAuthenticator(allowed_dir, std::move(allowed), std::move(also_allowed)));
  auto socket = std::make_shared<zmq::socket_t>(ctx, zmq::socket_type::rep);
  try {
    socket->set(zmq::sockopt::linger, 0);
    socket->bind(kZapEndpoint);
  } catch (const zmq::error_t& e) {
    return absl::InternalError(absl::StrCat("ZAP handler: ", e.what()));
  }
  // The socket moves to the handler's thread (thread creation is the barrier ZeroMQ asks for).
  z->thread_ = std::thread([self = z.get(), socket] { self->Loop(*socket); });
  return z;
}

ZapAuthenticator::~ZapAuthenticator() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void ZapAuthenticator::Loop(zmq::socket_t& socket) {
  while (!stop_) {
    zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
    try {
      zmq::poll(&item, 1, std::chrono::milliseconds(100));
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
      continue;  // EINTR
    }
    if (!(item.revents & ZMQ_POLLIN)) continue;
    absl::StatusOr<std::optional<std::vector<std::string>>> request =
        ReceiveFrames(socket, zmq::recv_flags::dontwait);
    if (!request.ok() || !request->has_value()) continue;
    const std::vector<std::string> reply = Answer(**request);
    std::vector<std::string_view> frames(reply.begin(), reply.end());
    if (absl::Status s = SendFrames(socket, frames); !s.ok()) LOG(WARNING) << "ZAP reply: " << s;
  }
}

void ZapAuthenticator::Reload() {
  const auto now = std::chrono::steady_clock::now();
  if (now - loaded_ < std::chrono::seconds(1)) return;
  loaded_ = now;
  absl::StatusOr<std::vector<AllowedClient>> allowed = ReadAllowedClients(dir_);
  if (!allowed.ok()) {
    LOG_EVERY_T(ERROR, 10) << "keeping the allowed client keys read before: " << allowed.status();
    return;
  }
  allowed_ = std::move(*allowed);
}

std::vector<std::string> ZapAuthenticator::Answer(const std::vector<std::string>& request) {
  // ZAP 1.0 (rfc.zeromq.org/spec/27): version, request id, domain, address, routing id,
  // mechanism, credentials...; the reply: version, request id, status code and text, user id,
  // metadata.
  if (request.size() < 6 || request[0] != "1.0") {
    ++refused_;
    return {"1.0", request.size() > 1 ? request[1] : "", "500", "bad ZAP request", "", ""};
  }
  const std::string& id = request[1];
  if (request[5] != "CURVE" || request.size() != 7 || request[6].size() != kKeyBytes) {
    ++refused_;
    LOG_EVERY_T(WARNING, 10) << "refused a " << request[5] << " client from " << request[3]
                             << ": CURVE is required";
    return {"1.0", id, "400", "CURVE required", "", ""};
  }
  Reload();
  const std::string key = EncodeZ85(request[6]);
  for (const std::vector<AllowedClient>* list : {&std::as_const(allowed_), &also_}) {
    for (const AllowedClient& c : *list) {
      if (c.public_key == key) {
        ++accepted_;
        return {"1.0", id, "200", "OK", c.name, ""};
      }
    }
  }
  ++refused_;
  LOG_EVERY_T(WARNING, 10) << "refused a CURVE client from " << request[3] << " with key " << key
                           << ": not in the allowed client keys (" << dir_ << ")";
  return {"1.0", id, "400", "key not allowed", "", ""};
}

}  // namespace kvserve
