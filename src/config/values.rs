//! The values the flags carry, parsed as the Go original parses them:
//! `host:port` bind addresses, Kubernetes quantities, Go durations, node
//! labels. Pure.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A validated `host:port` bind address (`:port` = every interface).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddr {
    /// Empty for "every interface"; else an IP or a host name (no brackets).
    pub host: String,
    pub port: u16,
}

impl ListenAddr {
    /// Parse like Go's `net.SplitHostPort` followed by a numeric port in
    /// 1–65535. `10260`, `:0`, `:70000` and `:http` are refused.
    pub fn parse(raw: &str) -> std::result::Result<Self, String> {
        let (host, port) = split_host_port(raw)?;
        if port.is_empty() {
            return Err("the port is empty".into());
        }
        if !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("the port {port:?} is not a number"));
        }
        let port = match port.parse::<u32>() {
            Ok(p) if (1..=65535).contains(&p) => p as u16,
            _ => return Err(format!("the port {port} is outside 1-65535")),
        };
        Ok(ListenAddr {
            host: host.to_string(),
            port,
        })
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Go's `net.SplitHostPort`: `host:port`, `[v6]:port`; exactly one colon
/// outside brackets.
fn split_host_port(raw: &str) -> std::result::Result<(&str, &str), String> {
    if let Some(rest) = raw.strip_prefix('[') {
        let Some(end) = rest.find(']') else {
            return Err("missing ']' in the address".into());
        };
        let host = &rest[..end];
        let after = &rest[end + 1..];
        let Some(port) = after.strip_prefix(':') else {
            return Err("missing port in the address".into());
        };
        if port.contains(':') || host.contains('[') || host.contains(']') {
            return Err("too many colons in the address".into());
        }
        return Ok((host, port));
    }
    let Some(colon) = raw.rfind(':') else {
        return Err("missing port in the address".into());
    };
    let (host, port) = (&raw[..colon], &raw[colon + 1..]);
    if host.contains(':') {
        return Err("too many colons in the address (write IPv6 as [addr]:port)".into());
    }
    if host.contains('[') || host.contains(']') || port.contains('[') || port.contains(']') {
        return Err("unexpected bracket in the address".into());
    }
    Ok((host, port))
}

/// Checks a Kubernetes resource quantity (`<number><suffix>`):
/// digits with an optional decimal part, then nothing, a binary suffix
/// (Ki…Ei), a decimal suffix (n, u, m, k, M, G, T, P, E) or a decimal
/// exponent (e/E followed by an optional sign and digits). A leading `+` is
/// allowed; negative values are refused, and so is zero (a zero capacity
/// makes the scheduler reject every Pod).
pub fn validate_quantity(raw: &str) -> std::result::Result<Quantity, String> {
    let s = raw.strip_prefix('+').unwrap_or(raw);
    if s.starts_with('-') {
        return Err("it is negative".into());
    }
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    if number.is_empty() {
        return Err("it does not start with a number".into());
    }
    let mut parts = number.split('.');
    let whole = parts.next().unwrap_or("");
    let frac = parts.next();
    if parts.next().is_some() {
        return Err("the number has more than one '.'".into());
    }
    if whole.is_empty() && frac.is_none_or(str::is_empty) {
        return Err("it does not start with a number".into());
    }
    let valid_suffix = match suffix {
        "" | "Ki" | "Mi" | "Gi" | "Ti" | "Pi" | "Ei" | "n" | "u" | "m" | "k" | "M" | "G" | "T"
        | "P" | "E" => true,
        _ => match suffix.strip_prefix(['e', 'E']) {
            Some(exp) => {
                let exp = exp.strip_prefix(['+', '-']).unwrap_or(exp);
                !exp.is_empty() && exp.bytes().all(|b| b.is_ascii_digit())
            }
            None => false,
        },
    };
    if !valid_suffix {
        return Err(format!(
            "the suffix {suffix:?} is not one of Ki Mi Gi Ti Pi Ei n u m k M G T P E or e<exponent>"
        ));
    }
    if !number.bytes().any(|b| matches!(b, b'1'..=b'9')) {
        return Err("it is zero".into());
    }
    Ok(Quantity(raw.to_string()))
}

/// A Go duration (`time.ParseDuration`) in signed nanoseconds: an optional
/// sign, then one or more `<decimal><unit>` with units ns, us (µs), ms, s,
/// m, h; `0` alone needs no unit.
pub fn parse_go_duration(raw: &str) -> std::result::Result<i128, String> {
    let (negative, mut rest) = match raw.as_bytes().first() {
        Some(b'-') => (true, &raw[1..]),
        Some(b'+') => (false, &raw[1..]),
        _ => (false, raw),
    };
    if rest == "0" {
        return Ok(0);
    }
    if rest.is_empty() {
        return Err("it is empty (write e.g. 30s, 1m30s or 500ms)".into());
    }
    let mut total: i128 = 0;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(num_end);
        let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
        if whole.is_empty() && frac.is_empty() || frac.contains('.') {
            return Err(format!("{number:?} is not a number"));
        }
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let unit_nanos: i128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err("a unit is missing (ns, us, ms, s, m or h)".into()),
            other => {
                return Err(format!(
                    "unknown unit {other:?} (want ns, us, ms, s, m or h)"
                ));
            }
        };
        let whole_v: i128 = if whole.is_empty() {
            0
        } else {
            whole
                .parse::<i128>()
                .map_err(|_| format!("{whole:?} is too large"))?
        };
        let mut value = whole_v
            .checked_mul(unit_nanos)
            .ok_or_else(|| "the duration is too large".to_string())?;
        // The fractional part, truncated to nanoseconds like Go.
        let mut scale = unit_nanos;
        for digit in frac.bytes().take(30) {
            scale /= 10;
            if scale == 0 {
                break;
            }
            value += i128::from(digit - b'0') * scale;
        }
        total = total
            .checked_add(value)
            .filter(|t| *t <= i128::from(i64::MAX))
            .ok_or_else(|| "the duration is too large".to_string())?;
        rest = next;
    }
    Ok(if negative { -total } else { total })
}

/// `--node-labels` as the Go program reads it: split on `,`, trim, split at the
/// first `=`; items without `=` or with an empty key are skipped; empty
/// values are allowed; later duplicates win.
pub fn parse_node_labels(raw: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    for item in raw.split(',') {
        let item = item.trim();
        let Some((key, value)) = item.split_once('=') else {
            continue;
        };
        let key = key.trim();
        if key.is_empty() {
            continue;
        }
        labels.insert(key.to_string(), value.trim().to_string());
    }
    labels
}

/// Kubernetes label key syntax: `[prefix/]name`, prefix a DNS subdomain of
/// at most 253 characters, name at most 63 of `[A-Za-z0-9-_.]`, starting
/// and ending alphanumeric.
pub(super) fn check_label_key(key: &str) -> std::result::Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let dns_ok = !prefix.is_empty()
            && prefix.len() <= 253
            && prefix.split('.').all(|part| {
                !part.is_empty()
                    && part.len() <= 63
                    && part
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !part.starts_with('-')
                    && !part.ends_with('-')
            });
        if !dns_ok {
            return Err(format!(
                "label key {key:?}: prefix {prefix:?} is not a lowercase DNS subdomain"
            ));
        }
    }
    check_label_name(name).map_err(|why| format!("label key {key:?}: name {why}"))
}

fn check_label_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > 63 {
        return Err("must be 1-63 characters".into());
    }
    check_label_chars(name)
}

pub(super) fn check_label_value(value: &str) -> std::result::Result<(), String> {
    if value.is_empty() {
        return Ok(());
    }
    if value.len() > 63 {
        return Err(format!(
            "label value {value:?} is longer than 63 characters"
        ));
    }
    check_label_chars(value).map_err(|why| format!("label value {value:?} {why}"))
}

fn check_label_chars(s: &str) -> std::result::Result<(), String> {
    let ok_inner = s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    let ok_ends = s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric());
    if ok_inner && ok_ends {
        Ok(())
    } else {
        Err("must use only A-Z a-z 0-9 - _ . and start and end alphanumeric".into())
    }
}

/// Signed nanoseconds (from [`parse_go_duration`]) as a `Duration`;
/// negative is zero.
pub fn nanos_to_duration(n: i128) -> Duration {
    let n = u128::try_from(n).unwrap_or(0);
    Duration::new(
        u64::try_from(n / 1_000_000_000).unwrap_or(u64::MAX),
        (n % 1_000_000_000) as u32,
    )
}

/// Default of `--sandboxd-advertise-addr`: the URL's `host[:port]` authority;
/// if the value does not parse as a URL with a host, the raw value minus
/// trailing `/`.
pub fn advertise_default(sandboxd_url: &str) -> String {
    match url::Url::parse(sandboxd_url) {
        Ok(u) if u.host_str().is_some() => {
            let host = match u.host() {
                Some(url::Host::Ipv6(ip)) => format!("[{ip}]"),
                Some(h) => h.to_string(),
                None => String::new(),
            };
            match u.port() {
                Some(port) => format!("{host}:{port}"),
                None => host,
            }
        }
        _ => sandboxd_url.trim_end_matches('/').to_string(),
    }
}
