// ShardedLineReader: exact coverage over ranks x workers, awkward line layouts, resume, shuffle.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>

#include "gz/core/error.h"
#include "gz/torch/sharded_line_reader.h"

namespace fs = std::filesystem;
using gz::ShardedLineReader;
using gz::ShardedLineReaderOptions;

namespace {

class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "gz_lines_XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& content) const {
    const auto p = (path_ / name).string();
    std::ofstream(p, std::ios::binary) << content;
    return p;
  }

 private:
  fs::path path_;
};

// Reference split: a line is the bytes before '\n'; a non-empty tail without '\n' is a line too.
std::vector<std::string> split_lines(const std::string& s, bool strip_cr = true) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < s.size()) {
    size_t nl = s.find('\n', start);
    std::string line = s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    if (strip_cr && !line.empty() && line.back() == '\r') line.pop_back();
    out.push_back(line);
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return out;
}

// Random text with empty lines, long lines (longer than small buffers), CRLF and unique ids.
std::string random_text(std::mt19937& gen, int lines, bool trailing_newline) {
  std::string s;
  for (int i = 0; i < lines; ++i) {
    const int kind = static_cast<int>(gen() % 10);
    if (kind == 0) {
      // empty line
    } else if (kind == 1) {
      s += "long" + std::to_string(i) + std::string(20 + gen() % 60, 'x');
    } else {
      s += "l" + std::to_string(i) + std::string(gen() % 6, 'a' + static_cast<char>(gen() % 26));
    }
    if (kind == 2) s += '\r';
    if (i + 1 < lines || trailing_newline) s += '\n';
  }
  return s;
}

std::vector<std::string> read_all(ShardedLineReader& r) {
  std::vector<std::string> out;
  std::string line;
  while (r.next(line)) out.push_back(line);
  return out;
}

ShardedLineReaderOptions opts(int rank, int ranks, int worker, int workers, size_t buffer = 7) {
  ShardedLineReaderOptions o;
  o.rank = rank;
  o.num_replicas = ranks;
  o.worker = worker;
  o.num_workers = workers;
  o.buffer_bytes = buffer;
  return o;
}

struct Corpus {
  std::vector<std::string> paths;
  std::vector<std::string> lines;  // in file order
};

Corpus make_corpus(const TempDir& dir, uint32_t seed) {
  std::mt19937 gen(seed);
  Corpus c;
  const std::string contents[] = {random_text(gen, 40, true), "", random_text(gen, 1, false),
                                  "\n\n\n", random_text(gen, 25, false), "only\r\n"};
  int i = 0;
  for (const auto& text : contents) {
    c.paths.push_back(dir.write("f" + std::to_string(i++) + ".txt", text));
    for (auto& l : split_lines(text)) c.lines.push_back(l);
  }
  return c;
}

}  // namespace

TEST(ShardedLineReader, ExactCoverageAllRanksAndWorkers) {
  TempDir dir;
  const auto corpus = make_corpus(dir, 1);
  for (int ranks = 1; ranks <= 7; ++ranks) {
    for (int workers = 0; workers <= 4; ++workers) {
      // Shards in order, concatenated, reproduce the files' lines exactly (order included).
      std::vector<std::string> all;
      for (int r = 0; r < ranks; ++r) {
        std::vector<std::string> rank_lines;
        for (int w = 0; w < std::max(workers, 1); ++w) {
          ShardedLineReader reader(corpus.paths, opts(r, ranks, w, workers));
          auto got = read_all(reader);
          rank_lines.insert(rank_lines.end(), got.begin(), got.end());
        }
        if (workers > 0) {
          // A rank's workers together read what the rank reads alone.
          ShardedLineReader whole(corpus.paths, opts(r, ranks, 0, 0));
          EXPECT_EQ(read_all(whole), rank_lines) << "rank " << r << "/" << ranks << " workers " << workers;
        }
        all.insert(all.end(), rank_lines.begin(), rank_lines.end());
      }
      ASSERT_EQ(all, corpus.lines) << "ranks " << ranks << " workers " << workers;
    }
  }
}

TEST(ShardedLineReader, ManyShardsOnTinyAndLongLineFiles) {
  TempDir dir;
  // More shards than lines; one line far longer than the buffer and than several shard ranges.
  const std::string text = "a\n" + std::string(500, 'z') + "\n\nb";
  const auto path = dir.write("t.txt", text);
  for (int ranks = 1; ranks <= 7; ++ranks) {
    for (size_t buffer : {1, 3, 64, 4096}) {
      std::vector<std::string> all;
      for (int r = 0; r < ranks; ++r) {
        for (int w = 0; w < 4; ++w) {
          ShardedLineReader reader({path}, opts(r, ranks, w, 4, buffer));
          auto got = read_all(reader);
          all.insert(all.end(), got.begin(), got.end());
        }
      }
      EXPECT_EQ(all, split_lines(text)) << "ranks " << ranks << " buffer " << buffer;
    }
  }
}

TEST(ShardedLineReader, CrlfOptional) {
  TempDir dir;
  const auto path = dir.write("crlf.txt", "a\r\nb\r\n\r\nc\r");
  ShardedLineReader strip({path});
  EXPECT_EQ(read_all(strip), (std::vector<std::string>{"a", "b", "", "c"}));
  auto o = opts(0, 1, 0, 0);
  o.strip_cr = false;
  ShardedLineReader keep({path}, o);
  EXPECT_EQ(read_all(keep), (std::vector<std::string>{"a\r", "b\r", "\r", "c\r"}));
}

TEST(ShardedLineReader, ResumeAtEveryPoint) {
  TempDir dir;
  const auto corpus = make_corpus(dir, 2);
  for (size_t shuffle : {0, 4}) {
    for (int ranks : {1, 3}) {
      for (int r = 0; r < ranks; ++r) {
        auto o = opts(r, ranks, 1, 2);
        o.shuffle_lines = shuffle;
        o.seed = 9;
        ShardedLineReader ref(corpus.paths, o);
        ref.set_epoch(3);
        const auto full = read_all(ref);
        for (size_t cut = 0; cut <= full.size(); ++cut) {
          ShardedLineReader a(corpus.paths, o);
          a.set_epoch(3);
          std::string line;
          for (size_t i = 0; i < cut; ++i) ASSERT_TRUE(a.next(line));
          const auto saved = a.state();
          EXPECT_EQ(saved.lines_emitted, cut);
          ShardedLineReader b(corpus.paths, o);
          b.load_state(saved);
          b.set_epoch(3);  // keeps the restored position
          auto rest = read_all(b);
          std::vector<std::string> head(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(cut));
          head.insert(head.end(), rest.begin(), rest.end());
          ASSERT_EQ(head, full) << "shuffle " << shuffle << " rank " << r << " cut " << cut;
          EXPECT_EQ(b.state().lines_emitted, full.size());
        }
      }
    }
  }
}

TEST(ShardedLineReader, ShuffleIsAPermutationPerEpoch) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "line" + std::to_string(i) + "\n";
  const auto path = dir.write("s.txt", text);
  for (int r = 0; r < 2; ++r) {
    ShardedLineReader plain({path}, opts(r, 2, 0, 0, 64));
    auto ordered = read_all(plain);
    auto o = opts(r, 2, 0, 0, 64);
    o.shuffle_lines = 16;
    ShardedLineReader s({path}, o);
    auto e0 = read_all(s);
    EXPECT_NE(e0, ordered);
    s.reset();
    EXPECT_EQ(read_all(s), e0);  // same epoch, same order
    s.set_epoch(1);
    auto e1 = read_all(s);
    EXPECT_NE(e1, e0);
    for (auto* v : {&e0, &e1}) {
      std::sort(v->begin(), v->end());
      auto sorted = ordered;
      std::sort(sorted.begin(), sorted.end());
      EXPECT_EQ(*v, sorted);
    }
  }
}

TEST(ShardedLineReader, Errors) {
  TempDir dir;
  const auto path = dir.write("a.txt", "x\ny\n");
  EXPECT_THROW(ShardedLineReader({dir.write("b.txt", "") + ".missing"}), gz::SystemError);
  EXPECT_THROW(ShardedLineReader({}), gz::InvalidArgument);
  EXPECT_THROW(ShardedLineReader({path}, opts(2, 2, 0, 0)), gz::InvalidArgument);
  EXPECT_THROW(ShardedLineReader({path}, opts(0, 2, 2, 2)), gz::InvalidArgument);
  EXPECT_THROW(ShardedLineReader({path}, opts(0, 1, 0, 0, 0)), gz::InvalidArgument);
  ShardedLineReader r0({path}, opts(0, 2, 0, 0));
  ShardedLineReader r1({path}, opts(1, 2, 0, 0));
  std::string line;
  ASSERT_TRUE(r1.next(line));
  EXPECT_EQ(line, "y");
  EXPECT_THROW(r0.load_state(r1.state()), gz::InvalidArgument);  // another shard's state
  ASSERT_TRUE(r0.next(line));
  EXPECT_EQ(line, "x");  // unchanged by the failed load
  auto bad = r0.state();
  bad.total_bytes += 1;
  EXPECT_THROW(r0.load_state(bad), gz::InvalidArgument);
}

TEST(ShardedLineReader, OverlongLineIsAClearErrorWithoutReadingItAll) {
  TempDir dir;
  // Lines of exactly max_line_bytes pass; one byte more is an error naming file and offset.
  const auto edge = dir.write("edge.txt", "0123456789\n0123456789a\nnext\n");
  ShardedLineReaderOptions o;
  o.max_line_bytes = 10;
  o.buffer_bytes = 4;  // the limit holds while a line is assembled across reads
  ShardedLineReader r({edge}, o);
  std::string line;
  ASSERT_TRUE(r.next(line));
  EXPECT_EQ(line, "0123456789");
  try {
    r.next(line);
    FAIL() << "no error for an 11-byte line with max_line_bytes = 10";
  } catch (const gz::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(edge), std::string::npos) << msg;
    EXPECT_NE(msg.find("byte 11"), std::string::npos) << msg;
    EXPECT_NE(msg.find("max_line_bytes = 10"), std::string::npos) << msg;
  }

  // A 1 GiB line (sparse: ftruncate of zeros, no newline, nothing on disk) with the default
  // 16 MiB limit: an error after reading about 16 MiB, not a 1 GiB string.
  const auto big = dir.write("big.txt", "first\n");
  fs::resize_file(big, (uint64_t(1) << 30) + 6);
  ShardedLineReader rb({big});
  std::string l;
  ASSERT_TRUE(rb.next(l));
  EXPECT_EQ(l, "first");
  try {
    rb.next(l);
    FAIL() << "a 1 GiB line was read whole";
  } catch (const gz::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(big), std::string::npos) << msg;
    EXPECT_NE(msg.find("byte 6"), std::string::npos) << msg;
    EXPECT_NE(msg.find("max_line_bytes"), std::string::npos) << msg;
  }
  EXPECT_LE(l.capacity(), 2 * gz::kDefaultMaxLineBytes);
}
