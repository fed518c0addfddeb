// kvserve-make-model: writes a small Llama-architecture checkpoint with random weights in
// Hugging Face layout (config.json, generation_config.json, model.safetensors), sized to a
// real tokenizer's vocabulary and shipping that tokenizer, so the whole serving path (chat
// template, tokenizer, engine, detokenizer) runs end to end without downloading a model.
// Its answers are random text: it is a plumbing model, not a language model. Without
// --tokenizer, --vocab-size sizes it and no tokenizer ships (a model of a given shape for
// benchmarks that feed token ids, e.g. Llama 3.2 1B's in tests/gpu/run.sh).
//
//   kvserve-make-model --tokenizer models/llama3-tokenizer --out models/kvserve-tiny-llama3
//   kvserve-make-model --vocab-size 128256 --hidden-size 2048 --num-layers 16 --num-heads 32
//       --num-kv-heads 8 --intermediate-size 8192 --out /tmp/llama-1b
#include <filesystem>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/init.h"
#include "common/status_macros.h"
#include "common/tokenizer/tokenizer.h"
#include "tools/random_model.h"

ABSL_FLAG(std::string, out, "", "Output directory (created)");
ABSL_FLAG(std::string, tokenizer, "",
          "Directory with tokenizer.json and tokenizer_config.json to ship");
ABSL_FLAG(int32_t, vocab_size, 0, "Vocabulary size when no --tokenizer is given");
ABSL_FLAG(int32_t, hidden_size, 64, "Hidden size");
ABSL_FLAG(int32_t, num_layers, 2, "Decoder layers");
ABSL_FLAG(int32_t, num_heads, 4, "Attention heads");
ABSL_FLAG(int32_t, num_kv_heads, 2, "KV heads");
ABSL_FLAG(int32_t, intermediate_size, 192, "MLP intermediate size");
ABSL_FLAG(int32_t, max_position_embeddings, 8192, "Longest context");
ABSL_FLAG(uint64_t, seed, 0, "Random seed for the weights");

namespace kvserve {
namespace {

namespace fs = std::filesystem;

absl::Status Make() {
  const std::string out = absl::GetFlag(FLAGS_out);
  const std::string tok_dir = absl::GetFlag(FLAGS_tokenizer);
  const int vocab_size = absl::GetFlag(FLAGS_vocab_size);
  if (out.empty()) return absl::InvalidArgumentError("--out is required");
  if (tok_dir.empty() == (vocab_size == 0)) {
    return absl::InvalidArgumentError("give either --tokenizer or --vocab-size");
  }
  RandomModelOptions o;
  o.hidden = absl::GetFlag(FLAGS_hidden_size);
  o.layers = absl::GetFlag(FLAGS_num_layers);
  o.heads = absl::GetFlag(FLAGS_num_heads);
  o.kv_heads = absl::GetFlag(FLAGS_num_kv_heads);
  o.intermediate = absl::GetFlag(FLAGS_intermediate_size);
  o.max_position_embeddings = absl::GetFlag(FLAGS_max_position_embeddings);
  o.seed = absl::GetFlag(FLAGS_seed);
  if (tok_dir.empty()) {
    o.vocab = vocab_size;
    return WriteRandomLlama(o, out);
  }
  ASSIGN_OR_RETURN(auto tok, tokenizer::Tokenizer::FromDirectory(tok_dir));
  o.vocab = tok->vocab_size();
  o.bos_id = tok->bos_id().value_or(0);
  if (tok->eos_id()) o.eos_ids.push_back(*tok->eos_id());
  if (auto eot = tok->TokenToId("<|eot_id|>")) o.eos_ids.push_back(*eot);
  RETURN_IF_ERROR(WriteRandomLlama(o, out));
  std::error_code ec;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(fs::path(tok_dir) / f, fs::path(out) / f, fs::copy_options::overwrite_existing,
                  ec);
    if (ec) return absl::InternalError(absl::StrCat("cannot copy ", f, ": ", ec.message()));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvserve

int main(int argc, char** argv) {
  kvserve::InitProgram(
      argc, argv,
      "kvserve-make-model --tokenizer DIR | --vocab-size N --out DIR: a random-weight Llama "
      "checkpoint");
  absl::Status s = kvserve::Make();
  if (!s.ok()) {
    std::cerr << "kvserve-make-model: " << s.message() << "\n";
    return 1;
  }
  return 0;
}
