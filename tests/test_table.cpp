// Command output as data (cli/table.h): one table printed, written as CSV and as JSON, and a row
// that does not fill the columns refused wherever it is, the last one included.
#define BOOST_TEST_MODULE table
#include <boost/test/unit_test.hpp>
#include <cmath>

#include "cli/table.h"
#include "lib/core.h"

using namespace hl;

namespace {
Table two_rows() {
  Table t;
  t.row().integer("layer", 0).number("score", 0.25, 3).text("name", "a,\"b\"");
  t.row().integer("layer", 1).number("score", NAN, 3).empty("name");
  return t;
}
bool refused(const std::function<void()>& f, const std::string& words) {
  try {
    f();
  } catch (const std::exception& e) {
    return std::string(e.what()).find(words) != std::string::npos;
  }
  return false;
}
}  // namespace

BOOST_AUTO_TEST_CASE(one_table_gives_the_same_cells_as_csv_json_and_text) {
  const Table t = two_rows();
  BOOST_TEST(t.csv() == "layer,score,name\n0,0.250,\"a,\"\"b\"\"\"\n1,nan,\n");
  const auto j = t.json();
  BOOST_TEST(j.size() == 2u);
  BOOST_TEST(j[0]["layer"].get<int>() == 0);
  BOOST_TEST(j[0]["score"].get<double>() == 0.25);  // full precision, not the CSV's 3 digits
  BOOST_TEST(j[0]["name"].get<std::string>() == "a,\"b\"");
  BOOST_TEST(j[1]["score"].is_null());  // not finite: null, as JSON has no NaN
  BOOST_TEST(j[1]["name"].is_null());
  const auto text = t.text_rows();
  BOOST_TEST(text.size() == 3u);
  BOOST_TEST(text[1][2] == "a,\"b\"");  // quoted only in CSV
}

BOOST_AUTO_TEST_CASE(a_row_short_of_the_columns_is_refused_the_last_one_included) {
  Table t = two_rows();
  t.row().integer("layer", 2).number("score", 1.0);  // no name: the last row is short
  BOOST_TEST(refused([&] { (void)t.csv(); }, "row 2 fills 2 of the 3 columns"));
  BOOST_TEST(refused([&] { (void)t.json(); }, "row 2 fills 2 of the 3 columns"));
  BOOST_TEST(refused([&] { (void)t.text_rows(); }, "row 2 fills 2 of the 3 columns"));
  BOOST_TEST(refused([&] { (void)t.row(); }, "row 2 fills 2 of the 3 columns"));
  Table u;
  u.row().integer("layer", 0).integer("head", 1);
  BOOST_TEST(refused([&] { u.row().integer("head", 1); }, "row 1 sets 'head' where the columns have 'layer'"));
}
