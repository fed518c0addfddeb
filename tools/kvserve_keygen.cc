// kvserve-keygen: CURVE key pairs for the router <-> worker links (docs/SECURITY.md).
//
//   kvserve-keygen --dir keys router worker   # keys/router.key (0600), keys/router.pub, ...
//   kvserve-keygen --kubernetes-secret kvserve-curve > curve-secret.yaml
//
// The second form prints a Kubernetes Secret holding router.key, router.pub, worker.key and
// worker.pub: the Helm chart's curve.existingSecret.
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/init.h"
#include "common/net/curve.h"
#include "common/status_macros.h"

ABSL_FLAG(std::string, dir, ".", "Where NAME.key and NAME.pub are written (never overwritten)");
ABSL_FLAG(std::string, kubernetes_secret, "",
          "Print a Secret of this name with fresh router and worker keys instead");

namespace kvserve {
namespace {

absl::Status WritePair(const std::string& name) {
  if (name.empty() || name.find('/') != std::string::npos || name.starts_with('.')) {
    return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a plain file name"));
  }
  ASSIGN_OR_RETURN(CurveKeyPair pair, GenerateCurveKeyPair());
  const std::string base = absl::StrCat(absl::GetFlag(FLAGS_dir), "/", name);
  RETURN_IF_ERROR(
      WriteCurveKeyFile(base + ".key", {true, pair.secret_key},
                        absl::StrCat("kvserve CURVE secret key of ", name, ": keep it private")));
  RETURN_IF_ERROR(WriteCurveKeyFile(base + ".pub", {false, pair.public_key},
                                    absl::StrCat("kvserve CURVE public key of ", name)));
  std::cout << base << ".key " << base << ".pub\n";
  return absl::OkStatus();
}

// A Kubernetes object name (RFC 1123 subdomain): lower-case alphanumerics, '-' and '.'.
bool IsObjectName(std::string_view name) {
  if (name.empty() || name.size() > 253 || !absl::ascii_isalnum(name.front()) ||
      !absl::ascii_isalnum(name.back())) {
    return false;
  }
  for (char c : name) {
    if (!(absl::ascii_isdigit(c) || absl::ascii_islower(c) || c == '-' || c == '.')) return false;
  }
  return true;
}

absl::Status PrintSecret(const std::string& secret) {
  if (!IsObjectName(secret)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kubernetes-secret '", secret, "' is not a Kubernetes name (a-z, 0-9, '-', '.')"));
  }
  std::cout << "apiVersion: v1\nkind: Secret\nmetadata:\n  name: " << secret
            << "\ntype: Opaque\ndata:\n";
  for (const char* name : {"router", "worker"}) {
    ASSIGN_OR_RETURN(CurveKeyPair pair, GenerateCurveKeyPair());
    for (const CurveKeyFile& k :
         {CurveKeyFile{true, pair.secret_key}, CurveKeyFile{false, pair.public_key}}) {
      const std::string text = FormatCurveKeyFile(
          k, absl::StrCat("kvserve CURVE ", k.secret ? "secret" : "public", " key of ", name));
      std::cout << "  " << name << (k.secret ? ".key: " : ".pub: ") << absl::Base64Escape(text)
                << "\n";
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) {
  const std::vector<char*> names = kvserve::InitProgram(
      argc, argv, "kvserve-keygen [--dir DIR] NAME... | kvserve-keygen --kubernetes-secret NAME");
  absl::Status s;
  if (const std::string secret = absl::GetFlag(FLAGS_kubernetes_secret); !secret.empty()) {
    s = names.size() > 1 ? absl::InvalidArgumentError(
                               "names and --kubernetes-secret exclude "
                               "each other")
                         : kvserve::PrintSecret(secret);
  } else if (names.size() < 2) {
    s = absl::InvalidArgumentError("give one or more key names (e.g. router worker)");
  }
  for (size_t i = 1; s.ok() && i < names.size(); ++i) s = kvserve::WritePair(names[i]);
  if (!s.ok()) {
    std::cerr << "kvserve-keygen: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
