//! Dense linear algebra on the small matrices model-based tuners use: a Gaussian process's
//! kernel matrix (at most a few hundred observations) and CMA-ES's covariance (one row per
//! search dimension). Matrices are row-major `Vec<f64>` of `n × n`.
//!
//! Written here rather than taken from a crate: the operations needed (Cholesky with solves, an
//! inverse from it, a symmetric eigendecomposition) are a few dozen lines each, and a
//! linear-algebra crate would add its compile time to every build of the plugin.

/// The Cholesky factor `L` (lower triangular, `A = L Lᵀ`) of a symmetric positive-definite matrix.
#[derive(Debug, Clone)]
pub(crate) struct Cholesky {
    n: usize,
    lower: Vec<f64>,
}

impl Cholesky {
    /// Factors `matrix` (`n × n`, only its lower triangle is read); `None` when it is not
    /// positive definite in floating point (a pivot is not a positive finite number).
    pub(crate) fn factor(matrix: &[f64], n: usize) -> Option<Cholesky> {
        debug_assert_eq!(matrix.len(), n * n);
        let mut lower = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..=i {
                let dot = dot(&lower[i * n..i * n + j], &lower[j * n..j * n + j]);
                let value = matrix[i * n + j] - dot;
                if i == j {
                    if !(value > 0.0 && value.is_finite()) {
                        return None;
                    }
                    lower[i * n + i] = value.sqrt();
                } else {
                    lower[i * n + j] = value / lower[j * n + j];
                }
            }
        }
        Some(Cholesky { n, lower })
    }

    /// Solves `L y = b` in place.
    pub(crate) fn solve_lower(&self, b: &mut [f64]) {
        let n = self.n;
        for i in 0..n {
            let dot = dot(&self.lower[i * n..i * n + i], &b[..i]);
            b[i] = (b[i] - dot) / self.lower[i * n + i];
        }
    }

    /// Solves `Lᵀ x = y` in place.
    pub(crate) fn solve_upper(&self, b: &mut [f64]) {
        let n = self.n;
        for i in (0..n).rev() {
            let dot: f64 = (i + 1..n).map(|k| self.lower[k * n + i] * b[k]).sum();
            b[i] = (b[i] - dot) / self.lower[i * n + i];
        }
    }

    /// Solves `A x = b` in place.
    pub(crate) fn solve(&self, b: &mut [f64]) {
        self.solve_lower(b);
        self.solve_upper(b);
    }

    /// `ln det A`.
    pub(crate) fn log_det(&self) -> f64 {
        2.0 * (0..self.n)
            .map(|i| self.lower[i * self.n + i].ln())
            .sum::<f64>()
    }

    /// `A⁻¹`, as `L⁻ᵀ L⁻¹`.
    pub(crate) fn inverse(&self) -> Vec<f64> {
        let n = self.n;
        // Row j of `inv_lower_t` is column j of L⁻¹ (so the product below reads rows only).
        let mut inv_lower_t = vec![0.0; n * n];
        for j in 0..n {
            let column = &mut inv_lower_t[j * n..(j + 1) * n];
            column[j] = 1.0;
            for i in j..n {
                let dot = dot(&self.lower[i * n + j..i * n + i], &column[j..i]);
                column[i] = (column[i] - dot) / self.lower[i * n + i];
            }
        }
        let mut inverse = vec![0.0; n * n];
        for a in 0..n {
            for b in 0..=a {
                // (L⁻ᵀ L⁻¹)_ab = Σ_k (L⁻¹)_ka (L⁻¹)_kb, and (L⁻¹)_ka is zero for k < a.
                let start = a.max(b);
                let dot = dot(
                    &inv_lower_t[a * n + start..(a + 1) * n],
                    &inv_lower_t[b * n + start..(b + 1) * n],
                );
                inverse[a * n + b] = dot;
                inverse[b * n + a] = dot;
            }
        }
        inverse
    }
}

/// `Σ aᵢ bᵢ` over slices of equal length, in four running sums: written so the compiler
/// vectorizes it, since the O(n³) factorizations spend nearly all their time here.
fn dot(a: &[f64], b: &[f64]) -> f64 {
    let mut sums = [0.0; 4];
    let (a_chunks, b_chunks) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = a_chunks
        .remainder()
        .iter()
        .zip(b_chunks.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a_chunks.zip(b_chunks) {
        for ((sum, x), y) in sums.iter_mut().zip(x).zip(y) {
            *sum += x * y;
        }
    }
    sums.iter().sum::<f64>() + tail
}

/// Eigenvalues and eigenvectors of the symmetric `n × n` `matrix` by cyclic Jacobi rotations
/// (slow for big matrices, exact to rounding and simple for the few dozen rows CMA-ES has).
/// Returns `(values, vectors)` with eigenvector `i` in column `i` of the row-major `vectors`.
pub(crate) fn symmetric_eigen(matrix: &[f64], n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut a = matrix.to_vec();
    let mut v = vec![0.0; n * n];
    for i in 0..n {
        v[i * n + i] = 1.0;
    }
    for _sweep in 0..100 {
        let off: f64 = (0..n)
            .flat_map(|p| (p + 1..n).map(move |q| (p, q)))
            .map(|(p, q)| a[p * n + q] * a[p * n + q])
            .sum();
        let diagonal: f64 = (0..n).map(|i| a[i * n + i] * a[i * n + i]).sum();
        if off <= 1e-30 * diagonal || off == 0.0 {
            break;
        }
        for p in 0..n {
            for q in p + 1..n {
                let apq = a[p * n + q];
                if apq == 0.0 {
                    continue;
                }
                // The rotation that zeroes a[p][q]: t = tan of its angle, the smaller root.
                let theta = (a[q * n + q] - a[p * n + p]) / (2.0 * apq);
                let t = theta.signum() / (theta.abs() + (theta * theta + 1.0).sqrt());
                let c = 1.0 / (t * t + 1.0).sqrt();
                let s = t * c;
                for k in 0..n {
                    let (akp, akq) = (a[k * n + p], a[k * n + q]);
                    a[k * n + p] = c * akp - s * akq;
                    a[k * n + q] = s * akp + c * akq;
                }
                for k in 0..n {
                    let (apk, aqk) = (a[p * n + k], a[q * n + k]);
                    a[p * n + k] = c * apk - s * aqk;
                    a[q * n + k] = s * apk + c * aqk;
                }
                a[p * n + q] = 0.0;
                a[q * n + p] = 0.0;
                for k in 0..n {
                    let (vkp, vkq) = (v[k * n + p], v[k * n + q]);
                    v[k * n + p] = c * vkp - s * vkq;
                    v[k * n + q] = s * vkp + c * vkq;
                }
            }
        }
    }
    ((0..n).map(|i| a[i * n + i]).collect(), v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-10 * a.abs().max(1.0)
    }

    #[test]
    fn cholesky_solves_inverts_and_has_the_determinant() {
        let a = [4.0, 2.0, 0.6, 2.0, 5.0, 1.0, 0.6, 1.0, 3.0];
        let chol = Cholesky::factor(&a, 3).unwrap();
        let mut x = [1.0, 2.0, 3.0];
        chol.solve(&mut x);
        for i in 0..3 {
            let ax: f64 = (0..3).map(|k| a[i * 3 + k] * x[k]).sum();
            assert!(close(ax, [1.0, 2.0, 3.0][i]), "row {i}: {ax}");
        }
        let inverse = chol.inverse();
        for i in 0..3 {
            for j in 0..3 {
                let product: f64 = (0..3).map(|k| a[i * 3 + k] * inverse[k * 3 + j]).sum();
                assert!(close(product, f64::from(u8::from(i == j))), "{i},{j}");
            }
        }
        // det = 4(15-1) - 2(6-0.6) + 0.6(2-3) = 56 - 10.8 - 0.6
        assert!(close(chol.log_det(), 44.6f64.ln()));
        assert!(Cholesky::factor(&[1.0, 2.0, 2.0, 1.0], 2).is_none());
    }

    #[test]
    fn jacobi_finds_eigenpairs() {
        let a = [2.0, 1.0, 0.0, 1.0, 3.0, 0.5, 0.0, 0.5, 1.0];
        let (values, vectors) = symmetric_eigen(&a, 3);
        for i in 0..3 {
            for r in 0..3 {
                let av: f64 = (0..3).map(|k| a[r * 3 + k] * vectors[k * 3 + i]).sum();
                assert!(
                    close(av, values[i] * vectors[r * 3 + i]),
                    "pair {i}, row {r}"
                );
            }
        }
        let trace: f64 = values.iter().sum();
        assert!(close(trace, 6.0));
    }
}
