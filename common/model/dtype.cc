#include "common/model/dtype.h"

#include "absl/strings/str_cat.h"

namespace kvserve {
namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};

constexpr DTypeInfo kDTypes[] = {
    {DType::kF32, "F32", 4},        {DType::kF16, "F16", 2}, {DType::kBF16, "BF16", 2},
    {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kI8, "I8", 1},   {DType::kU8, "U8", 1},
    {DType::kI32, "I32", 4},        {DType::kI64, "I64", 8},
};

}  // namespace

size_t DTypeSize(DType t) { return kDTypes[static_cast<int>(t)].size; }

std::string_view DTypeName(DType t) { return kDTypes[static_cast<int>(t)].name; }

absl::StatusOr<DType> ParseSafetensorsDType(std::string_view name) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.name == name) return info.type;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown dtype '", std::string(name), "'"));
}

}  // namespace kvserve
