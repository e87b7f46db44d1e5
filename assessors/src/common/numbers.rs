//! Numbers in verdict reasons: short, but never so short that two different numbers a reason
//! compares ("best 0.74 below median 0.74") print the same.

/// `value` with 4 significant digits, trailing zeros dropped.
pub(crate) fn number(value: f64) -> String {
    with_significant_digits(value, 4)
}

/// Both numbers with the fewest significant digits (at least 4) that print them differently,
/// so that a reason saying one is below the other is visibly true.
pub(crate) fn numbers_apart(a: f64, b: f64) -> (String, String) {
    for digits in 4..=17 {
        let (text_a, text_b) = (
            with_significant_digits(a, digits),
            with_significant_digits(b, digits),
        );
        if text_a != text_b || digits == 17 {
            return (text_a, text_b);
        }
    }
    unreachable!("the loop returns at 17 digits")
}

fn with_significant_digits(value: f64, digits: usize) -> String {
    if value.is_nan() {
        return "NaN".into();
    }
    if value.is_infinite() {
        return if value > 0.0 { "inf" } else { "-inf" }.into();
    }
    if value == 0.0 {
        return "0".into();
    }
    let magnitude = value.abs().log10().floor() as i32;
    if (-4..15).contains(&magnitude) {
        let decimals = (digits as i32 - 1 - magnitude).max(0) as usize;
        let text = format!("{value:.decimals$}");
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            text
        }
    } else {
        let precision = digits - 1;
        let text = format!("{value:.precision$e}");
        // 1.500e-7 → 1.5e-7
        match text.split_once('e') {
            Some((mantissa, exponent)) if mantissa.contains('.') => format!(
                "{}e{exponent}",
                mantissa.trim_end_matches('0').trim_end_matches('.')
            ),
            _ => text,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_and_distinct() {
        assert_eq!(number(0.61), "0.61");
        assert_eq!(number(0.612345), "0.6123");
        assert_eq!(number(1234.5678), "1235");
        assert_eq!(number(-2.5), "-2.5");
        assert_eq!(number(1.5e-7), "1.5e-7");
        assert_eq!(number(f64::NAN), "NaN");
        assert_eq!(
            numbers_apart(0.74001, 0.74002),
            ("0.74001".into(), "0.74002".into())
        );
        assert_eq!(numbers_apart(0.5, 0.5), ("0.5".into(), "0.5".into()));
    }
}
