//! What russh's known_hosts reader leaves out, read from the file's text: the file's own line
//! numbers (russh does not count comment lines), and the host-key
//! algorithms to ask a server for first (those of the keys recorded for it, as OpenSSH does).

use russh::keys::Algorithm;

/// The file's line number of russh's `line`: russh numbers the lines that do not start with
/// `#` (it skips comments without counting them), from 1.
pub fn file_line(text: &str, russh_line: usize) -> usize {
    text.split_inclusive('\n')
        .enumerate()
        .filter(|(_, line)| !line.starts_with('#'))
        .nth(russh_line.saturating_sub(1))
        .map_or(russh_line, |(index, _)| index + 1)
}

/// The server's host-key algorithms to ask for, most preferred first: russh's defaults, those of
/// a kind `recorded` holds first (OpenSSH orders them so too). Without it a server with an
/// ed25519 and an RSA key shows its ed25519 one, and a known_hosts that pins only the RSA key
/// (`ssh-keyscan -t rsa`, an entry from before ed25519) could not be used.
pub fn preferred_algorithms(recorded: &[Algorithm]) -> Vec<Algorithm> {
    let defaults = russh::Preferred::DEFAULT.key;
    let is_recorded = |a: &Algorithm| recorded.iter().any(|r| same_kind(r, a));
    let mut order: Vec<Algorithm> = defaults
        .iter()
        .filter(|a| is_recorded(a))
        .cloned()
        .collect();
    order.extend(defaults.iter().filter(|a| !is_recorded(a)).cloned());
    order
}

/// Whether two algorithms are one kind of key: RSA keys serve every RSA signature hash.
pub fn same_kind(a: &Algorithm, b: &Algorithm) -> bool {
    a == b || matches!((a, b), (Algorithm::Rsa { .. }, Algorithm::Rsa { .. }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn russh_lines_are_counted_past_comments() {
        let text = "# a\nhost ssh-ed25519 X\n#b\n\nhost ssh-rsa Y\n";
        assert_eq!(file_line(text, 1), 2);
        assert_eq!(file_line(text, 3), 5);
    }

    #[test]
    fn recorded_kinds_come_first() {
        let rsa = Algorithm::Rsa { hash: None };
        let order = preferred_algorithms(std::slice::from_ref(&rsa));
        let names: Vec<String> = order.iter().map(|a| a.to_string()).collect();
        assert_eq!(
            names[..4],
            ["rsa-sha2-512", "rsa-sha2-256", "ssh-rsa", "ssh-ed25519"]
        );
        assert_eq!(order.len(), russh::Preferred::DEFAULT.key.len());
        assert_eq!(
            preferred_algorithms(&[]),
            russh::Preferred::DEFAULT.key.to_vec()
        );
    }
}
