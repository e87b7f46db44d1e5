//! L-BFGS for smooth unconstrained minimization with a gradient: fitting a Gaussian process's
//! hyperparameters (a dozen numbers) by maximizing its marginal likelihood. Deterministic: the
//! same start gives the same iterates.

/// How many recent steps shape the inverse-Hessian estimate.
const MEMORY: usize = 6;

/// The best point found and its value.
#[derive(Debug, Clone)]
pub(crate) struct Minimum {
    pub(crate) x: Vec<f64>,
    pub(crate) value: f64,
}

/// Minimizes `objective` (value and gradient; a non-finite value means "do not go there") from
/// `start` for at most `max_iterations` iterations, with a backtracking Armijo line search.
pub(crate) fn minimize(
    mut objective: impl FnMut(&[f64]) -> (f64, Vec<f64>),
    start: Vec<f64>,
    max_iterations: usize,
) -> Minimum {
    let mut x = start;
    let (mut value, mut gradient) = objective(&x);
    if !value.is_finite() || gradient.iter().any(|g| !g.is_finite()) {
        return Minimum { x, value };
    }
    let mut steps: Vec<(Vec<f64>, Vec<f64>, f64)> = Vec::new(); // (s, y, 1 / yᵀs)
    for iteration in 0..max_iterations {
        if gradient.iter().all(|g| g.abs() < 1e-6) {
            break;
        }
        let mut direction = two_loop_direction(&gradient, &steps);
        let mut slope = dot(&direction, &gradient);
        if slope.is_nan() || slope >= 0.0 {
            // The estimate went bad (rounding): restart from steepest descent.
            steps.clear();
            direction = gradient.iter().map(|g| -g).collect();
            slope = dot(&direction, &gradient);
        }
        // Without curvature information yet, scale the first step to a unit move.
        let mut step = if iteration == 0 && steps.is_empty() {
            1.0 / norm(&direction).max(1.0)
        } else {
            1.0
        };
        let mut accepted = None;
        for _ in 0..40 {
            let candidate: Vec<f64> = x
                .iter()
                .zip(&direction)
                .map(|(xi, di)| xi + step * di)
                .collect();
            let (new_value, new_gradient) = objective(&candidate);
            let finite = new_value.is_finite() && new_gradient.iter().all(|g| g.is_finite());
            if finite && new_value <= value + 1e-4 * step * slope {
                accepted = Some((candidate, new_value, new_gradient));
                break;
            }
            step *= 0.5;
        }
        let Some((new_x, new_value, new_gradient)) = accepted else {
            break;
        };
        let s: Vec<f64> = new_x.iter().zip(&x).map(|(a, b)| a - b).collect();
        let y: Vec<f64> = new_gradient
            .iter()
            .zip(&gradient)
            .map(|(a, b)| a - b)
            .collect();
        let curvature = dot(&s, &y);
        if curvature > 1e-12 {
            if steps.len() == MEMORY {
                steps.remove(0);
            }
            steps.push((s, y, 1.0 / curvature));
        }
        let improvement = value - new_value;
        x = new_x;
        value = new_value;
        gradient = new_gradient;
        if improvement <= 1e-10 * value.abs().max(1.0) {
            break;
        }
    }
    Minimum { x, value }
}

/// `-H g` by the L-BFGS two-loop recursion, `H` scaled by the latest step's curvature.
fn two_loop_direction(gradient: &[f64], steps: &[(Vec<f64>, Vec<f64>, f64)]) -> Vec<f64> {
    let mut q = gradient.to_vec();
    let mut alphas = Vec::with_capacity(steps.len());
    for (s, y, rho) in steps.iter().rev() {
        let alpha = rho * dot(s, &q);
        q.iter_mut().zip(y).for_each(|(qi, yi)| *qi -= alpha * yi);
        alphas.push(alpha);
    }
    if let Some((s, y, _)) = steps.last() {
        let gamma = dot(s, y) / dot(y, y);
        q.iter_mut().for_each(|qi| *qi *= gamma);
    }
    for ((s, y, rho), alpha) in steps.iter().zip(alphas.into_iter().rev()) {
        let beta = rho * dot(y, &q);
        q.iter_mut()
            .zip(s)
            .for_each(|(qi, si)| *qi += (alpha - beta) * si);
    }
    q.iter().map(|v| -v).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn norm(a: &[f64]) -> f64 {
    dot(a, a).sqrt()
}

#[cfg(test)]
mod tests {
    use super::minimize;

    #[test]
    fn finds_the_rosenbrock_minimum() {
        let rosenbrock = |x: &[f64]| {
            let (a, b) = (x[0], x[1]);
            let value = (1.0 - a).powi(2) + 100.0 * (b - a * a).powi(2);
            let gradient = vec![
                -2.0 * (1.0 - a) - 400.0 * a * (b - a * a),
                200.0 * (b - a * a),
            ];
            (value, gradient)
        };
        let found = minimize(rosenbrock, vec![-1.2, 1.0], 500);
        assert!(found.value < 1e-8, "{found:?}");
    }
}
