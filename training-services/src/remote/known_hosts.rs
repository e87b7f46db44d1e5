//! What russh's known_hosts reader leaves out, read from the file's text: the `@revoked` and
//! `@cert-authority` marker lines (russh takes `@revoked` for a host name and skips the line),
//! the file's own line numbers (russh does not count comment lines), and the host-key
//! algorithms to ask a server for first (those of the keys recorded for it, as OpenSSH does).

use std::path::Path;

use russh::keys::{Algorithm, PublicKey};

/// What a known_hosts file records for a host: its keys with the file's line numbers, and the
/// lines skipped for a key that does not parse.
pub struct Recorded {
    pub keys: Vec<(usize, PublicKey)>,
    pub skipped: Vec<usize>,
}

/// The keys `path` records for `host` at `port`, read by russh (hashed names, patterns), with
/// the file's own line numbers. A host line whose key does not parse (cut short, mistyped) is
/// skipped, as OpenSSH skips it: russh refused the whole file for one such line, so a host that
/// `ssh` reaches was refused for the run. Only a file that cannot be read is an error.
///
/// Host names match as OpenSSH matches them, whatever their case: it lowercases the name it
/// looks up (and `ssh-keyscan` writes names lowercased), and its patterns ignore case. russh
/// compares bytes, so `host: GPU1.Lab` was refused against the line `ssh-keyscan` wrote for it,
/// and knob's own advice (that command) could not help.
pub fn recorded_keys(path: &Path, host: &str, port: u16) -> Result<Recorded, String> {
    let file = path.display();
    let unreadable =
        |e: &dyn std::fmt::Display| format!("cannot read known hosts file {file}: {e}");
    // A file not made yet records nothing, as ssh takes it. As an error it refused the host
    // for good (a fresh user's `~/.ssh/known_hosts`, a `knownHostsFile` that `config check`
    // lets `acceptNewHostKey` create), so `acceptNewHostKey` could never make the file.
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Recorded {
                keys: Vec::new(),
                skipped: Vec::new(),
            })
        }
        Err(e) => return Err(unreadable(&e)),
    };
    let host = host.to_ascii_lowercase();
    let skipped: Vec<usize> = text
        .lines()
        .enumerate()
        .filter(|(_, line)| !readable_line(line))
        .map(|(index, _)| index + 1)
        .collect();
    let uppercase_names = text.lines().any(|line| lowercased_names(line).is_some());
    let (keys, read) = if skipped.is_empty() && !uppercase_names {
        let keys = russh::keys::known_hosts::known_host_keys_path(&host, port, path)
            .map_err(|e| unreadable(&e))?;
        (keys, text)
    } else {
        // russh reads only files: a copy with the skipped lines made comments and host names
        // lowercased, one line for one, so that [`file_line`] over it gives the file's numbers.
        let kept: String = text
            .split_inclusive('\n')
            .enumerate()
            .map(|(index, line)| match skipped.contains(&(index + 1)) {
                true => "# skipped\n".to_string(),
                false => lowercased_names(line).unwrap_or_else(|| line.to_string()),
            })
            .collect();
        let mut copy = tempfile::NamedTempFile::new().map_err(|e| unreadable(&e))?;
        std::io::Write::write_all(&mut copy, kept.as_bytes()).map_err(|e| unreadable(&e))?;
        let keys = russh::keys::known_hosts::known_host_keys_path(&host, port, copy.path())
            .map_err(|e| unreadable(&e))?;
        (keys, kept)
    };
    Ok(Recorded {
        keys: keys
            .into_iter()
            .map(|(line, key)| (file_line(&read, line), key))
            .collect(),
        skipped,
    })
}

/// `line` with its host names lowercased, if a plain (not hashed) one has a capital letter;
/// `None` for a line left as it is (a comment, a marker line, hashed names, no capitals).
fn lowercased_names(line: &str) -> Option<String> {
    let start = line.len() - line.trim_start().len();
    let names = line[start..].split_whitespace().next()?;
    if names.starts_with(['#', '@', '|']) || !names.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let end = start + names.len();
    Some(format!(
        "{}{}{}",
        &line[..start],
        names.to_ascii_lowercase(),
        &line[end..]
    ))
}

/// Whether russh can read a line: a comment, a blank or marker line (`@revoked`, read apart),
/// or host patterns, a key type and a key that parses.
fn readable_line(line: &str) -> bool {
    let mut fields = line.split_whitespace();
    match fields.next() {
        None => true,
        Some(first) if first.starts_with('#') || first.starts_with('@') => true,
        Some(_) => {
            let _key_type = fields.next();
            fields
                .next()
                .is_some_and(|key| russh::keys::parse_public_key_base64(key).is_ok())
        }
    }
}

/// The line numbers and keys of the file's `@revoked` lines. A revoked key "must not ever be
/// accepted" (sshd(8)), so the line's host patterns do not narrow it: knob refuses the key from
/// any host. A line whose key does not parse is skipped: it cannot equal a server's key.
pub fn revoked_keys(text: &str) -> Vec<(usize, PublicKey)> {
    marker_lines(text, "@revoked")
        .filter_map(|(line, fields)| {
            let key = russh::keys::parse_public_key_base64(fields.get(2)?).ok()?;
            Some((line, key))
        })
        .collect()
}

/// The number of the first `@cert-authority` line whose plain host patterns match `host` at
/// `port` (hashed patterns are not read: this only adds a hint to a refusal).
pub fn cert_authority_line(text: &str, host: &str, port: u16) -> Option<usize> {
    let name = host_port(host, port);
    marker_lines(text, "@cert-authority")
        .find(|(_, fields)| fields.first().is_some_and(|p| patterns_match(p, &name)))
        .map(|(line, _)| line)
}

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

/// The host as known_hosts names it: `host` on port 22, `[host]:port` on others.
fn host_port(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

/// The lines that begin with `marker`, numbered from 1, as their fields after it.
fn marker_lines<'a>(
    text: &'a str,
    marker: &'a str,
) -> impl Iterator<Item = (usize, Vec<&'a str>)> + 'a {
    text.lines().enumerate().filter_map(move |(index, line)| {
        let mut fields = line.split_whitespace();
        (fields.next() == Some(marker)).then(|| (index + 1, fields.collect()))
    })
}

/// OpenSSH's pattern list: comma-separated, `*` and `?` wildcards, `!` negates (a negated match
/// rules the host out whatever else matches).
fn patterns_match(list: &str, name: &str) -> bool {
    let mut matched = false;
    for pattern in list.split(',') {
        match pattern.strip_prefix('!') {
            Some(negated) if glob(negated.as_bytes(), name.as_bytes()) => return false,
            Some(_) => {}
            None => matched |= glob(pattern.as_bytes(), name.as_bytes()),
        }
    }
    matched
}

fn glob(pattern: &[u8], name: &[u8]) -> bool {
    match (pattern.first(), name.first()) {
        (None, None) => true,
        (Some(b'*'), _) => {
            glob(&pattern[1..], name) || (!name.is_empty() && glob(pattern, &name[1..]))
        }
        (Some(b'?'), Some(_)) => glob(&pattern[1..], &name[1..]),
        (Some(p), Some(n)) if p.eq_ignore_ascii_case(n) => glob(&pattern[1..], &name[1..]),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED25519: &str = "AAAAC3NzaC1lZDI1NTE5AAAAIJRKOjW7u8pigJAGkWmO2WsWkRih/HA2mZb2EneqCOmr";

    /// As `ssh` matches them: `ssh-keyscan` writes names lowercased, and a config may not.
    #[test]
    fn host_names_match_whatever_their_case() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("known_hosts");
        for (line, host) in [
            ("[gpu1.lab]:2222", "GPU1.Lab"),
            ("[GPU1.Lab]:2222", "gpu1.lab"),
            ("# a comment\n[Gpu1.LAB]:2222", "gpu1.Lab"),
        ] {
            std::fs::write(&file, format!("{line} ssh-ed25519 {ED25519}\n")).unwrap();
            let recorded = recorded_keys(&file, host, 2222).unwrap();
            let lines: Vec<usize> = recorded.keys.iter().map(|(line, _)| *line).collect();
            assert_eq!(lines, [line.lines().count()], "{line} for {host}");
            assert!(recorded_keys(&file, "other.lab", 2222)
                .unwrap()
                .keys
                .is_empty());
        }
        assert_eq!(lowercased_names("|1|abc=|DEF= ssh-ed25519 K"), None);
        assert_eq!(
            lowercased_names("  Host.A,host.b ssh-ed25519 K\n").as_deref(),
            Some("  host.a,host.b ssh-ed25519 K\n")
        );
    }

    #[test]
    fn revoked_lines_are_read_whatever_their_hosts() {
        let text = format!(
            "# comment\n[127.0.0.1]:2222 ssh-ed25519 {ED25519}\n@revoked * ssh-ed25519 {ED25519}\n\
             @revoked\tother.host  ssh-ed25519 {ED25519} comment\n@revoked * ssh-ed25519 not-base64\n"
        );
        let lines: Vec<usize> = revoked_keys(&text).into_iter().map(|(l, _)| l).collect();
        assert_eq!(lines, vec![3, 4]);
    }

    #[test]
    fn cert_authority_lines_match_plain_patterns() {
        let text = format!(
            "@cert-authority *.lab,!bad.lab ssh-ed25519 {ED25519}\n@cert-authority [10.0.0.?]:2222 ssh-ed25519 {ED25519}\n"
        );
        assert_eq!(cert_authority_line(&text, "gpu1.LAB", 22), Some(1));
        assert_eq!(cert_authority_line(&text, "bad.lab", 22), None);
        assert_eq!(cert_authority_line(&text, "10.0.0.7", 2222), Some(2));
        assert_eq!(cert_authority_line(&text, "10.0.0.7", 22), None);
    }

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
