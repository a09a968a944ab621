#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "gz/train/tensorboard.h"

// A namespace of its own: the unity build (GZ_UNITY_BUILD) compiles this file together with
// the other files of its test target.
namespace test_tensorboard {

namespace fs = std::filesystem;

namespace {

// Independent bit-by-bit CRC-32C (the library uses a table).
uint32_t crc32c_bitwise(const std::string& s) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char ch : s) {
    crc ^= ch;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}
uint32_t masked(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

struct Scalar {
  std::string tag;
  float value = 0;
  int64_t step = 0;
};

uint64_t varint(const std::string& s, size_t& pos) {
  uint64_t v = 0;
  for (int shift = 0;; shift += 7) {
    unsigned char b = static_cast<unsigned char>(s.at(pos++));
    v |= static_cast<uint64_t>(b & 0x7F) << shift;
    if (!(b & 0x80)) return v;
  }
}

// Minimal protobuf walk of Event / Summary / Value. Returns the fields it understood.
void parse_event(const std::string& e, std::vector<Scalar>& out, std::string& file_version, double& wall) {
  size_t pos = 0;
  int64_t step = 0;
  std::vector<Scalar> values;
  while (pos < e.size()) {
    uint64_t key = varint(e, pos);
    int field = static_cast<int>(key >> 3), wire = static_cast<int>(key & 7);
    if (wire == 1) {
      std::memcpy(&wall, e.data() + pos, 8);
      pos += 8;
    } else if (wire == 0) {
      uint64_t v = varint(e, pos);
      if (field == 2) step = static_cast<int64_t>(v);
    } else if (wire == 2) {
      uint64_t len = varint(e, pos);
      std::string body = e.substr(pos, len);
      pos += len;
      if (field == 3) file_version = body;
      if (field == 5) {  // Summary
        size_t p = 0;
        while (p < body.size()) {
          uint64_t k = varint(body, p);
          ASSERT_EQ(k, (1u << 3) | 2u);
          uint64_t l = varint(body, p);
          std::string val = body.substr(p, l);
          p += l;
          Scalar sc;
          size_t q = 0;
          while (q < val.size()) {
            uint64_t vk = varint(val, q);
            if (vk == ((1u << 3) | 2u)) {
              uint64_t tl = varint(val, q);
              sc.tag = val.substr(q, tl);
              q += tl;
            } else if (vk == ((2u << 3) | 5u)) {
              std::memcpy(&sc.value, val.data() + q, 4);
              q += 4;
            } else {
              FAIL() << "unexpected Value field " << vk;
            }
          }
          values.push_back(sc);
        }
      }
    } else {
      FAIL() << "unexpected wire type " << wire;
    }
  }
  for (auto& v : values) {
    v.step = step;
    out.push_back(v);
  }
}

}  // namespace

TEST(TensorBoard, Crc32cKnownVector) {
  // RFC 3720 check value of "123456789".
  EXPECT_EQ(gz::train::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(gz::train::crc32c("123456789", 9), crc32c_bitwise("123456789"));
}

TEST(TensorBoard, RecordsAndCrcsValidate) {
  auto dir = fs::temp_directory_path() / ("gz_tb_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::string path;
  {
    gz::train::TensorBoardWriter w(dir.string());
    path = w.path();
    for (int i = 0; i < 5; ++i) w.add_scalar("train/loss", 1.0 / (i + 1), i * 10);
    w.add_scalar("eval/test_accuracy", 0.875, 40);
  }
  EXPECT_NE(fs::path(path).filename().string().find("events.out.tfevents."), std::string::npos);
  std::ifstream in(path, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(in)), {});
  size_t pos = 0;
  int records = 0;
  std::vector<Scalar> scalars;
  std::string file_version;
  while (pos < data.size()) {
    ASSERT_LE(pos + 12, data.size());
    std::string len_bytes = data.substr(pos, 8);
    uint64_t len;
    std::memcpy(&len, len_bytes.data(), 8);
    uint32_t len_crc;
    std::memcpy(&len_crc, data.data() + pos + 8, 4);
    EXPECT_EQ(len_crc, masked(crc32c_bitwise(len_bytes))) << "record " << records;
    ASSERT_LE(pos + 12 + len + 4, data.size());
    std::string event = data.substr(pos + 12, len);
    uint32_t data_crc;
    std::memcpy(&data_crc, data.data() + pos + 12 + len, 4);
    EXPECT_EQ(data_crc, masked(crc32c_bitwise(event))) << "record " << records;
    double wall = 0;
    parse_event(event, scalars, file_version, wall);
    EXPECT_GT(wall, 1.5e9);
    pos += 12 + len + 4;
    ++records;
  }
  EXPECT_EQ(records, 7);
  EXPECT_EQ(file_version, "brain.Event:2");
  ASSERT_EQ(scalars.size(), 6u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(scalars[i].tag, "train/loss");
    EXPECT_FLOAT_EQ(scalars[i].value, static_cast<float>(1.0 / (i + 1)));
    EXPECT_EQ(scalars[i].step, i * 10);
  }
  EXPECT_EQ(scalars[5].tag, "eval/test_accuracy");
  EXPECT_FLOAT_EQ(scalars[5].value, 0.875f);
  // Optional: the real reader, when this machine has it.
  if (fs::exists("/usr/bin/python3") &&
      std::system("/usr/bin/python3 -c 'import tensorboard' >/dev/null 2>&1") == 0) {
    std::string cmd = "/usr/bin/python3 -c \"from tensorboard.backend.event_processing.event_accumulator import "
                      "EventAccumulator as E; a=E('" + dir.string() + "'); a.Reload(); "
                      "assert len(a.Scalars('train/loss'))==5\"";
    EXPECT_EQ(std::system(cmd.c_str()), 0);
  }
  fs::remove_all(dir);
}

}  // namespace test_tensorboard
