//! knob's built-in tuners, exported as one plugin library.
//!
//! Each tuner lives in its own module; what several tuners share (the grid walk, the record of
//! points already tried, the normal quantile, common classArgs) lives in `common`.

mod anneal;
mod batch;
mod bohb;
mod cmaes;
mod common;
mod evolution;
mod gp;
mod grid_search;
mod hyperband;
mod nsga2;
mod pbt;
mod random;
mod tpe;

pub use anneal::AnnealTuner;
pub use batch::BatchTuner;
pub use bohb::BohbTuner;
pub use cmaes::CmaEsTuner;
pub use evolution::EvolutionTuner;
pub use gp::GpTuner;
pub use grid_search::GridSearchTuner;
pub use hyperband::HyperbandTuner;
pub use nsga2::Nsga2Tuner;
pub use pbt::PbtTuner;
pub use random::RandomTuner;
pub use tpe::TpeTuner;

knob_plugin_api::export_plugin! {
    tuner "CMAES": CmaEsTuner = "CMA-ES with IPOP restarts over the numeric parameters (choices drawn from the best results so far)";
    tuner "GPTuner": GpTuner = "Bayesian optimization with a Gaussian process (NNI's GPTuner): Matérn kernel with fitted length scales, EI/UCB/PI, every search-space type";
    tuner "TPE": TpeTuner = "Tree-structured Parzen Estimator (NNI's TPE; multivariate by default, variant: nni for NNI 3.0's): seeded, constant liar for parallel trials, resumes exactly; takes objectives (Optuna 5's multi-objective TPE)";
    tuner "Anneal": AnnealTuner = "annealing (NNI's Anneal, hyperopt's algorithm): samples ever closer to the best trials; seeded, no repeats, resumes exactly";
    tuner "Batch": BatchTuner = "the parameter sets listed in one choice, in order, each once (NNI's BatchTuner)";
    tuner "Evolution": EvolutionTuner = "naive evolution (NNI's Evolution): random first generation, then tournaments and one-parameter mutations; defers while no parent is ready";
    tuner "NSGA2": Nsga2Tuner = "multi-objective evolution (Optuna's NSGA-II defaults: population 50, uniform crossover 0.9 with swapping 0.5, mutation 1/#params), constrained domination, takes objectives";
    tuner "PBT": PbtTuner = "population-based training (Ray Tune's semantics and names): members stopped at their interval in the bottom quantile are replaced by clones of top members with a checkpoint, parameters explored; lineage and checkpoints through KNOB_CHECKPOINT_DIR / KNOB_RESTORE_FROM";
    tuner "Random": RandomTuner = "random search (NNI's Random): seeded, never repeats a point, ends when a finite space is used up";
    tuner "Hyperband": HyperbandTuner = "Hyperband (NNI's): brackets of successive halving over random configurations, TRIAL_BUDGET in the parameters, NNI's string trial ids; exec_mode parallelism or serial";
    tuner "BOHB": BohbTuner = "BOHB (NNI's, in Rust): Hyperband's brackets with configurations from per-budget good/bad kernel densities";
    tuner "GridSearch": GridSearchTuner = "grid search (NNI's GridSearch): every combination of choices and integers, continuous ranges refined in rounds";
}
