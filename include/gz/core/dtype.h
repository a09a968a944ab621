// Element types understood by the communication layer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace gz {

/// @brief Element type of a buffer handed to a collective.
enum class DType : uint8_t { f32 = 0, f64, f16, bf16, i8, u8, i32, i64 };

/// @brief Bytes per element.
size_t dtype_size(DType t);
/// @brief "f32", "bf16", ...
const char* dtype_name(DType t);
/// @brief Parse "f32"/"float32"/"float", "bf16"/"bfloat16", ...; throws InvalidArgument.
DType parse_dtype(const std::string& s);

/// @brief IEEE half <-> float conversions (round to nearest even).
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
/// @brief bfloat16 <-> float conversions (round to nearest even).
inline float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
uint16_t float_to_bf16(float f);

}  // namespace gz
