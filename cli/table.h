// Command output as data: one Table of rows of named, typed cells is printed as an aligned text
// table, written as CSV and as JSON (an array of objects), so a command defines its columns once.
// The first row names the columns; every later row fills the same ones in the same order.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace hl {

class Table {
 public:
  struct Cell {
    enum Kind { Empty, Integer, Number, Text } kind = Empty;
    int64_t integer = 0;
    double number = 0;
    int decimals = 6;  // a number's digits after the point in CSV (and in text unless the table says)
    std::string text;
  };
  class Row {
   public:
    Row& integer(const std::string& column, int64_t v);
    Row& number(const std::string& column, double v, int decimals = 6);
    Row& number(const std::string& column, const std::optional<double>& v, int decimals = 6);  // none: empty
    Row& text(const std::string& column, const std::string& v);
    Row& empty(const std::string& column);

   private:
    friend class Table;
    Row(Table& t, size_t index) : table_(&t), index_(index) {}
    Row& put(const std::string& column, Cell c);
    Table* table_;
    size_t index_;
  };

  // shown_decimals >= 0: numbers printed with that many digits (CSV and JSON keep theirs).
  explicit Table(int shown_decimals = -1) : shown_decimals_(shown_decimals) {}
  Row row();  // a new row, filled through the returned handle
  const std::vector<std::string>& columns() const { return columns_; }
  size_t rows() const { return rows_.size(); }

  std::string csv() const;         // header line, then a line per row (empty cells as empty fields)
  nlohmann::ordered_json json() const;     // [{column: value}] in column order, empty cells as null, numbers at full precision
  std::vector<std::vector<std::string>> text_rows() const;  // header first, as print_table takes
  void print() const;              // aligned, on stdout

 private:
  std::string shown(const Cell& c, bool for_csv) const;
  // Every row fills every column: the next row, and each writer, refuse a row left short.
  void check_complete() const;
  int shown_decimals_;
  std::vector<std::string> columns_;
  std::vector<std::vector<Cell>> rows_;
};

}  // namespace hl
