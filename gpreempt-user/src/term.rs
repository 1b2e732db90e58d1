//! Text bound for a terminal. A process names itself (comm, cmdline) and its code objects name
//! their kernels: such a string may carry ESC, CSI or OSC sequences and newlines that would set
//! the window title, clear the screen or forge rows in root's terminal. Every such string goes
//! through [`clean`] before `top`, `queues`, `doctor` or `trace`'s text output prints it (the
//! JSON and metrics outputs escape on their own).

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether colour is off: `NO_COLOR` present and not empty (the no-color.org convention), for the
/// log lines and `top` alike.
pub fn no_color() -> bool {
    no_color_in(std::env::var_os("NO_COLOR").as_deref())
}

fn no_color_in(v: Option<&std::ffi::OsStr>) -> bool {
    v.is_some_and(|v| !v.is_empty())
}

/// `s` with every control character (C0 including newline and tab, DEL, C1) written as an
/// escape (`\n`, `\t`, `\x1b`, `\u{9b}`): printable, one line, nothing the terminal obeys.
pub fn clean(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x80 && c.is_control() => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn no_color_is_a_non_empty_variable() {
        use std::ffi::OsStr;
        assert!(!super::no_color_in(None));
        assert!(!super::no_color_in(Some(OsStr::new(""))));
        assert!(super::no_color_in(Some(OsStr::new("1"))));
    }

    use super::*;

    #[test]
    fn control_sequences_and_newlines_are_shown_not_obeyed() {
        assert!(matches!(clean("python3"), Cow::Borrowed("python3")));
        // Set the window title (OSC), clear the screen (CSI), forge a row.
        let evil = "x\x1b]0;pwned\x07\x1b[2J\nroot    1 online";
        let c = clean(evil);
        assert_eq!(c, "x\\x1b]0;pwned\\x07\\x1b[2J\\nroot    1 online");
        assert!(!c.chars().any(char::is_control));
        // C1 controls (a one-character CSI) and DEL.
        assert_eq!(clean("a\u{9b}2Jb\x7f"), "a\\u{9b}2Jb\\x7f");
        // Unicode text stays.
        assert_eq!(clean("dÃ©jà-vu ✓"), "dÃ©jà-vu ✓");
    }
}
