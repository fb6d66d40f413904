//! `kubectl exec -t`: the guest agent's terminal is its shell, with no argv
//! (docs/streaming.md#a-terminal). To run the command the user named under
//! that terminal, the shell is handed one line, ` printf MARK; exec ARGV ||
//! exit 127`, and everything the terminal prints until the marker (prompt,
//! the line's echo, start-up messages) is dropped: the user sees their
//! program alone, with a real terminal, and its exit code is the session's.
//! The marker is printed from escapes, so the line's echo never contains
//! it. Pure: the line and the output filter.

/// What the shell is given, and what to wait for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    /// Typed into the terminal (newline included).
    pub line: Vec<u8>,
    /// Printed by the shell just before it becomes the program.
    pub marker: Vec<u8>,
}

/// Discarded output after which the filter stops looking for the marker
/// and passes everything through (a shell that cannot print it must not
/// swallow the session).
pub const MAX_DISCARD: usize = 1024 * 1024;

/// POSIX single-quoting.
pub fn quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

/// The line that makes the terminal's shell run `argv`; `nonce` makes the
/// marker unguessable by whatever runs before it.
pub fn injection(argv: &[String], nonce: &str) -> Injection {
    let command = argv.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ");
    // A leading space keeps the line out of shell history; \036 is RS.
    let line = format!(" printf '\\036%s\\036' {nonce}; exec {command} || exit 127\n");
    let mut marker = vec![0x1e];
    marker.extend_from_slice(nonce.as_bytes());
    marker.push(0x1e);
    Injection {
        line: line.into_bytes(),
        marker,
    }
}

/// Drops terminal output up to and including the marker.
#[derive(Debug)]
pub struct MarkerFilter {
    marker: Vec<u8>,
    /// The tail of what was discarded that could start the marker.
    tail: Vec<u8>,
    discarded: usize,
    passing: bool,
}

impl MarkerFilter {
    pub fn new(marker: Vec<u8>) -> MarkerFilter {
        MarkerFilter {
            marker,
            tail: Vec::new(),
            discarded: 0,
            passing: false,
        }
    }

    /// Whether output now passes through (marker seen, or given up).
    pub fn passing(&self) -> bool {
        self.passing
    }

    /// Stop filtering: what was held back passes with the next output.
    pub fn give_up(&mut self) -> Vec<u8> {
        self.passing = true;
        std::mem::take(&mut self.tail)
    }

    /// The part of `data` to pass on.
    pub fn feed(&mut self, data: &[u8]) -> Vec<u8> {
        if self.passing {
            return data.to_vec();
        }
        let mut window = std::mem::take(&mut self.tail);
        window.extend_from_slice(data);
        if let Some(at) = window
            .windows(self.marker.len())
            .position(|w| w == self.marker.as_slice())
        {
            self.passing = true;
            return window.split_off(at + self.marker.len());
        }
        let keep = (self.marker.len() - 1).min(window.len());
        self.discarded += window.len() - keep;
        if self.discarded > MAX_DISCARD {
            self.passing = true;
            return window;
        }
        self.tail = window.split_off(window.len() - keep);
        Vec::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_any_argument() {
        assert_eq!(quote("a"), "'a'");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("$HOME `x` \"y\""), "'$HOME `x` \"y\"'");
    }

    #[test]
    fn the_line_runs_the_argv_and_the_echo_cannot_hold_the_marker() {
        let inj = injection(
            &["python3".into(), "-c".into(), "print('x')".into()],
            "n0nce",
        );
        let line = String::from_utf8(inj.line.clone()).unwrap();
        assert_eq!(
            line,
            " printf '\\036%s\\036' n0nce; exec 'python3' '-c' 'print('\\''x'\\'')' || exit 127\n"
        );
        assert_eq!(inj.marker, b"\x1en0nce\x1e");
        assert!(
            !inj.line.windows(inj.marker.len()).any(|w| w == inj.marker),
            "the echoed line must not contain the marker"
        );
    }

    #[test]
    fn output_before_the_marker_is_dropped_even_split_across_reads() {
        let marker = b"\x1eabc\x1e".to_vec();
        for cut in 0..=marker.len() {
            let mut f = MarkerFilter::new(marker.clone());
            let mut first = b"$ prompt echo\r\n".to_vec();
            first.extend_from_slice(&marker[..cut]);
            let mut second = marker[cut..].to_vec();
            second.extend_from_slice(b"hello");
            let mut out = f.feed(&first);
            out.extend(f.feed(&second));
            assert_eq!(out, b"hello", "cut {cut}");
            assert!(f.passing());
            assert_eq!(f.feed(b"more"), b"more");
        }
    }

    #[test]
    fn near_misses_are_dropped_not_passed() {
        let mut f = MarkerFilter::new(b"\x1eabc\x1e".to_vec());
        assert!(f.feed(b"\x1eab").is_empty());
        assert!(f.feed(b"x\x1e").is_empty());
        assert!(!f.passing());
        assert_eq!(f.feed(b"\x1eabc\x1e!"), b"!");
    }

    #[test]
    fn a_shell_that_never_prints_the_marker_is_given_up_on() {
        let mut f = MarkerFilter::new(b"\x1eabc\x1e".to_vec());
        let junk = vec![b'j'; MAX_DISCARD];
        assert!(f.feed(&junk).is_empty());
        assert!(!f.passing(), "up to the limit it still waits");
        let out = f.feed(b"tail-end");
        assert!(f.passing());
        assert!(out.ends_with(b"tail-end"));
        let mut g = MarkerFilter::new(b"\x1eabc\x1e".to_vec());
        assert!(g.feed(b"xyz\x1ea").is_empty());
        assert_eq!(g.give_up(), b"yz\x1ea");
        assert_eq!(g.feed(b"b"), b"b");
    }
}
