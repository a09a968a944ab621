#include "gz/train/data/image_io.h"

#include <png.h>
// jpeglib.h needs FILE and size_t declared first.
#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <memory>
#include <jpeglib.h>

#include "gz/core/error.h"

namespace gz::train {
namespace {

struct FileCloser {
  void operator()(FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<FILE, FileCloser>;

FilePtr open_file(const std::string& path, const char* mode) {
  FilePtr f(std::fopen(path.c_str(), mode));
  if (!f) throw SystemError("image: cannot open '" + path + "'", errno);
  return f;
}

// libjpeg reports errors through a callback that must not return: jump back to the decode
// function, which turns the message into an exception outside any libjpeg frame.
struct JpegError {
  jpeg_error_mgr mgr;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void jpeg_error_exit(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  std::longjmp(err->jump, 1);
}

// Is width x height x channels over max_bytes? Without overflow: the header's 32-bit dimensions
// multiply past 64 bits.
bool over_cap(int64_t width, int64_t height, int64_t channels, int64_t max_bytes) {
  return width > 0 && height > 0 && (width > max_bytes / height || width * height > max_bytes / channels);
}

// Returns an empty string on success, else libjpeg's message. Only trivially destructible
// objects live between setjmp and longjmp. `too_large` is set (and nothing decoded) when the
// header's size is over `max_bytes`; out's dimensions are those of the header then.
std::string decode_jpeg(FILE* f, int channels, int64_t max_bytes, Image& out, bool& too_large) {
  jpeg_decompress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_exit;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return err.message;
  }
  jpeg_create_decompress(&cinfo);
  jpeg_stdio_src(&cinfo, f);
  jpeg_read_header(&cinfo, TRUE);
  cinfo.out_color_space = channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  // jpeg_start_decompress allocates (whole-image coefficient buffers for progressive files), so
  // the cap is checked on the computed output size before it.
  jpeg_calc_output_dimensions(&cinfo);
  out.height = cinfo.output_height;
  out.width = cinfo.output_width;
  out.channels = cinfo.output_components;
  if (over_cap(out.width, out.height, out.channels, max_bytes)) {
    too_large = true;
    jpeg_destroy_decompress(&cinfo);
    return {};
  }
  jpeg_start_decompress(&cinfo);
  out.pixels.resize(static_cast<size_t>(out.height * out.width * out.channels));
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = out.pixels.data() + static_cast<size_t>(cinfo.output_scanline) * out.width * out.channels;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return {};
}

[[noreturn]] void throw_too_large(const std::string& path, const char* kind, const Image& img, int64_t max_bytes) {
  GZ_THROW(Error, "image: ", kind, " '", path, "' is ", img.width, " x ", img.height, " pixels x ", img.channels,
           " channels, over the limit of ", max_bytes, " bytes (width x height x channels; max_image_bytes)");
}

std::string encode_jpeg(FILE* f, const Image& img, int quality) {
  jpeg_compress_struct cinfo;
  JpegError err;
  cinfo.err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = jpeg_error_exit;
  if (setjmp(err.jump)) {
    jpeg_destroy_compress(&cinfo);
    return err.message;
  }
  jpeg_create_compress(&cinfo);
  jpeg_stdio_dest(&cinfo, f);
  cinfo.image_width = static_cast<JDIMENSION>(img.width);
  cinfo.image_height = static_cast<JDIMENSION>(img.height);
  cinfo.input_components = static_cast<int>(img.channels);
  cinfo.in_color_space = img.channels == 1 ? JCS_GRAYSCALE : JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<uint8_t*>(img.pixels.data()) +
                   static_cast<size_t>(cinfo.next_scanline) * img.width * img.channels;
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  return {};
}

void check_image(const Image& img, const std::string& path) {
  if ((img.channels != 1 && img.channels != 3) || img.width <= 0 || img.height <= 0 ||
      img.pixels.size() != static_cast<size_t>(img.width * img.height * img.channels))
    GZ_THROW(InvalidArgument, "image: cannot write '", path, "': bad image ", img.width, "x", img.height, "x",
             img.channels, " with ", img.pixels.size(), " bytes");
}

}  // namespace

Image read_image(const std::string& path, int channels, int64_t max_bytes) {
  GZ_CHECK_ARG(channels == 1 || channels == 3, "read_image: channels ", channels);
  GZ_CHECK_ARG(max_bytes > 0, "read_image: max_bytes ", max_bytes);
  auto f = open_file(path, "rb");
  unsigned char sig[8] = {};
  const size_t n = std::fread(sig, 1, sizeof sig, f.get());
  std::rewind(f.get());
  Image img;
  if (n == 8 && png_sig_cmp(sig, 0, 8) == 0) {
    png_image png;
    std::memset(&png, 0, sizeof png);
    png.version = PNG_IMAGE_VERSION;
    if (!png_image_begin_read_from_stdio(&png, f.get()))
      GZ_THROW(Error, "image: corrupt PNG '", path, "': ", png.message);
    png.format = channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
    img.height = png.height;
    img.width = png.width;
    img.channels = channels;
    if (over_cap(img.width, img.height, img.channels, max_bytes)) {
      png_image_free(&png);
      throw_too_large(path, "PNG", img, max_bytes);
    }
    img.pixels.resize(PNG_IMAGE_SIZE(png));
    if (!png_image_finish_read(&png, nullptr, img.pixels.data(), 0, nullptr)) {
      const std::string msg = png.message;
      png_image_free(&png);
      GZ_THROW(Error, "image: corrupt PNG '", path, "': ", msg);
    }
    return img;
  }
  if (n >= 3 && sig[0] == 0xFF && sig[1] == 0xD8 && sig[2] == 0xFF) {
    bool too_large = false;
    const std::string msg = decode_jpeg(f.get(), channels, max_bytes, img, too_large);
    if (too_large) throw_too_large(path, "JPEG", img, max_bytes);
    if (!msg.empty()) GZ_THROW(Error, "image: corrupt JPEG '", path, "': ", msg);
    return img;
  }
  GZ_THROW(Error, "image: '", path, "' is neither PNG nor JPEG");
}

void write_png(const std::string& path, const Image& img) {
  check_image(img, path);
  png_image png;
  std::memset(&png, 0, sizeof png);
  png.version = PNG_IMAGE_VERSION;
  png.width = static_cast<png_uint_32>(img.width);
  png.height = static_cast<png_uint_32>(img.height);
  png.format = img.channels == 1 ? PNG_FORMAT_GRAY : PNG_FORMAT_RGB;
  if (!png_image_write_to_file(&png, path.c_str(), 0, img.pixels.data(), 0, nullptr))
    GZ_THROW(Error, "image: cannot write PNG '", path, "': ", png.message);
}

void write_jpeg(const std::string& path, const Image& img, int quality) {
  check_image(img, path);
  auto f = open_file(path, "wb");
  const std::string msg = encode_jpeg(f.get(), img, quality);
  if (!msg.empty()) GZ_THROW(Error, "image: cannot write JPEG '", path, "': ", msg);
}

}  // namespace gz::train
