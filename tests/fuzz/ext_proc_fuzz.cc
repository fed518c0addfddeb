// What a gateway (or anyone reaching the endpoint picker's port) may send on an ext_proc
// stream: ProcessingRequests in any order and with any content, split at 0xFF bytes (several
// messages in one input), each parsed and handed to an ExtProcExchange; a pick it asks for is
// answered, alternately picked and refused. No crash, no unbounded allocation, and the
// protocol's promises hold: a pick is asked for at most once, and once answered, no second
// destination or immediate response follows.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "epp/ext_proc_exchange.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvserve::epp;
  using kvserve::frontend::OpenAiError;
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  ExtProcExchange x({.max_body_bytes = 1 << 16, .chunk_bytes = 1 << 10});
  int asks = 0;
  for (size_t start = 0; start <= in.size();) {
    size_t end = in.find('\xff', start);
    if (end == std::string_view::npos) end = in.size();
    ext_proc::ProcessingRequest m;
    if (m.ParseFromArray(in.data() + start, static_cast<int>(end - start))) {
      if (!x.OnMessage(m).ok()) return 0;  // a stream that ends with an error
      if (x.TakePickAsk()) {
        ++asks;
        const bool picked = asks % 2 == 1;
        if (picked ? x.Picked({"10.0.0.1:8000", "10.0.0.2:8000"}).empty()
                   : x.Refused(OpenAiError{.http_status = 503, .json = "{}"}).empty()) {
          __builtin_trap();  // the first answer to an ask always says something
        }
        if (!x.Picked({"10.0.0.3:8000"}).empty()) __builtin_trap();  // never a second answer
      }
    }
    start = end + 1;
  }
  if (asks > 1) __builtin_trap();
  return 0;
}
