// The input format of the message fuzzers: records of [type: 1 byte] [length: 2 bytes, little
// endian] [payload], each one ZeroMQ message whose type frame is kTypes[type % size] (the last
// entry an unknown type). make_seeds.cc writes valid messages in this form.
#ifndef KVSERVE_TESTS_FUZZ_FRAMES_H_
#define KVSERVE_TESTS_FUZZ_FRAMES_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvserve::fuzz {

struct Record {
  uint8_t type = 0;
  std::string payload;
};

inline std::vector<Record> ReadRecords(const uint8_t* data, size_t size) {
  std::vector<Record> out;
  size_t at = 0;
  while (at + 3 <= size) {
    const size_t len = std::min<size_t>(data[at + 1] | (data[at + 2] << 8), size - at - 3);
    out.push_back({data[at], std::string(reinterpret_cast<const char*>(data) + at + 3, len)});
    at += 3 + len;
  }
  return out;
}

inline std::string WriteRecord(uint8_t type, std::string_view payload) {
  const size_t len = std::min<size_t>(payload.size(), 0xffff);
  std::string out = {static_cast<char>(type), static_cast<char>(len & 0xff),
                     static_cast<char>(len >> 8)};
  out.append(payload.substr(0, len));
  return out;
}

}  // namespace kvserve::fuzz

#endif  // KVSERVE_TESTS_FUZZ_FRAMES_H_
