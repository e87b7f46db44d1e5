//! NNI's algorithm names: every entry of NNI 3.0's `builtin_algorithms.yml`
//! (`nni/runtime/default_config/`), and the knob component that runs it natively, if any.
//!
//! This table is the one place knob knows NNI's names. [`super::PluginRegistry::find`] falls back
//! to it when no plugin exports the name as written, so `GP` and `BatchTuner` (what NNI's own
//! examples write) reach `GPTuner` and `Batch`, while a plugin that exports one of these names
//! itself still wins. `cli/tests/it/nni_names.rs` holds the table to the real file of the
//! installed `nni` 3.0 and constructs every native entry from the built-in plugins.

use crate::ComponentKind;

/// One entry of `builtin_algorithms.yml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NniAlgorithm {
    /// `tuners` or `assessors` in the file; NNI's advisors (`isAdvisor: true`) are tuners there.
    pub kind: ComponentKind,
    /// `builtinName`.
    pub name: &'static str,
    /// `alias`, where the file has one.
    pub alias: Option<&'static str>,
    /// The name knob's built-in plugin exports for the same algorithm; `None` where knob has no
    /// native version (knob's core then runs NNI's own through the dispatcher plugin,
    /// `knob_core::nni_dispatch`).
    pub native: Option<&'static str>,
    /// NNI's class minimises when its `classArgs` give no `optimize_mode` (hyperopt's
    /// `HyperoptTuner` and NNI 3.0's `TpeTuner` default to `minimize`; every other NNI
    /// algorithm to `maximize`). knob's native version defaults the same way, and so does the
    /// experiment's direction (`knob_core::config::ExperimentConfig::direction`): "best" is
    /// what the tuner optimises for.
    pub minimizes_by_default: bool,
}

const fn tuner(
    name: &'static str,
    alias: Option<&'static str>,
    native: Option<&'static str>,
) -> NniAlgorithm {
    NniAlgorithm {
        kind: ComponentKind::Tuner,
        name,
        alias,
        native,
        minimizes_by_default: false,
    }
}

/// A tuner whose NNI class defaults to `optimize_mode: minimize`.
const fn minimizing_tuner(name: &'static str, native: Option<&'static str>) -> NniAlgorithm {
    NniAlgorithm {
        minimizes_by_default: true,
        ..tuner(name, None, native)
    }
}

const fn assessor(name: &'static str, native: Option<&'static str>) -> NniAlgorithm {
    NniAlgorithm {
        kind: ComponentKind::Assessor,
        name,
        alias: None,
        native,
        minimizes_by_default: false,
    }
}

/// NNI 3.0's `builtin_algorithms.yml`, in the file's order.
///
/// Not native, on purpose: `TPE_legacy` is hyperopt's TPE (knob's `TPE` is NNI 3.0's own, a
/// different algorithm), and `RegularizedEvolutionTuner` is aging evolution (knob's `Evolution`
/// is NNI's naive evolution): mapping them would run something else under the user's name.
pub const NNI_ALGORITHMS: [NniAlgorithm; 19] = [
    assessor("Medianstop", Some("Medianstop")),
    assessor("Curvefitting", Some("Curvefitting")),
    tuner("PPO", Some("PPOTuner"), None),
    tuner("SMAC", None, None),
    minimizing_tuner("TPE", Some("TPE")),
    minimizing_tuner("TPE_legacy", None),
    tuner("Random", None, Some("Random")),
    minimizing_tuner("Anneal", Some("Anneal")),
    tuner("Evolution", None, Some("Evolution")),
    tuner("Batch", Some("BatchTuner"), Some("Batch")),
    tuner("GridSearch", None, Some("GridSearch")),
    tuner("NetworkMorphism", None, None),
    tuner("Metis", Some("MetisTuner"), None),
    tuner("GP", Some("GPTuner"), Some("GPTuner")),
    tuner("PBT", Some("PBTTuner"), None),
    tuner("RegularizedEvolutionTuner", None, None),
    tuner("DNGO", Some("DNGOTuner"), None),
    tuner("Hyperband", None, Some("Hyperband")),
    tuner("BOHB", None, Some("BOHB")),
];

/// The components of knob's NNI dispatcher plugin (`nni-dispatcher/`): the bridge the core runs
/// NNI's own algorithms through, chosen from a config's `className` or NNI name, never named by
/// a config itself (it would lack the algorithm the core hands it).
pub const NNI_DISPATCHER_TUNER: &str = "NniDispatcher";
/// See [`NNI_DISPATCHER_TUNER`].
pub const NNI_DISPATCHER_ASSESSOR: &str = "NniDispatcherAssessor";

/// Whether `name` is one of the dispatcher plugin's components, ignoring case as lookups do.
pub fn is_nni_dispatcher(name: &str) -> bool {
    name.eq_ignore_ascii_case(NNI_DISPATCHER_TUNER)
        || name.eq_ignore_ascii_case(NNI_DISPATCHER_ASSESSOR)
}

/// The entry NNI would pick for `name`: its `builtinName` or `alias`, ignoring case, as NNI's
/// `config_manager.get_algo_meta` matches them.
pub fn nni_algorithm(kind: ComponentKind, name: &str) -> Option<&'static NniAlgorithm> {
    NNI_ALGORITHMS.iter().find(|algorithm| {
        algorithm.kind == kind
            && (algorithm.name.eq_ignore_ascii_case(name)
                || algorithm
                    .alias
                    .is_some_and(|alias| alias.eq_ignore_ascii_case(name)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every (kind, builtinName, alias) of NNI 3.0's `builtin_algorithms.yml`, copied from the
    /// wheel's file; the gated CLI test compares the table with the installed file itself.
    const NNI_3_0_FILE: [(&str, &str, Option<&str>); 19] = [
        ("assessors", "Medianstop", None),
        ("assessors", "Curvefitting", None),
        ("tuners", "PPO", Some("PPOTuner")),
        ("tuners", "SMAC", None),
        ("tuners", "TPE", None),
        ("tuners", "TPE_legacy", None),
        ("tuners", "Random", None),
        ("tuners", "Anneal", None),
        ("tuners", "Evolution", None),
        ("tuners", "Batch", Some("BatchTuner")),
        ("tuners", "GridSearch", None),
        ("tuners", "NetworkMorphism", None),
        ("tuners", "Metis", Some("MetisTuner")),
        ("tuners", "GP", Some("GPTuner")),
        ("tuners", "PBT", Some("PBTTuner")),
        ("tuners", "RegularizedEvolutionTuner", None),
        ("tuners", "DNGO", Some("DNGOTuner")),
        ("tuners", "Hyperband", None),
        ("tuners", "BOHB", None),
    ];

    #[test]
    fn the_table_is_nni_3_0_s_file() {
        let table: Vec<(&str, &str, Option<&str>)> = NNI_ALGORITHMS
            .iter()
            .map(|algorithm| {
                let section = match algorithm.kind {
                    ComponentKind::Tuner => "tuners",
                    ComponentKind::Assessor => "assessors",
                    ComponentKind::TrainingService => "trainingServices",
                };
                (section, algorithm.name, algorithm.alias)
            })
            .collect();
        assert_eq!(table, NNI_3_0_FILE);
    }

    #[test]
    fn names_and_aliases_resolve_ignoring_case_as_in_nni() {
        let native = |kind, name| nni_algorithm(kind, name).and_then(|algorithm| algorithm.native);
        assert_eq!(native(ComponentKind::Tuner, "GP"), Some("GPTuner"));
        assert_eq!(native(ComponentKind::Tuner, "gptuner"), Some("GPTuner"));
        assert_eq!(native(ComponentKind::Tuner, "BatchTuner"), Some("Batch"));
        assert_eq!(native(ComponentKind::Tuner, "batch"), Some("Batch"));
        assert_eq!(native(ComponentKind::Tuner, "hyperband"), Some("Hyperband"));
        assert_eq!(
            native(ComponentKind::Assessor, "medianstop"),
            Some("Medianstop")
        );
        // Known to NNI, not native: found, without a knob name.
        assert_eq!(
            nni_algorithm(ComponentKind::Tuner, "SMAC").map(|a| a.native),
            Some(None)
        );
        // Kinds do not mix, and unknown names are unknown.
        assert_eq!(nni_algorithm(ComponentKind::Assessor, "GP"), None);
        assert_eq!(nni_algorithm(ComponentKind::Tuner, "Bayesian"), None);
    }

    #[test]
    fn native_names_are_their_own_entry() {
        // A native name must resolve to itself, so the registry's fallback never loops or
        // lands on another algorithm.
        for algorithm in NNI_ALGORITHMS.iter() {
            if let Some(native) = algorithm.native {
                let again = nni_algorithm(algorithm.kind, native).unwrap();
                assert_eq!(again.native, Some(native), "{algorithm:?}");
            }
        }
    }
}
