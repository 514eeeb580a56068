#include "planner/isotonic.h"

#include <algorithm>
#include <cmath>
#include <map>
#include "common/errors.h"

namespace dltrain::planner {

std::vector<double> pava(const std::vector<double>& y, const std::vector<double>& w, Direction dir) {
  if (y.size() != w.size()) throw InvalidArgument("pava: y and w differ in size");
  const double sign = dir == Direction::kIncreasing ? 1.0 : -1.0;
  struct Block {
    double wy, w;
    std::size_t n;
    double mean() const { return wy / w; }
  };
  std::vector<Block> st;
  st.reserve(y.size());
  for (std::size_t i = 0; i < y.size(); ++i) {
    if (!(w[i] > 0)) throw InvalidArgument("pava: weight " + std::to_string(i) + " is not positive");
    st.push_back({sign * y[i] * w[i], w[i], 1});
    // Pool while the last two blocks violate the order.
    while (st.size() > 1 && st[st.size() - 2].mean() > st.back().mean()) {
      Block b = st.back();
      st.pop_back();
      st.back().wy += b.wy;
      st.back().w += b.w;
      st.back().n += b.n;
    }
  }
  std::vector<double> z;
  z.reserve(y.size());
  for (const auto& b : st) z.insert(z.end(), b.n, sign * b.mean());
  return z;
}

IsotonicFit::IsotonicFit(const std::vector<double>& x, const std::vector<double>& y, const std::vector<double>& w,
                         Direction dir) {
  if (x.empty() || x.size() != y.size() || x.size() != w.size()) {
    throw InvalidArgument("isotonic fit: x, y, w must be non-empty and of equal size");
  }
  std::map<double, std::pair<double, double>> merged;  // x → (Σ w·y, Σ w)
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (!(w[i] > 0)) throw InvalidArgument("isotonic fit: weight " + std::to_string(i) + " is not positive");
    auto& m = merged[x[i]];
    m.first += w[i] * y[i];
    m.second += w[i];
  }
  std::vector<double> ym;
  for (const auto& [xv, m] : merged) {
    x_.push_back(xv);
    ym.push_back(m.first / m.second);
    w_.push_back(m.second);
  }
  z_ = pava(ym, w_, dir);
}

double IsotonicFit::predict(double x) const {
  if (x <= x_.front()) return z_.front();
  if (x >= x_.back()) return z_.back();
  const auto it = std::upper_bound(x_.begin(), x_.end(), x);
  const std::size_t j = static_cast<std::size_t>(it - x_.begin());
  const double t = (x - x_[j - 1]) / (x_[j] - x_[j - 1]);
  return z_[j - 1] + t * (z_[j] - z_[j - 1]);
}

GridFit isotonic_grid(const std::vector<std::vector<double>>& y, const std::vector<std::vector<double>>& w,
                      Direction row_dir, Direction col_dir, double tol, int max_iterations) {
  const std::size_t R = y.size();
  if (R == 0 || y[0].empty() || w.size() != R) throw InvalidArgument("isotonic grid: empty or ragged input");
  const std::size_t C = y[0].size();
  for (std::size_t r = 0; r < R; ++r) {
    if (y[r].size() != C || w[r].size() != C) throw InvalidArgument("isotonic grid: ragged input");
  }
  // Dykstra: x_{k} = P_rows(z + p), p = z + p − x_k; z = P_cols(x_k + q), q = x_k + q − z.
  // "Rows" constrains the order along c within each row r (the column index), "cols"
  // the order along r within each column c.
  using Grid = std::vector<std::vector<double>>;
  Grid z = y, p(R, std::vector<double>(C, 0.0)), q = p, xk = p;
  GridFit out;
  std::vector<double> line, lw;
  for (int it = 1; it <= max_iterations; ++it) {
    double change = 0;
    // Projection onto "monotone along c" (each row by PAVA).
    for (std::size_t r = 0; r < R; ++r) {
      line.assign(C, 0.0);
      for (std::size_t c = 0; c < C; ++c) line[c] = z[r][c] + p[r][c];
      auto f = pava(line, w[r], col_dir);
      for (std::size_t c = 0; c < C; ++c) {
        p[r][c] = line[c] - f[c];
        xk[r][c] = f[c];
      }
    }
    // Projection onto "monotone along r" (each column by PAVA).
    for (std::size_t c = 0; c < C; ++c) {
      line.assign(R, 0.0);
      lw.assign(R, 0.0);
      for (std::size_t r = 0; r < R; ++r) {
        line[r] = xk[r][c] + q[r][c];
        lw[r] = w[r][c];
      }
      auto f = pava(line, lw, row_dir);
      for (std::size_t r = 0; r < R; ++r) {
        q[r][c] = line[r] - f[r];
        change = std::max(change, std::fabs(f[r] - z[r][c]));
        z[r][c] = f[r];
      }
    }
    out.iterations = it;
    out.change = change;
    if (change <= tol) break;
  }
  out.z = std::move(z);
  return out;
}

}  // namespace dltrain::planner
