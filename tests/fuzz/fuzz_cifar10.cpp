// Fuzzes the CIFAR-10 binary reader (data/cifar10.h): parse_cifar10, what a worker runs
// on data_batch_*.bin and test_batch.bin.
//
// Input: a whole file, read without a limit and, for inputs of even length, with a limit
// of 2 records. Checks, beyond "no crash" and "only ProtocolError escapes":
//   - an accepted file is a whole number of 3073-byte records and yields that many
//     images (capped by the limit), 32×32×3 each, labels in 0..9;
//   - record 0's label and its first red, green and blue bytes land where the format
//     puts them (pixel 0 of the HWC image).
#include <cstdint>
#include <span>

#include "common/errors.h"
#include "data/cifar10.h"
#include "fuzz_check.h"

using namespace dltrain;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::int64_t limit = size % 2 == 0 ? 2 : 0;
  try {
    const auto m = data::parse_cifar10(std::span<const std::uint8_t>(data, size), "fuzz", limit);
    FUZZ_CHECK(size > 0 && size % data::kCifar10RecordBytes == 0, "accepted a partial record");
    const auto records = static_cast<std::int64_t>(size / data::kCifar10RecordBytes);
    FUZZ_CHECK(m.count == (limit > 0 && limit < records ? limit : records), "wrong record count");
    FUZZ_CHECK(m.height == 32 && m.width == 32 && m.channels == 3, "not 32x32x3");
    FUZZ_CHECK(m.pixels.size() == static_cast<std::size_t>(m.count) * 3072 && m.labels.size() == static_cast<std::size_t>(m.count),
               "pixels or labels of the wrong size");
    for (const auto l : m.labels) FUZZ_CHECK(l >= 0 && l < 10, "a label outside 0..9");
    FUZZ_CHECK(m.labels[0] == data[0] && m.pixels[0] == data[1] && m.pixels[1] == data[1 + 1024] &&
                   m.pixels[2] == data[1 + 2048],
               "record 0 is not where the format puts it");
  } catch (const ProtocolError&) {
  }
  return 0;
}
