use std::collections::BTreeMap;

use jiff::Timestamp;

use super::view::{self, Verification};
use super::*;
use crate::claims::Claim;
use crate::sandboxd::SandboxRow;

fn claim(id: &str, deadline: Option<&str>) -> Claim {
    Claim {
        id: id.into(),
        token: crate::sandboxd::Token::new(format!("tok-{id}")),
        address: String::new(),
        pod_uid: format!("uid-{id}"),
        claimed_at: "2026-01-01T00:00:00Z".parse().expect("ts"),
        deadline: deadline.map(|d| d.parse().expect("ts")),
        lifecycle: Default::default(),
    }
}

fn row(id: &str, claim_ref: &str) -> SandboxRow {
    serde_json::from_value(serde_json::json!({"id": id, "claim_ref": claim_ref})).expect("row")
}

fn view_of(rows: &[(&str, Claim)]) -> StateView {
    StateView {
        loaded: crate::claims::format::Loaded {
            rows: rows
                .iter()
                .map(|(k, c)| (k.to_string(), c.clone()))
                .collect(),
            ..Default::default()
        },
        snapshot_found: true,
        journal_found: false,
        attempts: 1,
    }
}

#[test]
fn table_columns_line_up_and_tokens_stay_hidden() {
    let state = view_of(&[
        ("ns/a-long-name", claim("sb_1", None)),
        ("ns/b", claim("sb_22", Some("2020-01-01T00:00:00Z"))),
    ]);
    let now: Timestamp = "2026-06-01T00:00:00Z".parse().expect("ts");
    let text = view::list_table(&state, now, false);
    let lines: Vec<&str> = text.lines().collect();
    let col = |l: &str, name: &str| l.find(name);
    let sandbox_at = col(lines[0], "SANDBOX").expect("header");
    assert_eq!(col(lines[1], "sb_1"), Some(sandbox_at), "{text}");
    assert_eq!(col(lines[2], "sb_22"), Some(sandbox_at), "{text}");
    assert!(lines[1].ends_with("active") && lines[2].ends_with("expired"));
    assert!(!text.contains("tok-"), "{text}");
    assert!(view::list_table(&state, now, true).contains("tok-sb_22"));
    assert_eq!(view::list_table(&view_of(&[]), now, false), "no claims\n");
}

#[test]
fn verification_sorts_every_sandbox() {
    let rows: BTreeMap<String, Claim> = [
        ("ns/held".to_string(), claim("sb_held", None)),
        ("ns/gone".to_string(), claim("sb_gone", None)),
        (
            "ns/reaped".to_string(),
            claim("sb_reaped", Some("2020-01-01T00:00:00Z")),
        ),
    ]
    .into();
    let listing = [
        row("sb_held", "ns/held"),
        row("sb_stray", "ns/gone"),
        row("sb_ext", "other/x"),
        row("sb_orphan", ""),
    ];
    let v = Verification::new(&rows, &listing);
    assert_eq!(v.held_listed, vec![("ns/held".into(), "sb_held".into())]);
    assert_eq!(
        v.held_missing,
        vec![
            ("ns/gone".into(), "sb_gone".into(), false),
            ("ns/reaped".into(), "sb_reaped".into(), true)
        ]
    );
    assert_eq!(
        v.listed_not_held,
        vec![("ns/gone".into(), "sb_stray".into())]
    );
    assert_eq!(v.external, vec![("sb_ext".into(), "other/x".into())]);
    assert_eq!(v.orphans, vec!["sb_orphan".to_string()]);
    assert!(!v.consistent());
    let text = v.text();
    assert!(text.contains("its deadline passed: reaped"), "{text}");
    assert!(text.ends_with("1 under other claim refs and 1 possible orphans (no claim ref)\n"));

    let only_held = Verification::new(&rows, &[]);
    assert_eq!(only_held.held_missing.len(), 3);
    let fine = Verification::new(
        &BTreeMap::from([("ns/held".to_string(), claim("sb_held", None))]),
        &[row("sb_held", "ns/held"), row("sb_ext", "other/x")],
    );
    assert!(fine.consistent(), "{fine:?}");
}

#[test]
fn an_empty_state_path_is_a_clear_error() {
    let cmd = ClaimsCommand::Export {
        state: StateArg {
            state_path: String::new(),
        },
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    assert_eq!(run(&cmd, &mut out, &mut err), 1);
    let err = String::from_utf8(err).expect("utf8");
    assert!(
        err.contains("--state-path (env VK_STATE_PATH) is empty"),
        "{err}"
    );
    assert!(out.is_empty());
}

#[test]
fn the_subcommands_take_the_daemons_flags_and_environment() {
    let env = |name: &str| match name {
        "VK_STATE_PATH" => Some("/env/claims.json".to_string()),
        "SANDBOXD_URL" => Some("http://sandboxd:1".to_string()),
        _ => None,
    };
    let cli = crate::config::parse_from(["vk-sandbox", "claims", "verify", "-o", "json"], &env)
        .expect("parse");
    let Some(crate::config::Command::Claims(ClaimsArgs {
        command: ClaimsCommand::Verify { view, sandboxd },
    })) = cli.command
    else {
        panic!("not claims verify: {cli:?}");
    };
    assert_eq!(view.state.state_path, "/env/claims.json");
    assert_eq!(view.output, Output::Json);
    assert_eq!(sandboxd.sandboxd_url, "http://sandboxd:1");
    let cli = crate::config::parse_from(
        ["vk-sandbox", "claims", "list", "--state-path=/flag.json"],
        &env,
    )
    .expect("parse");
    let Some(crate::config::Command::Claims(ClaimsArgs {
        command: ClaimsCommand::List { view, show_tokens },
    })) = cli.command
    else {
        panic!("not claims list");
    };
    assert_eq!(view.state.state_path, "/flag.json", "the flag wins");
    assert!(!show_tokens);
    let help = crate::config::command(&env)
        .find_subcommand_mut("claims")
        .and_then(|c| c.find_subcommand_mut("list"))
        .map(|c| c.render_help().to_string())
        .expect("help");
    assert!(help.contains("[env: VK_STATE_PATH]"), "{help}");
}
