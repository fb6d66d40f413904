//! `kubectl exec -t`: the guest agent's terminal is its shell, with no argv
//! (docs/streaming.md#a-terminal). To run the command the user named under
//! that terminal, the shell is typed a few short lines that end in
//! ` printf MARK; exec ARGV || exit 127`, and everything the terminal
//! prints until the marker (prompt, the lines' echo, start-up messages) is
//! dropped: the user sees their program alone, with a real terminal, and
//! its exit code is the session's. The marker is printed from escapes, so
//! the echo never contains it. Pure: the lines and the output filter.
//!
//! What is typed goes through the terminal's line discipline and the
//! shell's line editor before the shell parses it: a TAB completes, control
//! characters edit, a line over 4095 bytes (busybox: 1024) is cut. So every
//! typed line is printable ASCII and short: an argument that is not (or is
//! long) is typed as a `printf` format of octal escapes in pieces, and
//! rebuilt by the shell's own `printf` (a builtin of bash, dash and busybox
//! ash; nothing in the guest beyond the shell is needed).

/// What the shell is given, and what to wait for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injection {
    /// Typed into the terminal: lines, each ending in a newline.
    pub typed: Vec<u8>,
    /// Printed by the shell just before it becomes the program.
    pub marker: Vec<u8>,
}

/// Discarded output after which the filter stops looking for the marker
/// and passes everything through (a shell that cannot print it must not
/// swallow the session), beyond the echo of what was typed.
pub const MAX_DISCARD: usize = 1024 * 1024;

/// The most bytes typed on one line, prefix included: well under busybox
/// ash's 1024 and the line discipline's 4095.
pub const MAX_LINE: usize = 400;

/// POSIX single-quoting.
pub fn quote(arg: &str) -> String {
    format!("'{}'", arg.replace('\'', r"'\''"))
}

/// Bytes typed as themselves in a `printf` format: nothing the format, the
/// quotes around it, the line editor or history expansion reads.
fn plain(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-_./:=,+@ ".contains(&b)
}

/// `arg` as a `printf` format that prints it: plain bytes as they are,
/// every other one as a 3-digit octal escape. Pieces of at most `room`
/// bytes, never cut inside an escape. Pure.
pub fn format_pieces(arg: &[u8], room: usize) -> Vec<String> {
    let mut pieces = Vec::new();
    let mut piece = String::new();
    for &b in arg {
        let esc = if plain(b) {
            char::from(b).to_string()
        } else {
            format!("\\{b:03o}")
        };
        if piece.len() + esc.len() > room {
            pieces.push(std::mem::take(&mut piece));
        }
        piece.push_str(&esc);
    }
    if !piece.is_empty() {
        pieces.push(piece);
    }
    pieces
}

/// Whether `arg` can be typed single-quoted as it is: printable ASCII,
/// and no `!` (bash's history expansion, which single quotes stop, but
/// nothing is gained by relying on it).
fn typable(arg: &str) -> bool {
    arg.bytes().all(|b| (0x20..0x7f).contains(&b) && b != b'!')
}

/// The lines that make the terminal's shell run `argv`; `nonce` makes the
/// marker unguessable by whatever runs before it. Every line starts with a
/// space (kept out of the shell's history).
pub fn injection(argv: &[String], nonce: &str) -> Injection {
    let last = format!(" printf '\\036%s\\036' {nonce}; exec ");
    let direct = argv.iter().map(|a| quote(a)).collect::<Vec<_>>().join(" ");
    let typed = if argv.iter().all(|a| typable(a))
        && last.len() + direct.len() + " || exit 127\n".len() <= MAX_LINE
    {
        format!("{last}{direct} || exit 127\n")
    } else {
        let mut lines = String::from(" set --\n");
        for arg in argv {
            let quoted = quote(arg);
            if typable(arg) && quoted.len() + 20 <= MAX_LINE {
                lines.push_str(&format!(" set -- \"$@\" {quoted}\n"));
                continue;
            }
            // Built in `_f`, printed into `_a` (with a trailing x, as a
            // command substitution drops trailing newlines).
            for (i, piece) in format_pieces(arg.as_bytes(), MAX_LINE - 16)
                .iter()
                .enumerate()
            {
                let append = if i == 0 { "" } else { "$_f" };
                lines.push_str(&format!(" _f={append}'{piece}'\n"));
            }
            lines.push_str(" _a=$(printf \"${_f}x\"); set -- \"$@\" \"${_a%x}\"\n");
        }
        lines.push_str(&format!("{last}\"$@\" || exit 127\n"));
        lines
    };
    let mut marker = vec![0x1e];
    marker.extend_from_slice(nonce.as_bytes());
    marker.push(0x1e);
    Injection {
        typed: typed.into_bytes(),
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
    /// Discarded output after which everything passes.
    limit: usize,
    passing: bool,
}

impl MarkerFilter {
    pub fn new(marker: Vec<u8>) -> MarkerFilter {
        MarkerFilter {
            marker,
            tail: Vec::new(),
            discarded: 0,
            limit: MAX_DISCARD,
            passing: false,
        }
    }

    /// The filter of `inj`: its typed lines' echo (with the line editor's
    /// redrawing, a few times their size) is allowed beyond
    /// [`MAX_DISCARD`].
    pub fn of(inj: &Injection) -> MarkerFilter {
        MarkerFilter {
            limit: MAX_DISCARD + 4 * inj.typed.len(),
            ..MarkerFilter::new(inj.marker.clone())
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
        if self.discarded > self.limit {
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
    fn a_plain_short_argv_is_one_line_and_the_echo_cannot_hold_the_marker() {
        let inj = injection(
            &["python3".into(), "-c".into(), "print('x')".into()],
            "n0nce",
        );
        let line = String::from_utf8(inj.typed.clone()).expect("typed text is UTF-8");
        assert_eq!(
            line,
            " printf '\\036%s\\036' n0nce; exec 'python3' '-c' 'print('\\''x'\\'')' || exit 127\n"
        );
        assert_eq!(inj.marker, b"\x1en0nce\x1e");
        assert!(
            !inj.typed.windows(inj.marker.len()).any(|w| w == inj.marker),
            "the echoed line must not contain the marker"
        );
    }

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    /// Finding 8 of the 2026-12-b review: whatever the argv, every typed
    /// line is short printable ASCII (no TAB, no control byte, nothing
    /// over [`MAX_LINE`]), so no line editor or line discipline changes it.
    #[test]
    fn every_typed_line_is_short_and_printable() {
        let long = "x".repeat(5000);
        let binary: String = (1u8..=127).map(char::from).collect();
        let cases = [
            args(&["printf", "%s", "a\tb"]),
            args(&["sh", "-c", "printf %s \"$1\" | wc -c", "_", &long]),
            args(&["echo", &binary, "é ü", "", "!!", "$HOME"]),
            (0..300).map(|i| format!("arg{i}")).collect(),
        ];
        for argv in cases {
            let inj = injection(&argv, "n0nce");
            assert!(inj.typed.ends_with(b"\n"));
            for line in inj.typed.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
                assert!(line.len() <= MAX_LINE, "{} bytes", line.len());
                assert!(
                    line.iter().all(|b| (0x20..0x7f).contains(b)),
                    "{:?}",
                    String::from_utf8_lossy(line)
                );
                assert!(line.starts_with(b" "), "kept out of the history");
                assert!(!line.contains(&b'!'), "no history expansion");
            }
            assert!(!inj.typed.windows(inj.marker.len()).any(|w| w == inj.marker));
        }
    }

    #[test]
    fn format_pieces_escape_and_never_cut_an_escape() {
        assert_eq!(format_pieces(b"ab c", 10), ["ab c"]);
        assert_eq!(format_pieces(b"a\tb", 100), ["a\\011b"]);
        assert_eq!(format_pieces(b"%'\\", 100), ["\\045\\047\\134"]);
        assert_eq!(format_pieces(b"\xff", 100), ["\\377"]);
        assert_eq!(format_pieces(b"abc", 2), ["ab", "c"]);
        assert_eq!(format_pieces(b"a\t", 4), ["a", "\\011"]);
        assert_eq!(format_pieces(b"\t\t", 4), ["\\011", "\\011"]);
        assert!(format_pieces(b"", 4).is_empty());
    }

    /// What the shell `cmd` makes of the typed lines, read as a script:
    /// the argv it ends up executing, printed NUL-separated by a shell of
    /// its own; `None` when `cmd[0]` is not installed.
    fn run_typed(cmd: &[&str], argv: &[String]) -> Option<Vec<String>> {
        use std::io::Write;
        if !std::path::Path::new(cmd[0]).exists() {
            return None;
        }
        let mut full = args(&[
            "/bin/sh",
            "-c",
            "for a; do printf '%s\\0' \"$a\"; done",
            "_",
        ]);
        full.extend_from_slice(argv);
        let inj = injection(&full, "n0nce");
        let mut child = std::process::Command::new(cmd[0])
            .args(&cmd[1..])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn the shell");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(&inj.typed)
            .expect("type");
        let out = child.wait_with_output().expect("run");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rest = out
            .stdout
            .strip_prefix(inj.marker.as_slice())
            .expect("the marker first")
            .to_vec();
        let mut got: Vec<String> = rest
            .split(|&b| b == 0)
            .map(|a| String::from_utf8(a.to_vec()).expect("utf-8"))
            .collect();
        assert_eq!(got.pop().as_deref(), Some(""), "NUL-terminated");
        Some(got)
    }

    /// The lines rebuild every argument byte for byte, in the shells a
    /// guest may have (a real terminal's line editor is the end-to-end
    /// test's, tests/sandboxd_data_plane.rs).
    #[test]
    fn the_shells_rebuild_the_argv_exactly() {
        let binary: String = (1u8..=127).map(char::from).collect();
        let argv = args(&[
            "a\tb",
            "",
            "trailing newlines\n\n",
            &binary,
            "é ü ✓",
            "it's \"quoted\" $HOME `x` %s \\n",
            &"y".repeat(5000),
            &"\t".repeat(700),
        ]);
        let mut ran = 0;
        for shell in [
            &["/bin/sh", "-s"][..],
            &["/bin/dash", "-s"],
            &["/bin/bash", "-s"],
            &["/usr/bin/busybox", "sh", "-s"],
        ] {
            if let Some(got) = run_typed(shell, &argv) {
                assert_eq!(got, argv, "{shell:?}");
                ran += 1;
            }
        }
        assert!(ran >= 2, "at least sh and bash here");
    }

    #[test]
    fn the_filter_allows_the_echo_of_long_input() {
        let inj = injection(&args(&["x", &"\t".repeat(300_000)]), "n0nce");
        let mut f = MarkerFilter::of(&inj);
        let echo = vec![b'e'; MAX_DISCARD + 2 * inj.typed.len()];
        assert!(f.feed(&echo).is_empty(), "still waiting");
        assert!(!f.passing());
        let mut g = MarkerFilter::of(&inj);
        let flood = vec![b'e'; MAX_DISCARD + 4 * inj.typed.len() + inj.marker.len()];
        assert!(!g.feed(&flood).is_empty());
        assert!(g.passing(), "given up past the allowance");
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
