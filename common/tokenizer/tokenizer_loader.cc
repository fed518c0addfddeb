// Parses tokenizer.json (simdjson: the files are ~10 MB) and tokenizer_config.json into a
// Tokenizer, rejecting components that are not implemented with a message naming them.
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/file_util.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "common/tokenizer/byte_level.h"
#include "common/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "simdjson.h"

namespace kvserve::tokenizer {

// GPT-2's pre-tokenizer regex, used by ByteLevel when `use_regex` is true.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class TokenizerLoader {
 public:
  using Element = simdjson::dom::element;
  using Object = simdjson::dom::object;

  explicit TokenizerLoader(std::string_view source) : source_(source) {}

  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": ", what));
  }

  // Field `key` of `obj`, or nullopt when absent or null.
  static std::optional<Element> Get(Object obj, std::string_view key) {
    Element e;
    if (obj[key].get(e) != simdjson::SUCCESS || e.is_null()) return std::nullopt;
    return e;
  }

  static std::string GetString(Object obj, std::string_view key) {
    std::string_view s;
    auto e = Get(obj, key);
    if (e && e->get_string().get(s) == simdjson::SUCCESS) return std::string(s);
    return "";
  }

  static bool GetBool(Object obj, std::string_view key, bool fallback) {
    bool b;
    auto e = Get(obj, key);
    if (e && e->get_bool().get(b) == simdjson::SUCCESS) return b;
    return fallback;
  }

  absl::StatusOr<Object> AsObject(std::optional<Element> e, absl::string_view what) const {
    Object o;
    if (!e || e->get_object().get(o) != simdjson::SUCCESS) {
      return Error(absl::StrCat(what, " is missing or not an object"));
    }
    return o;
  }

  absl::Status Load(std::string_view tokenizer_json, std::string_view config_json, Tokenizer* tok) {
    simdjson::dom::parser parser;
    simdjson::padded_string padded(tokenizer_json.data(), tokenizer_json.size());
    Element root_el;
    if (auto err = parser.parse(padded).get(root_el)) {
      return Error(
          absl::StrCat("tokenizer.json is not valid JSON: ", simdjson::error_message(err)));
    }
    ASSIGN_OR_RETURN(Object root, AsObject(root_el, "tokenizer.json"));
    ASSIGN_OR_RETURN(Object model, AsObject(Get(root, "model"), "'model'"));
    max_id_ = MaxId(root, model);
    RETURN_IF_ERROR(LoadModel(model, tok));
    RETURN_IF_ERROR(LoadAddedTokens(root, tok));
    RETURN_IF_ERROR(LoadNormalizer(Get(root, "normalizer"), tok));
    bool byte_level = false;
    RETURN_IF_ERROR(LoadPreTokenizer(Get(root, "pre_tokenizer"), tok, &byte_level));
    if (!byte_level) {
      return Error(
          "only byte-level BPE tokenizers are supported: the pre_tokenizer has no "
          "ByteLevel step");
    }
    RETURN_IF_ERROR(LoadDecoder(Get(root, "decoder")));
    RETURN_IF_ERROR(LoadPostProcessor(Get(root, "post_processor"), tok));
    if (!config_json.empty()) RETURN_IF_ERROR(LoadConfig(config_json, tok));
    return absl::OkStatus();
  }

 private:
  // The largest token id the file may use: ids are dense in real vocabularies (the vocabulary's
  // entries, then the added tokens), so an id past twice their count (plus a little) is a broken
  // or hostile file, refused before the decode table grows to it.
  static int64_t MaxId(Object root, Object model) {
    size_t entries = 0;
    Object vocab;
    simdjson::dom::array added;
    if (auto v = Get(model, "vocab"); v && v->get_object().get(vocab) == simdjson::SUCCESS) {
      entries += vocab.size();
    }
    if (auto a = Get(root, "added_tokens"); a && a->get_array().get(added) == simdjson::SUCCESS) {
      entries += added.size();
    }
    return 2 * static_cast<int64_t>(entries) + 1024;
  }

  absl::Status CheckId(int64_t id, absl::string_view what) const {
    if (id >= 0 && id <= max_id_) return absl::OkStatus();
    return Error(absl::StrCat(what, " has id ", id, ", outside 0..", max_id_,
                              " (twice the file's vocabulary and added tokens)"));
  }

  absl::Status LoadModel(Object model, Tokenizer* tok) {
    std::string type = GetString(model, "type");
    if (type != "BPE") {
      return Error(absl::StrCat("model type '", type, "' is not supported (BPE)"));
    }
    if (!GetString(model, "continuing_subword_prefix").empty() ||
        !GetString(model, "end_of_word_suffix").empty()) {
      return Error("BPE continuing_subword_prefix / end_of_word_suffix are not supported");
    }
    if (auto dropout = Get(model, "dropout")) {
      double d = 0;
      if (dropout->get_double().get(d) == simdjson::SUCCESS && d > 0) {
        return Error("BPE dropout is not supported");
      }
    }
    BpeOptions options;
    options.ignore_merges = GetBool(model, "ignore_merges", false);
    options.byte_fallback = GetBool(model, "byte_fallback", false);
    ASSIGN_OR_RETURN(Object vocab_obj, AsObject(Get(model, "vocab"), "'model.vocab'"));
    StringMap<int> vocab;
    vocab.reserve(vocab_obj.size());
    for (simdjson::dom::key_value_pair kv : vocab_obj) {
      int64_t id;
      if (kv.value.get_int64().get(id) != simdjson::SUCCESS) {
        return Error(absl::StrCat("vocab entry '", Sv(kv.key), "' has an invalid id"));
      }
      RETURN_IF_ERROR(CheckId(id, absl::StrCat("vocab entry '", Sv(kv.key), "'")));
      std::string token(kv.key);
      SetDecode(tok, static_cast<int>(id), token, /*special=*/false);
      tok->token_to_id_[token] = static_cast<int>(id);
      std::string raw;
      if (ByteLevelToBytes(token, &raw)) vocab[raw] = static_cast<int>(id);
    }
    std::string unk = GetString(model, "unk_token");
    if (!unk.empty()) {
      auto it = tok->token_to_id_.find(unk);
      if (it == tok->token_to_id_.end())
        return Error(absl::StrCat("unk_token '", unk, "' is not in the vocab"));
      options.unk_id = it->second;
    }
    std::vector<std::pair<std::string, std::string>> merges;
    simdjson::dom::array merges_arr;
    // As in Hugging Face tokenizers, a BPE model has merges (an empty list at least).
    auto merges_json = Get(model, "merges");
    if (!merges_json) return Error("'model.merges' is missing");
    if (merges_json->get_array().get(merges_arr) != simdjson::SUCCESS) {
      return Error("'model.merges' is not an array");
    }
    merges.reserve(merges_arr.size());
    for (Element m : merges_arr) {
      std::string_view pair_str, left, right;
      simdjson::dom::array pair;
      if (m.get_string().get(pair_str) == simdjson::SUCCESS) {
        size_t space = pair_str.find(' ', 1);
        if (space == std::string_view::npos)
          return Error(absl::StrCat("merge '", Sv(pair_str), "' has no space"));
        left = pair_str.substr(0, space);
        right = pair_str.substr(space + 1);
      } else if (m.get_array().get(pair) == simdjson::SUCCESS && pair.size() == 2 &&
                 pair.at(0).get_string().get(left) == simdjson::SUCCESS &&
                 pair.at(1).get_string().get(right) == simdjson::SUCCESS) {
      } else {
        return Error("a merge is neither \"a b\" nor [\"a\", \"b\"]");
      }
      std::string raw_left, raw_right;
      if (!ByteLevelToBytes(left, &raw_left) || !ByteLevelToBytes(right, &raw_right)) {
        return Error(absl::StrCat("merge '", Sv(left), " ", Sv(right), "' is not byte-level text"));
      }
      merges.emplace_back(std::move(raw_left), std::move(raw_right));
    }
    absl::StatusOr<std::unique_ptr<BpeModel>> bpe =
        BpeModel::Create(std::move(vocab), merges, options);
    if (!bpe.ok()) return Error(bpe.status().message());
    tok->bpe_ = *std::move(bpe);
    return absl::OkStatus();
  }

  // The ByteLevel decoder turns each token's characters back into bytes; a token with a
  // character outside the alphabet is kept as its own UTF-8 (Hugging Face does the same).
  static void SetDecode(Tokenizer* tok, int id, const std::string& token, bool special) {
    if (static_cast<size_t>(id) >= tok->decode_.size()) {
      tok->decode_.resize(id + 1);
      tok->valid_.resize(id + 1);
    }
    tok->valid_[id] = true;
    Tokenizer::DecodeEntry& e = tok->decode_[id];
    e.bytes.clear();
    if (!ByteLevelToBytes(token, &e.bytes)) e.bytes = token;
    e.special = special;
  }

  absl::Status LoadAddedTokens(Object root, Tokenizer* tok) {
    std::vector<AddedToken> tokens;
    simdjson::dom::array arr;
    if (auto a = Get(root, "added_tokens")) {
      if (a->get_array().get(arr) != simdjson::SUCCESS)
        return Error("'added_tokens' is not an array");
      for (Element e : arr) {
        Object o;
        int64_t id;
        if (e.get_object().get(o) != simdjson::SUCCESS || !Get(o, "id") ||
            Get(o, "id")->get_int64().get(id) != simdjson::SUCCESS) {
          return Error("an added token has no valid 'id'");
        }
        RETURN_IF_ERROR(CheckId(id, "an added token"));
        AddedToken t;
        t.id = static_cast<int>(id);
        t.content = GetString(o, "content");
        if (t.content.empty()) return Error(absl::StrCat("added token ", id, " has empty content"));
        t.special = GetBool(o, "special", false);
        t.lstrip = GetBool(o, "lstrip", false);
        t.rstrip = GetBool(o, "rstrip", false);
        t.single_word = GetBool(o, "single_word", false);
        t.normalized = GetBool(o, "normalized", !t.special);
        SetDecode(tok, t.id, t.content, t.special);
        tok->token_to_id_[t.content] = t.id;
        tokens.push_back(std::move(t));
      }
    }
    tok->added_ = std::make_unique<AddedVocabulary>(std::move(tokens));
    return absl::OkStatus();
  }

  absl::Status LoadNormalizer(std::optional<Element> e, Tokenizer* tok) {
    if (!e) return absl::OkStatus();
    ASSIGN_OR_RETURN(Object o, AsObject(e, "'normalizer'"));
    std::string type = GetString(o, "type");
    if (type == "NFC") {
      tok->nfc_ = true;
      return absl::OkStatus();
    }
    if (type == "Sequence") {
      simdjson::dom::array arr;
      if (auto n = Get(o, "normalizers"); !n || n->get_array().get(arr) != simdjson::SUCCESS) {
        return Error("normalizer Sequence has no 'normalizers' array");
      }
      for (Element child : arr) RETURN_IF_ERROR(LoadNormalizer(child, tok));
      return absl::OkStatus();
    }
    return Error(absl::StrCat("normalizer '", type, "' is not supported (NFC)"));
  }

  absl::Status LoadPreTokenizer(std::optional<Element> e, Tokenizer* tok, bool* byte_level) {
    if (!e) return absl::OkStatus();
    ASSIGN_OR_RETURN(Object o, AsObject(e, "'pre_tokenizer'"));
    std::string type = GetString(o, "type");
    if (type == "Sequence") {
      simdjson::dom::array arr;
      if (auto p = Get(o, "pretokenizers"); !p || p->get_array().get(arr) != simdjson::SUCCESS) {
        return Error("pre_tokenizer Sequence has no 'pretokenizers' array");
      }
      for (Element child : arr) RETURN_IF_ERROR(LoadPreTokenizer(child, tok, byte_level));
      return absl::OkStatus();
    }
    if (type == "Split") {
      std::string behavior = GetString(o, "behavior");
      if (behavior != "Isolated" || GetBool(o, "invert", false)) {
        return Error(absl::StrCat("Split pre-tokenizer behavior '", behavior,
                                  "' (or invert) is not supported (Isolated)"));
      }
      ASSIGN_OR_RETURN(Object pattern, AsObject(Get(o, "pattern"), "Split 'pattern'"));
      std::string regex = GetString(pattern, "Regex");
      if (regex.empty()) {
        std::string literal = GetString(pattern, "String");
        if (literal.empty()) return Error("Split pattern has neither 'Regex' nor 'String'");
        regex = absl::StrCat("\\Q", literal, "\\E");
      }
      return AddSplitter(regex, tok);
    }
    if (type == "ByteLevel") {
      *byte_level = true;
      if (GetBool(o, "add_prefix_space", false)) tok->add_prefix_space_ = true;
      if (GetBool(o, "use_regex", true)) return AddSplitter(kGpt2Pattern, tok);
      return absl::OkStatus();
    }
    return Error(
        absl::StrCat("pre_tokenizer '", type, "' is not supported (Sequence, Split, ByteLevel)"));
  }

  absl::Status AddSplitter(const std::string& regex, Tokenizer* tok) {
    absl::StatusOr<std::unique_ptr<RegexSplitter>> splitter = RegexSplitter::Create(regex);
    if (!splitter.ok()) return Error(splitter.status().message());
    tok->pre_tokenize_.push_back({*std::move(splitter)});
    return absl::OkStatus();
  }

  absl::Status LoadDecoder(std::optional<Element> e) {
    if (!e) return Error("'decoder' is missing; byte-level BPE needs the ByteLevel decoder");
    ASSIGN_OR_RETURN(Object o, AsObject(e, "'decoder'"));
    std::string type = GetString(o, "type");
    if (type != "ByteLevel") {
      return Error(absl::StrCat("decoder '", type, "' is not supported (ByteLevel)"));
    }
    return absl::OkStatus();
  }

  absl::Status LoadPostProcessor(std::optional<Element> e, Tokenizer* tok) {
    if (!e) return absl::OkStatus();
    ASSIGN_OR_RETURN(Object o, AsObject(e, "'post_processor'"));
    std::string type = GetString(o, "type");
    if (type == "ByteLevel") return absl::OkStatus();  // offsets only
    if (type == "Sequence") {
      simdjson::dom::array arr;
      if (auto p = Get(o, "processors"); !p || p->get_array().get(arr) != simdjson::SUCCESS) {
        return Error("post_processor Sequence has no 'processors' array");
      }
      for (Element child : arr) RETURN_IF_ERROR(LoadPostProcessor(child, tok));
      return absl::OkStatus();
    }
    if (type != "TemplateProcessing") {
      return Error(absl::StrCat("post_processor '", type,
                                "' is not supported (ByteLevel, TemplateProcessing)"));
    }
    ASSIGN_OR_RETURN(Object specials,
                     AsObject(Get(o, "special_tokens"), "TemplateProcessing 'special_tokens'"));
    simdjson::dom::array single;
    if (auto s = Get(o, "single"); !s || s->get_array().get(single) != simdjson::SUCCESS) {
      return Error("TemplateProcessing has no 'single' array");
    }
    bool seen_sequence = false;
    for (Element piece : single) {
      Object p;
      if (piece.get_object().get(p) != simdjson::SUCCESS)
        return Error("bad TemplateProcessing piece");
      if (Get(p, "Sequence")) {
        seen_sequence = true;
        continue;
      }
      ASSIGN_OR_RETURN(Object special,
                       AsObject(Get(p, "SpecialToken"), "TemplateProcessing piece"));
      std::string name = GetString(special, "id");
      ASSIGN_OR_RETURN(Object entry,
                       AsObject(Get(specials, name), absl::StrCat("special token '", name, "'")));
      simdjson::dom::array ids;
      if (auto i = Get(entry, "ids"); !i || i->get_array().get(ids) != simdjson::SUCCESS) {
        return Error(absl::StrCat("special token '", name, "' has no 'ids'"));
      }
      for (Element id_el : ids) {
        int64_t id;
        if (id_el.get_int64().get(id) != simdjson::SUCCESS) return Error("bad special token id");
        RETURN_IF_ERROR(CheckId(id, absl::StrCat("special token '", name, "'")));
        (seen_sequence ? tok->suffix_ids_ : tok->prefix_ids_).push_back(static_cast<int>(id));
      }
    }
    return absl::OkStatus();
  }

  // BOS/EOS tokens (a string or an AddedToken object), add_bos_token / add_eos_token, and
  // the default chat template. nlohmann here: the file is small and may hold integers too
  // large for simdjson (`model_max_length`: 1e30).
  absl::Status LoadConfig(std::string_view config_json, Tokenizer* tok) {
    using json = nlohmann::json;
    json root = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
    if (root.is_discarded() || !root.is_object()) {
      return Error("tokenizer_config.json is not a valid JSON object");
    }
    auto token_text = [&](const char* key) -> std::string {
      auto it = root.find(key);
      if (it == root.end()) return "";
      if (it->is_string()) return it->get<std::string>();
      if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
        return (*it)["content"].get<std::string>();
      }
      return "";
    };
    auto flag = [&](const char* key) {
      auto it = root.find(key);
      return it != root.end() && it->is_boolean() && it->get<bool>();
    };
    tok->bos_token_ = token_text("bos_token");
    tok->eos_token_ = token_text("eos_token");
    if (!tok->bos_token_.empty()) {
      tok->bos_id_ = tok->TokenToId(tok->bos_token_);
      if (!tok->bos_id_)
        return Error(absl::StrCat("bos_token '", tok->bos_token_, "' is not a token"));
    }
    if (!tok->eos_token_.empty()) {
      tok->eos_id_ = tok->TokenToId(tok->eos_token_);
      if (!tok->eos_id_)
        return Error(absl::StrCat("eos_token '", tok->eos_token_, "' is not a token"));
    }
    // Slow-tokenizer style flags, honoured when the post-processor does not already add them.
    if (flag("add_bos_token") && tok->bos_id_ && tok->prefix_ids_.empty()) {
      tok->prefix_ids_.push_back(*tok->bos_id_);
    }
    if (flag("add_eos_token") && tok->eos_id_ && tok->suffix_ids_.empty()) {
      tok->suffix_ids_.push_back(*tok->eos_id_);
    }
    auto t = root.find("chat_template");
    if (t != root.end() && t->is_string()) {
      tok->chat_template_ = t->get<std::string>();
    } else if (t != root.end() && t->is_array()) {  // [{"name": "default", "template": ...}]
      for (const json& item : *t) {
        if (item.is_object() && item.value("name", "") == "default" && item.contains("template") &&
            item["template"].is_string()) {
          tok->chat_template_ = item["template"].get<std::string>();
        }
      }
    }
    return absl::OkStatus();
  }

  std::string source_;
  int64_t max_id_ = 0;  // see MaxId
};

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view tokenizer_json,
                                                               std::string_view config_json,
                                                               std::string_view source) {
  std::unique_ptr<Tokenizer> tok(new Tokenizer());
  RETURN_IF_ERROR(TokenizerLoader(source).Load(tokenizer_json, config_json, tok.get()));
  return tok;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& dir) {
  namespace fs = std::filesystem;
  ASSIGN_OR_RETURN(std::string json, ReadFileToString((fs::path(dir) / "tokenizer.json").string()));
  std::string config;
  const std::string config_path = (fs::path(dir) / "tokenizer_config.json").string();
  std::error_code ec;
  if (fs::exists(config_path, ec)) {
    ASSIGN_OR_RETURN(config, ReadFileToString(config_path));
  }
  return FromJson(json, config, dir);
}

}  // namespace kvserve::tokenizer
