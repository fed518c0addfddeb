// A 64-bit fingerprint of bytes that a GPU computes in parallel and the CPU computes the same:
// the KV transfer's check of a chunk that moved device to device (NCCL), where no host ever
// sees the bytes to hash them (docs/DISAGGREGATION.md). The bytes are read as little-endian
// 64-bit words (the last zero-padded); word i contributes Term(word, i), a bijection of the word
// for each position, and the fingerprint is the sum of the terms (mod 2^64) plus Mix64 of the
// length. A sum is the same in any order, so the threads of a kernel add their terms as they
// come; a changed, swapped or missing word changes it but with odds of 2^-64. Not a defence
// against a forger: the link's peer is authenticated by how it was made (the router pairs the
// workers).
//
//   const uint64_t f = FingerprintBytes(host_bytes, n);      // == backend.Fingerprint(dev, n)
#ifndef KVSERVE_KERNELS_FINGERPRINT_H_
#define KVSERVE_KERNELS_FINGERPRINT_H_

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/host_device.h"

namespace kvserve::kernels {

// SplitMix64's finalizer: a bijection of 64-bit words that mixes every bit into every bit.
KVSERVE_HD inline uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

KVSERVE_HD inline uint64_t FingerprintTerm(uint64_t word, uint64_t index) {
  return Mix64(word ^ Mix64(index + 0x9e3779b97f4a7c15ull));
}

KVSERVE_HD inline uint64_t FingerprintLength(uint64_t bytes) {
  return Mix64(bytes ^ 0xd6e8feb86659fd93ull);
}

// The fingerprint of ranges: each range's, mixed with its place, summed.
inline uint64_t CombineFingerprints(const uint64_t* range_fingerprints, size_t count) {
  uint64_t sum = 0;
  for (size_t r = 0; r < count; ++r) sum += Mix64(range_fingerprints[r] + r);
  return sum;
}

// The fingerprint of `bytes` bytes of host memory.
inline uint64_t FingerprintBytes(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t sum = FingerprintLength(bytes);
  for (size_t i = 0; i * 8 < bytes; ++i) {
    uint64_t word = 0;
    const size_t n = bytes - i * 8 < 8 ? bytes - i * 8 : 8;
    std::memcpy(&word, p + i * 8, n);  // little-endian hosts only (x86-64, aarch64)
    sum += FingerprintTerm(word, i);
  }
  return sum;
}

}  // namespace kvserve::kernels

#endif  // KVSERVE_KERNELS_FINGERPRINT_H_
