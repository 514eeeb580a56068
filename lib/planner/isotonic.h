// Isotonic (order-preserving) regression: weighted PAVA in one dimension and the
// least-squares projection onto the product order on a 2-D grid (Dykstra's algorithm).
// Plain C++; errors are dltrain::InvalidArgument (common/errors.h).
#pragma once

#include <cstddef>
#include <vector>

#include "common/errors.h"

namespace dltrain::planner {

/// Direction of a monotone fit.
enum class Direction { kIncreasing, kDecreasing };

/// Weighted isotonic regression of `y` (in the given order) by the pool-adjacent-
/// violators algorithm (Ayer et al. 1955; Barlow et al. 1972, §1.2): the vector z that
/// minimises Σ w_i (y_i − z_i)² subject to z_1 ≤ … ≤ z_n (or ≥ for kDecreasing).
/// O(n). Weights must be > 0 and the sizes equal; throws InvalidArgument
/// otherwise. Thread-safe.
std::vector<double> pava(const std::vector<double>& y, const std::vector<double>& w, Direction dir);

/// A fitted 1-D isotonic function of x, predicting by linear interpolation between the
/// fitted points and clipping outside them — the behaviour of scikit-learn's
/// IsotonicRegression(out_of_bounds="clip"). Observations with equal x are first merged
/// into their weighted mean (weights added).
class IsotonicFit {
 public:
  /// Throws InvalidArgument for empty input, unequal sizes or a weight <= 0.
  IsotonicFit(const std::vector<double>& x, const std::vector<double>& y, const std::vector<double>& w,
              Direction dir);
  double predict(double x) const;
  const std::vector<double>& xs() const { return x_; }      ///< distinct x, ascending
  const std::vector<double>& fitted() const { return z_; }  ///< fitted value at each xs()
  const std::vector<double>& weights() const { return w_; } ///< merged weight at each xs()

 private:
  std::vector<double> x_, z_, w_;
};

/// Result of a 2-D fit.
struct GridFit {
  std::vector<std::vector<double>> z;  ///< z[r][c], fitted values
  int iterations = 0;                  ///< Dykstra cycles (row pass + column pass)
  double change = 0;                   ///< largest change in the last cycle
};

/// Weighted least-squares projection of y[r][c] onto the functions monotone in r (by
/// `row_dir`) and in c (by `col_dir`) — isotonic regression under the product order —
/// by Dykstra's alternating projection algorithm (Dykstra 1983; Boyle & Dykstra 1986)
/// over row-wise and column-wise weighted PAVA, with its correction terms, so that it
/// converges to the projection and not merely to a feasible point. Stops when no value
/// changes by more than `tol` in a cycle or after `max_iterations` cycles.
/// `w[r][c]` > 0; a cell without observations should be given a negligible weight and
/// a neutral value by the caller. Throws InvalidArgument on ragged or empty input.
GridFit isotonic_grid(const std::vector<std::vector<double>>& y, const std::vector<std::vector<double>>& w,
                      Direction row_dir, Direction col_dir, double tol = 1e-9, int max_iterations = 100000);

}  // namespace dltrain::planner
