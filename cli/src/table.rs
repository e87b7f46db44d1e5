//! Plain-text tables for the terminal.

use knob_core::manager::TrialSummary;

/// Left-aligned columns separated by two spaces; the last column is not padded.
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
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

/// A metric value as users read it.
pub fn metric(value: Option<f64>) -> String {
    match value {
        Some(v) => format!("{v:.6}"),
        None => "-".into(),
    }
}

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

/// The best `limit` trials with a final result, best first.
pub fn best_trials_table(trials: &[TrialSummary], maximize: bool, limit: usize) -> String {
    let mut ranked: Vec<&TrialSummary> = trials
        .iter()
        .filter(|t| t.final_value.is_some_and(|v| !v.is_nan()))
        .collect();
    ranked.sort_by(|a, b| {
        let (a, b) = (
            a.final_value.unwrap_or_default(),
            b.final_value.unwrap_or_default(),
        );
        if maximize {
            b.total_cmp(&a)
        } else {
            a.total_cmp(&b)
        }
    });
    if ranked.is_empty() {
        let unusable = trials
            .iter()
            .filter(|t| t.final_value.is_some_and(f64::is_nan))
            .count();
        if unusable > 0 {
            return format!(
                "no trial reported a usable final result ({unusable} reported one that is NaN, infinite or unreadable: see `knob trial ls`)"
            );
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
                t.parameters.to_string(),
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
