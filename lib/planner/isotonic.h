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

/// A monotone function of two variables fitted to scattered points: the points are
/// merged into the cells of the grid of their distinct x and y values (weighted means),
/// fitted by isotonic_grid (cells without a point get the overall mean at a negligible
/// weight, so that only the monotonicity constraints place them), and predicted by
/// bilinear interpolation between grid points, clipped outside the grid — with one
/// column, the predictions of scikit-learn's IsotonicRegression(out_of_bounds="clip"),
/// which a test checks against a committed fixture. The planner's epoch-time surface over (workers, batch size) and
/// its accuracy surface over (global batch, density) are such fits. Immutable after
/// construction; thread-safe to read.
class MonotoneGrid {
 public:
  /// One point: position (x, y), measured value and weight (> 0).
  struct Point {
    double x = 0, y = 0, value = 0, weight = 1;
  };
  /// Throws InvalidArgument for no points or a weight <= 0.
  MonotoneGrid(const std::vector<Point>& points, Direction x_dir, Direction y_dir);
  /// The fitted value at (x, y): bilinear between grid points, clipped to the grid.
  double predict(double x, double y) const;
  /// Total weight of the points at exactly (x, y) (0 off the grid or in an empty cell).
  double weight_at(double x, double y) const;
  /// Distinct cells holding at least one point.
  int cells() const;
  const std::vector<double>& xs() const { return xs_; }  ///< distinct x, ascending
  const std::vector<double>& ys() const { return ys_; }  ///< distinct y, ascending
  /// Root mean square of the points' residuals value − predict(x, y) (unweighted),
  /// or of (value − fit) / fit when `relative` (cells fitted at 0 skipped).
  double rms_residual(bool relative) const;

 private:
  std::vector<Point> points_;
  std::vector<double> xs_, ys_;
  std::vector<std::vector<double>> z_, weight_;
};

}  // namespace dltrain::planner
