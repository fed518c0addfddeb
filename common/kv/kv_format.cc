#include "common/kv/kv_format.h"

#include <algorithm>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "common/string_util.h"

namespace kvserve {
namespace {

struct DTypeRow {
  KvDType type;
  std::string_view name;
  int bits;
};
constexpr DTypeRow kDTypes[] = {{KvDType::kFp32, "fp32", 32}, {KvDType::kFp16, "fp16", 16},
                                {KvDType::kBf16, "bf16", 16}, {KvDType::kFp8E4M3, "fp8_e4m3", 8},
                                {KvDType::kInt8, "int8", 8},  {KvDType::kInt4, "int4", 4}};

}  // namespace

std::string_view KvDTypeName(KvDType t) { return kDTypes[static_cast<int>(t)].name; }

absl::StatusOr<KvDType> ParseKvDType(std::string_view name) {
  for (const DTypeRow& r : kDTypes) {
    if (r.name == name) return r.type;
  }
  if (name == "fp8") return KvDType::kFp8E4M3;
  return absl::InvalidArgumentError(
      absl::StrCat("--kv-cache-dtype '", Sv(name),
                   "' is not one of auto, fp32, fp16, bf16, fp8_e4m3, int8, int4"));
}

std::string_view KvGranularityName(KvGranularity g) {
  switch (g) {
    case KvGranularity::kNone:
      return "none";
    case KvGranularity::kPerToken:
      return "per_token";
    case KvGranularity::kPerGroup:
      return "per_group";
    case KvGranularity::kPerChannel:
      return "per_channel";
  }
  return "?";
}

absl::StatusOr<KvGranularity> ParseKvGranularity(std::string_view name) {
  for (KvGranularity g :
       {KvGranularity::kPerToken, KvGranularity::kPerGroup, KvGranularity::kPerChannel}) {
    if (KvGranularityName(g) == name) return g;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--kv-quant-granularity '", Sv(name), "' is not one of per_token, per_group, per_channel"));
}

int KvFormat::bits() const { return kDTypes[static_cast<int>(dtype)].bits; }

int KvFormat::scale_params() const {
  if (!quantized()) return 0;
  return dtype == KvDType::kInt4 ? 2 : 1;
}

int64_t KvFormat::ScaleEntries(int block_size, int head_dim) const {
  switch (granularity) {
    case KvGranularity::kNone:
      return 0;
    case KvGranularity::kPerToken:
      return int64_t{block_size} * scale_params();
    case KvGranularity::kPerGroup:
      return int64_t{block_size} * (head_dim / group_size) * scale_params();
    case KvGranularity::kPerChannel:
      return int64_t{head_dim} * scale_params();
  }
  return 0;
}

std::string KvFormat::Describe() const {
  std::string out(KvDTypeName(dtype));
  if (granularity == KvGranularity::kNone) return out;
  absl::StrAppend(&out, "/", Sv(KvGranularityName(granularity)));
  if (granularity == KvGranularity::kPerGroup) absl::StrAppend(&out, ":", group_size);
  return out;
}

int64_t KvCacheSpec::BytesPerBlock(int num_kv_heads, int block_size, int head_dim) const {
  int64_t total = 0;
  for (size_t l = 0; l < k.size(); ++l) {
    total += num_kv_heads * (k[l].BlockHeadBytes(block_size, head_dim) +
                             v[l].BlockHeadBytes(block_size, head_dim));
  }
  return total;
}

double KvCacheSpec::BytesPerToken(int num_kv_heads, int block_size, int head_dim) const {
  return static_cast<double>(BytesPerBlock(num_kv_heads, block_size, head_dim)) / block_size;
}

std::string KvCacheSpec::CacheKeyDType() const {
  std::set<std::string> names;
  for (size_t l = 0; l < k.size(); ++l) {
    names.insert(std::string(KvDTypeName(k[l].dtype)));
    names.insert(std::string(KvDTypeName(v[l].dtype)));
  }
  return absl::StrJoin(names, "+");
}

std::string KvCacheSpec::CacheKeyQuant() const {
  // Runs of layers with the same formats: "0-0:fp32,fp32;1-30:int8/per_token,int8/per_token".
  std::string out;
  size_t start = 0;
  for (size_t l = 1; l <= k.size(); ++l) {
    if (l < k.size() && k[l] == k[start] && v[l] == v[start]) continue;
    absl::StrAppend(&out, out.empty() ? "" : ";", start, "-", l - 1, ":", k[start].Describe(), ",",
                    v[start].Describe());
    start = l;
  }
  return out;
}

absl::StatusOr<std::vector<int>> ParseLayerList(std::string_view spec, int num_layers) {
  std::set<int> layers;
  for (absl::string_view piece : absl::StrSplit(Sv(spec), ',', absl::SkipWhitespace())) {
    const std::string_view item = StdSv(piece);
    auto bad = [&] {
      return absl::InvalidArgumentError(absl::StrCat("--kv-full-precision-layers item '", Sv(item),
                                                     "' is not a layer index in [0, ", num_layers,
                                                     "), first:N or last:N"));
    };
    int n;
    if (item.rfind("first:", 0) == 0 || item.rfind("last:", 0) == 0) {
      const bool first = item[0] == 'f';
      if (!absl::SimpleAtoi(Sv(item.substr(first ? 6 : 5)), &n) || n < 0 || n > num_layers)
        return bad();
      for (int i = 0; i < n; ++i) layers.insert(first ? i : num_layers - 1 - i);
    } else {
      if (!absl::SimpleAtoi(Sv(item), &n) || n < 0 || n >= num_layers) return bad();
      layers.insert(n);
    }
  }
  return std::vector<int>(layers.begin(), layers.end());
}

absl::StatusOr<KvCacheSpec> MakeKvCacheSpec(const KvQuantOptions& options, int num_layers,
                                            int head_dim, KvDType auto_dtype) {
  KvDType dtype = auto_dtype;
  if (options.dtype != "auto") {
    ASSIGN_OR_RETURN(dtype, ParseKvDType(options.dtype));
  }
  KvFormat k{dtype, KvGranularity::kNone, 0}, v = k;
  if (k.quantized()) {
    // "per_group" for both, or "k:per_channel,v:per_token".
    std::string_view g = options.granularity;
    if (g.find(':') == std::string_view::npos && g.find('=') == std::string_view::npos) {
      ASSIGN_OR_RETURN(k.granularity, ParseKvGranularity(g));
      v.granularity = k.granularity;
    } else {
      bool have_k = false, have_v = false;
      for (absl::string_view piece : absl::StrSplit(Sv(g), ',')) {
        const std::string_view part = StdSv(piece);
        const size_t sep = part.find_first_of(":=");
        const std::string_view which = part.substr(0, sep);
        ASSIGN_OR_RETURN(KvGranularity parsed, ParseKvGranularity(part.substr(sep + 1)));
        if (which == "k") {
          k.granularity = parsed;
          have_k = true;
        } else if (which == "v") {
          v.granularity = parsed;
          have_v = true;
        } else {
          return absl::InvalidArgumentError(absl::StrCat(
              "--kv-quant-granularity '", options.granularity, "': use k:GRAN,v:GRAN"));
        }
      }
      if (!have_k || !have_v) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--kv-quant-granularity '", options.granularity, "' must give both k: and v:"));
      }
    }
    for (KvFormat* f : {&k, &v}) {
      if (f->granularity != KvGranularity::kPerGroup) continue;
      const int gs = options.group_size;
      if (gs < 8 || (gs & (gs - 1)) != 0 || gs > head_dim || head_dim % gs != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("--kv-quant-group-size ", gs,
                         " must be a power of two >= 8 that divides head_dim (", head_dim, ")"));
      }
      f->group_size = gs;
    }
  }
  KvCacheSpec spec;
  spec.k.assign(num_layers, k);
  spec.v.assign(num_layers, v);
  ASSIGN_OR_RETURN(std::vector<int> full,
                   ParseLayerList(options.full_precision_layers, num_layers));
  for (int l : full) {
    spec.k[l] = KvFormat{auto_dtype, KvGranularity::kNone, 0};
    spec.v[l] = spec.k[l];
  }
  return spec;
}

}  // namespace kvserve
