#include "common/model/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/string_util.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"

namespace kvserve {
namespace {

using json = nlohmann::json;

absl::Status Invalid(const std::string& file, const std::string& tensor, const std::string& what) {
  if (tensor.empty()) return absl::InvalidArgumentError(absl::StrCat(file, ": ", what));
  return absl::InvalidArgumentError(absl::StrCat(file, ": tensor '", tensor, "': ", what));
}

// Multiplies shape dimensions, failing on negative values or int64 overflow.
bool CheckedNumel(const std::vector<int64_t>& shape, int64_t* out) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return false;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return false;
    n *= d;
  }
  *out = n;
  return true;
}

}  // namespace

int64_t TensorInfo::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<float> TensorInfo::ToFloat32() const {
  const int64_t n = NumElements();
  std::vector<float> out(n);
  const uint8_t* p = bytes.data();
  switch (dtype) {
    case DType::kF32:
      std::memcpy(out.data(), p, n * 4);
      break;
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) out[i] = F16ToFloat(p[2 * i] | (p[2 * i + 1] << 8));
      break;
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(p[2 * i] | (p[2 * i + 1] << 8));
      break;
    case DType::kF8E4M3:
      for (int64_t i = 0; i < n; ++i) out[i] = F8E4M3ToFloat(p[i]);
      break;
    default:
      LOG(FATAL) << "ToFloat32 on integer tensor " << name << " (" << DTypeName(dtype) << ")";
  }
  return out;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::Open(path));
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(std::move(mapped)));
  RETURN_IF_ERROR(file->Parse());
  return file;
}

namespace {

// The header's JSON object, after checking that its length fits the limit and the file.
absl::StatusOr<json> ParseHeader(const std::string& path, absl::Span<const uint8_t> all,
                                 uint64_t* header_len) {
  if (all.size() < 8) {
    return Invalid(
        path, "",
        absl::StrCat("truncated: ", all.size(), " bytes, too short for the 8-byte header length"));
  }
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | all[i];
  if (len > SafetensorsFile::kMaxHeaderBytes) {
    return Invalid(path, "",
                   absl::StrCat("header length ", len, " exceeds the limit of ",
                                SafetensorsFile::kMaxHeaderBytes, " bytes"));
  }
  if (len > all.size() - 8) {
    return Invalid(path, "",
                   absl::StrCat("truncated: header length ", len,
                                " runs past the end of the file (", all.size(), " bytes)"));
  }
  const auto* begin = reinterpret_cast<const char*>(all.data() + 8);
  json header = json::parse(begin, begin + len, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return Invalid(path, "", "header is not a valid JSON object");
  }
  *header_len = len;
  return header;
}

// A tensor's byte range in the data section.
struct Range {
  uint64_t begin, end;
  const std::string* name;
};

// One header entry: its dtype, shape and byte range, checked against each other and against
// the `data` section's size.
absl::StatusOr<TensorInfo> ParseEntry(const std::string& path, const std::string& name,
                                      const json& entry, absl::Span<const uint8_t> data,
                                      Range* range) {
  if (!entry.is_object()) return Invalid(path, name, "entry is not an object");
  auto dtype_it = entry.find("dtype");
  auto shape_it = entry.find("shape");
  auto offsets_it = entry.find("data_offsets");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return Invalid(path, name, "missing or non-string 'dtype'");
  }
  absl::StatusOr<DType> dtype = ParseSafetensorsDType(dtype_it->get<std::string>());
  if (!dtype.ok()) return Invalid(path, name, std::string(dtype.status().message()));
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return Invalid(path, name, "missing or non-array 'shape'");
  }
  TensorInfo info;
  info.name = name;
  info.dtype = *dtype;
  info.file = path;
  for (const json& d : *shape_it) {
    if (!d.is_number_unsigned()) {
      return Invalid(path, name, "shape holds a non-integer or negative dimension");
    }
    info.shape.push_back(static_cast<int64_t>(d.get<uint64_t>()));
  }
  if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
      !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
    return Invalid(path, name, "'data_offsets' must be two non-negative integers");
  }
  const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
  const uint64_t end = (*offsets_it)[1].get<uint64_t>();
  if (begin > end) {
    return Invalid(path, name, absl::StrCat("data_offsets [", begin, ", ", end, "] are reversed"));
  }
  if (end > data.size()) {
    return Invalid(path, name,
                   absl::StrCat("data_offsets [", begin, ", ", end,
                                "] are out of range: the data section has ", data.size(),
                                " bytes (file truncated?)"));
  }
  int64_t numel;
  if (!CheckedNumel(info.shape, &numel) ||
      static_cast<uint64_t>(numel) > std::numeric_limits<uint64_t>::max() / DTypeSize(info.dtype)) {
    return Invalid(path, name, "shape overflows");
  }
  const uint64_t expected = static_cast<uint64_t>(numel) * DTypeSize(info.dtype);
  if (end - begin != expected) {
    return Invalid(path, name,
                   absl::StrCat("byte range holds ", end - begin, " bytes but shape and dtype ",
                                Sv(DTypeName(info.dtype)), " need ", expected));
  }
  info.bytes = data.subspan(begin, end - begin);
  range->begin = begin;
  range->end = end;
  return info;
}

// No two tensors' bytes overlap.
absl::Status CheckOverlaps(const std::string& path, std::vector<Range> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return Invalid(path, *ranges[i].name,
                     absl::StrCat("byte range [", ranges[i].begin, ", ", ranges[i].end,
                                  ") overlaps tensor '", *ranges[i - 1].name, "' [",
                                  ranges[i - 1].begin, ", ", ranges[i - 1].end, ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status SafetensorsFile::Parse() {
  const std::string& path = file_->path();
  absl::Span<const uint8_t> all = file_->bytes();
  uint64_t header_len = 0;
  ASSIGN_OR_RETURN(const json header, ParseHeader(path, all, &header_len));
  absl::Span<const uint8_t> data = all.subspan(8 + header_len);
  std::vector<Range> ranges;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return Invalid(path, "", "__metadata__ is not an object");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) {
          return Invalid(path, "", absl::StrCat("__metadata__ '", k, "' is not a string"));
        }
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    Range range;
    ASSIGN_OR_RETURN(TensorInfo info, ParseEntry(path, name, entry, data, &range));
    auto [it, inserted] = tensors_.emplace(name, std::move(info));
    range.name = &it->first;
    ranges.push_back(range);
  }
  return CheckOverlaps(path, std::move(ranges));
}

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  namespace fs = std::filesystem;
  auto ckpt = std::make_unique<Checkpoint>();
  const std::string index_path = (fs::path(dir) / "model.safetensors.index.json").string();
  std::error_code ec;
  if (!fs::exists(index_path, ec)) {
    const std::string single = (fs::path(dir) / "model.safetensors").string();
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(single));
    for (const auto& [name, info] : file->tensors()) ckpt->tensors_[name] = &info;
    ckpt->files_.push_back(std::move(file));
    return ckpt;
  }
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(index_path));
  json index = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded() || !index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    return Invalid(index_path, "", "not a JSON object with a 'weight_map' object");
  }
  std::map<std::string, SafetensorsFile*> opened;
  for (auto& [name, file_json] : index["weight_map"].items()) {
    if (!file_json.is_string())
      return Invalid(index_path, name, "weight_map value is not a string");
    const std::string file_name = file_json.get<std::string>();
    if (file_name.empty() || file_name.find('/') != std::string::npos || file_name == "." ||
        file_name == "..") {
      return Invalid(index_path, name,
                     absl::StrCat("shard name '", file_name,
                                  "' must be a plain file name in the model directory"));
    }
    auto it = opened.find(file_name);
    if (it == opened.end()) {
      ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file,
                       SafetensorsFile::Open((fs::path(dir) / file_name).string()));
      it = opened.emplace(file_name, file.get()).first;
      ckpt->files_.push_back(std::move(file));
    }
    auto tensor_it = it->second->tensors().find(name);
    if (tensor_it == it->second->tensors().end()) {
      return Invalid(it->second->path(), name, "listed in the index but not in this shard");
    }
    ckpt->tensors_[name] = &tensor_it->second;
  }
  return ckpt;
}

absl::StatusOr<const TensorInfo*> Checkpoint::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end())
    return absl::NotFoundError(absl::StrCat("no tensor '", name, "' in checkpoint"));
  return it->second;
}

int64_t Checkpoint::TotalBytes() const {
  int64_t total = 0;
  for (const auto& [name, info] : tensors_) total += static_cast<int64_t>(info->bytes.size());
  return total;
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    int64_t numel;
    if (!CheckedNumel(t.shape, &numel) ||
        static_cast<uint64_t>(numel) * DTypeSize(t.dtype) != t.bytes.size()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", t.name, "': ", t.bytes.size(),
                                                     " bytes do not match its shape and dtype"));
    }
    if (header.contains(t.name)) {
      return absl::InvalidArgumentError(absl::StrCat("duplicate tensor name '", t.name, "'"));
    }
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  out.reserve(8 + text.size() + offset);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((text.size() >> (8 * i)) & 0xff));
  out += text;
  for (const TensorToWrite& t : tensors) out.append(t.bytes.data(), t.bytes.size());
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::InternalError(absl::StrCat("cannot create '", path, "'"));
  bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return absl::InternalError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace kvserve
