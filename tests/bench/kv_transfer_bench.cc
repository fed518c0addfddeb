// The KV transfer's throughput on this machine, per KV format, against the memcpy limit of the
// same bytes (docs/DISAGGREGATION.md). Blocks of Llama-3.1-8B's KV shape (32 layers, 8 KV
// heads of 128 channels, 16-token blocks) move as kvserve moves them for a peer fetch, between
// three threads standing in for the three processes, over TCP loopback with CURVE:
//   source "worker" (ROUTER, CURVE server): EncodeBlocks in chunks of --chunk-bytes, each a
//     KvChunk answer to the relay;
//   relay "router" (a DEALER to each worker, CURVE clients): parses each chunk's header fields
//     and forwards its bytes as they came, as KvFetches does;
//   target "worker" (ROUTER, CURVE server): ReadBlocks (every checksum) and WriteBlock into its
//     pool, a KvChunkAck per chunk.
// Timed from the ask to the last ack; reported as wire GB/s and against memcpy of the wire's
// bytes (one buffer to another, the same machine). Beside it, to show where the time goes: the
// encode alone, the check and write alone, the relay without CURVE ("plain"), and with
// `--direct` the source's chunks going straight to the target's socket (CURVE, no relay).
//
//   build/bin/kv_transfer_bench [--blocks 64] [--reps 5] [--chunk_bytes 4194304]
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/init.h"
#include "common/kv/kv_format.h"
#include "common/net/curve.h"
#include "common/net/zmq_framing.h"
#include "glog/logging.h"
#include "kernels/backend.h"
#include "kvserve/v1/kvserve.pb.h"
#include "worker/kv_cache/kv_block_wire.h"
#include "worker/kv_cache/kv_storage.h"
#include "zmq.hpp"

ABSL_FLAG(int32_t, blocks, 64, "Blocks moved per transfer (16 tokens each)");
ABSL_FLAG(int32_t, reps, 5, "Transfers per format; the median is reported");
ABSL_FLAG(int32_t, chunk_bytes, 4 << 20, "The most bytes of blocks in one chunk");
ABSL_FLAG(bool, direct, true, "Also time the chunks going straight to the target (no relay)");

namespace kvserve {
namespace {

namespace pb = ::kvserve::v1;
using Clock = std::chrono::steady_clock;
using worker::KvStorage;

constexpr int kLayers = 32, kKvHeads = 8, kHeadDim = 128, kBlockSize = 16;

struct Format {
  std::string name, dtype, granularity;
};

// A failure here is the bench's own bug: it stops.
void Must(const absl::Status& s) { CHECK(s.ok()) << s; }

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Every byte of the pool random (the codes' values do not change the cost).
void Fill(KvStorage& s) {
  std::mt19937 rng(7);
  for (int l = 0; l < s.num_layers(); ++l) {
    const kernels::KvCacheView v = s.View(l);
    const int64_t units = v.num_blocks * v.num_kv_heads * v.block_size;
    for (int64_t i = 0; i < units * v.k_format.RowBytes(kHeadDim); ++i) v.k[i] = rng();
    for (int64_t i = 0; i < units * v.v_format.RowBytes(kHeadDim); ++i) v.v[i] = rng();
  }
}

// One endpoint pair as the cluster has it: `server` bound (a worker's ROUTER, CURVE server),
// `client` connected (the router's DEALER, CURVE client).
struct Link {
  zmq::socket_t server, client;
};

Link MakeLink(zmq::context_t& ctx, const CurveKeyPair& server_keys, const CurveKeyPair& client_keys,
              bool curve = true) {
  Link l{zmq::socket_t(ctx, zmq::socket_type::router),
         zmq::socket_t(ctx, zmq::socket_type::dealer)};
  if (curve) Must(MakeCurveServer(l.server, server_keys.secret_key));
  const int port = *BindTcp(l.server, "127.0.0.1", 0, "bench");
  if (curve) Must(MakeCurveClient(l.client, client_keys, server_keys.public_key));
  l.client.connect(absl::StrCat("tcp://127.0.0.1:", port));
  return l;
}

// The source worker: answers one KvExportRequest with every block, in chunks.
void Source(zmq::socket_t& socket, KvStorage& pool, kernels::Backend& cpu, int blocks,
            int per_chunk) {
  std::optional<ReceivedMessage> ask = *ReceiveMessage(socket, /*with_prefix=*/true);
  for (int first = 0, index = 0; first < blocks; first += per_chunk, ++index) {
    const int n = std::min(per_chunk, blocks - first);
    std::vector<int> ids(n);
    std::vector<BlockHash> hashes(n);
    for (int i = 0; i < n; ++i) {
      ids[i] = first + i;
      hashes[i] = {.low = static_cast<uint64_t>(first + i), .high = 1};
    }
    pb::KvChunk c;
    c.set_transfer_id("bench");
    c.set_index(index);
    c.set_first_block(first);
    c.set_num_blocks(n);
    c.set_last(first + n == blocks);
    c.add_rank_wires(*worker::EncodeBlocks(pool, cpu, ids, hashes));
    Must(SendMessage(socket, ask->prefix, c));
  }
}

// The target worker: checks and writes each chunk, acknowledges it; returns after the last.
void Target(zmq::socket_t& socket, KvStorage& pool, kernels::Backend& cpu) {
  for (bool last = false; !last;) {
    std::optional<ReceivedMessage> m = *ReceiveMessage(socket, /*with_prefix=*/true);
    pb::KvChunk c;
    Must(ParseMessage(*m, &c));
    std::vector<worker::WireBlock> got = *worker::ReadBlocks(c.rank_wires(0), pool);
    for (size_t i = 0; i < got.size(); ++i) {
      worker::WriteBlock(pool, cpu, static_cast<int>(c.first_block() + i), got[i]);
    }
    pb::KvChunkAck ack;
    ack.set_transfer_id(c.transfer_id());
    ack.set_index(c.index());
    ack.set_blocks_added(static_cast<uint32_t>(got.size()));
    Must(SendMessage(socket, m->prefix, ack));
    last = c.last();
  }
}

// The relay (the router's core thread): asks the source, forwards each chunk to the target as
// it came (its header parsed to find the transfer), waits for the last ack.
void Relay(zmq::socket_t& to_source, zmq::socket_t& to_target) {
  pb::KvExportRequest ask;
  ask.set_transfer_id("bench");
  Must(SendMessage(to_source, "", ask));
  int forwarded = 0, acked = 0;
  bool source_done = false;
  while (!source_done || acked < forwarded) {
    zmq::pollitem_t items[] = {{to_source.handle(), 0, ZMQ_POLLIN, 0},
                               {to_target.handle(), 0, ZMQ_POLLIN, 0}};
    zmq::poll(items, 2, std::chrono::milliseconds(100));
    if (items[0].revents & ZMQ_POLLIN) {
      std::optional<ReceivedMessage> m = *ReceiveMessage(to_source, false);
      pb::KvChunk c;
      Must(ParseMessage(*m, &c));
      const std::string_view frames[] = {m->type, m->payload};
      Must(SendFrames(to_target, frames));
      ++forwarded;
      source_done = c.last();
    }
    if (items[1].revents & ZMQ_POLLIN) {
      (void)*ReceiveMessage(to_target, false);
      ++acked;
    }
  }
}

struct Result {
  int64_t wire_bytes = 0, block_bytes = 0;
  // memcpy of the wire's bytes; encoding every chunk; checking and writing every chunk; the
  // relayed transfer with CURVE and without; the direct one (CURVE).
  double memcpy_s = 0, encode_s = 0, accept_s = 0, relay_s = 0, plain_s = 0, direct_s = 0;
};

// The relayed transfer over `b` (source) and `a` (target): its seconds, median of `reps` after
// one to warm the connections up.
double TimeRelay(Link& b, Link& a, KvStorage& source, KvStorage& target, kernels::Backend& cpu,
                 int blocks, int per_chunk, int reps) {
  std::vector<double> took;
  for (int i = 0; i < reps + 1; ++i) {
    const auto t0 = Clock::now();
    std::thread src([&] { Source(b.server, source, cpu, blocks, per_chunk); });
    std::thread dst([&] { Target(a.server, target, cpu); });
    Relay(b.client, a.client);
    src.join();
    dst.join();
    if (i > 0) took.push_back(Seconds(Clock::now() - t0));
  }
  return Median(took);
}

// Encoding every chunk, and checking and writing every chunk, with no sockets: (encode, accept).
std::pair<double, double> TimeEnds(KvStorage& source, KvStorage& target, kernels::Backend& cpu,
                                   int blocks, int per_chunk, int reps) {
  std::vector<double> enc, acc;
  for (int r = 0; r < reps; ++r) {
    std::vector<std::string> wires;
    auto t0 = Clock::now();
    for (int first = 0; first < blocks; first += per_chunk) {
      const int n = std::min(per_chunk, blocks - first);
      std::vector<int> ids(n);
      std::vector<BlockHash> hashes(n);
      for (int i = 0; i < n; ++i) ids[i] = first + i, hashes[i] = {.low = 1u + first + i};
      wires.push_back(*worker::EncodeBlocks(source, cpu, ids, hashes));
    }
    enc.push_back(Seconds(Clock::now() - t0));
    t0 = Clock::now();
    int at = 0;
    for (const std::string& w : wires) {
      const std::vector<worker::WireBlock> got = *worker::ReadBlocks(w, target);
      for (const worker::WireBlock& b : got) worker::WriteBlock(target, cpu, at++, b);
    }
    acc.push_back(Seconds(Clock::now() - t0));
  }
  return {Median(enc), Median(acc)};
}

Result Measure(const Format& f, int blocks, int reps, int chunk_bytes, bool direct) {
  auto cpu = kernels::CreateCpuBackend({.num_threads = 1});
  absl::StatusOr<KvCacheSpec> spec =
      MakeKvCacheSpec({.dtype = f.dtype, .granularity = f.granularity, .group_size = 32}, kLayers,
                      kHeadDim, KvDType::kBf16);
  Must(spec.status());
  KvStorage source(*spec, blocks, kKvHeads, kBlockSize, kHeadDim, cpu.get());
  KvStorage target(*spec, blocks, kKvHeads, kBlockSize, kHeadDim, cpu.get());
  Fill(source);
  Result r;
  r.block_bytes = worker::WireBlockBytes(source);
  const int per_chunk = std::max<int>(1, static_cast<int>(chunk_bytes / r.block_bytes));
  r.wire_bytes = r.block_bytes * blocks;

  std::string from(static_cast<size_t>(r.wire_bytes), 'x'), to(from.size(), 'y');
  std::vector<double> copies, straight;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = Clock::now();
    std::memcpy(to.data(), from.data(), from.size());
    copies.push_back(Seconds(Clock::now() - t0));
  }

  zmq::context_t ctx;
  const CurveKeyPair router_keys = *GenerateCurveKeyPair();
  const CurveKeyPair worker_keys = *GenerateCurveKeyPair();
  // The router's public key in the directory the workers read, as kvserve-keygen writes it.
  char dir[] = "/tmp/kv-transfer-bench-XXXXXX";
  CHECK(mkdtemp(dir) != nullptr);
  const std::string key_file = absl::StrCat(dir, "/router.key");
  Must(WriteCurveKeyFile(key_file, {.secret = false, .key = router_keys.public_key}, "bench"));
  absl::StatusOr<std::unique_ptr<ZapAuthenticator>> zap = ZapAuthenticator::Start(ctx, dir);
  Must(zap.status());
  Link b = MakeLink(ctx, worker_keys, router_keys), a = MakeLink(ctx, worker_keys, router_keys);
  r.relay_s = TimeRelay(b, a, source, target, *cpu, blocks, per_chunk, reps);
  Link pb_ = MakeLink(ctx, worker_keys, router_keys, false),
       pa = MakeLink(ctx, worker_keys, router_keys, false);
  r.plain_s = TimeRelay(pb_, pa, source, target, *cpu, blocks, per_chunk, reps);
  std::tie(r.encode_s, r.accept_s) = TimeEnds(source, target, *cpu, blocks, per_chunk, reps);
  if (direct) {
    // The source's worker answers the target's socket itself: source ROUTER -> target DEALER,
    // the target checking and writing as before.
    Link d = MakeLink(ctx, worker_keys, router_keys);
    for (int i = 0; i < reps + 1; ++i) {
      const auto t0 = Clock::now();
      std::thread src([&] { Source(d.server, source, *cpu, blocks, per_chunk); });
      pb::KvExportRequest ask;
      Must(SendMessage(d.client, "", ask));
      for (bool last = false; !last;) {
        std::optional<ReceivedMessage> m = *ReceiveMessage(d.client, false);
        pb::KvChunk c;
        Must(ParseMessage(*m, &c));
        std::vector<worker::WireBlock> got = *worker::ReadBlocks(c.rank_wires(0), target);
        for (size_t k = 0; k < got.size(); ++k) {
          worker::WriteBlock(target, *cpu, static_cast<int>(c.first_block() + k), got[k]);
        }
        last = c.last();
      }
      src.join();
      if (i > 0) straight.push_back(Seconds(Clock::now() - t0));
    }
  }
  unlink(key_file.c_str());
  rmdir(dir);
  r.memcpy_s = Median(copies);
  r.direct_s = straight.empty() ? 0 : Median(straight);
  return r;
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) {
  kvserve::InitProgram(argc, argv, "kv_transfer_bench: KV transfer throughput per format");
  using kvserve::Format;
  const std::vector<Format> formats = {{"bf16", "bf16", ""},
                                       {"fp8 (per token)", "fp8_e4m3", "per_token"},
                                       {"int8 (per token)", "int8", "per_token"},
                                       {"int4 (per token)", "int4", "per_token"}};
  const int blocks = absl::GetFlag(FLAGS_blocks);
  std::cout << absl::StrFormat(
      "%d blocks of Llama-3.1-8B KV (32 layers x 8 KV heads x 128, 16 tokens), chunks of at most "
      "%d bytes, median of %d\n",
      blocks, absl::GetFlag(FLAGS_chunk_bytes), absl::GetFlag(FLAGS_reps));
  std::cout << absl::StrFormat("%-18s %11s %7s | GB/s: %7s %7s %7s %9s %9s %9s | %s\n", "format",
                               "bytes/block", "of bf16", "memcpy", "encode", "accept", "relay",
                               "plain", "direct", "relay of memcpy");
  int64_t bf16_bytes = 0;
  for (const Format& f : formats) {
    const kvserve::Result r =
        kvserve::Measure(f, blocks, absl::GetFlag(FLAGS_reps), absl::GetFlag(FLAGS_chunk_bytes),
                         absl::GetFlag(FLAGS_direct));
    if (bf16_bytes == 0) bf16_bytes = r.block_bytes;
    const double gb = static_cast<double>(r.wire_bytes) / 1e9;
    std::cout << absl::StrFormat(
        "%-18s %11d %6.2fx | GB/s: %7.2f %7.2f %7.2f %9.2f %9.2f %9.2f | %.3fx\n", f.name,
        r.block_bytes, static_cast<double>(r.block_bytes) / static_cast<double>(bf16_bytes),
        gb / r.memcpy_s, gb / r.encode_s, gb / r.accept_s, gb / r.relay_s, gb / r.plain_s,
        r.direct_s > 0 ? gb / r.direct_s : 0, r.memcpy_s / r.relay_s);
  }
  return 0;
}
