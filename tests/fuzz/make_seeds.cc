// Writes the binary seed corpora of the fuzzers into tests/fuzz/corpus (committed; run again
// when the protocol changes): valid protobuf messages in frames.h's form for the message
// fuzzers, a small safetensors file. The text seeds (JSON, HTTP) are written by hand.
//
//   build-fuzz/bin/make_seeds tests/fuzz/corpus
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "common/kv/block_hash.h"
#include "common/model/safetensors.h"
#include "kvserve/v1/kvserve.pb.h"
#include "tests/fuzz/frames.h"

namespace pb = ::kvserve::v1;
using kvserve::fuzz::WriteRecord;

namespace {

void Write(const std::string& path, const std::string& bytes) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

std::string Hash(uint64_t i) { return kvserve::BlockHash{i * 7919 + 1, i}.ToBytes(); }

std::string RouterSeed() {
  pb::WorkerStatus st;
  st.set_worker_id("w0");
  st.set_instance_id(11);
  st.set_state(pb::WORKER_STATE_READY);
  st.set_block_size(16);
  st.set_model_id("tiny");
  st.set_kv_cache_dtype("auto");
  pb::BlockCounts* b = st.add_blocks();
  b->set_medium(pb::MEDIUM_DEVICE);
  b->set_total(32);
  b->set_free(20);
  b->set_active(8);
  pb::KvEventBatch batch;
  batch.set_instance_id(11);
  batch.set_seq(1);
  pb::BlockStored* stored = batch.add_events()->mutable_stored();
  for (int i = 0; i < 4; ++i) stored->add_block_hashes(Hash(i));
  stored->set_medium(pb::MEDIUM_DEVICE);
  pb::BlockRemoved* removed = batch.add_events()->mutable_removed();
  removed->add_block_hashes(Hash(2));
  removed->set_medium(pb::MEDIUM_DEVICE);
  pb::KvEventBatch cleared;
  cleared.set_instance_id(11);
  cleared.set_seq(2);
  cleared.add_events()->mutable_all_cleared();
  pb::KvSnapshot snap;
  snap.set_instance_id(11);
  snap.set_seq(5);
  for (int i = 0; i < 3; ++i) {
    pb::CachedBlock* c = snap.add_blocks();
    c->set_block_hash(Hash(i));
    c->set_medium(i % 2 ? pb::MEDIUM_HOST : pb::MEDIUM_DEVICE);
  }
  pb::Control ask;
  ask.set_action(pb::CONTROL_ACTION_RECYCLE_REQUEST);
  ask.set_reason("requests");
  return WriteRecord(0, st.SerializeAsString()) + WriteRecord(1, batch.SerializeAsString()) +
         WriteRecord(1, cleared.SerializeAsString()) + WriteRecord(2, snap.SerializeAsString()) +
         WriteRecord(3, ask.SerializeAsString());
}

std::vector<std::string> WorkerSeeds() {
  pb::GenerateRequest g;
  g.set_request_id("r1");
  for (int t : {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17})
    g.add_prompt_token_ids(t);
  g.set_max_tokens(4);
  g.add_stop_token_ids(2);
  g.set_cache_salt("tenant");
  g.set_stream(true);
  pb::SamplingParams* sp = g.mutable_sampling();
  sp->set_temperature(0.7f);
  sp->set_top_p(0.9f);
  sp->set_top_k(20);
  sp->set_n(2);
  sp->set_seed(5);
  sp->set_logprobs(3);
  pb::AbortRequest a;
  a.set_request_id("r1");
  a.set_reason("client went away");
  std::vector<std::string> seeds = {
      WriteRecord(0, g.SerializeAsString()) + WriteRecord(1, a.SerializeAsString()),
      WriteRecord(0, g.SerializeAsString()) + WriteRecord(0, g.SerializeAsString())};
  for (int action = 1; action <= 8; ++action) {
    pb::Control c;
    c.set_action(static_cast<pb::ControlAction>(action));
    c.set_control_id(action);
    c.set_reason("fuzz");
    seeds.push_back(WriteRecord(2, c.SerializeAsString()));
  }
  // The KV transfer: an export of a prompt's blocks (none cached: one empty chunk answers), and
  // a chunk whose wire is only a header.
  pb::KvExportRequest x;
  x.set_transfer_id("r1#1.1");
  for (int t = 0; t < 40; ++t) x.add_token_ids(100 + t);
  x.set_first_block(1);
  x.set_max_chunk_bytes(64);
  seeds.push_back(WriteRecord(4, x.SerializeAsString()));
  pb::KvChunk k;
  k.set_transfer_id("r1#1.1");
  k.set_first_block(0);
  k.set_num_blocks(1);
  k.mutable_token_ids()->CopyFrom(x.token_ids());
  k.add_rank_wires(std::string("KVBW\x01\x00\x00\x00\x01\x00\x00\x00", 12));
  seeds.push_back(WriteRecord(5, k.SerializeAsString()));
  return seeds;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: make_seeds CORPUS_DIR\n";
    return 1;
  }
  const std::string dir = argv[1];
  Write(dir + "/router_message/status-events-snapshot", RouterSeed());
  std::vector<std::string> worker = WorkerSeeds();
  for (size_t i = 0; i < worker.size(); ++i) {
    Write(dir + "/worker_message/seed-" + std::to_string(i), worker[i]);
  }
  const float weights[6] = {1, -2, 0.5f, 0, 3, -0.25f};
  const uint16_t half[2] = {0x3c00, 0xc000};
  std::filesystem::create_directories(dir + "/safetensors");
  absl::Status s = kvserve::WriteSafetensors(
      dir + "/safetensors/two-tensors",
      {{"a.weight", kvserve::DType::kF32, {2, 3}, {reinterpret_cast<const char*>(weights), 24}},
       {"b.bias", kvserve::DType::kF16, {2}, {reinterpret_cast<const char*>(half), 4}}},
      {{"format", "pt"}});
  if (!s.ok()) {
    std::cerr << s << "\n";
    return 1;
  }
  return 0;
}
