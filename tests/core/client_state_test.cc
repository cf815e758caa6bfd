// ClientState (core/client_state.h) with components defined here: the envelope format, lazy
// parsing, pass-through of unknown components, commit, and every kind of corrupt blob.
#include "core/client_state.h"

#include <catch2/catch.hpp>
#include <string>
#include <vector>

using namespace starling;

namespace {

struct Note final : StateComponent {
  std::string text;
  uint32_t version() const override { return 1; }
  void save(ByteWriter& w) const override { w.str(text); }
  void load(ByteReader& r, uint32_t v) override {
    if (v != 1) r.fail("note version ", v);
    text = r.str(100);
  }
  size_t memoryBytes() const override { return text.capacity(); }
};

struct Vec final : StateComponent {
  std::vector<float> v;
  uint64_t steps = 0;
  uint32_t version() const override { return 3; }
  void save(ByteWriter& w) const override {
    w.u64(steps);
    w.floats(v);
  }
  void load(ByteReader& r, uint32_t ver) override {
    if (ver != 3) r.fail("vec version ", ver);
    steps = r.u64();
    r.floats(v);
  }
  size_t memoryBytes() const override { return v.capacity() * 4; }
};

std::vector<uint8_t> save(const ClientState& s) {
  std::vector<uint8_t> b;
  s.saveTo(b);
  return b;
}

ClientState sample() {
  ClientState s(0x0102030405060708ull);
  s.get<Note>("b.note").text = "xy";
  auto& v = s.get<Vec>("a.vec");
  v.v = {1.0f, -2.5f};
  v.steps = 9;
  return s;
}

// A blob written by hand, field by field (little-endian, as documented).
struct BlobWriter {
  std::vector<uint8_t> b;
  ByteWriter w{b};
  BlobWriter& header(uint32_t magic, uint32_t format, uint64_t fp, uint32_t count) {
    w.u32(magic);
    w.u32(format);
    w.u64(fp);
    w.u32(count);
    return *this;
  }
  BlobWriter& component(const std::string& name, uint32_t version,
                        const std::vector<uint8_t>& bytes, int64_t length_lie = 0) {
    w.str(name);
    w.u32(version);
    w.u64(static_cast<uint64_t>(static_cast<int64_t>(bytes.size()) + length_lie));
    w.bytes(bytes.data(), bytes.size());
    return *this;
  }
};

std::vector<uint8_t> noteBytes(const std::string& t) {
  std::vector<uint8_t> b;
  ByteWriter(b).str(t);
  return b;
}

}  // namespace

TEST_CASE("the serialized form is the documented little-endian envelope", "[core]") {
  ClientState s(0x0102030405060708ull);
  s.get<Note>("a").text = "xy";
  // Computed by hand from core/client_state.h's format description.
  const std::vector<uint8_t> want = {
      0x53, 0x4c, 0x43, 0x53,                          // magic "SLCS"
      0x02, 0x00, 0x00, 0x00,                          // format version 2
      0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01,  // layout fingerprint
      0x01, 0x00, 0x00, 0x00,                          // one component
      0x01, 0x00, 0x00, 0x00, 'a',                     // its name
      0x01, 0x00, 0x00, 0x00,                          // its version
      0x06, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,  // its length
      0x02, 0x00, 0x00, 0x00, 'x',  'y',               // its bytes (Note::save)
  };
  CHECK(save(s) == want);
  CHECK(save(ClientState(7)) == std::vector<uint8_t>{0x53, 0x4c, 0x43, 0x53, 2, 0, 0, 0, 7, 0,
                                                     0,    0,    0,    0,    0, 0, 0, 0, 0, 0});
}

TEST_CASE("components are named, sorted, typed and erasable", "[core]") {
  ClientState s(5);
  CHECK(s.size() == 0u);
  CHECK_FALSE(s.has("x"));
  CHECK(s.find<Note>("x") == nullptr);
  s.get<Note>("z.note").text = "last";
  s.get<Vec>("a.vec").steps = 2;
  CHECK(s.names() == std::vector<std::string>{"a.vec", "z.note"});
  CHECK(&s.get<Note>("z.note") == s.find<Note>("z.note"));  // get does not replace
  CHECK(s.get<Note>("z.note").text == "last");
  CHECK_THROWS_AS(s.get<Vec>("z.note"), InternalError);  // two modules claiming one name
  CHECK_THROWS_AS(s.put("", std::make_unique<Note>()), InvalidArgument);
  CHECK_THROWS_AS(
      s.put(std::string(ClientState::kMaxNameLength + 1, 'n'), std::make_unique<Note>()),
      InvalidArgument);
  CHECK_THROWS_AS(s.put("null", nullptr), InvalidArgument);
  CHECK(s.size() == 2u);
  s.erase("a.vec");
  s.erase("never.there");
  CHECK(s.names() == std::vector<std::string>{"z.note"});
  s.reset(6);
  CHECK(s.size() == 0u);
  CHECK(s.layoutFingerprint() == 6u);
}

TEST_CASE("commit installs staged components all at once", "[core]") {
  ClientState s = sample();
  std::vector<std::pair<std::string, std::unique_ptr<StateComponent>>> staged;
  auto n = std::make_unique<Note>();
  n->text = "new";
  staged.emplace_back("b.note", std::move(n));  // replaces
  staged.emplace_back("c.added", std::make_unique<Note>());
  s.commit(staged);
  CHECK(staged.empty());
  CHECK(s.names() == std::vector<std::string>{"a.vec", "b.note", "c.added"});
  CHECK(s.find<Note>("b.note")->text == "new");
  CHECK(s.find<Vec>("a.vec")->steps == 9u);

  // A bad batch changes nothing and leaves the batch with the caller.
  const auto before = save(s);
  staged.emplace_back("d.one", std::make_unique<Note>());
  staged.emplace_back("d.one", std::make_unique<Note>());
  CHECK_THROWS_AS(s.commit(staged), InvalidArgument);
  CHECK(staged.size() == 2u);
  staged.clear();
  staged.emplace_back("e.ok", std::make_unique<Note>());
  staged.emplace_back("e.null", nullptr);
  CHECK_THROWS_AS(s.commit(staged), InvalidArgument);
  CHECK(staged.size() == 2u);
  CHECK(save(s) == before);
}

TEST_CASE("a saved state loads back, lazily, and unknown components pass through", "[core]") {
  const ClientState a = sample();
  const auto blob = save(a);
  ClientState b;
  b.loadFrom(blob);
  CHECK(b.layoutFingerprint() == 0x0102030405060708ull);
  CHECK(b.names() == std::vector<std::string>{"a.vec", "b.note"});
  // Nothing parsed: saved back byte for byte.
  CHECK(save(b) == blob);
  const Vec* v = b.find<Vec>("a.vec");
  REQUIRE(v != nullptr);
  CHECK(v->v == std::vector<float>{1.0f, -2.5f});
  CHECK(v->steps == 9u);
  CHECK(b.find<Note>("b.note")->text == "xy");
  CHECK(save(b) == blob);
  CHECK(b.memoryBytes() > 0u);

  ClientState c = b.copy();
  CHECK(save(c) == blob);
  c.find<Vec>("a.vec")->steps = 10;  // a deep copy
  CHECK(b.find<Vec>("a.vec")->steps == 9u);

  // A component whose stored bytes do not parse: IoError on access, the bytes stay as they were.
  BlobWriter w;
  w.header(0x53434c53u, 2, 1, 1).component("b.note", 1, {0xff, 0xff, 0xff, 0xff});
  ClientState d;
  d.loadFrom(w.b);
  CHECK(d.has("b.note"));
  CHECK_THROWS_AS(d.find<Note>("b.note"), IoError);
  CHECK(save(d) == w.b);
  CHECK_THROWS_AS(d.get<Note>("b.note"), IoError);
  CHECK(save(d) == w.b);
  // A version the component cannot read is its own IoError too.
  BlobWriter w2;
  w2.header(0x53434c53u, 2, 1, 1).component("b.note", 2, noteBytes("hi"));
  ClientState e;
  e.loadFrom(w2.b);
  CHECK_THROWS_WITH(e.find<Note>("b.note"), Catch::Contains("note version 2"));
  // A component that does not read every byte it is given is corrupt.
  auto extra = noteBytes("hi");
  extra.push_back(0);
  BlobWriter w3;
  w3.header(0x53434c53u, 2, 1, 1).component("b.note", 1, extra);
  ClientState f;
  f.loadFrom(w3.b);
  CHECK_THROWS_WITH(f.find<Note>("b.note"), Catch::Contains("trailing"));
}

TEST_CASE("loading into a used state reuses its component objects", "[core]") {
  ClientState a = sample();
  a.find<Vec>("a.vec")->v.assign(1000, 3.0f);
  const auto blob = save(a);
  ClientState b(99);
  auto& v = b.get<Vec>("a.vec");
  v.v.reserve(5000);
  const float* buf = v.v.data();
  b.get<Note>("z.stale").text = "from another client";
  b.loadFrom(blob);
  CHECK(b.layoutFingerprint() == a.layoutFingerprint());
  CHECK(b.names() == a.names());  // the stale component is gone
  CHECK(b.find<Vec>("a.vec") == &v);
  CHECK(v.v.data() == buf);
  CHECK(v.v == std::vector<float>(1000, 3.0f));
  CHECK(save(b) == blob);
}

// Every kind of corrupt blob, each with one fault.
std::vector<std::pair<std::string, std::vector<uint8_t>>> corruptBlobs() {
  const auto good = save(sample());
  const auto note = noteBytes("xy");
  std::vector<std::pair<std::string, std::vector<uint8_t>>> bad;
  for (size_t n = 0; n < good.size(); ++n)
    bad.push_back({"truncated to " + std::to_string(n) + " bytes",
                   std::vector<uint8_t>(good.begin(), good.begin() + n)});
  auto flip = [&](size_t i, uint8_t x) {
    auto b = good;
    b[i] ^= x;
    return b;
  };
  bad.push_back({"bad magic (byte 0)", flip(0, 0x20)});
  bad.push_back({"bad magic (byte 3)", flip(3, 0x01)});
  bad.push_back({"format version 3", flip(4, 0x01)});
  bad.push_back({"format version 2^24 + 2", flip(7, 0x01)});
  {
    auto b = good;
    b.push_back(0);
    bad.push_back({"a trailing byte", b});
  }
  bad.push_back({"component names out of order", BlobWriter()
                                                     .header(0x53434c53u, 2, 1, 2)
                                                     .component("b", 1, note)
                                                     .component("a", 1, note)
                                                     .b});
  bad.push_back({"a repeated component name", BlobWriter()
                                                  .header(0x53434c53u, 2, 1, 2)
                                                  .component("a", 1, note)
                                                  .component("a", 1, note)
                                                  .b});
  bad.push_back({"an empty component name",
                 BlobWriter().header(0x53434c53u, 2, 1, 1).component("", 1, note).b});
  bad.push_back({"a component name too long",
                 BlobWriter()
                     .header(0x53434c53u, 2, 1, 1)
                     .component(std::string(ClientState::kMaxNameLength + 1, 'n'), 1, note)
                     .b});
  bad.push_back({"a length one too long",
                 BlobWriter().header(0x53434c53u, 2, 1, 1).component("a", 1, note, +1).b});
  bad.push_back({"a length one too short",
                 BlobWriter().header(0x53434c53u, 2, 1, 1).component("a", 1, note, -1).b});
  bad.push_back({"a length of 2^64 - 1",
                 BlobWriter().header(0x53434c53u, 2, 1, 1).component("a", 1, note, -7).b});
  bad.push_back({"a count that lies (more)",
                 BlobWriter().header(0x53434c53u, 2, 1, 2).component("a", 1, note).b});
  bad.push_back({"a count that lies (fewer)", BlobWriter()
                                                  .header(0x53434c53u, 2, 1, 1)
                                                  .component("a", 1, note)
                                                  .component("b", 1, note)
                                                  .b});
  bad.push_back({"a count of 2^32 - 1",
                 BlobWriter().header(0x53434c53u, 2, 1, 0xffffffffu).component("a", 1, note).b});
  // A component this state holds an object for is parsed while loading: its corruption is caught
  // then.
  bad.push_back(
      {"a known component that does not parse",
       BlobWriter().header(0x53434c53u, 2, 1, 1).component("held", 1, {0xff, 0xff, 0xff, 0xff}).b});
  bad.push_back(
      {"a known component with bytes left over",
       BlobWriter().header(0x53434c53u, 2, 1, 1).component("held", 1, {0, 0, 0, 0, 9}).b});
  return bad;
}

ClientState usedState() {
  ClientState s = sample();
  s.get<Note>("held").text = "a component object this state holds";
  return s;
}

TEST_CASE("every corrupt blob is an IoError", "[core]") {
  // The hand-written blobs are well formed apart from their one fault.
  ClientState ok;
  const auto note = noteBytes("xy");
  CHECK_NOTHROW(ok.loadFrom(
      BlobWriter().header(0x53434c53u, 2, 1, 2).component("a", 1, note).component("b", 1, note).b));
  CHECK(ok.names() == std::vector<std::string>{"a", "b"});
  CHECK_NOTHROW(
      usedState().loadFrom(BlobWriter().header(0x53434c53u, 2, 1, 1).component("held", 1, note).b));
  for (const auto& [what, bytes] : corruptBlobs()) {
    INFO(what);
    ClientState s = usedState();
    CHECK_THROWS_AS(s.loadFrom(bytes), IoError);
    // A state that holds no object for the component keeps its bytes until asked for it.
    ClientState fresh;
    if (what.find("known component") == std::string::npos) {
      CHECK_THROWS_AS(fresh.loadFrom(bytes), IoError);
    } else {
      CHECK_NOTHROW(fresh.loadFrom(bytes));
      CHECK_THROWS_AS(fresh.find<Note>("held"), IoError);
    }
  }
}

// core/client_state.h: "on a throw the state is left empty (bound to no model)".
TEST_CASE("a corrupt blob leaves the state it was loaded into empty", "[core]") {
  for (const auto& [what, bytes] : corruptBlobs()) {
    INFO(what);
    ClientState s = usedState();
    try {
      s.loadFrom(bytes);
    } catch (const IoError&) {
    }
    CHECK((s.size() == 0u && s.layoutFingerprint() == 0u));
  }
}
