// bf16 bit patterns on the CPU, for the references and the tests.
#pragma once

#include <cstdint>

namespace muse_decode::reference {

// The value of a bf16 bit pattern.
float bf16_bits_to_float(uint16_t bits);
// The nearest bf16 (ties to even); NaN stays a quiet NaN.
uint16_t float_to_bf16_bits(float value);

}  // namespace muse_decode::reference
