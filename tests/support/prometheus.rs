//! A real Prometheus server (Debian's `prometheus` package, installed by
//! e2e/deps.sh) on loopback, scraping one target, queried over its HTTP API.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use super::process::free_port;
use super::wait_for;

pub struct Prometheus {
    child: Child,
    pub url: String,
    pub log: std::path::PathBuf,
}

/// The `prometheus` binary, or `None` with the reason (a failure under
/// `VK_REQUIRE_CLUSTER=1`, where the project's scripts must have installed it).
pub fn binary() -> Option<String> {
    let found = Command::new("prometheus")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if found {
        return Some("prometheus".into());
    }
    let why =
        "the prometheus server is not installed (run e2e/deps.sh: apt-get install prometheus)";
    if std::env::var("VK_REQUIRE_CLUSTER").as_deref() == Ok("1") {
        panic!("{why}");
    }
    eprintln!("SKIPPED: {why}");
    None
}

impl Prometheus {
    /// Starts Prometheus scraping `target` (`host:port`, path `/metrics`)
    /// every second, with its data and log under `dir`.
    pub async fn start(dir: &Path, target: &str) -> Option<Prometheus> {
        let bin = binary()?;
        let port = free_port();
        let config = dir.join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 scrape_configs:\n  - job_name: vk-sandbox\n    scrape_interval: 1s\n    \
                 static_configs:\n      - targets: ['{target}']\n"
            ),
        )
        .expect("write prometheus.yml");
        let log = dir.join("prometheus.log");
        let out = std::fs::File::create(&log).expect("prometheus log");
        let err = out.try_clone().expect("clone log handle");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .expect("spawn prometheus");
        let p = Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            log,
        };
        let ready = format!("{}/-/ready", p.url);
        wait_for(
            "Prometheus to be ready",
            Duration::from_secs(60),
            || async {
                match reqwest::get(&ready).await {
                    Ok(r) if r.status().is_success() => Ok(()),
                    Ok(r) => Err(format!("{}: {}", r.status(), p.logs_tail())),
                    Err(e) => Err(format!("{e}: {}", p.logs_tail())),
                }
            },
        )
        .await;
        Some(p)
    }

    pub fn logs_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        super::vk::tail(&text, 15)
    }

    /// An instant query; the value of each returned series (by its labels).
    pub async fn query(&self, promql: &str) -> Result<Vec<(Value, f64)>, String> {
        let mut url =
            url::Url::parse(&format!("{}/api/v1/query", self.url)).map_err(|e| e.to_string())?;
        url.query_pairs_mut().append_pair("query", promql);
        let r = reqwest::get(url).await.map_err(|e| e.to_string())?;
        let body: Value = r.json().await.map_err(|e| e.to_string())?;
        if body["status"] != "success" {
            return Err(format!("query {promql}: {body}"));
        }
        let results = body["data"]["result"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        Ok(results
            .into_iter()
            .map(|s| {
                let v = s["value"][1]
                    .as_str()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(f64::NAN);
                (s["metric"].clone(), v)
            })
            .collect())
    }

    /// Waits until `promql` returns one series whose value satisfies `ok`.
    pub async fn wait_value(&self, promql: &str, ok: impl Fn(f64) -> bool) -> f64 {
        wait_for(
            &format!("Prometheus query {promql}"),
            Duration::from_secs(60),
            || async {
                let series = self.query(promql).await?;
                match series.as_slice() {
                    [(_, v)] if ok(*v) => Ok(*v),
                    other => Err(format!("{other:?}; prometheus log:\n{}", self.logs_tail())),
                }
            },
        )
        .await
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `promtool <args>`, `input` on its stdin; whether it succeeded, and
/// its stdout then stderr. Panics when promtool cannot run: it comes with
/// the Debian package prometheus, which `make test` and `make deps` install
/// (e2e/deps.sh).
pub fn promtool(args: &[&str], input: &str) -> (bool, String) {
    use std::io::Write;
    let mut child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run promtool ({e}): it is in the Debian package prometheus, which \
                 `make test` and `make deps` install (e2e/deps.sh)"
            )
        });
    // promtool reads its whole input before it writes: no pipe deadlock.
    child
        .stdin
        .take()
        .expect("promtool stdin")
        .write_all(input.as_bytes())
        .expect("feed promtool");
    let out = child.wait_with_output().expect("promtool output");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}
