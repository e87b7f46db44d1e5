//! Plain-text tables for the terminal.

use knob_core::manager::TrialSummary;
use knob_core::store::TrialStatus;

/// `n` and `noun`, plural unless `n` is 1: "1 trial", "2 trials", "0 parameters".
pub fn counted(n: usize, noun: &str) -> String {
    match n {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

/// `text` with each control character shown as `�`, for a line on the terminal that holds what
/// knob did not write itself (a trial's output, a file's name), on which a terminal would act.
pub fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '\u{fffd}' } else { c })
        .collect()
}

/// Left-aligned columns separated by two spaces; the last column is not padded. A control
/// character in a cell is shown as `�`: cells hold what trials wrote (a final result as sent, an
/// end message recorded before knob cleaned them), and a terminal would act on an escape.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|row| row.iter().map(|cell| printable(cell)).collect())
        .collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(&widths).enumerate() {
            if i == last {
                text.push_str(cell);
            } else {
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        text.trim_end().to_string()
    };
    let mut out = vec![line(header.to_vec())];
    out.extend(
        rows.iter()
            .map(|row| line(row.iter().map(String::as_str).collect())),
    );
    out.join("\n")
}

/// A metric value as users read it: six decimals, or in scientific notation where those would
/// say nothing or too much (1.79e308 was 309 digits wide).
pub fn metric(value: Option<f64>) -> String {
    match value {
        Some(v) if v != 0.0 && v.is_finite() && !(1e-4..1e15).contains(&v.abs()) => {
            format!("{v:.6e}")
        }
        Some(v) => format!("{v:.6}"),
        None => "-".into(),
    }
}

/// A trial's parameters in a table: their JSON, cut at [`PARAMETERS_CELL_CHARS`] with `…` (a
/// parameter of 120 KB filled the terminal; `knob experiment export` has them whole).
pub fn parameters_cell(parameters: &serde_json::Value) -> String {
    let text = parameters.to_string();
    match text.char_indices().nth(PARAMETERS_CELL_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// How much of a trial's parameters a table shows.
pub const PARAMETERS_CELL_CHARS: usize = 200;

/// A final result as `knob trial ls` shows it: the number, or, for one reported without a usable
/// value (NaN, ±Infinity, unreadable), `-` and what the trial sent.
pub fn final_cell(value: Option<f64>, raw: Option<&str>) -> String {
    match (value, raw) {
        (Some(v), _) => metric(Some(v)),
        (None, Some(raw)) => {
            const MAX: usize = 24;
            let raw = raw.trim();
            let shown: String = raw.chars().take(MAX).collect();
            let more = if raw.chars().count() > MAX { "…" } else { "" };
            format!("- ({shown}{more})")
        }
        (None, None) => "-".into(),
    }
}

/// The best `limit` trials, best first: those that rank (`objectives::Ranking`, as the manager
/// judged each), ties to the earlier trial.
pub fn best_trials_table(
    id: &str,
    trials: &[TrialSummary],
    maximize: bool,
    limit: usize,
) -> String {
    let mut ranked: Vec<&TrialSummary> = trials.iter().filter(|t| t.ranks).collect();
    let direction = if maximize {
        knob_core::store::Direction::Maximize
    } else {
        knob_core::store::Direction::Minimize
    };
    ranked.sort_by(|a, b| {
        let key = |t: &TrialSummary| (t.final_value.unwrap_or(f64::NAN), t.sequence);
        knob_core::objectives::best_first(direction, key(a), key(b))
    });
    if ranked.is_empty() {
        // Why none ranks, of the trials that succeeded with a final result.
        let (infeasible, unusable): (Vec<&TrialSummary>, Vec<&TrialSummary>) = trials
            .iter()
            .filter(|t| t.status == TrialStatus::Succeeded && t.final_value.is_some())
            .partition(|t| t.infeasible);
        if !unusable.is_empty() {
            return format!(
                "no trial reported a usable final result ({} reported one that is NaN, infinite or unreadable: see `knob trial ls`)",
                unusable.len()
            );
        }
        if !infeasible.is_empty() {
            return format!(
                "no trial met every constraint ({} broke one: `knob experiment pareto {id} --all` lists them)",
                infeasible.len()
            );
        }
        if trials.iter().any(|t| t.final_value.is_some()) {
            return "no trial that reported a final result succeeded (and so none is the best): see `knob trial ls`".into();
        }
        return "no trial reported a final result".into();
    }
    let rows: Vec<Vec<String>> = ranked
        .iter()
        .take(limit)
        .enumerate()
        .map(|(rank, t)| {
            vec![
                format!("{}", rank + 1),
                t.id.clone(),
                metric(t.final_value),
                parameters_cell(&t.parameters),
            ]
        })
        .collect();
    render(
        &[
            "#",
            "trial",
            if maximize { "best (max)" } else { "best (min)" },
            "parameters",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_says_one_in_the_singular_and_the_rest_in_the_plural() {
        assert_eq!(counted(1, "trial"), "1 trial");
        assert_eq!(counted(0, "trial"), "0 trials");
        assert_eq!(counted(3, "parameter"), "3 parameters");
    }

    #[test]
    fn metrics_stay_readable_at_any_magnitude() {
        assert_eq!(metric(Some(0.5)), "0.500000");
        assert_eq!(metric(Some(-12345.25)), "-12345.250000");
        assert_eq!(metric(Some(0.0)), "0.000000");
        assert_eq!(metric(Some(1.79e308)), "1.790000e308");
        assert_eq!(metric(Some(-2.5e-7)), "-2.500000e-7");
        assert_eq!(metric(None), "-");
    }

    #[test]
    fn a_cell_s_control_characters_do_not_reach_the_terminal() {
        let rows = vec![
            vec!["a".to_string(), "exit code 1: \x1b]0;title\x07".to_string()],
            vec!["b\tc".to_string(), "- (\x1b[31m1\0)".to_string()],
        ];
        assert_eq!(
            render(&["trial", "reason"], &rows),
            "trial  reason\na      exit code 1: �]0;title�\nb�c    - (�[31m1�)"
        );
    }

    #[test]
    fn long_parameters_are_cut_on_a_character() {
        let short = serde_json::json!({"x": 1});
        assert_eq!(parameters_cell(&short), r#"{"x":1}"#);
        let long = serde_json::json!({"text": "é".repeat(500)});
        let cell = parameters_cell(&long);
        assert_eq!(cell.chars().count(), PARAMETERS_CELL_CHARS + 1);
        assert!(
            cell.starts_with(r#"{"text":"éé"#) && cell.ends_with("é…"),
            "{cell}"
        );
    }
}
