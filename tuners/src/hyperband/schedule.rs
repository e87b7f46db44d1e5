//! Hyperband's brackets as NNI 3.0 computes them (`hyperband_advisor.py`, `bohb_advisor.py`).
//!
//! `s_max = floor(log_eta(R) + 1e-6)` (BOHB: `log_eta(max_budget / min_budget)`). Brackets run
//! `s = s_max, s_max - 1, ..., 0` and then again from `s_max`. Bracket `s` starts
//! `n = ceil((s_max + 1) eta^s / (s + 1) - 1e-6)` configurations at `r = R / eta^s`; its round
//! `i` (0..=s) runs `floor(n / eta^i + 1e-6)` of them at budget `floor(r eta^i + 1e-6)`.

/// NNI's guard against `log` and division landing just below a whole number.
const EPSILON: f64 = 1e-6;

/// The bracket schedule of one Hyperband (or BOHB) configuration.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Schedule {
    s_max: u32,
    eta: u64,
    max_budget: f64,
}

impl Schedule {
    /// Hyperband's: `R` is the largest budget, `R / eta^s_max` (at least 1) the smallest.
    pub(crate) fn hyperband(r: u64, eta: u64) -> Schedule {
        Schedule::new((r as f64).ln() / (eta as f64).ln(), eta, r as f64)
    }

    /// BOHB's: as many halvings as fit between the two budgets.
    pub(crate) fn bohb(min_budget: u64, max_budget: u64, eta: u64) -> Schedule {
        Schedule::new(
            (max_budget as f64 / min_budget as f64).ln() / (eta as f64).ln(),
            eta,
            max_budget as f64,
        )
    }

    fn new(log: f64, eta: u64, max_budget: f64) -> Schedule {
        Schedule {
            s_max: (log + EPSILON).floor().max(0.0) as u32,
            eta,
            max_budget,
        }
    }

    pub(crate) fn s_max(&self) -> u32 {
        self.s_max
    }

    pub(crate) fn max_budget(&self) -> f64 {
        self.max_budget
    }

    fn eta_pow(&self, e: u32) -> f64 {
        (self.eta as f64).powi(e as i32)
    }

    /// The `s` of bracket number `b` (0, 1, 2, ... in the order they are opened).
    pub(crate) fn bracket_s(&self, b: u64) -> u32 {
        self.s_max - (b % (u64::from(self.s_max) + 1)) as u32
    }

    /// NNI's cycle number of bracket `b` (the `0` of Hyperband's bracket id `"0-4"`).
    pub(crate) fn cycle(&self, b: u64) -> u64 {
        b / (u64::from(self.s_max) + 1)
    }

    /// How many configurations bracket `s` starts.
    pub(crate) fn configs(&self, s: u32) -> u64 {
        ((f64::from(self.s_max) + 1.0) * self.eta_pow(s) / (f64::from(s) + 1.0) - EPSILON).ceil()
            as u64
    }

    /// Round `i` of bracket `s`: how many configurations run, and at which budget.
    pub(crate) fn round(&self, s: u32, i: u32) -> (u64, u64) {
        let n = self.configs(s) as f64;
        let r = self.max_budget / self.eta_pow(s);
        (
            (n / self.eta_pow(i) + EPSILON).floor() as u64,
            (r * self.eta_pow(i) + EPSILON).floor() as u64,
        )
    }

    /// Configurations started by one full cycle of brackets (`s_max` down to 0).
    fn cycle_configs(&self) -> u64 {
        (0..=self.s_max).map(|s| self.configs(s)).sum()
    }

    /// The number of bracket `b`'s first configuration: configurations are numbered 0, 1, 2, ...
    /// across brackets, as NNI's `create_parameter_id` numbers them.
    pub(crate) fn first_config(&self, b: u64) -> u64 {
        let per_cycle = u64::from(self.s_max) + 1;
        let mut k = self.cycle(b).saturating_mul(self.cycle_configs());
        for earlier in 0..b % per_cycle {
            k += self.configs(self.s_max - earlier as u32);
        }
        k
    }

    /// The bracket that configuration `k` was started in.
    pub(crate) fn bracket_of(&self, k: u64) -> u64 {
        let per_cycle = u64::from(self.s_max) + 1;
        let cycle = k / self.cycle_configs();
        let mut rest = k % self.cycle_configs();
        let mut b = cycle * per_cycle;
        loop {
            let n = self.configs(self.bracket_s(b));
            if rest < n {
                return b;
            }
            rest -= n;
            b += 1;
        }
    }
}
