//! Least-squares fitting of one curve family: Levenberg–Marquardt with a forward-difference
//! Jacobian, the method behind SciPy's `curve_fit` (MINPACK's `lmdif`) that NNI calls.
//!
//! Deterministic: the same points and starting parameters give the same fit, bit for bit.

/// A function of `x` with parameters `p`.
pub(crate) type Curve = fn(x: f64, p: &[f64]) -> f64;

/// SciPy's limit for `lmdif` is 200·(n+1) function evaluations; one iteration here costs n+1.
const MAX_ITERATIONS: usize = 200;
const MAX_DAMPING: f64 = 1e16;
/// Stop once an accepted step lowers the cost by less than this fraction (MINPACK's `ftol`).
const RELATIVE_TOLERANCE: f64 = 1.49e-8;

/// The parameters minimising Σ (curve(x, p) − y)² over `points`, starting from `initial`.
/// Never worse than `initial`: a step that does not lower the cost, or that makes any
/// prediction non-finite, is refused. Where the start itself is not finite (the family cannot
/// describe these points, e.g. `1/ln(x)` at x = 1) it is returned unchanged, as NNI keeps the
/// starting parameters when SciPy's fit fails.
pub(crate) fn least_squares(curve: Curve, points: &[(f64, f64)], initial: &[f64]) -> Vec<f64> {
    let n = initial.len();
    let mut params = initial.to_vec();
    if points.len() < n {
        // SciPy refuses a fit with fewer points than parameters; NNI then keeps the start.
        return params;
    }
    let Some(mut cost) = cost(curve, points, &params) else {
        return params;
    };
    let mut damping = 1e-3;
    let mut residuals = vec![0.0; points.len()];
    let mut jacobian = vec![vec![0.0; n]; points.len()];
    for _ in 0..MAX_ITERATIONS {
        if cost == 0.0 {
            break;
        }
        // Residuals and forward-difference Jacobian at `params`.
        for (i, &(x, y)) in points.iter().enumerate() {
            residuals[i] = curve(x, &params) - y;
        }
        let mut jacobian_finite = true;
        for j in 0..n {
            let step = f64::EPSILON.sqrt() * params[j].abs().max(1e-2);
            let mut shifted = params.clone();
            shifted[j] += step;
            for (i, &(x, y)) in points.iter().enumerate() {
                let derivative = (curve(x, &shifted) - y - residuals[i]) / step;
                jacobian_finite &= derivative.is_finite();
                jacobian[i][j] = derivative;
            }
        }
        if !jacobian_finite {
            break;
        }
        // Normal equations JᵀJ δ = −Jᵀr, damped on the diagonal (Marquardt's scaling).
        let mut normal = vec![vec![0.0; n]; n];
        let mut gradient = vec![0.0; n];
        for (row, &residual) in jacobian.iter().zip(&residuals) {
            for a in 0..n {
                gradient[a] -= row[a] * residual;
                for b in 0..n {
                    normal[a][b] += row[a] * row[b];
                }
            }
        }
        let mut improved = false;
        while damping < MAX_DAMPING {
            let mut damped = normal.clone();
            for (a, row) in damped.iter_mut().enumerate() {
                row[a] += damping * normal[a][a].max(1e-12);
            }
            let Some(delta) = solve(damped, gradient.clone()) else {
                damping *= 10.0;
                continue;
            };
            let candidate: Vec<f64> = params.iter().zip(&delta).map(|(p, d)| p + d).collect();
            match self::cost(curve, points, &candidate) {
                Some(candidate_cost) if candidate_cost < cost => {
                    let relative_gain = (cost - candidate_cost) / cost;
                    params = candidate;
                    cost = candidate_cost;
                    damping = (damping / 10.0).max(1e-12);
                    improved = relative_gain > RELATIVE_TOLERANCE;
                    break;
                }
                _ => damping *= 10.0,
            }
        }
        if !improved {
            break;
        }
    }
    params
}

/// Σ (curve(x, p) − y)², or `None` when a prediction is not finite.
fn cost(curve: Curve, points: &[(f64, f64)], params: &[f64]) -> Option<f64> {
    let mut total = 0.0;
    for &(x, y) in points {
        let predicted = curve(x, params);
        if !predicted.is_finite() {
            return None;
        }
        total += (predicted - y) * (predicted - y);
    }
    total.is_finite().then_some(total)
}

/// Solves `matrix · x = rhs` by Gaussian elimination with partial pivoting (n ≤ 4);
/// `None` when the matrix is singular.
fn solve(mut matrix: Vec<Vec<f64>>, mut rhs: Vec<f64>) -> Option<Vec<f64>> {
    let n = rhs.len();
    for column in 0..n {
        let pivot = (column..n)
            .max_by(|&a, &b| matrix[a][column].abs().total_cmp(&matrix[b][column].abs()))?;
        if matrix[pivot][column].abs() < 1e-300 || !matrix[pivot][column].is_finite() {
            return None;
        }
        matrix.swap(column, pivot);
        rhs.swap(column, pivot);
        let (upper, lower) = matrix.split_at_mut(column + 1);
        let pivot_row = &upper[column];
        for (offset, row) in lower.iter_mut().enumerate() {
            let factor = row[column] / pivot_row[column];
            for (entry, pivot_entry) in row[column..].iter_mut().zip(&pivot_row[column..]) {
                *entry -= factor * pivot_entry;
            }
            rhs[column + 1 + offset] -= factor * rhs[column];
        }
    }
    let mut solution = vec![0.0; n];
    for row in (0..n).rev() {
        let known: f64 = (row + 1..n).map(|k| matrix[row][k] * solution[k]).sum();
        solution[row] = (rhs[row] - known) / matrix[row][row];
    }
    solution.iter().all(|v| v.is_finite()).then_some(solution)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovers_the_parameters_of_exact_curves() {
        let line: Curve = |x, p| p[0] * x + p[1];
        let points: Vec<(f64, f64)> = (1..=8).map(|x| (x as f64, 2.0 * x as f64 - 1.0)).collect();
        let fitted = least_squares(line, &points, &[1.0, 0.0]);
        assert!((fitted[0] - 2.0).abs() < 1e-6 && (fitted[1] + 1.0).abs() < 1e-6);

        let pow3: Curve = |x, p| p[0] - p[1] * x.powf(-p[2]);
        let points: Vec<(f64, f64)> = (1..=12)
            .map(|x| (x as f64, 0.9 - 0.5 * (x as f64).powf(-0.7)))
            .collect();
        let fitted = least_squares(pow3, &points, &[0.84, 0.52, 0.01]);
        let error: f64 = points
            .iter()
            .map(|&(x, y)| (pow3(x, &fitted) - y).abs())
            .fold(0.0, f64::max);
        assert!(error < 1e-4, "{fitted:?}: max error {error}");
    }
}
