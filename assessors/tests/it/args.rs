//! classArgs: defaults, ranges, and unknown names refused with the known ones listed.

use expect_test::{expect, Expect};
use knob_assessors::{
    AshaAssessor, CurvefittingAssessor, MedianstopAssessor, PatienceAssessor, ThresholdAssessor,
};
use knob_plugin_api::Assessor;

use crate::class_args_error;

fn check<A: Assessor>(class_args: &str, expected: Expect) {
    expected.assert_eq(&class_args_error::<A>(class_args));
}

#[test]
fn unknown_class_args_are_refused_listing_the_known_ones() {
    check::<MedianstopAssessor>(
        r#"{"start_stpe": 3}"#,
        expect!["classArgs of Medianstop: unknown argument `start_stpe`; known: optimize_mode, start_step"],
    );
    check::<CurvefittingAssessor>(
        r#"{"epoch_num": 20, "optimize": "maximize"}"#,
        expect!["classArgs of Curvefitting: unknown argument `optimize`; known: epoch_num, start_step, threshold, gap, optimize_mode"],
    );
    check::<AshaAssessor>(
        r#"{"max_t": 100}"#,
        expect!["classArgs of ASHA: unknown argument `max_t`; known: optimize_mode, reduction_factor, eta, min_resource, max_resource, grace_period"],
    );
    check::<ThresholdAssessor>(
        r#"{"lower": 0, "n_warmup": 3}"#,
        expect!["classArgs of Threshold: unknown argument `n_warmup`; known: lower, upper, n_warmup_steps, interval_steps"],
    );
    check::<PatienceAssessor>(
        r#"{"patience": 3, "mode": "min"}"#,
        expect!["classArgs of Patience: unknown argument `mode`; known: patience, min_delta, optimize_mode"],
    );
}

#[test]
fn bad_values_are_refused_with_what_is_allowed() {
    check::<MedianstopAssessor>(
        r#"{"optimize_mode": "max"}"#,
        expect![[
            r#"classArgs of Medianstop: optimize_mode must be "maximize" or "minimize", got "max""#
        ]],
    );
    check::<MedianstopAssessor>(
        r#"{"start_step": -1}"#,
        expect![
            "classArgs of Medianstop: start_step must be a whole number from 0 to 9999, got -1"
        ],
    );
    check::<CurvefittingAssessor>(
        "{}",
        expect![
            "classArgs of Curvefitting: epoch_num is required: the epoch whose result to predict"
        ],
    );
    check::<CurvefittingAssessor>(
        r#"{"epoch_num": 20, "gap": 0}"#,
        expect!["classArgs of Curvefitting: gap must be a whole number from 1 to 9999, got 0"],
    );
    check::<CurvefittingAssessor>(
        r#"{"epoch_num": 20, "threshold": -0.5}"#,
        expect!["classArgs of Curvefitting: threshold must be a number from 0 to 9999, got -0.5"],
    );
    check::<AshaAssessor>(
        r#"{"eta": 3, "reduction_factor": 3}"#,
        expect!["classArgs of ASHA: reduction_factor and eta are the same setting; give only one"],
    );
    check::<AshaAssessor>(
        r#"{"eta": 1}"#,
        expect!["classArgs of ASHA: eta must be a whole number of at least 2, got 1"],
    );
    // Past the largest whole number it takes: said so, not "at least 0".
    check::<AshaAssessor>(
        r#"{"grace_period": 100000000000}"#,
        expect!["classArgs of ASHA: grace_period must be a whole number from 0 to 4294967295, got 100000000000"],
    );
    check::<ThresholdAssessor>(
        r#"{"lower": 0, "n_warmup_steps": 1e20}"#,
        expect!["classArgs of Threshold: n_warmup_steps must be a whole number from 0 to 4294967295, got 1e+20"],
    );
    check::<AshaAssessor>(
        r#"{"min_resource": 4, "max_resource": 4}"#,
        expect!["classArgs of ASHA: max_resource (4) must be above min_resource (4)"],
    );
    check::<ThresholdAssessor>(
        "{}",
        expect![
            "classArgs of Threshold: give lower, upper or both: results outside them stop a trial"
        ],
    );
    check::<ThresholdAssessor>(
        r#"{"lower": 2, "upper": 1}"#,
        expect!["classArgs of Threshold: lower (2) must not be above upper (1)"],
    );
    check::<PatienceAssessor>(
        "{}",
        expect!["classArgs of Patience: patience is required: how many results without improvement to allow"],
    );
    check::<PatienceAssessor>(
        r#"{"patience": 2, "min_delta": -0.1}"#,
        expect!["classArgs of Patience: min_delta must be a number of at least 0, got -0.1"],
    );
}

#[test]
fn defaults_need_no_class_args_where_nni_needs_none() {
    // Null is what the host passes when a config has no classArgs.
    let null = serde_json::Value::Null;
    assert!(MedianstopAssessor::new(&null).is_ok());
    assert!(AshaAssessor::new(&null).is_ok());
    assert!(CurvefittingAssessor::new(&serde_json::json!({"epoch_num": 10})).is_ok());
}
