// tokenizer.json (+ tokenizer_config.json) loading on arbitrary text: the input is the two files
// separated by a NUL byte. A loaded tokenizer encodes and decodes a fixed text without fault.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "common/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view json = input.substr(0, nul);
  const std::string_view config = nul == std::string_view::npos ? "" : input.substr(nul + 1);
  auto tok = kvserve::tokenizer::Tokenizer::FromJson(json, config, "fuzz");
  if (!tok.ok()) return 0;
  absl::StatusOr<std::vector<int>> ids = (*tok)->Encode("Hello wörld 123 <|x|>\n\t!", true);
  if (ids.ok()) (*tok)->Decode(*ids, true).IgnoreError();
  const int probe[] = {0, 1, (*tok)->vocab_size() - 1, (*tok)->vocab_size(), -1};
  (*tok)->Decode(probe, false).IgnoreError();
  return 0;
}
