//! The stream options of an exec or attach request, read as the kubelet
//! reads them: query values (a urlencoded POST body first, Go's
//! `FormValue`), `"1"` meaning on; `command` repeated once per argument.
//! Pure.

/// What the client asked for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StreamOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
    /// The argv (exec only).
    pub command: Vec<String>,
}

fn all(form: &[(String, String)], query: &str, key: &str) -> Vec<String> {
    let from_form: Vec<String> = form
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.clone())
        .collect();
    if !from_form.is_empty() {
        return from_form;
    }
    url::form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
        .collect()
}

fn on(form: &[(String, String)], query: &str, key: &str) -> bool {
    all(form, query, key).first().is_some_and(|v| v == "1")
}

/// The options, or why they are invalid (a 400): none of stdin, stdout,
/// stderr; or a terminal together with stderr.
pub fn stream_options(form: &[(String, String)], query: &str) -> Result<StreamOptions, String> {
    let opts = StreamOptions {
        stdin: on(form, query, "input"),
        stdout: on(form, query, "output"),
        stderr: on(form, query, "error"),
        tty: on(form, query, "tty"),
        command: all(form, query, "command"),
    };
    if !opts.stdin && !opts.stdout && !opts.stderr {
        return Err("you must specify at least 1 of stdin, stdout, stderr".into());
    }
    if opts.tty && opts.stderr {
        return Err("stderr cannot be set together with tty".into());
    }
    Ok(opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_and_command() {
        let o = stream_options(
            &[],
            "command=sh&command=-c&command=echo+a%26b&output=1&error=1&input=0",
        )
        .expect("valid options");
        assert_eq!(o.command, ["sh", "-c", "echo a&b"]);
        assert!(o.stdout && o.stderr && !o.stdin && !o.tty);
        let form = vec![
            ("command".to_string(), "ls".to_string()),
            ("input".to_string(), "1".to_string()),
        ];
        let o = stream_options(&form, "command=ignored&tty=1").expect("valid options");
        assert_eq!(o.command, ["ls"], "the body's values win");
        assert!(o.stdin && o.tty);
    }

    #[test]
    fn invalid_combinations() {
        assert!(stream_options(&[], "").is_err());
        assert!(stream_options(&[], "output=true").is_err(), "only 1 is on");
        assert!(stream_options(&[], "tty=1&output=1&error=1").is_err());
        assert!(stream_options(&[], "error=1").is_ok());
        let form = vec![("output".to_string(), "0".to_string())];
        assert!(
            stream_options(&form, "output=1").is_err(),
            "body values win"
        );
    }
}
