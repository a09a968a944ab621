#include "gz/train/tensorboard.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "gz/core/error.h"

namespace gz::train {

namespace {

struct Crc32cTable {
  uint32_t t[256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
  }
};

// Protobuf wire helpers: varint, tag, length-delimited, fixed 32/64.
void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void put_tag(std::string& out, int field, int wire) { put_varint(out, (static_cast<uint64_t>(field) << 3) | wire); }
void put_bytes(std::string& out, int field, const std::string& bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out += bytes;
}
template <typename T>
void put_fixed(std::string& out, T v) {
  char buf[sizeof(T)];
  std::memcpy(buf, &v, sizeof(T));  // x86/ARM hosts are little-endian, as the format requires
  out.append(buf, sizeof(T));
}

std::string event_header(int64_t step) {
  std::string e;
  double wall = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  put_tag(e, 1, 1);  // wall_time: double
  put_fixed(e, wall);
  put_tag(e, 2, 0);  // step: int64
  put_varint(e, static_cast<uint64_t>(step));
  return e;
}

}  // namespace

uint32_t crc32c(const void* data, size_t n, uint32_t crc) {
  static const Crc32cTable table;
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) crc = table.t[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t n) {
  uint32_t c = crc32c(data, n);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& log_dir) {
  std::error_code ec;
  std::filesystem::create_directories(log_dir, ec);
  if (ec) throw SystemError("create directory " + log_dir, ec.value());
  char host[256] = "localhost";
  ::gethostname(host, sizeof(host) - 1);
  long now = static_cast<long>(std::chrono::duration_cast<std::chrono::seconds>(
                                   std::chrono::system_clock::now().time_since_epoch()).count());
  path_ = (std::filesystem::path(log_dir) /
           ("events.out.tfevents." + std::to_string(now) + "." + host + "." + std::to_string(::getpid())))
              .string();
  file_ = std::fopen(path_.c_str(), "ab");
  if (!file_) throw SystemError("open " + path_, errno);
  std::string e = event_header(0);
  put_bytes(e, 3, "brain.Event:2");  // file_version
  write_record(e);
  flush();
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

void TensorBoardWriter::add_scalar(const std::string& tag, double value, int64_t step) {
  std::string v;
  put_bytes(v, 1, tag);  // Summary.Value.tag
  put_tag(v, 2, 5);      // Summary.Value.simple_value: float
  put_fixed(v, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, 1, v);  // Summary.value
  std::string e = event_header(step);
  put_bytes(e, 5, summary);  // Event.summary
  write_record(e);
}

void TensorBoardWriter::write_record(const std::string& event) {
  std::string rec;
  uint64_t len = event.size();
  put_fixed(rec, len);
  put_fixed(rec, masked_crc32c(rec.data(), 8));
  rec += event;
  put_fixed(rec, masked_crc32c(event.data(), event.size()));
  if (std::fwrite(rec.data(), 1, rec.size(), file_) != rec.size()) throw SystemError("write " + path_, errno);
}

void TensorBoardWriter::flush() {
  if (file_) std::fflush(file_);
}

}  // namespace gz::train
