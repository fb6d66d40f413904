//! Property checks over untrusted input, shared by the fuzz targets
//! (`fuzz/fuzz_targets/*.rs`, cargo-fuzz on nightly) and the stable
//! regression test `tests/fuzz_regressions.rs`, which compiles this file with
//! `#[path]`. It therefore uses only vk-sandbox's public API and crates that
//! vk-sandbox already depends on.
//!
//! Every `check_*` takes the fuzzer's raw bytes and panics (a crash libFuzzer
//! keeps) when a property fails. The properties go beyond "no panic":
//!
//! - [`check_annotations`]: the Pod contract (behaviour.md §3.2 steps 1,
//!   6–8) against an independent oracle; the claim body sent to sandboxd
//!   decodes back to the request (TTL clamped, empty fields omitted); every
//!   refusal names the annotation and the value.
//! - [`check_sandboxd_reply`]: each reply maps as sandboxd.md §4 says (a
//!   status never turns into another outcome; a failed listing is never an
//!   empty list); a decoded claim re-encodes and decodes to itself; deadlines
//!   round-trip through their own text and through the state file; an
//!   `owner_addr` classification is stable under its own `Display`, and a Pod
//!   IP is only ever a concrete address.
//! - [`check_claims_load`]: `ClaimsStore::open` over arbitrary snapshot and
//!   journal files: it refuses exactly what the format documentation says
//!   is malformed, with an error naming the file, leaving every file
//!   byte-identical; what it accepts equals the documented replay, and the
//!   snapshot its start-up write leaves behind reads back equal.
//! - [`check_claims_roundtrip`]: commits and removals of arbitrary claims
//!   through the store's writer (journal appends, compactions), then a
//!   restart: the table read back equals the model; the pure encoders
//!   round-trip.
//! - [`check_kubelet_query`]: `/containerLogs` query validation against an
//!   oracle of behaviour.md §7, and the kubelet router on arbitrary paths,
//!   queries and methods (status set, bodies, redirects).
//! - [`check_sandboxd_verbs`]: the lifecycle and data-plane replies
//!   (hibernate, wake, renew, get, stats, owner, exec, the upgrades): only
//!   each call's success status succeeds; every failure is a refusal whose
//!   kind follows its status and body (a JSON 404 is "unknown sandbox", the
//!   router's plain-text one "unsupported"); a renew's deadline is the one
//!   sent; an unmeasured memory is never a figure.
//! - [`check_spdy`]: the SPDY/3.1 framer and header blocks (re-encoding is
//!   exact, limits hold, incomplete input waits) and a server session fed
//!   arbitrary client bytes (it ends, and writes only valid frames).

#![allow(clippy::missing_panics_doc)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use jiff::Timestamp;
use serde_json::Value;
use vk_sandbox::claims::format::{self as claims_format, JournalOp};
use vk_sandbox::claims::{self, ClaimState, ClaimsStore, StoreOptions};
use vk_sandbox::pods::annotations;
use vk_sandbox::sandboxd::decode::{
    self, decode_claim, decode_info, decode_list, decode_release, error_message,
};
use vk_sandbox::sandboxd::types::ClaimBody;
use vk_sandbox::sandboxd::{
    Deadline, Op, OwnerAddr, OwnerProbe, RawReply, Refusal, ReleaseOutcome, SandboxdError,
    pod_ip_from_owner_addr, verbs_decode,
};

// ---------------------------------------------------------------------------
// Input helpers

/// A cursor over the fuzzer's bytes. Reads past the end yield zeros / empty.
struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    fn new(data: &'a [u8]) -> Self {
        Input { data }
    }

    fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    fn u64(&mut self) -> u64 {
        let mut v = 0u64;
        for _ in 0..8 {
            v = (v << 8) | u64::from(self.byte());
        }
        v
    }

    /// Bytes up to the next NUL (consumed), or the rest.
    fn field(&mut self) -> &'a [u8] {
        match self.data.iter().position(|b| *b == 0) {
            Some(i) => {
                let f = &self.data[..i];
                self.data = &self.data[i + 1..];
                f
            }
            None => std::mem::take(&mut self.data),
        }
    }

    fn string(&mut self) -> String {
        String::from_utf8_lossy(self.field()).into_owned()
    }

    fn rest(self) -> &'a [u8] {
        self.data
    }
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
    })
}

/// A scratch directory, on tmpfs when there is one (the store fsyncs).
fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let builder = tempfile::Builder::new().prefix("vk-fuzz-").tempdir_in(shm);
    match builder {
        Ok(d) => d,
        Err(_) => tempfile::tempdir().expect("temp dir"),
    }
}

/// Go's `strconv.Atoi` on 64 bits: `[+-]?[0-9]+` within i64.
fn go_atoi(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Only the value range is left to check; i64's parser agrees on syntax.
    s.parse::<i64>().ok()
}

// ---------------------------------------------------------------------------
// Annotations

/// Input: a flag byte (bit i: the i-th of runtime, template, net, size,
/// ttl-seconds is set; bit 5: a namespace is set; bit 6: a case variant of
/// the ttl key is added, which must be ignored), then NUL-separated fields:
/// namespace, name, runtime, template, net, size, ttl, the variant's value.
pub fn check_annotations(data: &[u8]) {
    use vk_sandbox::pods::pod::Pod;

    let mut input = Input::new(data);
    let flags = input.byte();
    let namespace = input.string();
    let name = input.string();
    let keys = [
        annotations::RUNTIME,
        annotations::TEMPLATE,
        annotations::NET,
        annotations::SIZE,
        annotations::TTL_SECONDS,
    ];
    let mut values: [Option<String>; 5] = Default::default();
    for (i, v) in values.iter_mut().enumerate() {
        let s = input.string();
        if flags & (1 << i) != 0 {
            *v = Some(s);
        }
    }
    let variant = input.string();

    let mut pod = Pod::default();
    if flags & 0x20 != 0 {
        pod.metadata.namespace = Some(namespace.clone());
    }
    pod.metadata.name = Some(name.clone());
    let mut ann = BTreeMap::new();
    for (k, v) in keys.iter().zip(&values) {
        if let Some(v) = v {
            ann.insert(k.to_string(), v.clone());
        }
    }
    if flags & 0x40 != 0 {
        ann.insert(annotations::TTL_SECONDS.to_ascii_uppercase(), variant);
    }
    pod.metadata.annotations = Some(ann);

    let get = |i: usize| values[i].as_deref().filter(|v| !v.is_empty());
    let key = format!(
        "{}/{}",
        if flags & 0x20 != 0 {
            namespace.as_str()
        } else {
            "default"
        },
        name
    );
    assert_eq!(pod.key(), key);

    // The runtime gate.
    match (get(0), annotations::runtime_gate(&pod)) {
        (None | Some("sandboxd"), Ok(())) => {}
        (Some(rt), Err(e)) if rt != "sandboxd" => {
            assert!(
                e.contains(&format!("{rt:?}")) && e.contains(&key),
                "runtime refusal must name the runtime and the Pod: {e}"
            );
        }
        (rt, got) => panic!("runtime {rt:?}: runtime_gate gave {got:?}"),
    }

    // The claim request: TTL first, then template.
    let ttl = match get(4) {
        None => Ok(annotations::DEFAULT_TTL_SECONDS),
        Some(raw) => match go_atoi(raw) {
            Some(n) if n >= 0 => Ok(n as u64),
            _ => Err((annotations::TTL_SECONDS, raw.to_string())),
        },
    };
    let expected = ttl.and_then(|ttl| match get(1) {
        None => Err((annotations::TEMPLATE, String::new())),
        Some(t) => Ok((t.to_string(), ttl)),
    });
    match (expected, annotations::claim_request(&pod)) {
        (Ok((template, ttl)), Ok(req)) => {
            assert_eq!(req.template, template);
            assert_eq!(req.ttl_seconds, ttl);
            assert_eq!(req.net, get(2).unwrap_or_default());
            assert_eq!(req.size, get(3).unwrap_or_default());
            assert_eq!(req.claim_ref, key);
            check_claim_body(&req);
        }
        (Err((what, raw)), Err(e)) => {
            assert!(e.contains(what), "refusal must name {what}: {e}");
            if !raw.is_empty() {
                assert!(
                    e.contains(&format!("{raw:?}")),
                    "refusal must quote the value: {e}"
                );
            }
        }
        (want, got) => panic!("annotations {values:?}: want {want:?}, got {got:?}"),
    }
}

/// The body sent to sandboxd decodes back to the request: `template`
/// always; `net`, `size`, `claim_ref` only when non-empty; `ttl_seconds`
/// only when non-zero, clamped to 24 h.
fn check_claim_body(req: &vk_sandbox::sandboxd::ClaimRequest) {
    let bytes = serde_json::to_vec(&ClaimBody::from(req)).expect("claim body encodes");
    let v: Value = serde_json::from_slice(&bytes).expect("claim body is JSON");
    let obj = v.as_object().expect("claim body is an object");
    assert_eq!(
        obj.get("template").and_then(Value::as_str),
        Some(req.template.as_str())
    );
    for (name, field) in [
        ("net", &req.net),
        ("size", &req.size),
        ("claim_ref", &req.claim_ref),
    ] {
        let want = (!field.is_empty()).then_some(field.as_str());
        assert_eq!(obj.get(name).and_then(Value::as_str), want, "{name}");
    }
    let ttl = req.ttl_seconds.min(vk_sandbox::sandboxd::MAX_TTL_SECONDS);
    let want = (ttl != 0).then_some(ttl);
    assert_eq!(obj.get("ttl_seconds").and_then(Value::as_u64), want);
    let allowed = ["template", "net", "size", "claim_ref", "ttl_seconds"];
    assert!(obj.keys().all(|k| allowed.contains(&k.as_str())), "{v}");
}

// ---------------------------------------------------------------------------
// sandboxd replies

const STATUSES: [u16; 16] = [
    200, 200, 200, 200, 204, 404, 404, 429, 500, 503, 201, 202, 400, 401, 301, 0,
];

/// Input: op byte (claim, release, list, info), status byte (an index into
/// a table of interesting statuses, or with bit 7 a raw u16 from the next
/// two bytes), flags (bit 0: the body was cut at the limit), then the body.
pub fn check_sandboxd_reply(data: &[u8]) {
    let mut input = Input::new(data);
    let op = input.byte() % 4;
    let sel = input.byte();
    let status = if sel & 0x80 != 0 {
        u16::from(input.byte()) << 8 | u16::from(input.byte())
    } else {
        STATUSES[usize::from(sel) % STATUSES.len()]
    };
    let over_limit = input.byte() & 1 == 1;
    let body = input.rest();
    let reply = RawReply {
        status,
        body: body.to_vec(),
        over_limit,
    };
    // serde skips unknown fields without checking their UTF-8, so a reply
    // the decoder accepts may need the lossy text to become a Value.
    let json: Option<Value> = serde_json::from_slice(body)
        .or_else(|_| serde_json::from_str(&String::from_utf8_lossy(body)))
        .ok();
    match op {
        0 => check_claim_reply(&reply, json.as_ref()),
        1 => check_release_reply(&reply),
        2 => check_list_reply(&reply, json.as_ref()),
        _ => check_info_reply(&reply, json.as_ref()),
    }
    // The text fields: every string in the body, and the body itself.
    let text = String::from_utf8_lossy(body);
    check_deadline_text(&text);
    check_owner_addr_text(&text);
    if let Some(v) = &json {
        for_each_string(v, &mut |s| {
            check_deadline_text(s);
            check_owner_addr_text(s);
        });
    }
}

fn for_each_string(v: &Value, f: &mut impl FnMut(&str)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(a) => a.iter().for_each(|v| for_each_string(v, f)),
        Value::Object(o) => o.iter().for_each(|(k, v)| {
            f(k);
            for_each_string(v, f);
        }),
        _ => {}
    }
}

/// What the deadline field of a decoded object must be.
fn expected_deadline(obj: &serde_json::Map<String, Value>) -> Deadline {
    match obj.get("deadline") {
        None | Some(Value::Null) => Deadline::Never,
        Some(Value::String(s)) => Deadline::parse(Some(s)),
        Some(other) => Deadline::Unparseable(other.to_string()),
    }
}

fn assert_decode_error(err: &SandboxdError, status: u16) {
    match err {
        SandboxdError::Decode {
            status: s, message, ..
        } => {
            assert_eq!(*s, status);
            assert!(!message.is_empty(), "a decode error says what is wrong");
        }
        other => panic!("status {status}: want a decode error, got {other:?}"),
    }
}

fn assert_http_error(err: &SandboxdError, reply: &RawReply) {
    match err {
        SandboxdError::Http {
            status, message, ..
        } => {
            assert_eq!(*status, reply.status);
            if *status != 404 {
                assert_eq!(*message, error_message(&reply.body));
            }
        }
        other => panic!("status {}: want an HTTP error, got {other:?}", reply.status),
    }
}

fn check_claim_reply(reply: &RawReply, json: Option<&Value>) {
    let got = decode_claim(reply);
    match reply.status {
        200 if reply.over_limit => assert_decode_error(&got.expect_err("over limit"), 200),
        200 => {
            let obj = json.and_then(Value::as_object);
            match got {
                Ok(claim) => {
                    let obj = obj.expect("a decoded claim comes from a JSON object");
                    assert_eq!(
                        obj.get("id").and_then(Value::as_str),
                        Some(claim.id.as_str())
                    );
                    assert!(!claim.id.is_empty());
                    assert!(!claim.token.is_empty());
                    assert_eq!(
                        obj.get("token").and_then(Value::as_str),
                        Some(claim.token.expose())
                    );
                    assert_eq!(
                        claim.owner_addr,
                        obj.get("owner_addr")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                    );
                    assert_eq!(claim.deadline, expected_deadline(obj));
                    // Re-encode the claim as sandboxd would and decode it again.
                    let mut again = serde_json::json!({
                        "id": claim.id,
                        "token": claim.token.expose(),
                        "owner_addr": claim.owner_addr,
                    });
                    match &claim.deadline {
                        Deadline::Never => {}
                        Deadline::At(ts) => again["deadline"] = Value::String(ts.to_string()),
                        Deadline::Unparseable(_) => {
                            again["deadline"] = obj["deadline"].clone();
                        }
                    }
                    if let Some(cp) = &claim.from_checkpoint {
                        again["from_checkpoint"] = Value::String(cp.clone());
                    }
                    let reply2 = RawReply::new(200, serde_json::to_vec(&again).expect("json"));
                    let claim2 = decode_claim(&reply2).expect("re-encoded claim decodes");
                    assert_eq!(claim2, claim, "claim reply does not round-trip");
                }
                Err(SandboxdError::CapacityMiss { message }) => {
                    let obj = obj.expect("a capacity miss comes from a JSON object");
                    let id = obj.get("id").and_then(Value::as_str).unwrap_or_default();
                    assert!(id.is_empty(), "an id was delivered: {message}");
                    assert!(!message.is_empty());
                }
                Err(err) => {
                    assert_decode_error(&err, 200);
                    assert!(err.is_outcome_unknown(), "a garbled 200 may hide a claim");
                }
            }
        }
        429 => assert!(matches!(
            got,
            Err(SandboxdError::CapacityMiss { ref message }) if *message == error_message(&reply.body)
        )),
        _ => assert_http_error(&got.expect_err("non-200 claim"), reply),
    }
}

fn check_release_reply(reply: &RawReply) {
    let got = decode_release(reply);
    let is_json_error = decode::json_error_message(&reply.body).is_some();
    match (reply.status, got) {
        (204, Ok(ReleaseOutcome::Released)) => {}
        (404, Ok(ReleaseOutcome::AlreadyGone)) if is_json_error => {}
        (404, Err(SandboxdError::Http { status: 404, .. })) if !is_json_error => {}
        (s, Err(err)) if s != 204 && s != 404 => assert_http_error(&err, reply),
        (s, got) => panic!("release status {s} json-error {is_json_error}: got {got:?}"),
    }
}

fn check_list_reply(reply: &RawReply, json: Option<&Value>) {
    let got = decode_list(reply);
    match reply.status {
        200 if reply.over_limit => assert_decode_error(&got.expect_err("over limit"), 200),
        200 => match got {
            Ok(rows) => {
                let listed = json
                    .and_then(|v| v.get("sandboxes"))
                    .and_then(Value::as_array)
                    .expect("a listing comes from {\"sandboxes\":[…]}");
                assert_eq!(rows.len(), listed.len());
                for (row, v) in rows.iter().zip(listed) {
                    // A row written as an array decodes field by field
                    // (serde's leniency). Known and harmless: it can only add
                    // a listed row, never hide one.
                    let Some(obj) = v.as_object() else {
                        continue;
                    };
                    assert_eq!(obj.get("id").and_then(Value::as_str), Some(row.id.as_str()));
                    assert_eq!(
                        obj.get("claim_ref")
                            .and_then(Value::as_str)
                            .unwrap_or_default(),
                        row.claim_ref
                    );
                    assert_eq!(row.deadline, expected_deadline(obj));
                    let flag = |k: &str| obj.get(k).and_then(Value::as_bool).unwrap_or(false);
                    assert_eq!(
                        (row.hibernated, row.archived),
                        (flag("hibernated"), flag("archived"))
                    );
                }
            }
            Err(err) => assert_decode_error(&err, 200),
        },
        _ => assert_http_error(&got.expect_err("a failed listing is never empty"), reply),
    }
}

fn check_info_reply(reply: &RawReply, json: Option<&Value>) {
    let got = decode_info(reply);
    match reply.status {
        200 if reply.over_limit => assert_decode_error(&got.expect_err("over limit"), 200),
        200 => match got {
            Ok(info) => {
                let pools = json
                    .and_then(|v| v.get("pools"))
                    .and_then(Value::as_array)
                    .expect("info comes from {\"pools\":[…]}");
                assert_eq!(info.pools.len(), pools.len());
            }
            Err(err) => assert_decode_error(&err, 200),
        },
        _ => assert_http_error(&got.expect_err("failed info is never zero capacity"), reply),
    }
}

/// A claim carrying `deadline`, as the store holds it.
fn claim_with_deadline(deadline: Option<Timestamp>) -> claims::Claim {
    claims::Claim {
        id: "sb_1".into(),
        token: vk_sandbox::sandboxd::Token::new("t"),
        address: String::new(),
        pod_uid: String::new(),
        claimed_at: Timestamp::from_second(1_700_000_000).expect("ts"),
        deadline,
        lifecycle: Default::default(),
    }
}

fn check_deadline_text(s: &str) {
    let parsed = Deadline::parse(Some(s));
    match &parsed {
        Deadline::Never => assert!(
            s.trim().is_empty() || parsed.expires_at().is_none(),
            "{s:?}"
        ),
        Deadline::Unparseable(raw) => assert_eq!(raw, s),
        Deadline::At(ts) => {
            // Its own text parses back to it.
            assert_eq!(
                Deadline::parse(Some(&ts.to_string())),
                parsed,
                "deadline {s:?} does not round-trip through {ts}"
            );
            // And a claim holding it survives the state file.
            let d = claims_format::to_second(*ts);
            let rows = BTreeMap::from([("k".to_string(), claim_with_deadline(Some(d)))]);
            let bytes = claims_format::encode_snapshot(&rows);
            let now = Timestamp::now();
            let back = claims_format::decode_snapshot(&bytes, now).unwrap_or_else(|e| {
                panic!(
                    "deadline {s:?} was written as {} and cannot be read back: {e}",
                    String::from_utf8_lossy(&bytes)
                )
            });
            assert_eq!(back, rows, "deadline {s:?} changes through the state file");
        }
    }
}

fn check_owner_addr_text(s: &str) {
    let parsed = OwnerAddr::parse(Some(s));
    match &parsed {
        OwnerAddr::Absent => assert!(s.trim().is_empty()),
        OwnerAddr::Other(raw) => assert_eq!(raw, s.trim()),
        _ => {
            let shown = parsed.to_string();
            assert_eq!(
                OwnerAddr::parse(Some(&shown)),
                parsed,
                "owner_addr {s:?} is shown as {shown:?}, which classifies differently"
            );
        }
    }
    match pod_ip_from_owner_addr(s) {
        Ok(ip) => {
            assert!(!ip.is_unspecified());
            assert_eq!(parsed.host().and_then(|h| h.parse().ok()), Some(ip));
        }
        Err(e) => {
            assert_eq!(e.raw, s);
            assert!(e.to_string().contains("no usable address"));
        }
    }
}

// ---------------------------------------------------------------------------
// Claims state loading

const PART_SEPARATOR: u8 = 0x1f;
/// In "frame it" mode, this text in a journal payload becomes the
/// snapshot's base.
const BASE_PLACEHOLDER: &[u8] = b"@BASE@";

fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

/// Frame each line of `payloads` as a journal frame (length, checksum), so
/// the fuzzer reaches replay with well-framed payloads. A trailing line
/// without a newline is framed without one (a torn tail).
fn frame_lines(payloads: &[u8], base: Option<&str>) -> Vec<u8> {
    let payloads = replace_all(payloads, BASE_PLACEHOLDER, base.unwrap_or("").as_bytes());
    let mut out = Vec::new();
    let mut lines = payloads.split(|b| *b == b'\n').peekable();
    while let Some(line) = lines.next() {
        let last = lines.peek().is_none();
        if last && line.is_empty() {
            break;
        }
        out.extend_from_slice(
            format!("{} {} ", line.len(), claims_format::snapshot_base(line)).as_bytes(),
        );
        out.extend_from_slice(line);
        if !last {
            out.push(b'\n');
        }
    }
    out
}

/// The documented load (claims/format.rs and `ClaimsStore::open`): which
/// rows, or which file is refused.
fn expected_load(
    snapshot: Option<&[u8]>,
    journal: Option<&[u8]>,
    journal_old: Option<&[u8]>,
    paths: &[PathBuf; 3],
    now: Timestamp,
) -> Result<BTreeMap<String, claims::Claim>, PathBuf> {
    let mut rows = match snapshot {
        Some(b) => claims_format::decode_snapshot(b, now).map_err(|_| paths[0].clone())?,
        None => BTreeMap::new(),
    };
    let base = snapshot.map(claims_format::snapshot_base);
    if let Some(b) = journal_old {
        let j = claims_format::decode_journal(b, now).map_err(|_| paths[2].clone())?;
        if j.base.is_some() && j.base == base {
            claims_format::replay(&mut rows, j.ops);
        }
    }
    if let Some(b) = journal {
        let j = claims_format::decode_journal(b, now).map_err(|_| paths[1].clone())?;
        if j.base.is_some() && j.base != base {
            return Err(paths[1].clone());
        }
        claims_format::replay(&mut rows, j.ops);
    }
    Ok(rows)
}

fn dir_contents(dir: &Path) -> BTreeMap<String, (Vec<u8>, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).expect("read dir") {
        let e = e.expect("dir entry");
        let mode = e.metadata().expect("metadata").permissions().mode();
        let bytes = std::fs::read(e.path()).unwrap_or_default();
        out.insert(e.file_name().to_string_lossy().into_owned(), (bytes, mode));
    }
    out
}

/// The rows of an open store, checked quarantined (as every loaded row is).
fn loaded_rows(store: &ClaimsStore) -> BTreeMap<String, claims::Claim> {
    store
        .all()
        .into_iter()
        .map(|(k, c, state)| {
            assert_eq!(state, ClaimState::Quarantined, "loaded row {k:?}");
            (k, c)
        })
        .collect()
}

/// `got` equals `want` decoded at `t0`, except that a `claimedAt` the file
/// lacked is filled with a time in `[t0, t1]`.
fn assert_rows_match(
    got: &BTreeMap<String, claims::Claim>,
    want_t0: &BTreeMap<String, claims::Claim>,
    want_t1: &BTreeMap<String, claims::Claim>,
    t0: Timestamp,
    t1: Timestamp,
) {
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want_t0.keys().collect::<Vec<_>>()
    );
    for (k, g) in got {
        let (a, b) = (&want_t0[k], &want_t1[k]);
        let mut g2 = g.clone();
        if a.claimed_at != b.claimed_at {
            assert!(
                g.claimed_at >= t0 && g.claimed_at <= t1,
                "row {k:?}: claimedAt {} not filled with now",
                g.claimed_at
            );
            g2.claimed_at = a.claimed_at;
        }
        assert_eq!(&g2, a, "row {k:?}");
    }
}

/// Input: a flag byte (bits 0–2: snapshot, journal, journal.old present;
/// bit 3: frame the journals' lines; bit 4: frame journal.old too), then
/// the present files' bytes separated by 0x1f.
pub fn check_claims_load(data: &[u8]) {
    let mut input = Input::new(data);
    let flags = input.byte();
    let mut parts = input.rest().split(|b| *b == PART_SEPARATOR);
    let mut part = |bit: u8| (flags & bit != 0).then(|| parts.next().unwrap_or_default().to_vec());
    let snapshot = part(1);
    let mut journal = part(2);
    let mut journal_old = part(4);
    let base = snapshot.as_deref().map(claims_format::snapshot_base);
    if flags & 8 != 0
        && let Some(j) = &mut journal
    {
        *j = frame_lines(j, base.as_deref());
    }
    if flags & 16 != 0
        && let Some(j) = &mut journal_old
    {
        *j = frame_lines(j, base.as_deref());
    }

    let dir = scratch_dir();
    let path = dir.path().join("claims.json");
    let paths = [
        path.clone(),
        dir.path().join("claims.json.journal"),
        dir.path().join("claims.json.journal.old"),
    ];
    for (p, bytes) in paths.iter().zip([&snapshot, &journal, &journal_old]) {
        if let Some(b) = bytes {
            std::fs::write(p, b).expect("write state file");
        }
    }
    let before = dir_contents(dir.path());
    let t0 = claims_format::to_second(Timestamp::now());
    let want_t0 = expected_load(
        snapshot.as_deref(),
        journal.as_deref(),
        journal_old.as_deref(),
        &paths,
        t0,
    );
    let got = runtime().block_on(ClaimsStore::open(&path));
    let t1 = claims_format::to_second(Timestamp::now());
    match (got, want_t0) {
        (Err(err), Err(refused)) => {
            match &err {
                vk_sandbox::Error::State { path: p, problem } => {
                    assert_eq!(*p, refused, "the error names another file: {err}");
                    assert!(!problem.is_empty());
                }
                other => panic!("want a state error naming {refused:?}, got {other}"),
            }
            assert!(
                err.to_string().contains(&refused.display().to_string()),
                "{err}"
            );
            assert_eq!(
                dir_contents(dir.path()),
                before,
                "refused state was modified on disk"
            );
        }
        (Ok(store), Ok(want_t0)) => {
            let want_t1 = expected_load(
                snapshot.as_deref(),
                journal.as_deref(),
                journal_old.as_deref(),
                &paths,
                t1,
            )
            .expect("same input loads at t1");
            let rows = loaded_rows(&store);
            assert_rows_match(&rows, &want_t0, &want_t1, t0, t1);
            drop(store);
            // The start-up write: one snapshot, 0600, holding exactly the rows.
            let after = dir_contents(dir.path());
            assert_eq!(
                after.keys().collect::<Vec<_>>(),
                vec!["claims.json"],
                "start-up write leaves only the snapshot"
            );
            let (bytes, mode) = &after["claims.json"];
            assert_eq!(mode & 0o777, 0o600);
            let written = claims_format::decode_snapshot(bytes, t1).unwrap_or_else(|e| {
                panic!(
                    "the snapshot the store wrote does not read back ({e}): {}",
                    String::from_utf8_lossy(bytes)
                )
            });
            assert_eq!(written, rows, "the snapshot the store wrote differs");
            // And a restart gives the same table.
            let again = runtime()
                .block_on(ClaimsStore::open(&path))
                .unwrap_or_else(|e| panic!("restart over the store's own snapshot fails: {e}"));
            assert_eq!(loaded_rows(&again), rows, "restart changes the table");
        }
        (got, want) => panic!(
            "load: want {:?}, got {:?}",
            want.map(|r| r.len()),
            got.map(|s| s.len())
        ),
    }
}

// ---------------------------------------------------------------------------
// Claims through the store's writer

/// `0000-01-01T00:00:00Z`, the earliest time vk-sandbox hands the store:
/// every time comes from `Deadline::parse` (which clamps to it; the
/// `sandboxd_reply` target checks that each parsed deadline survives the
/// state file) or from the clock.
const EARLIEST_SECOND: i64 = -62_167_219_200;

/// Times spread over the range the store can be handed, with the edges
/// (epoch, Go's zero time, year 0000, jiff's maximum) likely.
fn timestamp(input: &mut Input) -> Timestamp {
    let sel = input.byte();
    let raw = input.u64();
    let nanos = (raw % 1_000_000_000) as i32;
    let max = Timestamp::MAX.as_second();
    let second = match sel % 8 {
        0 => 0,
        1 => -62_135_596_800, // 0001-01-01T00:00:00Z
        2 => EARLIEST_SECOND + (raw % 100_000) as i64,
        3 => 1_700_000_000 + (raw % 100_000_000) as i64,
        4 => max - (raw % 100_000) as i64,
        _ => EARLIEST_SECOND + (raw % (max - EARLIEST_SECOND + 1) as u64) as i64,
    };
    Timestamp::new(second, nanos)
        .or_else(|_| Timestamp::from_second(second))
        .unwrap_or(Timestamp::UNIX_EPOCH)
}

fn arbitrary_claim(input: &mut Input) -> claims::Claim {
    let flags = input.byte();
    claims::Claim {
        id: input.string(),
        token: vk_sandbox::sandboxd::Token::new(input.string()),
        address: input.string(),
        pod_uid: input.string(),
        claimed_at: if flags & 1 != 0 {
            timestamp(input)
        } else {
            Timestamp::UNIX_EPOCH
        },
        deadline: (flags & 2 != 0).then(|| timestamp(input)),
        lifecycle: Default::default(),
    }
}

/// Input: an options byte, then operations until the bytes run out, each an
/// op byte (commit, remove, compact, restart) and its fields.
pub fn check_claims_roundtrip(data: &[u8]) {
    let mut input = Input::new(data);
    let opts = input.byte();
    let options = StoreOptions {
        compact_min_bytes: if opts & 1 != 0 { 0 } else { 1 << 20 },
        compact_ratio: u64::from((opts >> 1) & 3) + 1,
    };
    let dir = scratch_dir();
    let path = dir.path().join("state").join("claims.json");
    let rt = runtime();
    let open = |what: &str| {
        rt.block_on(ClaimsStore::open_with(&path, options))
            .unwrap_or_else(|e| panic!("{what}: the store's own files do not load: {e}"))
    };
    let mut store = open("first open");
    let mut model: BTreeMap<String, claims::Claim> = BTreeMap::new();
    let mut journal_ops = Vec::new();
    for _ in 0..64 {
        if input.data.is_empty() {
            break;
        }
        match input.byte() % 6 {
            0..=2 => {
                let key = input.string();
                let claim = arbitrary_claim(&mut input);
                let t0 = claims_format::to_second(Timestamp::now());
                let res = rt.block_on(store.commit(&key, claim.clone()));
                let t1 = claims_format::to_second(Timestamp::now());
                match model.get(&key) {
                    Some(held) if held.id != claim.id => {
                        assert!(
                            matches!(res, Err(vk_sandbox::Error::ClaimConflict { .. })),
                            "overwriting another claim id must be refused: {res:?}"
                        );
                        continue;
                    }
                    _ => res.unwrap_or_else(|e| panic!("commit {key:?}: {e}")),
                }
                let (stored, state) = store.get(&key).expect("committed row");
                assert_eq!(state, ClaimState::Settled);
                let mut want = claim.clone();
                want.deadline = want.deadline.and_then(claims_format::to_file_deadline);
                if claims_format::is_unset(claims_format::to_second(claim.claimed_at)) {
                    assert!(stored.claimed_at >= t0 && stored.claimed_at <= t1);
                    want.claimed_at = stored.claimed_at;
                } else {
                    want.claimed_at = claims_format::to_second(claim.claimed_at);
                }
                assert_eq!(stored, want, "commit {key:?} stored something else");
                journal_ops.push(JournalOp::Put {
                    key: key.clone(),
                    claim: stored.clone(),
                });
                model.insert(key, stored);
            }
            3 => {
                let key = input.string();
                let id = match input.byte() % 2 {
                    0 => model.get(&key).map(|c| c.id.clone()).unwrap_or_default(),
                    _ => input.string(),
                };
                let removed = rt
                    .block_on(store.remove(&key, &id))
                    .unwrap_or_else(|e| panic!("remove {key:?}: {e}"));
                let should = model.get(&key).is_some_and(|c| c.id == id);
                assert_eq!(removed, should, "remove {key:?} {id:?}");
                if removed {
                    model.remove(&key);
                    journal_ops.push(JournalOp::Del { key });
                }
            }
            4 => rt
                .block_on(store.compact())
                .unwrap_or_else(|e| panic!("compact: {e}")),
            _ => {
                drop(store);
                store = open("restart");
                assert_eq!(loaded_rows(&store), model, "restart changes the table");
                // Quarantined rows cannot be replaced by another id either;
                // the model already refuses that.
            }
        }
    }
    drop(store);
    let store = open("final restart");
    assert_eq!(loaded_rows(&store), model, "restart changes the table");
    drop(store);

    // The pure encoders round-trip what the store holds.
    let now = Timestamp::now();
    let snapshot = claims_format::encode_snapshot(&model);
    assert_eq!(
        claims_format::decode_snapshot(&snapshot, now).expect("own snapshot decodes"),
        model
    );
    let base = claims_format::snapshot_base(&snapshot);
    let mut journal = Vec::new();
    for (i, chunk) in journal_ops.chunks(3).enumerate() {
        journal.extend(claims_format::encode_frame(
            chunk,
            (i == 0).then_some(base.as_str()),
        ));
    }
    let decoded = claims_format::decode_journal(&journal, now).expect("own journal decodes");
    assert_eq!(decoded.ops, journal_ops);
    assert_eq!(decoded.torn_tail_bytes, 0);
    if !journal_ops.is_empty() {
        assert_eq!(decoded.base.as_deref(), Some(base.as_str()));
    }
}

// ---------------------------------------------------------------------------
// Kubelet API

/// Percent-decoding as Go's `url.ParseQuery` (`+` is a space); `None` for a
/// malformed escape (Go drops that pair; we then do not judge the query).
fn go_unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                let hex = b.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

/// Strict RFC 3339 `date-time` with the checks Go's `time.Parse(RFC3339)`
/// makes. `None` where the two legitimately differ (leap second, more than
/// nine fractional digits, lower-case `t`/`z` or a space separator).
fn rfc3339_verdict(s: &str) -> Option<bool> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        let d = b.get(r)?;
        if !d.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(d).ok()?.parse().ok()
    };
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || b[13] != b':' || b[16] != b':' {
        return Some(false);
    }
    let fields = [
        num(0..4),
        num(5..7),
        num(8..10),
        num(11..13),
        num(14..16),
        num(17..19),
    ];
    let [
        Some(year),
        Some(month),
        Some(day),
        Some(hour),
        Some(min),
        Some(sec),
    ] = fields
    else {
        return Some(false);
    };
    let mut unsure = !matches!(b[10], b'T');
    if !matches!(b[10], b'T' | b't' | b' ') {
        return Some(false);
    }
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return Some(false),
    };
    if day == 0 || day > days || hour > 23 || min > 59 || sec > 60 {
        return Some(false);
    }
    unsure |= sec == 60;
    let mut i = 19;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Some(false);
        }
        unsure |= i - start > 9;
    }
    let zone = &b[i..];
    let ok = match zone {
        [b'Z'] => true,
        [b'z'] => {
            unsure = true;
            true
        }
        [b'+' | b'-', h1, h2, b':', m1, m2] => {
            let two = |a: u8, b: u8| {
                (a.is_ascii_digit() && b.is_ascii_digit())
                    .then(|| u32::from(a - b'0') * 10 + u32::from(b - b'0'))
            };
            matches!((two(*h1, *h2), two(*m1, *m2)), (Some(h), Some(m)) if h <= 23 && m <= 59)
        }
        _ => false,
    };
    if !ok {
        return Some(false);
    }
    // jiff's range is narrower than year 0000 with a positive offset.
    if year == 0 || year == 9999 {
        unsure = true;
    }
    if unsure { None } else { Some(true) }
}

/// What `validate_log_query` must answer: `Some(Ok)`, `Some(Err(key))` (the
/// message must name it), or `None` when the query is not judged.
fn expected_log_query(query: &str) -> Option<Result<(), &'static str>> {
    let mut first: BTreeMap<String, String> = BTreeMap::new();
    for pair in query.split('&') {
        if pair.is_empty() {
            continue;
        }
        if pair.contains(';') {
            return None; // Go refuses `;`; url's parser splits on `&` only.
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let (k, v) = (go_unescape(k)?, go_unescape(v)?);
        first.entry(k).or_insert(v);
    }
    let get = |k: &str| first.get(k).map(String::as_str).unwrap_or("");
    let int_at_least = |k: &str, min: i64| {
        let v = get(k);
        v.is_empty() || go_atoi(v).is_some_and(|n| n >= min)
    };
    if !int_at_least("tailLines", 0) {
        return Some(Err("tailLines"));
    }
    for k in ["follow", "previous", "timestamps"] {
        let v = get(k);
        let ok = v.is_empty()
            || matches!(
                v,
                "1" | "t"
                    | "T"
                    | "TRUE"
                    | "true"
                    | "True"
                    | "0"
                    | "f"
                    | "F"
                    | "FALSE"
                    | "false"
                    | "False"
            );
        if !ok {
            return Some(Err(match k {
                "follow" => "follow",
                "previous" => "previous",
                _ => "timestamps",
            }));
        }
    }
    if !int_at_least("limitBytes", 1) {
        return Some(Err("limitBytes"));
    }
    if !int_at_least("sinceSeconds", 1) {
        return Some(Err("sinceSeconds"));
    }
    let since_time = get("sinceTime");
    if !since_time.is_empty() {
        match rfc3339_verdict(since_time) {
            None => return None,
            Some(false) => return Some(Err("sinceTime")),
            Some(true) if !get("sinceSeconds").is_empty() => return Some(Err("sinceSeconds")),
            Some(true) => {}
        }
    }
    Some(Ok(()))
}

const ROUTE_PREFIXES: [&str; 12] = [
    "/containerLogs/",
    "/containerLogs/ns/pod/",
    "/exec/",
    "/attach/",
    "/portForward/",
    "/pods",
    "/runningpods",
    "/stats/summary",
    "/metrics/resource",
    "/healthz",
    "/",
    "",
];
const METHODS: [&str; 5] = ["GET", "GET", "POST", "PUT", "DELETE"];

fn kubelet_router() -> axum::Router {
    static ROUTER: OnceLock<axum::Router> = OnceLock::new();
    ROUTER
        .get_or_init(|| {
            use std::sync::Arc;
            use vk_sandbox::kubelet::{KubeletState, PodSource, router};
            /// A node without Pods.
            struct NoPods;
            impl PodSource for NoPods {
                fn node_pods(&self) -> Vec<vk_sandbox::pods::pod::Pod> {
                    Vec::new()
                }
                fn running_pods(&self) -> Vec<vk_sandbox::pods::pod::Pod> {
                    Vec::new()
                }
            }
            router(KubeletState {
                node_name: "fuzz-node".into(),
                pods: Arc::new(NoPods),
                auth: None,
                metrics: vk_sandbox::metrics::Metrics::new().expect("metrics"),
                streaming: None,
            })
        })
        .clone()
}

/// Input: a selector byte (method, route prefix, form body), then the query
/// string for the validator, NUL, and the rest of the request target.
pub fn check_kubelet_query(data: &[u8]) {
    use vk_sandbox::kubelet::routes::{NO_CONTAINER_LOG, validate_log_query};

    let mut input = Input::new(data);
    let sel = input.byte();
    let query = input.string();
    let target_tail = input.string();
    let form = input.string();

    // The validator alone.
    let got = validate_log_query(&query);
    if let Some(want) = expected_log_query(&query) {
        match (&want, &got) {
            (Ok(()), Ok(())) => {}
            (Err(key), Err(msg)) => assert!(
                msg.contains(key),
                "query {query:?}: the refusal must name {key}: {msg}"
            ),
            _ => panic!("query {query:?}: want {want:?}, got {got:?}"),
        }
    }

    // The router.
    let method = METHODS[usize::from(sel) % METHODS.len()];
    let prefix = ROUTE_PREFIXES[usize::from(sel >> 3) % ROUTE_PREFIXES.len()];
    let target = format!("{prefix}{target_tail}");
    let Ok(uri) = target.parse::<http::Uri>() else {
        return;
    };
    if uri.path().is_empty() || !uri.path().starts_with('/') || uri.scheme().is_some() {
        return;
    }
    let mut req = http::Request::builder().method(method).uri(uri.clone());
    let with_form = sel & 0x80 != 0;
    if with_form {
        req = req.header("content-type", "application/x-www-form-urlencoded");
    }
    let body = if with_form { form } else { String::new() };
    let Ok(req) = req.body(axum::body::Body::from(body)) else {
        return;
    };
    let resp = runtime().block_on(async {
        use tower::ServiceExt;
        kubelet_router().oneshot(req).await.expect("infallible")
    });
    let status = resp.status().as_u16();
    let location = resp
        .headers()
        .get("location")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let body = runtime()
        .block_on(axum::body::to_bytes(resp.into_body(), 1 << 20))
        .expect("body");
    let body = String::from_utf8_lossy(&body);
    assert!(
        [200, 301, 400, 403, 404, 405, 503].contains(&status),
        "{method} {target}: status {status}"
    );
    match status {
        404 => assert_eq!(body, "404 request not found\n", "{method} {target}"),
        301 => {
            let loc = location.expect("a redirect has a location");
            assert!(
                loc == "/pods"
                    || loc == "/runningpods/"
                    || loc.starts_with("/pods?")
                    || loc.starts_with("/runningpods/?"),
                "{method} {target}: redirect to {loc:?}"
            );
        }
        _ => {}
    }
    let path = uri.path();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let uri_query = uri.query().unwrap_or("");
    if method == "GET"
        && segments.len() == 4
        && segments[0] == "containerLogs"
        && segments.iter().all(|s| !s.is_empty())
    {
        match validate_log_query(uri_query) {
            Ok(()) => {
                assert_eq!(status, 400, "{target}");
                assert_eq!(body, NO_CONTAINER_LOG);
            }
            Err(why) => {
                assert_eq!(status, 400, "{target}");
                assert_eq!(body, why);
            }
        }
    }
    if matches!(
        segments.first(),
        Some(&"exec") | Some(&"attach") | Some(&"portForward")
    ) {
        // Without a data plane nothing is upgraded or run: a refusal with a
        // reason, or "not configured".
        assert!(
            [400, 403, 404, 405, 503].contains(&status),
            "{method} {target}: {status}"
        );
        if status == 503 {
            assert!(
                body.contains("streaming is not configured"),
                "{target}: {body}"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// sandboxd's lifecycle and data-plane replies

const VERB_STATUSES: [u16; 20] = [
    200, 200, 200, 204, 204, 101, 101, 404, 404, 400, 401, 403, 409, 413, 426, 500, 502, 503, 504,
    405,
];

/// The refusal a failure reply must become: status, kind and message as
/// sandboxd's body says.
fn assert_refused(err: &SandboxdError, op: Op, reply: &RawReply) {
    match err {
        SandboxdError::Refused {
            op: o,
            status,
            reason,
            message,
        } => {
            assert_eq!(*o, op);
            assert_eq!(*status, reply.status);
            assert_eq!(*reason, Refusal::classify(reply.status, &reply.body));
            assert_eq!(*message, error_message(&reply.body));
            // Only sandboxd's own JSON error makes a 404 "unknown sandbox".
            let sandboxd_json = decode::json_error_message(&reply.body).is_some();
            if reply.status == 404 {
                assert_eq!(*reason == Refusal::UnknownSandbox, sandboxd_json);
                assert_eq!(*reason == Refusal::Unsupported, !sandboxd_json);
            }
            assert!(
                !err.to_string().is_empty() && err.to_string().contains(reason.describe()),
                "{err}"
            );
        }
        other => panic!("{op} status {}: want Refused, got {other:?}", reply.status),
    }
}

/// Input: op byte (hibernate/wake, renew, get, stats, owner, exec, the two
/// upgrades), status byte (as [`check_sandboxd_reply`]), flags (bit 0: body
/// cut at the limit; bits 1-2: the `Upgrade` header of a 101), then the
/// body.
pub fn check_sandboxd_verbs(data: &[u8]) {
    let mut input = Input::new(data);
    let op = input.byte() % 8;
    let sel = input.byte();
    let status = if sel & 0x80 != 0 {
        u16::from(input.byte()) << 8 | u16::from(input.byte())
    } else {
        VERB_STATUSES[usize::from(sel) % VERB_STATUSES.len()]
    };
    let flags = input.byte();
    let body = input.rest();
    let reply = RawReply {
        status,
        body: body.to_vec(),
        over_limit: flags & 1 == 1,
    };
    let json: Option<Value> = serde_json::from_slice(body)
        .or_else(|_| serde_json::from_str(&String::from_utf8_lossy(body)))
        .ok();
    let object = json.as_ref().and_then(Value::as_object);
    match op {
        0 => {
            let op = if flags & 2 == 0 {
                Op::Hibernate
            } else {
                Op::Wake
            };
            match verbs_decode::decode_no_content(op, &reply) {
                Ok(()) => assert_eq!(status, 204),
                Err(e) => {
                    assert_ne!(status, 204);
                    assert_refused(&e, op, &reply);
                }
            }
        }
        1 => match verbs_decode::decode_renew(&reply) {
            Ok(d) => {
                assert_eq!(status, 200);
                assert!(!reply.over_limit);
                let raw = object
                    .and_then(|o| o.get("deadline"))
                    .expect("a deadline field");
                assert_eq!(
                    d,
                    Deadline::parse(Some(raw.as_str().expect("a string deadline")))
                );
                assert!(!matches!(d, Deadline::Unparseable(_)));
            }
            Err(e) if status == 200 => {
                assert!(
                    matches!(e, SandboxdError::Decode { op: Op::Renew, .. }),
                    "{e:?}"
                );
                assert!(
                    e.is_outcome_unknown(),
                    "a lost renew reply may have moved the lease"
                );
            }
            Err(e) => assert_refused(&e, Op::Renew, &reply),
        },
        2 => match verbs_decode::decode_get(&reply) {
            Ok(info) => {
                assert_eq!(status, 200);
                let o = object.expect("a JSON object");
                assert_eq!(Some(info.id.as_str()), o.get("id").and_then(Value::as_str));
                assert!(!info.id.is_empty());
                assert_eq!(info.deadline, expected_deadline(o));
                if let Some(t) = &info.token {
                    assert!(!t.is_empty());
                    assert!(!format!("{info:?}").contains(t.expose()) || t.expose().len() < 4);
                }
            }
            Err(e) if status == 200 => {
                assert!(
                    matches!(e, SandboxdError::Decode { op: Op::Get, .. }),
                    "{e:?}"
                );
            }
            Err(e) => assert_refused(&e, Op::Get, &reply),
        },
        3 => match verbs_decode::decode_stats(&reply) {
            Ok(s) => {
                assert_eq!(status, 200);
                let o = object.expect("a JSON object");
                let measured = o.get("mem_used_measured") == Some(&Value::Bool(true));
                assert_eq!(
                    s.mem_used_bytes.is_some(),
                    measured,
                    "unmeasured is never a figure"
                );
            }
            Err(e) if status == 200 => {
                assert!(
                    matches!(e, SandboxdError::Decode { op: Op::Stats, .. }),
                    "{e:?}"
                );
            }
            Err(e) => assert_refused(&e, Op::Stats, &reply),
        },
        4 => match verbs_decode::decode_owner(&reply) {
            Ok(OwnerProbe::Owned { owner_addr }) => {
                assert_eq!(status, 200);
                let want = object
                    .and_then(|o| o.get("owner_addr"))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                assert_eq!(owner_addr, want);
            }
            Ok(OwnerProbe::NotOwnedHere) => {
                assert_eq!(status, 404);
                assert!(decode::json_error_message(body).is_some());
            }
            Err(e) if status == 200 => {
                assert!(
                    matches!(e, SandboxdError::Decode { op: Op::Owner, .. }),
                    "{e:?}"
                );
            }
            Err(e) => {
                assert_refused(&e, Op::Owner, &reply);
                assert_ne!(e.refusal(), Some(Refusal::UnknownSandbox));
            }
        },
        5 => match verbs_decode::decode_exec(&reply) {
            Ok(out) => {
                assert_eq!(status, 200);
                let o = object.expect("a JSON object");
                assert_eq!(
                    Some(i64::from(out.exit_code)),
                    o.get("exit_code").and_then(Value::as_i64)
                );
            }
            Err(e) if status == 200 => {
                assert!(
                    matches!(e, SandboxdError::Decode { op: Op::Exec, .. }),
                    "{e:?}"
                );
            }
            Err(e) => assert_refused(&e, Op::Exec, &reply),
        },
        _ => {
            let (op, proto) = if op == 6 {
                (Op::Agent, "silkd")
            } else {
                (Op::Port, "tcp")
            };
            let header = match (flags >> 1) & 3 {
                0 => None,
                1 => Some(proto.to_ascii_uppercase()),
                2 => Some(format!(" {proto} ")),
                _ => Some(String::from_utf8_lossy(body).into_owned()),
            };
            match verbs_decode::decode_upgrade(op, &reply, header.as_deref(), proto) {
                Ok(()) => {
                    assert_eq!(status, 101);
                    assert!(
                        header
                            .as_deref()
                            .is_some_and(|h| h.trim().eq_ignore_ascii_case(proto))
                    );
                }
                Err(e) if status == 101 => {
                    assert!(matches!(e, SandboxdError::Decode { .. }), "{e:?}");
                }
                Err(e) => assert_refused(&e, op, &reply),
            }
        }
    }
}

// ---------------------------------------------------------------------------
// SPDY

/// Header pairs grouped by name, values in order (what survives encoding:
/// values of one name are joined, so pairs of different names may
/// reorder).
fn grouped(pairs: &[(String, String)]) -> BTreeMap<String, Vec<String>> {
    let mut m: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (n, v) in pairs {
        m.entry(n.clone()).or_default().push(v.clone());
    }
    m
}

/// Input: a selector byte (the frame size limit), then a byte stream as a
/// SPDY client would send it.
///
/// - frames: whatever decodes re-encodes to the same number of bytes and
///   decodes back equal; a frame over the limit is refused, never
///   buffered; incomplete input consumes nothing;
/// - header blocks (through one inflater, as a session does) stay within
///   the cap; a parsed block re-encodes and parses back to the same values
///   per name;
/// - a server session fed the stream (and then EOF), with a handler that
///   echoes every stream, ends; everything it writes is well-formed frames
///   whose header blocks inflate to empty blocks.
pub fn check_spdy(data: &[u8]) {
    use bytes::{Bytes, BytesMut};
    use vk_sandbox::spdy::frame::{self, Frame, HEADER_LEN, MAX_PAYLOAD};
    use vk_sandbox::spdy::headers::{Inflater, MAX_BLOCK, decode_block, encode_block};

    let mut input = Input::new(data);
    let sel = input.byte();
    let limit = [16, 1024, 64 * 1024, MAX_PAYLOAD][usize::from(sel % 4)];
    let stream = input.rest();

    let mut buf = BytesMut::from(stream);
    let mut inflater = Inflater::new();
    loop {
        let before = buf.len();
        match frame::decode(&mut buf, limit) {
            Ok(Some(f)) => {
                let used = before - buf.len();
                assert!(
                    used >= HEADER_LEN && used - HEADER_LEN <= limit,
                    "{used} > {limit}"
                );
                let mut out = BytesMut::new();
                frame::encode(&f, &mut out).expect("a decoded frame encodes");
                assert_eq!(out.len(), used, "{f:?} re-encodes to another size");
                let again = frame::decode(&mut out, MAX_PAYLOAD)
                    .expect("re-encoded frame decodes")
                    .expect("whole");
                assert_eq!(again, f);
                assert!(out.is_empty());
                if let Frame::SynStream { header_block, .. }
                | Frame::SynReply { header_block, .. }
                | Frame::Headers { header_block, .. } = &f
                    && let Ok(raw) = inflater.decompress(header_block)
                {
                    assert!(raw.len() <= 2 * MAX_BLOCK, "inflated {} bytes", raw.len());
                    if let Ok(h) = decode_block(&raw) {
                        assert!(h.0.iter().all(|(n, _)| !n.is_empty()));
                        let pairs: Vec<(&str, &str)> =
                            h.0.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
                        let back = decode_block(&encode_block(&pairs)).expect("re-encoded block");
                        assert_eq!(grouped(&back.0), grouped(&h.0));
                    }
                }
            }
            Ok(None) => {
                assert_eq!(buf.len(), before, "incomplete input is not consumed");
                assert!(
                    before < HEADER_LEN + limit,
                    "a whole frame was left undecoded"
                );
                break;
            }
            Err(_) => break,
        }
    }
    let _ = decode_block(stream);

    let input = Bytes::copy_from_slice(stream);
    runtime().block_on(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (client, server) = tokio::io::duplex(1 << 16);
        let (session, mut streams) = vk_sandbox::spdy::start(server);
        let handler = tokio::spawn(async move {
            while let Some(mut s) = streams.recv().await {
                tokio::spawn(async move {
                    while let Ok(d) = s.reader.next().await {
                        if s.writer.write(d).await.is_err() {
                            return;
                        }
                    }
                    let _ = s.writer.finish().await;
                });
            }
        });
        let (mut rd, mut wr) = tokio::io::split(client);
        let drain = tokio::spawn(async move {
            let mut out = Vec::new();
            let _ = rd.read_to_end(&mut out).await;
            out
        });
        let feed = async {
            let _ = wr.write_all(&input).await;
            let _ = wr.shutdown().await;
        };
        let limit = std::time::Duration::from_secs(10);
        tokio::time::timeout(limit, async { tokio::join!(feed, session.ended()) })
            .await
            .expect("the session ends after EOF");
        drop(session);
        handler.abort();
        let out = tokio::time::timeout(limit, drain)
            .await
            .expect("the session closes its side once ended")
            .expect("drain task");
        let mut out = BytesMut::from(&out[..]);
        let mut inflater = Inflater::new();
        while !out.is_empty() {
            let f = frame::decode(&mut out, MAX_PAYLOAD)
                .expect("the session writes valid frames")
                .expect("and whole ones");
            if let Frame::SynReply { header_block, .. } = &f {
                let raw = inflater
                    .decompress(header_block)
                    .expect("its blocks inflate");
                assert!(decode_block(&raw).expect("and parse").0.is_empty());
            }
        }
    });
}
