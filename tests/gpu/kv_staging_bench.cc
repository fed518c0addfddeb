// Moving KV blocks out of and into a device pool, three ways, per KV format (issue 44's CUDA
// path, docs/DISAGGREGATION.md). One GPU cannot hold two NCCL ranks, so what one GPU can show
// is measured: the ends of a transfer between processes, and a copy within one.
//   pageable: the transfer's ends before staging. EncodeBlocks reads each block's ranges (per
//   layer: K and
//     V codes and scales) from the device pool into the wire, one Download each, and
//     WriteBlock writes them back, one Upload each.
//   pinned:   the engine's ends (worker/kv_cache/kv_staging.h). One CopyBlocks launch gathers
//     the blocks into a pool in the backend's pinned host memory, and the wire is encoded from
//     there by the CPU; the import writes the wire into that pool and one CopyBlocks scatters
//     it to the device. (On the CPU backend these are the pageable ends.)
//   device:   a same-process device-to-device CopyBlocks of the blocks: what NCCL send/recv
//     between two GPUs of one node would approach, without the wire's checksums.
// Each way's result is checked: the target pool's blocks encode to the same wire as the
// source's. GB/s are of the wire's block bytes; the median of --reps.
//
//   build/bin/kv_staging_bench [--device cuda] [--blocks 64] [--reps 5]
//
// On the CPU backend (--device cpu) every way is memcpy and the figures only show the code
// runs; tests/gpu/run.sh runs it on the GPU.
#include <algorithm>
#include <chrono>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "common/init.h"
#include "common/kv/kv_format.h"
#include "glog/logging.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "worker/kv_cache/kv_block_wire.h"
#include "worker/kv_cache/kv_staging.h"
#include "worker/kv_cache/kv_storage.h"

ABSL_FLAG(std::string, device, "cuda", "cuda or cpu");
ABSL_FLAG(int32_t, blocks, 64, "Blocks moved each way (16 tokens each)");
ABSL_FLAG(int32_t, reps, 5, "Repetitions; the median is reported");

namespace kvserve {
namespace {

using Clock = std::chrono::steady_clock;
using worker::KvStorage;

// Llama-3.1-8B's KV shape, as kv_transfer_bench.
constexpr int kLayers = 32, kKvHeads = 8, kHeadDim = 128, kBlockSize = 16;

struct Format {
  std::string name, dtype, granularity;
};

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Moves blocks [0, n) of `from` to the same blocks of `to` with one CopyBlocks, and waits.
void CopyAll(kernels::Backend& backend, KvStorage& from, KvStorage& to, int n) {
  std::vector<int32_t> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  const std::vector<kernels::KvCacheView> src = from.Views(), dst = to.Views();
  backend.CopyBlocks({.src_layers = src.data(),
                      .dst_layers = dst.data(),
                      .num_layers = static_cast<int64_t>(src.size()),
                      .src = ids.data(),
                      .dst = ids.data(),
                      .num_pairs = n});
  backend.Synchronize();
}

struct Pools {
  KvStorage source, target, fill;  // fill: host memory the random blocks start in
};

std::string Encode(KvStorage& pool, kernels::Backend& reader, int n) {
  std::vector<int> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<BlockHash> hashes(n);
  for (int i = 0; i < n; ++i) hashes[i] = {.low = static_cast<uint64_t>(i) + 1, .high = 7};
  absl::StatusOr<std::string> wire = worker::EncodeBlocks(pool, reader, ids, hashes);
  CHECK(wire.ok()) << wire.status();
  return *std::move(wire);
}

void Decode(const std::string& wire, KvStorage& pool, kernels::Backend& writer) {
  absl::StatusOr<std::vector<worker::WireBlock>> got = worker::ReadBlocks(wire, pool);
  CHECK(got.ok()) << got.status();
  for (size_t i = 0; i < got->size(); ++i) {
    worker::WriteBlock(pool, writer, static_cast<int>(i), (*got)[i]);
  }
}

// Every block of the target as the source's: the bench's own bug if not.
void CheckSame(Pools& p, kernels::Backend& dev, int n, const char* way) {
  CHECK(Encode(p.target, dev, n) == Encode(p.source, dev, n)) << way << ": the blocks differ";
}

struct Result {
  int64_t block_bytes = 0;
  double pageable_out = 0, pageable_in = 0, pinned_out = 0, pinned_in = 0, device = 0;
};

Result Measure(const Format& f, kernels::Backend& dev, kernels::Backend& host, int n, int reps) {
  absl::StatusOr<KvCacheSpec> spec =
      MakeKvCacheSpec({.dtype = f.dtype, .granularity = f.granularity, .group_size = 32}, kLayers,
                      kHeadDim, KvDType::kBf16);
  CHECK(spec.ok()) << spec.status();
  Pools p{KvStorage(*spec, n, kKvHeads, kBlockSize, kHeadDim, &dev),
          KvStorage(*spec, n, kKvHeads, kBlockSize, kHeadDim, &dev),
          KvStorage(*spec, n, kKvHeads, kBlockSize, kHeadDim, &dev, /*host_tier=*/true)};
  // Random source blocks: written into host memory, copied to the device.
  std::mt19937 rng(7);
  for (kernels::KvCacheView v : p.fill.Views()) {
    const int64_t rows = v.num_blocks * v.num_kv_heads * v.block_size;
    for (int64_t i = 0; i < rows * v.k_format.RowBytes(kHeadDim); ++i) v.k[i] = rng();
    for (int64_t i = 0; i < rows * v.v_format.RowBytes(kHeadDim); ++i) v.v[i] = rng();
  }
  CopyAll(dev, p.fill, p.source, n);
  // Zeroed blocks, to clear the target before each way, so that each way's check sees only
  // its own writes.
  KvStorage zero_pool(*spec, n, kKvHeads, kBlockSize, kHeadDim, &dev, /*host_tier=*/true);
  const std::string zeros = Encode(zero_pool, host, n);
  const auto clear = [&] { Decode(zeros, p.target, dev); };
  // The engine's ends of a transfer (worker/kv_cache/kv_staging.h), each with its own staging
  // pool, made before the clock starts.
  worker::KvStaging out(p.source, dev), in(p.target, dev);
  std::vector<int> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  std::vector<BlockHash> hashes(n);
  for (int i = 0; i < n; ++i) hashes[i] = {.low = static_cast<uint64_t>(i) + 1, .high = 7};
  CHECK(out.Encode(ids, hashes).ok());
  {
    const std::string warm = Encode(p.source, dev, n);
    absl::StatusOr<std::vector<worker::WireBlock>> got = worker::ReadBlocks(warm, p.target);
    CHECK(got.ok());
    std::vector<const worker::WireBlock*> blocks;
    for (const worker::WireBlock& b : *got) blocks.push_back(&b);
    in.Write(blocks, ids);
  }
  std::vector<double> po, pi, so, si, dd;
  for (int r = 0; r < reps; ++r) {
    clear();
    auto t0 = Clock::now();
    const std::string wire = Encode(p.source, dev, n);
    po.push_back(Seconds(Clock::now() - t0));
    t0 = Clock::now();
    Decode(wire, p.target, dev);
    dev.Synchronize();
    pi.push_back(Seconds(Clock::now() - t0));
    CheckSame(p, dev, n, "pageable");

    clear();
    t0 = Clock::now();
    absl::StatusOr<std::string> staged = out.Encode(ids, hashes);
    so.push_back(Seconds(Clock::now() - t0));
    CHECK(staged.ok()) << staged.status();
    CHECK(*staged == wire) << "pinned: the wire differs from the pageable one";
    t0 = Clock::now();
    absl::StatusOr<std::vector<worker::WireBlock>> got = worker::ReadBlocks(*staged, p.target);
    CHECK(got.ok()) << got.status();
    std::vector<const worker::WireBlock*> blocks;
    for (const worker::WireBlock& b : *got) blocks.push_back(&b);
    in.Write(blocks, ids);
    si.push_back(Seconds(Clock::now() - t0));
    CheckSame(p, dev, n, "pinned");

    clear();
    t0 = Clock::now();
    CopyAll(dev, p.source, p.target, n);
    dd.push_back(Seconds(Clock::now() - t0));
    CheckSame(p, dev, n, "device");
  }
  return {.block_bytes = worker::WireBlockBytes(p.source),
          .pageable_out = Median(po),
          .pageable_in = Median(pi),
          .pinned_out = Median(so),
          .pinned_in = Median(si),
          .device = Median(dd)};
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) {
  kvserve::InitProgram(argc, argv, "kv_staging_bench: KV blocks out of and into a device pool");
  const std::string device = absl::GetFlag(FLAGS_device);
  const int blocks = absl::GetFlag(FLAGS_blocks), reps = absl::GetFlag(FLAGS_reps);
  if (blocks < 1 || reps < 1) {
    std::cerr << "kv_staging_bench: --blocks and --reps must be >= 1\n";
    return 2;
  }
  std::unique_ptr<kvserve::kernels::Backend> dev;
  auto host = kvserve::kernels::CreateCpuBackend({.num_threads = 1});
  if (device == "cuda") {
    auto b = kvserve::kernels::CreateCudaBackend({});
    if (!b.ok()) {
      std::cerr << "kv_staging_bench: " << b.status() << "\n";
      return 1;
    }
    dev = *std::move(b);
  } else if (device == "cpu") {
    dev = kvserve::kernels::CreateCpuBackend({.num_threads = 1});
  } else {
    std::cerr << "kv_staging_bench: --device '" << device << "': give cuda or cpu\n";
    return 2;
  }
  std::cout << absl::StrFormat(
      "%s: %d blocks of Llama-3.1-8B KV (32 layers x 8 KV heads x 128, 16 tokens), median of %d; "
      "GB/s of wire block bytes\n",
      dev->name(), blocks, reps);
  std::cout << absl::StrFormat("%-18s %11s | %9s %9s | %9s %9s | %9s | %s\n", "format",
                               "bytes/block", "page out", "page in", "pin out", "pin in",
                               "dev copy", "pinned of pageable (out, in)");
  const std::vector<kvserve::Format> formats = {{"bf16", "bf16", ""},
                                                {"fp8 (per token)", "fp8_e4m3", "per_token"},
                                                {"int8 (per token)", "int8", "per_token"},
                                                {"int4 (per token)", "int4", "per_token"}};
  for (const kvserve::Format& f : formats) {
    const kvserve::Result r = kvserve::Measure(f, *dev, *host, blocks, reps);
    const double gb = static_cast<double>(r.block_bytes) * blocks / 1e9;
    std::cout << absl::StrFormat("%-18s %11d | %9.2f %9.2f | %9.2f %9.2f | %9.2f | %.2fx, %.2fx\n",
                                 f.name, r.block_bytes, gb / r.pageable_out, gb / r.pageable_in,
                                 gb / r.pinned_out, gb / r.pinned_in, gb / r.device,
                                 r.pageable_out / r.pinned_out, r.pageable_in / r.pinned_in);
  }
  return 0;
}
