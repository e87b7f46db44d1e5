//! Text from outside knob (a trial's stderr, a plugin's error, warning or reason) made one
//! line of visible text, as knob stores and shows it. The one place that does it: the core's
//! trial end messages and the host's plugin messages both use it.

/// `text` as one bounded line: the visible text of each of its lines ([`visible_text`]; a
/// carriage return ends a line as a newline does), joined by spaces, cut to its first `max`
/// characters ([`bounded`]).
pub fn one_line(text: &str, max: usize) -> String {
    let mut line = String::new();
    for part in text.split(['\n', '\r']).filter_map(visible_text) {
        // Past this many bytes it has more than enough characters: the rest is cut anyway.
        if line.len() > 4 * max {
            break;
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(&part);
    }
    bounded(&line, max).into_owned()
}

/// One line of text from outside knob (a trial's stderr, a plugin's message) as knob shows it,
/// trimmed, or `None` when it has nothing visible. The text reaches terminals (`knob trial ls`,
/// the launcher's `Trial.message`, the console) and the dashboard, so terminal escape sequences
/// are removed (colours of a coloured traceback or log line, a progress bar's window title:
/// shown, they drive the reader's terminal, and a line that is only one would hide the error
/// before it) and every other control character becomes `�`, as an undecodable byte already
/// has (a tab, a space).
pub fn visible_text(line: &str) -> Option<String> {
    const ESC: char = '\u{1b}';
    const BEL: char = '\u{7}';
    let mut text = String::with_capacity(line.len());
    let mut visible = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        // Which sequence starts here: ESC and a letter, or the one-character C1 form.
        let kind = match c {
            ESC => match chars.peek() {
                Some(&next @ ('[' | ']' | 'P' | 'X' | '^' | '_')) => {
                    chars.next();
                    Some(next)
                }
                _ => Some(ESC),
            },
            '\u{9b}' => Some('['),
            '\u{9d}' => Some(']'),
            '\u{90}' | '\u{98}' | '\u{9e}' | '\u{9f}' => Some('P'),
            _ => None,
        };
        match kind {
            // CSI (colours, cursor moves): parameter and intermediate bytes, then a final byte.
            Some('[') => {
                while chars.next_if(|c| matches!(c, ' '..='?')).is_some() {}
                chars.next_if(|c| matches!(c, '@'..='~'));
            }
            // OSC (a window title, a hyperlink, a clipboard write) and the other string
            // sequences: up to BEL or ST (ESC \\, or C1's), else to the end of the line. Any
            // other ESC ends one too, as terminals take it, and starts a sequence of its own.
            Some(']' | 'P' | 'X' | '^' | '_') => {
                while let Some(c) = chars.next_if(|&c| c != ESC) {
                    if c == BEL || c == '\u{9c}' {
                        break;
                    }
                }
                let mut ahead = chars.clone();
                if ahead.next() == Some(ESC) && ahead.next() == Some('\\') {
                    chars = ahead;
                }
            }
            // Any other escape: intermediate bytes, then a final byte (`ESC ( B`, `ESC 7`).
            Some(_) => {
                while chars.next_if(|c| matches!(c, ' '..='/')).is_some() {}
                chars.next_if(|c| matches!(c, '0'..='~'));
            }
            None if c == '\t' => text.push(' '),
            None if c.is_control() => text.push('\u{fffd}'),
            None => {
                visible |= !c.is_whitespace();
                text.push(c);
            }
        }
    }
    visible.then(|| text.trim().to_string())
}

/// `text` cut to its first `max` characters, with `…` when cut.
pub fn bounded(text: &str, max: usize) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]).into(),
        None => text.into(),
    }
}
