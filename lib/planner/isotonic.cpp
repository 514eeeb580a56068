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

namespace {

// Position of v in sorted `xs`: lower index and interpolation fraction (clipped).
std::pair<std::size_t, double> grid_locate(const std::vector<double>& xs, double v) {
  if (xs.size() == 1 || v <= xs.front()) return {0, 0.0};
  if (v >= xs.back()) return {xs.size() - 2, 1.0};
  const auto j = static_cast<std::size_t>(std::upper_bound(xs.begin(), xs.end(), v) - xs.begin());
  return {j - 1, (v - xs[j - 1]) / (xs[j] - xs[j - 1])};
}

std::size_t grid_index(const std::vector<double>& xs, double v) {
  return static_cast<std::size_t>(std::lower_bound(xs.begin(), xs.end(), v) - xs.begin());
}

}  // namespace

MonotoneGrid::MonotoneGrid(const std::vector<Point>& points, Direction x_dir, Direction y_dir) : points_(points) {
  if (points.empty()) throw InvalidArgument("MonotoneGrid: no points");
  double sum = 0, total = 0;
  for (const auto& p : points) {
    if (!(p.weight > 0)) throw InvalidArgument("MonotoneGrid: a weight must be > 0");
    xs_.push_back(p.x);
    ys_.push_back(p.y);
    sum += p.weight * p.value;
    total += p.weight;
  }
  for (auto* v : {&xs_, &ys_}) {
    std::sort(v->begin(), v->end());
    v->erase(std::unique(v->begin(), v->end()), v->end());
  }
  const double mean = sum / total;
  std::vector<std::vector<double>> ysum(xs_.size(), std::vector<double>(ys_.size(), 0.0));
  weight_.assign(xs_.size(), std::vector<double>(ys_.size(), 0.0));
  for (const auto& p : points) {
    const auto i = grid_index(xs_, p.x), j = grid_index(ys_, p.y);
    ysum[i][j] += p.weight * p.value;
    weight_[i][j] += p.weight;
  }
  std::vector<std::vector<double>> y(xs_.size(), std::vector<double>(ys_.size(), mean));
  std::vector<std::vector<double>> w(xs_.size(), std::vector<double>(ys_.size(), 1e-9));
  for (std::size_t i = 0; i < xs_.size(); ++i) {
    for (std::size_t j = 0; j < ys_.size(); ++j) {
      if (weight_[i][j] > 0) {
        y[i][j] = ysum[i][j] / weight_[i][j];
        w[i][j] = weight_[i][j];
      }
    }
  }
  z_ = isotonic_grid(y, w, x_dir, y_dir).z;
}

double MonotoneGrid::predict(double x, double y) const {
  const auto [i, fi] = grid_locate(xs_, x);
  const auto [j, fj] = grid_locate(ys_, y);
  auto at = [&](std::size_t a, std::size_t b) { return z_[std::min(a, xs_.size() - 1)][std::min(b, ys_.size() - 1)]; };
  return (1 - fi) * ((1 - fj) * at(i, j) + fj * at(i, j + 1)) + fi * ((1 - fj) * at(i + 1, j) + fj * at(i + 1, j + 1));
}

double MonotoneGrid::weight_at(double x, double y) const {
  const auto i = grid_index(xs_, x), j = grid_index(ys_, y);
  if (i >= xs_.size() || j >= ys_.size() || xs_[i] != x || ys_[j] != y) return 0;
  return weight_[i][j];
}

int MonotoneGrid::cells() const {
  int n = 0;
  for (const auto& row : weight_) {
    for (double w : row) n += w > 0 ? 1 : 0;
  }
  return n;
}

double MonotoneGrid::rms_residual(bool relative) const {
  double sq = 0, n = 0;
  for (const auto& p : points_) {
    const double f = z_[grid_index(xs_, p.x)][grid_index(ys_, p.y)];
    if (relative && f <= 0) continue;
    sq += std::pow(relative ? (p.value - f) / f : p.value - f, 2);
    n += 1;
  }
  return n > 0 ? std::sqrt(sq / n) : 0.0;
}

}  // namespace dltrain::planner
