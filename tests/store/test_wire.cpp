// Wire decoder: round trips, every truncation, corrupted fields; StoreState against MemStore.
#include <gtest/gtest.h>

#include <random>

#include "gz/core/error.h"
#include "gz/store/mem_store.h"
#include "store/store_state.h"
#include "store/wire.h"

namespace gz::wire {
namespace {

Message random_message(std::mt19937& rng, bool request) {
  Message m;
  if (request) {
    static const std::vector<std::pair<Op, int>> ops = {{Op::hello, 1},       {Op::set, 2},  {Op::get, 1},
                                                        {Op::add, 1},         {Op::compare_set, 3},
                                                        {Op::wait, -1},       {Op::check, -1},
                                                        {Op::delete_key, 1},  {Op::num_keys, 0},
                                                        {Op::append, 2},      {Op::auth, 1}};
    auto [op, n] = ops[rng() % ops.size()];
    m.code = static_cast<uint8_t>(op);
    if (n < 0) n = static_cast<int>(rng() % 5);
    m.parts.resize(static_cast<size_t>(n));
  } else {
    m.code = static_cast<uint8_t>(128 + rng() % 6);
    m.parts.resize(rng() % 4);
  }
  m.num = static_cast<int64_t>((static_cast<uint64_t>(rng()) << 32) | rng());
  for (auto& p : m.parts) {
    p.resize(rng() % 40);
    for (auto& c : p) c = static_cast<char>(rng());
  }
  return m;
}

const uint8_t* u8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

TEST(Wire, RoundTripsRandomMessages) {
  std::mt19937 rng(1234);
  Limits lim;
  for (int i = 0; i < 2000; ++i) {
    bool req = i % 2 == 0;
    Message m = random_message(rng, req);
    std::string f = encode(m);
    Message out;
    auto r = decode(u8(f), f.size(), req ? Direction::request : Direction::reply, lim, out);
    ASSERT_EQ(r.status, DecodeStatus::ok) << r.error;
    EXPECT_EQ(r.consumed, f.size());
    EXPECT_EQ(out.code, m.code);
    EXPECT_EQ(out.num, m.num);
    EXPECT_EQ(out.parts, m.parts);
  }
}

TEST(Wire, EveryTruncationNeedsMore) {
  std::mt19937 rng(99);
  Limits lim;
  for (int i = 0; i < 50; ++i) {
    std::string f = encode(random_message(rng, true));
    for (size_t n = 0; n < f.size(); ++n) {
      // Copy the prefix so a read past it would be caught by ASan.
      std::vector<uint8_t> prefix(f.begin(), f.begin() + static_cast<long>(n));
      Message out;
      auto r = decode(prefix.data(), prefix.size(), Direction::request, lim, out);
      EXPECT_EQ(r.status, DecodeStatus::need_more) << "prefix " << n << " of " << f.size();
      EXPECT_EQ(r.consumed, 0u);
    }
  }
}

TEST(Wire, DecodesBackToBackFrames) {
  Message a{static_cast<uint8_t>(Op::set), 0, {"k", "v"}}, b{static_cast<uint8_t>(Op::num_keys), 0, {}};
  std::string f = encode(a) + encode(b);
  Message out;
  auto r = decode(u8(f), f.size(), Direction::request, Limits{}, out);
  ASSERT_EQ(r.status, DecodeStatus::ok);
  EXPECT_EQ(out.parts, a.parts);
  auto r2 = decode(u8(f) + r.consumed, f.size() - r.consumed, Direction::request, Limits{}, out);
  ASSERT_EQ(r2.status, DecodeStatus::ok);
  EXPECT_EQ(out.code, b.code);
  EXPECT_EQ(r.consumed + r2.consumed, f.size());
}

TEST(Wire, RejectsCorruptFields) {
  Message m{static_cast<uint8_t>(Op::set), 0, {"key", "value"}};
  const std::string good = encode(m);
  Message out;
  auto status = [&](const std::string& f, Direction d = Direction::request, Limits lim = {}) {
    return decode(u8(f), f.size(), d, lim, out).status;
  };
  ASSERT_EQ(status(good), DecodeStatus::ok);
  // Unknown code, reply code as request, request code as reply.
  std::string f = good;
  f[4] = 77;
  EXPECT_EQ(status(f), DecodeStatus::malformed);
  f[4] = static_cast<char>(Reply::ok);
  EXPECT_EQ(status(f), DecodeStatus::malformed);
  EXPECT_EQ(status(good, Direction::reply), DecodeStatus::malformed);
  // Arity: set with three parts.
  EXPECT_EQ(status(encode(Message{static_cast<uint8_t>(Op::set), 0, {"a", "b", "c"}})), DecodeStatus::malformed);
  // Part length overruns the frame.
  f = good;
  f[4 + 13] = 100;
  EXPECT_EQ(status(f), DecodeStatus::malformed);
  // Part count larger than the frame could hold.
  f = good;
  f[4 + 9] = 100;
  EXPECT_EQ(status(f), DecodeStatus::malformed);
  // Trailing bytes inside the frame.
  f = good + "xx";
  f[0] = static_cast<char>(f[0] + 2);
  EXPECT_EQ(status(f), DecodeStatus::malformed);
  // Body too short for the fixed fields.
  EXPECT_EQ(status(std::string("\x03\x00\x00\x00\x02\x00\x00", 7)), DecodeStatus::malformed);
  // Too large: reported from the header alone.
  Limits small;
  small.max_body_bytes = 10;
  EXPECT_EQ(status(good.substr(0, 4), Direction::request, small), DecodeStatus::too_large);
  // Too many parts.
  Limits few;
  few.max_parts = 1;
  EXPECT_EQ(status(good, Direction::request, few), DecodeStatus::malformed);
}

TEST(Wire, RandomBytesNeverCrash) {
  std::mt19937 rng(5);
  Limits lim;
  lim.max_body_bytes = 1 << 16;
  for (int i = 0; i < 20000; ++i) {
    std::vector<uint8_t> buf(rng() % 64);
    for (auto& b : buf) b = static_cast<uint8_t>(rng());
    if (buf.size() >= 4 && rng() % 2) {  // plausible length prefix
      uint32_t len = static_cast<uint32_t>(buf.size() - 4);
      for (int k = 0; k < 4; ++k) buf[k] = static_cast<uint8_t>(len >> (8 * k));
    }
    Message out;
    auto r = decode(buf.data(), buf.size(), Direction::any, lim, out);
    if (r.status == DecodeStatus::ok) {
      EXPECT_LE(r.consumed, buf.size());
      EXPECT_EQ(encode(out), std::string(buf.begin(), buf.begin() + static_cast<long>(r.consumed)));
    }
  }
}

TEST(ParseCounter, StrictDecimal) {
  int64_t v = 0;
  EXPECT_TRUE(parse_counter("42", v));
  EXPECT_EQ(v, 42);
  EXPECT_TRUE(parse_counter("-9223372036854775808", v));
  EXPECT_EQ(v, INT64_MIN);
  EXPECT_TRUE(parse_counter("9223372036854775807", v));
  EXPECT_EQ(v, INT64_MAX);
  for (const char* bad : {"", "-", "+", "1x", " 1", "9223372036854775808", "99999999999999999999", "1e3"})
    EXPECT_FALSE(parse_counter(bad, v)) << bad;
}

// Random operations on StoreState and on MemStore (the reference) give the same answers.
TEST(StoreState, MatchesMemStore) {
  std::mt19937 rng(42);
  StoreState st(size_t{1} << 30);
  MemStore ref;
  const std::vector<std::string> keys = {"a", "b", "c", "n", ""};
  for (int i = 0; i < 5000; ++i) {
    const std::string& k = keys[rng() % keys.size()];
    std::string v = std::to_string(rng() % 5);
    Message req, rep;
    switch (rng() % 7) {
      case 0:
        req = {static_cast<uint8_t>(Op::set), 0, {k, v}};
        ASSERT_EQ(st.apply(req, rep), StoreState::Outcome::done);
        ref.set(k, to_bytes(v));
        break;
      case 1: {
        int64_t d = static_cast<int64_t>(rng() % 7) - 3;
        req = {static_cast<uint8_t>(Op::add), d, {k}};
        st.apply(req, rep);
        try {
          int64_t want = ref.add(k, d);
          ASSERT_EQ(rep.code, static_cast<uint8_t>(Reply::ok));
          EXPECT_EQ(rep.num, want);
        } catch (const gz::Error&) {
          EXPECT_EQ(rep.code, static_cast<uint8_t>(Reply::invalid));
        }
        break;
      }
      case 2: {
        std::string exp = rng() % 3 ? std::to_string(rng() % 5) : "";
        req = {static_cast<uint8_t>(Op::compare_set), 0, {k, exp, v}};
        st.apply(req, rep);
        ASSERT_EQ(rep.parts.size(), 1u);
        EXPECT_EQ(rep.parts[0], to_string(ref.compare_set(k, to_bytes(exp), to_bytes(v))));
        break;
      }
      case 3:
        req = {static_cast<uint8_t>(Op::delete_key), 0, {k}};
        st.apply(req, rep);
        EXPECT_EQ(rep.num != 0, ref.delete_key(k));
        break;
      case 4: {
        req = {static_cast<uint8_t>(Op::get), 0, {k}};
        bool has = ref.check({k});
        auto out = st.apply(req, rep);
        EXPECT_EQ(out == StoreState::Outcome::done, has);
        if (has) EXPECT_EQ(rep.parts.at(0), to_string(ref.get(k, Deadline::after(Duration(0)))));
        break;
      }
      case 5:
        req = {static_cast<uint8_t>(Op::check), 0, {k, keys[rng() % keys.size()]}};
        st.apply(req, rep);
        EXPECT_EQ(rep.num != 0, ref.check(req.parts));
        break;
      case 6:
        req = {static_cast<uint8_t>(Op::num_keys), 0, {}};
        st.apply(req, rep);
        EXPECT_EQ(rep.num, ref.num_keys());
        break;
    }
  }
}

TEST(StoreState, EnforcesTheByteBudget) {
  StoreState st(100);
  Message rep;
  st.apply({static_cast<uint8_t>(Op::set), 0, {"k", std::string(90, 'x')}}, rep);
  EXPECT_EQ(rep.code, static_cast<uint8_t>(Reply::ok));
  st.apply({static_cast<uint8_t>(Op::set), 0, {"j", std::string(20, 'x')}}, rep);
  EXPECT_EQ(rep.code, static_cast<uint8_t>(Reply::error));
  // Overwriting the same key with a smaller value is fine; the budget follows.
  st.apply({static_cast<uint8_t>(Op::set), 0, {"k", "small"}}, rep);
  EXPECT_EQ(rep.code, static_cast<uint8_t>(Reply::ok));
  EXPECT_EQ(st.total_bytes(), 6u);
  st.apply({static_cast<uint8_t>(Op::add), INT64_MAX, {"n"}}, rep);
  st.apply({static_cast<uint8_t>(Op::add), 1, {"n"}}, rep);
  EXPECT_EQ(rep.code, static_cast<uint8_t>(Reply::invalid));  // overflow refused
}

}  // namespace
}  // namespace gz::wire
