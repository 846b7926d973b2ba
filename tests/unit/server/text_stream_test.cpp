#include "server/text_stream.h"

#include <gtest/gtest.h>

using ms::server::TextStream;

namespace {

// Token i is byte i; like a byte-level BPE, a token may hold half a UTF-8 character.
std::string bytes(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t i : ids) s.push_back(static_cast<char>(i));
  return s;
}

std::vector<int32_t> ids_of(const std::string& s) {
  std::vector<int32_t> v;
  for (unsigned char c : s) v.push_back(c);
  return v;
}

std::vector<std::string> feed(TextStream& t, const std::string& text) {
  std::vector<std::string> pieces;
  for (int32_t id : ids_of(text)) pieces.push_back(t.add(id));
  pieces.push_back(t.finish());
  return pieces;
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& p : v) s += p;
  return s;
}

}  // namespace

TEST(TextStream, NeverSplitsAUtf8Character) {
  TextStream t(bytes, {});
  auto pieces = feed(t, "a\xC3\xA9z\xE2\x82\xAC");  // a é z €
  EXPECT_EQ(pieces[0], "a");
  EXPECT_EQ(pieces[1], "");  // first half of é
  EXPECT_EQ(pieces[2], "\xC3\xA9");
  EXPECT_EQ(join(pieces), "a\xC3\xA9z\xE2\x82\xAC");
}

TEST(TextStream, StopStringEndsTheTextAndIsNotSent) {
  TextStream t(bytes, {"STOP", "xyz"});
  std::string sent;
  for (int32_t id : ids_of("hello STthere STOP and more")) {
    sent += t.add(id);
    if (t.stopped()) break;
  }
  EXPECT_TRUE(t.stopped());
  EXPECT_EQ(sent, "hello STthere ");
  EXPECT_EQ(t.text(), "hello STthere ");
  EXPECT_EQ(t.add('a'), "");
}

TEST(TextStream, HeldBackPrefixIsReleasedAtTheEnd) {
  TextStream t(bytes, {"</end>"});
  auto pieces = feed(t, "abc</en");
  EXPECT_EQ(join(pieces), "abc</en");
  EXPECT_EQ(pieces[3], "");  // '<' waits
  EXPECT_FALSE(t.stopped());
}

TEST(TextStream, EarliestOfSeveralStopStringsWins) {
  TextStream t(bytes, {"cd", "bcde"});
  EXPECT_EQ(join(feed(t, "abcdef")), "ab");
  EXPECT_TRUE(t.stopped());
}
