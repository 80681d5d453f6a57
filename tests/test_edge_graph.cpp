// The edge graph (cli/edge_graph.h): edges.json checked, the top edges chosen by |exact|, and
// the PNG written whole (gnuplot, as every plot of the command line).
#define BOOST_TEST_MODULE edge_graph
#include <boost/test/unit_test.hpp>
#include <cmath>
#include <filesystem>
#include <string>

#include "cli/edge_graph.h"
#include "lib/fileutil.h"
#include "tests/fixtures.h"

using namespace hl;
using namespace hl::test;
using json = nlohmann::json;

namespace {

// Every edge of an L-layer, H-head model with MLPs, in the edge order of edges.json; exact of
// edge i is (-1)^i * (i % 7 + 1) / 7 (so the largest |exact| recur every 7 edges).
json synthetic_edges(int L, int H) {
  json edges = json::array();
  auto add = [&](const std::string& s, const std::string& r) {
    const size_t i = edges.size();
    const double exact = (i % 2 ? -1.0 : 1.0) * static_cast<double>(i % 7 + 1) / 7.0;
    edges.push_back({{"sender", s}, {"receiver", r}, {"exact", exact}, {"attribution", 0.9 * exact},
                     {"linearisation_error", -0.1 * exact}});
  };
  auto senders = [&](int layers_before, const std::string& r) {
    add("embed", r);
    for (int l = 0; l < layers_before; ++l)
      for (int h = 0; h < H; ++h) add("L" + std::to_string(l) + "H" + std::to_string(h), r);
  };
  for (int l = 0; l < L; ++l) {
    for (int h = 0; h < H; ++h)
      for (const char* c : {".q", ".k", ".v"}) senders(l, "L" + std::to_string(l) + "H" + std::to_string(h) + c);
    senders(l + 1, "mlp" + std::to_string(l));
  }
  senders(L, "logits");
  return {{"metric", "logit_difference"}, {"clean_metric", 2.5}, {"corrupted_metric", -1.25}, {"n_layers", L},
          {"n_heads", H}, {"has_mlp", true}, {"edges", edges}};
}

uint32_t big_endian(const std::string& b, size_t at) {
  return (static_cast<uint32_t>(static_cast<unsigned char>(b[at])) << 24) | (static_cast<unsigned char>(b[at + 1]) << 16) |
         (static_cast<unsigned char>(b[at + 2]) << 8) | static_cast<unsigned char>(b[at + 3]);
}

}  // namespace

BOOST_AUTO_TEST_CASE(top_edges_are_the_largest_by_magnitude_in_file_order_on_ties) {
  const EdgeGraphData g = read_edges_json(synthetic_edges(2, 3), "test");
  BOOST_TEST(g.edges.size() == 3u * 3 * 1 + 4 + 3u * 3 * 4 + 7 + 7);  // layer 0, mlp0, layer 1, mlp1, logits
  const std::vector<size_t> top = top_edges(g, 4);
  // |exact| = 1 at i % 7 == 6: edges 6, 13, 20, 27
  BOOST_TEST(top == (std::vector<size_t>{6, 13, 20, 27}), boost::test_tools::per_element());
  BOOST_TEST(top_edges(g, 1000).size() == g.edges.size());
  BOOST_TEST(error_of([&] { top_edges(g, 0); }).find("at least 1") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(the_png_is_written_whole) {
  const std::string dir = fresh_dir("edge-graph");
  make_dirs(dir);
  const std::string png = dir + "/edges.png";
  write_edge_graph_png(synthetic_edges(4, 8), 25, png);
  BOOST_REQUIRE(file_exists(png));
  const std::string bytes = read_file(png);
  BOOST_REQUIRE(bytes.size() > 5000);
  BOOST_TEST(bytes.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  BOOST_TEST(bytes.substr(12, 4) == "IHDR");
  // the size asked of gnuplot for 8 heads x 4 layers, and the image's last chunk
  BOOST_TEST(big_endian(bytes, 16) == 105u * 9 + 60);
  BOOST_TEST(big_endian(bytes, 20) == 130u * 6 + 90);
  BOOST_TEST(bytes.substr(bytes.size() - 8, 4) == "IEND");
  // left in place (the temporary directory, emptied by the next run) to be looked at
}

BOOST_AUTO_TEST_CASE(a_bad_edges_json_is_one_message_and_no_png) {
  const std::string dir = fresh_dir("edge-graph-bad");
  make_dirs(dir);
  const std::string png = dir + "/edges.png";
  auto message = [&](const std::function<void(json&)>& change) {
    json j = synthetic_edges(2, 2);
    change(j);
    return error_of([&] { write_edge_graph_png(j, 10, png); });
  };
  BOOST_TEST(message([](json& j) { j.erase("n_heads"); }).find("\"n_heads\" is missing") != std::string::npos);
  BOOST_TEST(message([](json& j) { j["edges"][3]["receiver"] = "L0H2.q"; }).find("receiver 'L0H2.q'") != std::string::npos);
  BOOST_TEST(message([](json& j) { j["edges"][3]["receiver"] = "L0H1.z"; }).find("receiver 'L0H1.z'") != std::string::npos);
  BOOST_TEST(message([](json& j) { j["edges"][0]["sender"] = "L0H0"; }).find("L0H0 is not written before L0H0.q") != std::string::npos);
  BOOST_TEST(message([](json& j) { j["edges"][5]["exact"] = "big"; }).find("edge 5: \"exact\"") != std::string::npos);
  BOOST_TEST(message([](json& j) { j["has_mlp"] = false; }).find("receiver 'mlp0'") != std::string::npos);
  BOOST_TEST(message([](json& j) { j = json::array(); }).find("expected a JSON object") != std::string::npos);
  BOOST_TEST(!file_exists(png));
  std::filesystem::remove_all(dir);
}
