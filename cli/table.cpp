#include "cli/table.h"

#include <cmath>
#include <cstdio>

#include "cli/commands.h"
#include "lib/core.h"

namespace hl {

void Table::check_complete() const {
  if (!rows_.empty() && rows_.back().size() != columns_.size())
    fail("table: row ", rows_.size() - 1, " fills ", rows_.back().size(), " of the ", columns_.size(), " columns");
}

Table::Row Table::row() {
  check_complete();
  rows_.emplace_back();
  return Row(*this, rows_.size() - 1);
}

Table::Row& Table::Row::put(const std::string& column, Cell c) {
  std::vector<Cell>& cells = table_->rows_[index_];
  const size_t at = cells.size();
  if (index_ == 0) table_->columns_.push_back(column);  // the first row names the columns
  else if (at >= table_->columns_.size() || table_->columns_[at] != column)
    fail("table: row ", index_, " sets '", column, "' where the columns have '",
         at < table_->columns_.size() ? table_->columns_[at] : std::string("nothing"), "'");
  cells.push_back(std::move(c));
  return *this;
}

Table::Row& Table::Row::integer(const std::string& column, int64_t v) {
  Cell c;
  c.kind = Cell::Integer, c.integer = v;
  return put(column, c);
}
Table::Row& Table::Row::number(const std::string& column, double v, int decimals) {
  Cell c;
  c.kind = Cell::Number, c.number = v, c.decimals = decimals;
  return put(column, c);
}
Table::Row& Table::Row::number(const std::string& column, const std::optional<double>& v, int decimals) {
  return v ? number(column, *v, decimals) : empty(column);
}
Table::Row& Table::Row::text(const std::string& column, const std::string& v) {
  Cell c;
  c.kind = Cell::Text, c.text = v;
  return put(column, c);
}
Table::Row& Table::Row::empty(const std::string& column) { return put(column, Cell{}); }

std::string Table::shown(const Cell& c, bool for_csv) const {
  switch (c.kind) {
    case Cell::Empty: return "";
    case Cell::Integer: return std::to_string(c.integer);
    case Cell::Number: return fixed(c.number, for_csv || shown_decimals_ < 0 ? c.decimals : shown_decimals_);
    case Cell::Text: break;
  }
  if (!for_csv || c.text.find_first_of(",\"\n") == std::string::npos) return c.text;
  std::string q = "\"";  // RFC 4180: quoted, quotes doubled
  for (char ch : c.text) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
  return q + "\"";
}

std::string Table::csv() const {
  check_complete();
  std::string out;
  for (size_t i = 0; i < columns_.size(); ++i) out += (i ? "," : "") + columns_[i];
  out += "\n";
  for (const auto& r : rows_) {
    for (size_t i = 0; i < r.size(); ++i) out += (i ? "," : "") + shown(r[i], true);
    out += "\n";
  }
  return out;
}

nlohmann::ordered_json Table::json() const {
  check_complete();
  nlohmann::ordered_json a = nlohmann::ordered_json::array();
  for (const auto& r : rows_) {
    nlohmann::ordered_json o = nlohmann::ordered_json::object();
    for (size_t i = 0; i < r.size(); ++i) {
      const Cell& c = r[i];
      o[columns_[i]] = c.kind == Cell::Integer ? nlohmann::ordered_json(c.integer)
                       : c.kind == Cell::Number ? (std::isfinite(c.number) ? nlohmann::ordered_json(c.number) : nlohmann::ordered_json())
                       : c.kind == Cell::Text   ? nlohmann::ordered_json(c.text)
                                                : nlohmann::ordered_json();
    }
    a.push_back(std::move(o));
  }
  return a;
}

std::vector<std::vector<std::string>> Table::text_rows() const {
  check_complete();
  std::vector<std::vector<std::string>> t = {columns_};
  for (const auto& r : rows_) {
    std::vector<std::string> line;
    for (const Cell& c : r) line.push_back(shown(c, false));
    t.push_back(std::move(line));
  }
  return t;
}

void Table::print() const { print_table(text_rows()); }

}  // namespace hl
