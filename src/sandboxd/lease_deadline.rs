//! Lease deadlines as sandboxd sends them (docs/architecture.md#sandboxd-api).
//!
//! sandboxd writes Go's `time.Time` as RFC 3339 with 0-9 fractional digits and
//! the server's zone. The zero time `0001-01-01T00:00:00Z` and an absent or
//! empty field mean "no expiry". A value that does not parse is "unknown",
//! which behaves as "never expires" (failing a Pod on a guess would be worse
//! than keeping it) but stays visible so callers can log it.

use std::fmt;

use jiff::Timestamp;
use serde::{Deserialize, Deserializer};

/// Go's zero `time.Time`, as a Unix second count (`0001-01-01T00:00:00Z`).
const GO_ZERO_UNIX_SECONDS: i64 = -62_135_596_800;
/// `0000-01-01T00:00:00Z`: the earliest instant RFC 3339 (four-digit years)
/// can write in UTC.
const RFC3339_MIN_UNIX_SECONDS: i64 = -62_167_219_200;

/// A parsed lease deadline.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Deadline {
    /// Absent, empty or the zero time: the lease never expires.
    #[default]
    Never,
    /// The lease ends at this instant.
    At(Timestamp),
    /// sandboxd sent something that is not an RFC 3339 time. Treated as
    /// "never expires"; the raw text is kept for logging.
    Unparseable(String),
}

impl Deadline {
    /// Parse the wire value. Never fails: see the variants.
    pub fn parse(raw: Option<&str>) -> Deadline {
        let Some(raw) = raw else {
            return Deadline::Never;
        };
        let trimmed = raw.trim();
        if trimmed.is_empty() {
            return Deadline::Never;
        }
        match parse_rfc3339(trimmed) {
            Some(ts) if is_go_zero(ts) => Deadline::Never,
            // Year 0000 with a positive offset is before year 0000 in UTC,
            // which the claims file, the NodeInventory (`date-time`) and Go
            // cannot write: clamp it to the earliest instant they can. Both
            // are long past, so the lease is just as expired.
            Some(ts) => Deadline::At(ts.max(rfc3339_min())),
            None => Deadline::Unparseable(raw.to_string()),
        }
    }

    /// The instant the lease ends, or `None` when it never expires (absent,
    /// zero or unparseable).
    pub fn expires_at(&self) -> Option<Timestamp> {
        match self {
            Deadline::At(ts) => Some(*ts),
            Deadline::Never | Deadline::Unparseable(_) => None,
        }
    }

    /// The raw text of a deadline that could not be parsed, for a log line.
    pub fn unparseable(&self) -> Option<&str> {
        match self {
            Deadline::Unparseable(raw) => Some(raw),
            _ => None,
        }
    }
}

impl fmt::Display for Deadline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Deadline::Never => f.write_str("never"),
            Deadline::At(ts) => write!(f, "{ts}"),
            Deadline::Unparseable(raw) => write!(f, "unparseable {raw:?}"),
        }
    }
}

/// Parse a deadline: `None` for absent, empty, zero or unparseable values.
/// Use [`Deadline::parse`] to tell "unparseable" apart.
pub fn parse_deadline(raw: Option<&str>) -> Option<Timestamp> {
    Deadline::parse(raw).expires_at()
}

fn rfc3339_min() -> Timestamp {
    Timestamp::from_second(RFC3339_MIN_UNIX_SECONDS).unwrap_or(Timestamp::MIN)
}

fn is_go_zero(ts: Timestamp) -> bool {
    ts.as_second() == GO_ZERO_UNIX_SECONDS && ts.subsec_nanosecond() == 0
}

/// Strict RFC 3339: `YYYY-MM-DDTHH:MM:SS[.frac](Z|±hh:mm)`. `t`/`z` and a
/// space separator are accepted as RFC 3339 allows; anything else (missing
/// seconds or zone, a bracketed time zone name, an offset hour above 23) is
/// rejected. Also the kubelet API's `sinceTime` check.
pub(crate) fn parse_rfc3339(s: &str) -> Option<Timestamp> {
    let b = s.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let digits = |range: std::ops::Range<usize>| b[range].iter().all(u8::is_ascii_digit);
    let shape_ok = digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && matches!(b[10], b'T' | b't' | b' ')
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !shape_ok {
        return None;
    }
    let mut i = 19;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start || i - start > 9 {
            return None;
        }
    }
    let zone = &s[i..];
    let zone_ok = match zone.as_bytes() {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1 @ b'0'..=b'2', h2, b':', b'0'..=b'5', m2] => {
            [h2, m2].iter().all(|c| c.is_ascii_digit()) && !(*h1 == b'2' && *h2 > b'3')
        }
        _ => false,
    };
    if !zone_ok {
        return None;
    }
    // jiff accepts a superset of RFC 3339; the shape check above keeps it to
    // RFC 3339 proper. Normalise the separators jiff may not take.
    let mut normalised = s.to_string();
    normalised.replace_range(10..11, "T");
    if zone == "z" {
        normalised.replace_range(i..i + 1, "Z");
    }
    normalised.parse::<Timestamp>().ok()
}

/// Serde helper: a deadline field that may be a string, `null` or absent.
/// A non-string value is kept as unparseable text rather than failing the
/// whole reply, so a claim that was created is never lost to a bad deadline.
pub(crate) fn deserialize_deadline<'de, D>(deserializer: D) -> Result<Deadline, D::Error>
where
    D: Deserializer<'de>,
{
    let value = Option::<serde_json::Value>::deserialize(deserializer)?;
    Ok(match value {
        None | Some(serde_json::Value::Null) => Deadline::Never,
        Some(serde_json::Value::String(s)) => Deadline::parse(Some(&s)),
        Some(other) => Deadline::Unparseable(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("test timestamp")
    }

    #[test]
    fn absent_empty_and_zero_mean_never() {
        assert_eq!(Deadline::parse(None), Deadline::Never);
        assert_eq!(Deadline::parse(Some("")), Deadline::Never);
        assert_eq!(Deadline::parse(Some("  ")), Deadline::Never);
        assert_eq!(
            Deadline::parse(Some("0001-01-01T00:00:00Z")),
            Deadline::Never
        );
        // The same instant written in another zone is still the zero time.
        assert_eq!(
            Deadline::parse(Some("0001-01-01T08:00:00+08:00")),
            Deadline::Never
        );
        assert_eq!(parse_deadline(Some("0001-01-01T00:00:00Z")), None);
    }

    #[test]
    fn any_fraction_length() {
        let base = at("2026-07-06T00:05:00Z");
        assert_eq!(parse_deadline(Some("2026-07-06T00:05:00Z")), Some(base));
        for (text, nanos) in [
            ("2026-07-06T00:05:00.1Z", 100_000_000),
            ("2026-07-06T00:05:00.12Z", 120_000_000),
            ("2026-07-06T00:05:00.123Z", 123_000_000),
            ("2026-07-06T00:05:00.123456Z", 123_456_000),
            ("2026-07-06T00:05:00.123456789Z", 123_456_789),
        ] {
            let got = parse_deadline(Some(text)).expect(text);
            assert_eq!(got.as_second(), base.as_second(), "{text}");
            assert_eq!(got.subsec_nanosecond(), nanos, "{text}");
        }
    }

    #[test]
    fn any_zone() {
        assert_eq!(
            parse_deadline(Some("2026-07-06T08:05:00.5+08:00")),
            Some(at("2026-07-06T00:05:00.5Z"))
        );
        assert_eq!(
            parse_deadline(Some("2026-07-05T19:05:00-05:00")),
            Some(at("2026-07-06T00:05:00Z"))
        );
        assert_eq!(
            parse_deadline(Some("2026-07-06t00:05:00z")),
            Some(at("2026-07-06T00:05:00Z"))
        );
    }

    /// Found by the `sandboxd_reply` and `claims_roundtrip` fuzz targets:
    /// `0000-01-01T00:00:00+01:00` is `-000001-12-31T23:00:00Z`, which
    /// vk-sandbox then wrote into the claims file (and would publish in the
    /// NodeInventory) in a form no RFC 3339 reader accepts, so the next start
    /// refused the claims file.
    #[test]
    fn deadline_before_year_zero_utc_is_clamped_to_it() {
        let earliest = at("0000-01-01T00:00:00Z");
        for text in ["0000-01-01T00:00:00+01:00", "0000-01-01T05:59:59.5+23:59"] {
            let d = Deadline::parse(Some(text));
            assert_eq!(d, Deadline::At(earliest), "{text}");
            assert_eq!(d.to_string(), "0000-01-01T00:00:00Z");
            assert_eq!(Deadline::parse(Some(&d.to_string())), d, "{text}");
        }
        // Year 0000 itself is representable and kept as it is.
        assert_eq!(
            parse_deadline(Some("0000-06-01T00:00:00-01:00")),
            Some(at("0000-06-01T01:00:00Z"))
        );
    }

    #[test]
    fn garbage_is_unparseable_not_an_error() {
        for bad in [
            "tomorrow",
            "2026-07-06",
            "2026-07-06T00:05Z",
            "2026-07-06T00:05:00",
            "2026-07-06T00:05:00.Z",
            "2026-07-06T00:05:00.1234567890Z",
            "2026-13-06T00:05:00Z",
            "2026-07-06T00:05:00+0800",
            "2026-07-06T00:05:00+24:00",
            "2026-07-06T00:05:00+08:60",
            "2026-07-06T00:05:00Z[Europe/Paris]",
            "1783296300",
        ] {
            let d = Deadline::parse(Some(bad));
            assert_eq!(d.unparseable(), Some(bad), "{bad}");
            assert_eq!(d.expires_at(), None, "{bad}");
        }
    }

    #[test]
    fn serde_accepts_string_null_absent_and_odd_types() {
        #[derive(Deserialize)]
        struct Row {
            #[serde(default, deserialize_with = "deserialize_deadline")]
            deadline: Deadline,
        }
        let parse =
            |json: &str| -> Deadline { serde_json::from_str::<Row>(json).expect(json).deadline };
        assert_eq!(parse("{}"), Deadline::Never);
        assert_eq!(parse(r#"{"deadline":null}"#), Deadline::Never);
        assert_eq!(
            parse(r#"{"deadline":"2026-07-06T00:05:00Z"}"#),
            Deadline::At(at("2026-07-06T00:05:00Z"))
        );
        assert_eq!(
            parse(r#"{"deadline":12}"#),
            Deadline::Unparseable("12".into())
        );
    }
}
