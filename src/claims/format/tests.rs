use std::collections::BTreeMap;

use jiff::Timestamp;

use super::super::Claim;
use super::journal::checksum;
use super::*;

fn ts(s: &str) -> Timestamp {
    s.parse().expect("timestamp")
}

fn now() -> Timestamp {
    ts("2026-08-01T12:00:00Z")
}

fn claim(id: &str) -> Claim {
    Claim {
        id: id.into(),
        token: crate::sandboxd::Token::new(format!("tok-{id}")),
        address: "10.0.0.5:7777".into(),
        pod_uid: "uid-1".into(),
        claimed_at: ts("2026-01-01T00:00:00Z"),
        deadline: Some(ts("2026-01-02T00:00:00Z")),
        lifecycle: Default::default(),
    }
}

#[test]
fn go_compact_round_trips_byte_for_byte() {
    let go = r#"{"claims":{"ns/a":{"id":"sb_1","token":"t1","address":"10.0.0.5:7777","podUID":"u1","claimedAt":"2026-01-01T00:00:00Z","deadline":"2026-01-02T00:00:00Z"},"ns/b":{"id":"sb_2","token":"t2","podUID":""}}}"#;
    let table = decode_snapshot(go.as_bytes(), now()).expect("decode");
    assert_eq!(table["ns/b"].claimed_at, now());
    assert_eq!(table["ns/b"].deadline, None);
    let mut again = table.clone();
    again.get_mut("ns/b").expect("row").claimed_at = Timestamp::UNIX_EPOCH;
    assert_eq!(
        String::from_utf8(encode_snapshot(&again)).expect("utf8"),
        go
    );
}

#[test]
fn empty_table_is_exact() {
    assert_eq!(encode_snapshot(&BTreeMap::new()), br#"{"claims":{}}"#);
}

#[test]
fn times_are_seconds_utc() {
    let mut c = claim("sb_1");
    c.claimed_at = ts("2026-01-01T08:00:00.987654321+08:00");
    c.deadline = Some(ts("2026-01-02T00:00:00.5Z"));
    let out =
        String::from_utf8(encode_snapshot(&BTreeMap::from([("k".to_string(), c)]))).expect("utf8");
    assert!(
        out.contains(r#""claimedAt":"2026-01-01T00:00:00Z""#),
        "{out}"
    );
    assert!(
        out.contains(r#""deadline":"2026-01-02T00:00:00Z""#),
        "{out}"
    );
}

#[test]
fn lenient_reader() {
    for (text, rows) in [
        ("{}", 0),
        (r#"{"claims":null}"#, 0),
        (r#"{"other":1}"#, 0),
        (
            "\n{\n  \"claims\": {\n    \"ns/a\": {\n      \"id\": \"sb_1\",\n      \"token\": \"t\",\n      \"podUID\": \"u\"\n    }\n  }\n}\n",
            1,
        ),
        (
            r#"{"claims":{"ns/a":{"ID":"sb_1","Token":"t","PodUid":"u","extra":[1,2],"claimedAt":null,"deadline":"0001-01-01T00:00:00Z"}},"version":3}"#,
            1,
        ),
        (r#"{"claims":{"ns/a":null}}"#, 1),
    ] {
        let table = decode_snapshot(text.as_bytes(), now()).expect(text);
        assert_eq!(table.len(), rows, "{text}");
    }
    let t = decode_snapshot(
        br#"{"claims":{"ns/a":{"ID":"sb_1","Token":"t","PodUid":"u","deadline":"0001-01-01T00:00:00Z"}}}"#,
        now(),
    )
    .expect("decode");
    let a = &t["ns/a"];
    assert_eq!(
        (
            a.id.as_str(),
            a.token.as_deref().map_or("", |t| t.expose()),
            a.pod_uid.as_str()
        ),
        ("sb_1", "t", "u")
    );
    assert_eq!(a.deadline, None);
    assert_eq!(a.claimed_at, now());
}

#[test]
fn malformed_snapshots_are_refused() {
    for bad in [
        "",
        "  \n",
        "{",
        "[]",
        "null",
        r#"{"claims":[]}"#,
        r#"{"claims":{"ns/a":{"id":5}}}"#,
        r#"{"claims":{"ns/a":"sb_1"}}"#,
        r#"{"claims":{"ns/a":{"deadline":"tomorrow"}}}"#,
        r#"{"claims":{}} trailing"#,
    ] {
        assert!(decode_snapshot(bad.as_bytes(), now()).is_err(), "{bad:?}");
    }
    assert!(decode_snapshot(b"{\"claims\":{}}\xff", now()).is_err());
}

fn frame(ops: &[JournalOp]) -> Vec<u8> {
    encode_frame(ops, Some("0123456789abcdef"))
}

#[test]
fn journal_round_trip_and_replay() {
    let a = claim("sb_1");
    let b = claim("sb_2");
    let mut bytes = frame(&[JournalOp::Put {
        key: "ns/a".into(),
        claim: a.clone(),
    }]);
    bytes.extend(frame(&[
        JournalOp::Put {
            key: "ns/b".into(),
            claim: b.clone(),
        },
        JournalOp::Del { key: "ns/a".into() },
    ]));
    let j = decode_journal(&bytes, now()).expect("journal");
    assert_eq!(j.frames, 2);
    assert_eq!(j.torn_tail_bytes, 0);
    assert_eq!(j.base.as_deref(), Some("0123456789abcdef"));
    let mut table = BTreeMap::from([("ns/c".to_string(), claim("sb_3"))]);
    replay(&mut table, j.ops);
    assert_eq!(
        table.keys().collect::<Vec<_>>(),
        vec!["ns/b", "ns/c"],
        "del removes, put adds, untouched keys stay"
    );
    assert_eq!(table["ns/b"], b);
}

#[test]
fn torn_last_line_is_ignored() {
    let good = frame(&[JournalOp::Del { key: "k".into() }]);
    let next = frame(&[JournalOp::Put {
        key: "k2".into(),
        claim: claim("sb_9"),
    }]);
    for cut in 1..next.len() {
        let mut bytes = good.clone();
        bytes.extend_from_slice(&next[..cut]);
        let j = decode_journal(&bytes, now()).unwrap_or_else(|e| panic!("cut {cut}: {e}"));
        assert_eq!(j.frames, 1, "cut {cut}");
        assert_eq!(j.torn_tail_bytes, cut, "cut {cut}");
    }
    // Blocks allocated but never written read as zeros.
    let mut zeros = good.clone();
    zeros.extend(std::iter::repeat_n(0u8, 4096));
    assert_eq!(decode_journal(&zeros, now()).expect("zeros").frames, 1);
    let mut holed = good.clone();
    let mut hole = next.clone();
    hole[10..20].fill(0);
    holed.extend(hole);
    assert_eq!(decode_journal(&holed, now()).expect("hole").frames, 1);
}

#[test]
fn damaged_middle_or_complete_last_line_is_refused() {
    let a = frame(&[JournalOp::Del { key: "a".into() }]);
    let b = frame(&[JournalOp::Del { key: "b".into() }]);
    // A torn line followed by another frame.
    let mut bytes = a[..a.len() - 3].to_vec();
    bytes.push(b'\n');
    bytes.extend_from_slice(&b);
    let err = decode_journal(&bytes, now()).expect_err("middle");
    assert!(err.contains("line 1"), "{err}");
    // A flipped byte in a complete last line.
    let mut flipped = a.clone();
    flipped.extend_from_slice(&b);
    let n = flipped.len();
    flipped[n - 4] ^= 0x01;
    let err = decode_journal(&flipped, now()).expect_err("checksum");
    assert!(err.contains("checksum"), "{err}");
    // An empty middle line.
    let mut empty = a.clone();
    empty.push(b'\n');
    empty.extend_from_slice(&b);
    assert!(decode_journal(&empty, now()).is_err());
    // A journal whose first frame names no base.
    let unbased = encode_frame(&[JournalOp::Del { key: "a".into() }], None);
    let err = decode_journal(&unbased, now()).expect_err("no base");
    assert!(err.contains("base"), "{err}");
    // A well-framed payload that is not a journal record.
    let payload = br#"{"ops":[{"op":"zap","key":"k"}]}"#;
    let mut odd = format!("{} {} ", payload.len(), checksum(payload)).into_bytes();
    odd.extend_from_slice(payload);
    odd.push(b'\n');
    assert!(decode_journal(&odd, now()).is_err());
}

fn with_lifecycle(id: &str) -> Claim {
    use crate::claims::lifecycle::{Lifecycle, OwnerRef, VmState};
    Claim {
        lifecycle: Box::new(Lifecycle {
            owner: Some(OwnerRef {
                api_version: "agents.x-k8s.io/v1beta1".into(),
                kind: "Sandbox".into(),
                name: "a".into(),
                uid: "o1".into(),
            }),
            vm: VmState::Hibernated {
                why: "suspended".into(),
                since: ts("2026-01-01T12:00:00Z"),
            },
            hibernate_refused: false,
            ttl_seconds: Some(86_400),
            granted_seconds: Some(20),
            pod_ip: None,
        }),
        ..claim(id)
    }
}

/// The lifecycle object is vk-sandbox's own: written after the Go fields
/// (which the Go build reads as before), read back through the snapshot
/// and the journal alike.
#[test]
fn lifecycle_rides_after_the_go_fields() {
    let c = with_lifecycle("sb_1");
    let table = BTreeMap::from([("ns/a".to_string(), c.clone())]);
    let text = String::from_utf8(encode_snapshot(&table)).expect("utf8");
    assert_eq!(
        text,
        r#"{"claims":{"ns/a":{"id":"sb_1","token":"tok-sb_1","address":"10.0.0.5:7777","podUID":"uid-1","claimedAt":"2026-01-01T00:00:00Z","deadline":"2026-01-02T00:00:00Z","lifecycle":{"owner":{"apiVersion":"agents.x-k8s.io/v1beta1","kind":"Sandbox","name":"a","uid":"o1"},"vm":"hibernated","why":"suspended","since":"2026-01-01T12:00:00Z","ttlSeconds":86400,"grantedSeconds":20}}}}"#
    );
    assert_eq!(
        decode_snapshot(text.as_bytes(), now()).expect("decode"),
        table
    );
    let j = decode_journal(
        &frame(&[JournalOp::Put {
            key: "ns/a".into(),
            claim: c.clone(),
        }]),
        now(),
    )
    .expect("journal");
    let mut replayed = BTreeMap::new();
    replay(&mut replayed, j.ops);
    assert_eq!(replayed, table);
    // Without lifecycle state, the row is the Go build's.
    let plain = BTreeMap::from([("ns/a".to_string(), claim("sb_1"))]);
    let text = String::from_utf8(encode_snapshot(&plain)).expect("utf8");
    assert!(!text.contains("lifecycle"), "{text}");
}

#[test]
fn a_malformed_lifecycle_is_refused_naming_the_row() {
    let bad = r#"{"claims":{"ns/a":{"id":"sb_1","token":"t","podUID":"u","lifecycle":{"vm":"asleep","since":"2026-01-01T00:00:00Z"}}}}"#;
    let e = decode_snapshot(bad.as_bytes(), now()).expect_err("refused");
    assert!(e.contains("ns/a") && e.contains("\"vm\""), "{e}");
    // A lifecycle of null is an empty one (as Go writes nothing there).
    let null = r#"{"claims":{"ns/a":{"id":"sb_1","token":"t","podUID":"u","lifecycle":null}}}"#;
    let t = decode_snapshot(null.as_bytes(), now()).expect("null");
    assert!(t["ns/a"].lifecycle.is_empty());
}
