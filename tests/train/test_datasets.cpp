// Datasets: IDX parsing and validation, augmentation determinism, image folders (PNG/JPEG),
// text lines and the hashing tokenizer, collate, the factory, and the real Fashion-MNIST.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <thread>

#include "gz/core/error.h"
#include "gz/train/data/collate.h"
#include "gz/train/data/factory.h"
#include "gz/train/data/fashion_mnist.h"
#include "gz/train/data/hash_tokenizer.h"
#include "gz/train/data/image_folder.h"
#include "gz/train/data/image_io.h"
#include "gz/train/data/text_lines.h"

namespace fs = std::filesystem;
using namespace gz::train;

namespace {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "gz_data_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string operator/(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  fs::path path_;
};

std::vector<uint8_t> be32(uint32_t v) {
  return {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  if (!bytes.empty()) ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), int(bytes.size()));
  gzclose(f);
}

// A tiny IDX pair: n random 28x28 images and labels; returns the reference tensors.
struct TinyMnist {
  torch::Tensor images;  // uint8 [n, 28, 28]
  torch::Tensor labels;  // int64 [n]
};

TinyMnist write_tiny_mnist(const std::string& dir, const std::string& prefix, int n, uint32_t seed,
                           uint32_t image_magic = 0x803, int label_count = -1, int extra_bytes = 0) {
  std::mt19937 gen(seed);
  TinyMnist ref{torch::empty({n, 28, 28}, torch::kUInt8), torch::empty({n}, torch::kLong)};
  std::vector<uint8_t> img;
  for (uint32_t v : {image_magic, uint32_t(n), 28u, 28u})
    for (auto b : be32(v)) img.push_back(b);
  for (int i = 0; i < n * 28 * 28; ++i) {
    const auto v = static_cast<uint8_t>(gen() % 256);
    img.push_back(v);
    ref.images.data_ptr<uint8_t>()[i] = v;
  }
  for (int i = 0; i < extra_bytes; ++i) img.push_back(0);
  const int nl = label_count < 0 ? n : label_count;
  std::vector<uint8_t> lab;
  for (uint32_t v : {0x801u, uint32_t(nl)})
    for (auto b : be32(v)) lab.push_back(b);
  for (int i = 0; i < nl; ++i) {
    lab.push_back(static_cast<uint8_t>(gen() % 10));
    if (i < n) ref.labels[i] = lab.back();
  }
  write_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz", img);
  write_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz", lab);
  return ref;
}

// Reference augmentation candidates: pad 2 with zeros, crop 28x28 at (oy, ox), optional flip.
bool matches_some_augmentation(const torch::Tensor& raw_u8, const torch::Tensor& out, float mean, float std) {
  auto x = (raw_u8.to(torch::kFloat) / 255.0f - mean) / std;  // [28, 28]
  auto padded = torch::constant_pad_nd(x, {2, 2, 2, 2}, (0.0f - mean) / std);
  for (int oy = 0; oy <= 4; ++oy)
    for (int ox = 0; ox <= 4; ++ox)
      for (bool flip : {false, true}) {
        auto c = padded.slice(0, oy, oy + 28).slice(1, ox, ox + 28);
        if (flip) c = c.flip({1});
        if (torch::allclose(c.unsqueeze(0), out, 1e-5, 1e-6)) return true;
      }
  return false;
}

}  // namespace

TEST(FashionMnist, ReadsTinyIdxAndNormalises) {
  TempDir dir;
  auto ref = write_tiny_mnist(dir.str(), "train", 6, 1);
  auto test_ref = write_tiny_mnist(dir.str(), "t10k", 3, 2);
  FashionMnistOptions o;
  o.root = dir.str();
  FashionMnistDataset ds(o);
  ASSERT_EQ(ds.size(), 6u);
  EXPECT_TRUE(torch::equal(ds.images(), ref.images));
  EXPECT_TRUE(torch::equal(ds.labels(), ref.labels));
  for (size_t i = 0; i < ds.size(); ++i) {
    auto ex = ds.get(i);
    auto expect = ((ref.images[i].to(torch::kFloat) / 255.0f - 0.2860f) / 0.3530f).unsqueeze(0);
    EXPECT_EQ(ex.input.sizes(), torch::IntArrayRef({1, 28, 28}));
    EXPECT_TRUE(torch::allclose(ex.input, expect, 1e-5, 1e-6)) << i;
    EXPECT_EQ(ex.label, ref.labels[i].item<int64_t>());
  }
  EXPECT_THROW(ds.get(6), gz::InvalidArgument);
  o.train = false;
  o.channels = 3;
  o.input_size = 32;
  FashionMnistDataset test(o);
  ASSERT_EQ(test.size(), 3u);
  EXPECT_TRUE(torch::equal(test.labels(), test_ref.labels));
  auto ex = test.get(1);
  EXPECT_EQ(ex.input.sizes(), torch::IntArrayRef({3, 32, 32}));
  EXPECT_TRUE(torch::equal(ex.input[0], ex.input[2]));
}

TEST(FashionMnist, CorruptOrMissingFilesAreClearErrors) {
  auto expect_error = [](const std::string& dir, const std::string& needle) {
    FashionMnistOptions o;
    o.root = dir;
    try {
      FashionMnistDataset ds(o);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const gz::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  {
    TempDir dir;
    expect_error(dir.str(), "cannot open");
  }
  {
    TempDir dir;
    write_tiny_mnist(dir.str(), "train", 2, 1, /*image_magic=*/0x801);
    expect_error(dir.str(), "magic number");
  }
  {
    TempDir dir;
    write_tiny_mnist(dir.str(), "train", 2, 1, 0x803, /*label_count=*/3);
    expect_error(dir.str(), "2 images but 3 labels");
  }
  {
    TempDir dir;
    write_tiny_mnist(dir.str(), "train", 2, 1, 0x803, -1, /*extra_bytes=*/5);
    expect_error(dir.str(), "data after");
  }
  {
    TempDir dir;
    write_tiny_mnist(dir.str(), "train", 2, 1);
    std::vector<uint8_t> cut;  // header says 2 images, only 100 bytes follow
    for (uint32_t v : {0x803u, 2u, 28u, 28u})
      for (auto b : be32(v)) cut.push_back(b);
    cut.resize(cut.size() + 100, 7);
    write_gz(dir / "train-images-idx3-ubyte.gz", cut);
    expect_error(dir.str(), "truncated");
  }
  {
    TempDir dir;
    write_tiny_mnist(dir.str(), "train", 2, 1);
    std::ofstream(dir / "train-labels-idx1-ubyte.gz", std::ios::binary) << "\x1f\x8b\x08garbage";
    expect_error(dir.str(), "Fashion-MNIST");
  }
}

TEST(FashionMnist, AugmentationIsSeededPerSampleAndThreadIndependent) {
  TempDir dir;
  auto ref = write_tiny_mnist(dir.str(), "train", 16, 3);
  FashionMnistOptions o;
  o.root = dir.str();
  o.augment = true;
  o.seed = 5;
  FashionMnistDataset ds(o);
  ds.set_epoch(2);
  std::vector<torch::Tensor> serial;
  for (size_t i = 0; i < ds.size(); ++i) {
    serial.push_back(ds.get(i).input);
    EXPECT_TRUE(matches_some_augmentation(ref.images[i], serial.back(), 0.2860f, 0.3530f)) << i;
  }
  // Concurrent get() in scrambled order gives the same tensors.
  std::vector<torch::Tensor> parallel(ds.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (size_t k = 0; k < ds.size(); ++k) {
        const size_t i = (k * 7 + t) % ds.size();
        if (static_cast<int>(i % 4) == t) parallel[i] = ds.get(i).input;
      }
    });
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < ds.size(); ++i) EXPECT_TRUE(torch::equal(serial[i], parallel[i])) << i;
  // Another epoch changes some augmentations; going back reproduces them.
  ds.set_epoch(3);
  int changed = 0;
  for (size_t i = 0; i < ds.size(); ++i) changed += !torch::equal(ds.get(i).input, serial[i]);
  EXPECT_GT(changed, 8);
  ds.set_epoch(2);
  for (size_t i = 0; i < ds.size(); ++i) EXPECT_TRUE(torch::equal(ds.get(i).input, serial[i]));
}

TEST(FashionMnist, RealDatasetWhenInstalled) {
  const std::string root = "/usr/share/datasets/fashion-mnist";
  if (!fs::exists(root + "/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)";
  FashionMnistOptions o;
  o.root = root;
  FashionMnistDataset train(o);
  o.train = false;
  FashionMnistDataset test(o);
  ASSERT_EQ(train.size(), 60000u);
  ASSERT_EQ(test.size(), 10000u);
  // Balanced classes: 6000 / 1000 per class.
  EXPECT_TRUE(torch::equal(torch::bincount(train.labels()), torch::full({10}, 6000, torch::kLong)));
  EXPECT_TRUE(torch::equal(torch::bincount(test.labels()), torch::full({10}, 1000, torch::kLong)));
  // The normalisation constants are the training set's statistics.
  auto px = train.images().to(torch::kFloat) / 255.0f;
  EXPECT_NEAR(px.mean().item<double>(), 0.2860, 5e-4);
  EXPECT_NEAR(px.std().item<double>(), 0.3530, 5e-4);
}

TEST(ImageIo, PngRoundTripAndJpegApproximate) {
  TempDir dir;
  Image rgb{5, 7, 3, {}};
  std::mt19937 gen(4);
  for (int i = 0; i < 5 * 7 * 3; ++i) rgb.pixels.push_back(static_cast<uint8_t>(gen() % 256));
  write_png(dir / "a.png", rgb);
  auto back = read_image(dir / "a.png", 3);
  EXPECT_EQ(back.height, 5);
  EXPECT_EQ(back.width, 7);
  EXPECT_EQ(back.pixels, rgb.pixels);
  // Smooth image: JPEG at quality 100 stays within a few levels.
  Image smooth{16, 16, 3, {}};
  for (int y = 0; y < 16; ++y)
    for (int x = 0; x < 16; ++x)
      for (int c = 0; c < 3; ++c) smooth.pixels.push_back(static_cast<uint8_t>(20 + 6 * x + 3 * y + 20 * c));
  write_jpeg(dir / "b.jpg", smooth, 100);
  auto j = read_image(dir / "b.jpg", 3);
  ASSERT_EQ(j.pixels.size(), smooth.pixels.size());
  for (size_t i = 0; i < j.pixels.size(); ++i) EXPECT_NEAR(j.pixels[i], smooth.pixels[i], 6) << i;
  auto gray = read_image(dir / "b.jpg", 1);
  EXPECT_EQ(gray.channels, 1);
  EXPECT_EQ(gray.pixels.size(), 16u * 16u);
  std::ofstream(dir / "bad.png", std::ios::binary) << "\x89PNG\r\n\x1a\nnot really";
  EXPECT_THROW(read_image(dir / "bad.png", 3), gz::Error);
  std::ofstream(dir / "bad.jpg", std::ios::binary) << "\xff\xd8\xff\xe0 truncated";
  EXPECT_THROW(read_image(dir / "bad.jpg", 3), gz::Error);
  std::ofstream(dir / "text.jpg") << "hello";
  EXPECT_THROW(read_image(dir / "text.jpg", 3), gz::Error);
  EXPECT_THROW(read_image(dir / "missing.png", 3), gz::SystemError);
}

namespace {

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()),
                                              static_cast<std::streamsize>(bytes.size()));
}

void put_be(std::vector<uint8_t>& b, size_t at, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) b[at + i] = static_cast<uint8_t>(v >> (8 * (bytes - 1 - i)));
}

// Runs fn() in a child process whose address space may grow by at most `headroom` bytes, so an
// allocation of gigabytes fails there (std::bad_alloc) instead of touching real memory. Returns
// fn()'s result, or 100 + signal.
int run_with_address_space_cap(size_t headroom, const std::function<int()>& fn) {
  size_t vm_kb = 0;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmSize:", 0) == 0) vm_kb = std::stoull(line.substr(7));
  const pid_t pid = ::fork();
  if (pid == 0) {
    rlimit lim{vm_kb * 1024 + headroom, vm_kb * 1024 + headroom};
    ::setrlimit(RLIMIT_AS, &lim);
    int rc = 99;
    try {
      rc = fn();
    } catch (...) {
    }
    ::_exit(rc);
  }
  int st = 0;
  ::waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

// 0 = gz::Error naming the file and "30000 x 30000"; 1 = decoded; 2 = another message;
// 3 = std::bad_alloc (a huge buffer was allocated); 4 = anything else.
int decode_expecting_size_error(const std::string& path) {
  try {
    read_image(path, 3);
    return 1;
  } catch (const gz::Error& e) {
    const std::string msg = e.what();
    return msg.find(path) != std::string::npos && msg.find("30000 x 30000") != std::string::npos &&
                   msg.find("max_image_bytes") != std::string::npos
               ? 0
               : 2;
  } catch (const std::bad_alloc&) {
    return 3;
  } catch (...) {
    return 4;
  }
}

}  // namespace

TEST(ImageIo, OversizedHeaderIsRejectedBeforeAllocating) {
  TempDir dir;
  Image small{16, 16, 3, std::vector<uint8_t>(16 * 16 * 3, 128)};
  // The headers of small files are edited to claim 30000 x 30000 RGB pixels (2.7 GB decoded).
  write_png(dir / "small.png", small);
  auto png = read_bytes(dir / "small.png");
  ASSERT_EQ(std::string(png.begin() + 12, png.begin() + 16), "IHDR");
  put_be(png, 16, 30000, 4);  // width
  put_be(png, 20, 30000, 4);  // height
  put_be(png, 29, static_cast<uint32_t>(crc32(0, png.data() + 12, 17)), 4);  // libpng checks the CRC
  write_bytes(dir / "huge.png", png);

  write_jpeg(dir / "small.jpg", small);
  auto jpg = read_bytes(dir / "small.jpg");
  size_t sof = 0;
  for (size_t i = 2; i + 9 < jpg.size() && !sof; ++i)
    if (jpg[i] == 0xFF && jpg[i + 1] == 0xC0) sof = i;
  ASSERT_NE(sof, 0u);
  put_be(jpg, sof + 5, 30000, 2);  // height
  put_be(jpg, sof + 7, 30000, 2);  // width
  write_bytes(dir / "huge.jpg", jpg);

  // In a child whose address space cannot grow by 512 MiB: a decoder that allocated first would
  // get std::bad_alloc (3) there instead of the size error (0).
  for (const std::string name : {"huge.png", "huge.jpg"})
    EXPECT_EQ(run_with_address_space_cap(size_t(512) << 20, [&] { return decode_expecting_size_error(dir / name); }),
              0)
        << name;

  // The cap is width x height x channels and configurable; exactly at the cap is fine.
  EXPECT_EQ(read_image(dir / "small.jpg", 3, 16 * 16 * 3).pixels.size(), 16u * 16u * 3u);
  EXPECT_EQ(read_image(dir / "small.png", 1, 16 * 16).pixels.size(), 16u * 16u);
  EXPECT_THROW(read_image(dir / "small.png", 3, 16 * 16 * 3 - 1), gz::Error);
  try {
    read_image(dir / "small.jpg", 1, 16 * 16 - 1);
    FAIL() << "no error";
  } catch (const gz::Error& e) {
    EXPECT_NE(std::string(e.what()).find("16 x 16 pixels x 1 channels"), std::string::npos) << e.what();
  }
}

TEST(ImageFolder, ClassesLabelsTransforms) {
  TempDir dir;
  fs::create_directories(dir / "zebra");
  fs::create_directories(dir / "ant");
  fs::create_directories(dir / "empty_class");
  Image a{8, 8, 3, std::vector<uint8_t>(8 * 8 * 3)};
  for (size_t i = 0; i < a.pixels.size(); ++i) a.pixels[i] = static_cast<uint8_t>(i % 251);
  write_png(dir / "zebra/1.png", a);
  write_png(dir / "ant/2.png", a);
  Image wide{8, 16, 3, std::vector<uint8_t>(8 * 16 * 3, 128)};
  write_jpeg(dir / "ant/1.jpg", wide, 100);
  std::ofstream(dir / "ant/readme.txt") << "not an image";

  ImageFolderOptions o;
  o.root = dir.str();
  o.input_size = 8;
  ImageFolderDataset ds(o);
  EXPECT_EQ(ds.classes(), (std::vector<std::string>{"ant", "empty_class", "zebra"}));
  ASSERT_EQ(ds.size(), 3u);
  EXPECT_EQ(ds.get(0).label, 0);  // ant/1.jpg
  EXPECT_EQ(ds.get(1).label, 0);  // ant/2.png
  EXPECT_EQ(ds.get(2).label, 2);  // zebra/1.png
  // Same size PNG, no resize: exact normalisation per channel.
  auto x = ds.get(2).input;
  ASSERT_EQ(x.sizes(), torch::IntArrayRef({3, 8, 8}));
  auto raw = torch::from_blob(a.pixels.data(), {8, 8, 3}, torch::kUInt8).permute({2, 0, 1}).to(torch::kFloat) / 255.0f;
  auto mean = torch::tensor(std::vector<float>{0.485f, 0.456f, 0.406f}).view({3, 1, 1});
  auto sd = torch::tensor(std::vector<float>{0.229f, 0.224f, 0.225f}).view({3, 1, 1});
  EXPECT_TRUE(torch::allclose(x, (raw - mean) / sd, 1e-5, 1e-5));
  // Wide JPEG: center crop of 8x16 (flat gray, so every pixel ~128).
  auto w = ds.get(0).input;
  ASSERT_EQ(w.sizes(), torch::IntArrayRef({3, 8, 8}));
  EXPECT_TRUE(torch::allclose(w, ((torch::full({3, 8, 8}, 128.0f / 255.0f)) - mean) / sd, 0, 0.1));
  // Grayscale output, resize to 4 and augmentation determinism.
  o.channels = 1;
  o.input_size = 4;
  o.resize = 6;
  o.augment = true;
  o.mean = {0.5f};
  o.std = {0.5f};
  ImageFolderDataset g(o);
  g.set_epoch(1);
  auto g2 = g.get(2).input;
  EXPECT_EQ(g2.sizes(), torch::IntArrayRef({1, 4, 4}));
  EXPECT_TRUE(torch::equal(g2, g.get(2).input));
  o.root = dir / "empty_class";
  EXPECT_THROW(ImageFolderDataset{o}, gz::InvalidArgument);
}

TEST(HashTokenizer, DeterministicCaseInsensitivePadded) {
  HashTokenizer t(100, 6);
  auto a = t.encode("Hello, world! hello");
  EXPECT_EQ(a.size(), 6u);
  EXPECT_EQ(a[0], a[2]);  // case-insensitive
  EXPECT_NE(a[0], 0);
  EXPECT_EQ(a[3], 0);
  for (auto id : a) EXPECT_TRUE(id >= 0 && id < 100);
  EXPECT_EQ(t.encode("hello world"), (std::vector<int64_t>{a[0], a[1], 0, 0, 0, 0}));
  auto long_text = t.encode("a b c d e f g h");
  for (auto id : long_text) EXPECT_GT(id, 0);  // truncated to 6, no padding
  // Many words spread over the vocabulary.
  HashTokenizer big(1000, 500);
  std::string text;
  for (int i = 0; i < 500; ++i) text += "w" + std::to_string(i) + " ";
  auto ids = big.encode(text);
  std::set<int64_t> distinct(ids.begin(), ids.end());
  EXPECT_GT(distinct.size(), 350u);
  EXPECT_THROW(HashTokenizer(1, 4), gz::InvalidArgument);
}

TEST(TextLines, DatasetStreamAndErrors) {
  TempDir dir;
  std::string text;
  std::vector<int64_t> labels;
  for (int i = 0; i < 23; ++i) {
    labels.push_back(i % 3);
    text += std::to_string(i % 3) + "\tsample number " + std::to_string(i) + " text\n";
    if (i == 5) text += "\n";  // empty lines are skipped
  }
  { std::ofstream(dir / "train.tsv") << text; }
  TextLinesOptions o;
  o.paths = {dir / "train.tsv"};
  o.vocab_size = 50;
  o.seq_len = 5;
  o.num_classes = 3;
  TextLinesDataset ds(o);
  ASSERT_EQ(ds.size(), 23u);
  HashTokenizer tok(50, 5);
  for (size_t i = 0; i < ds.size(); ++i) {
    auto ex = ds.get(i);
    EXPECT_EQ(ex.label, labels[i]);
    auto expect = tok.encode("sample number " + std::to_string(i) + " text");
    EXPECT_TRUE(torch::equal(ex.input, torch::tensor(expect, torch::kLong))) << i;
  }
  // Streams over 3 ranks cover the same examples; resume continues exactly.
  int64_t seen = 0;
  for (int r = 0; r < 3; ++r) {
    gz::ShardedLineReaderOptions ro;
    ro.rank = r;
    ro.num_replicas = 3;
    TextLinesStream s(o, ro);
    auto first = s.next_batch(2);
    if (!first) continue;
    seen += first->size();
    auto saved = s.state();
    std::vector<torch::Tensor> rest;
    while (auto b = s.next_batch(4)) rest.push_back(b->input);
    TextLinesStream resumed(o, ro);
    resumed.load_state(saved);
    size_t k = 0;
    while (auto b = resumed.next_batch(4)) {
      ASSERT_LT(k, rest.size());
      EXPECT_TRUE(torch::equal(b->input, rest[k++]));
      seen += b->size();
    }
    EXPECT_EQ(k, rest.size());
  }
  EXPECT_EQ(seen, 23);
  // Factory with a folder picks <split>.tsv.
  DataOptions d;
  d.kind = "text_lines";
  d.path = dir.str();
  d.input_size = 5;
  d.vocab_size = 50;
  EXPECT_EQ(create_dataset(d)->size(), 23u);
  // Bad label and a missing tab name the file and line.
  { std::ofstream(dir / "bad.tsv") << "1\tok\n7\tbad label\n"; }
  o.paths = {dir / "bad.tsv"};
  try {
    TextLinesDataset bad(o);
    ADD_FAILURE() << "no error";
  } catch (const gz::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("bad.tsv:2"), std::string::npos) << e.what();
  }
  { std::ofstream(dir / "notab.tsv") << "1 no tab\n"; }
  o.paths = {dir / "notab.tsv"};
  EXPECT_THROW(TextLinesDataset{o}, gz::InvalidArgument);
}

TEST(Collate, StacksAndValidates) {
  std::vector<Example> ex;
  for (int i = 0; i < 3; ++i) ex.push_back({torch::full({2, 2}, float(i)), i * 2});
  auto b = collate(ex);
  EXPECT_EQ(b.size(), 3);
  EXPECT_EQ(b.input.sizes(), torch::IntArrayRef({3, 2, 2}));
  EXPECT_TRUE(torch::equal(b.label, torch::tensor(std::vector<int64_t>{0, 2, 4})));
  EXPECT_EQ(b.input[2][1][1].item<float>(), 2.0f);
  ex.push_back({torch::zeros({3}), 0});
  EXPECT_THROW(collate(ex), gz::InvalidArgument);
  EXPECT_THROW(collate({}), gz::InvalidArgument);
}

TEST(CreateDataset, KindsAndErrors) {
  TempDir dir;
  write_tiny_mnist(dir.str(), "t10k", 4, 9);
  DataOptions o;
  o.kind = "fashion_mnist";
  o.path = dir.str();
  o.split = "test";
  auto ds = create_dataset(o);
  EXPECT_EQ(ds->size(), 4u);
  EXPECT_EQ(ds->get(0).input.sizes(), torch::IntArrayRef({1, 28, 28}));
  o.split = "validation";
  EXPECT_THROW(create_dataset(o), gz::InvalidArgument);
  o.split = "train";
  EXPECT_THROW(create_dataset(o), gz::SystemError);  // no train files here
  o.kind = "mystery";
  EXPECT_THROW(create_dataset(o), gz::InvalidArgument);
}

// Timing, not a check: GZ_BENCH=1 ./test_datasets --gtest_filter=*Timing* prints µs per get().
TEST(FashionMnist, GetTiming) {
  if (std::getenv("GZ_BENCH") == nullptr) GTEST_SKIP() << "set GZ_BENCH=1 to time get()";
  if (!fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
    GTEST_SKIP() << "Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)";
  torch::set_num_threads(1);
  for (bool augment : {false, true}) {
    FashionMnistOptions o;
    o.augment = augment;
    const auto t0 = std::chrono::steady_clock::now();
    FashionMnistDataset ds(o);
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<Example> batch;
    for (size_t i = 0; i < 6400; ++i) {
      batch.push_back(ds.get((i * 7919) % ds.size()));
      if (batch.size() == 64) {
        collate(batch);
        batch.clear();
      }
    }
    const auto t2 = std::chrono::steady_clock::now();
    std::printf("[bench] fashion_mnist load %.0f ms; get+collate (augment=%d): %.2f us/sample\n",
                std::chrono::duration<double, std::milli>(t1 - t0).count(), int(augment),
                std::chrono::duration<double, std::micro>(t2 - t1).count() / 6400);
  }
}
