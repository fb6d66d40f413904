//! The process metrics (`process_cpu_seconds_total`, resident memory, file
//! descriptors, threads, start time), with CPU time to the clock tick.
//!
//! The prometheus crate's process collector counts CPU time in whole
//! seconds (an integer counter), so a rate over a few minutes of a node
//! agent that uses a fraction of a core reads as steps of 0 and 1. This
//! collector keeps everything else of it and replaces that one family with
//! a float counter of user + system time from `/proc/self/stat`, as other
//! Prometheus clients report it.

use prometheus::core::{Collector, Desc};
use prometheus::process_collector::ProcessCollector;
use prometheus::proto::MetricFamily;
use prometheus::{Counter, Opts};

const CPU: &str = "process_cpu_seconds_total";

pub struct Process {
    inner: ProcessCollector,
    cpu: Counter,
    ticks_per_second: f64,
}

impl Process {
    pub fn for_self() -> prometheus::Result<Process> {
        let cpu = Counter::with_opts(Opts::new(
            CPU,
            "Total user and system CPU time spent in seconds.",
        ))?;
        // SAFETY: sysconf reads a constant of the running system.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        Ok(Process {
            inner: ProcessCollector::for_self(),
            cpu,
            ticks_per_second: if ticks > 0 { ticks as f64 } else { 100.0 },
        })
    }
}

/// User + system clock ticks from the text of `/proc/<pid>/stat`: the
/// 14th and 15th fields, counted after the command name (which is in
/// parentheses and may itself hold spaces or parentheses). Pure.
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    // After ")": state is field 3, utime 14, stime 15.
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

impl Collector for Process {
    fn desc(&self) -> Vec<&Desc> {
        // The inner collector's descriptions name the CPU family too.
        self.inner.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let mut families: Vec<MetricFamily> = self
            .inner
            .collect()
            .into_iter()
            .filter(|f| f.name() != CPU)
            .collect();
        if let Some(ticks) = std::fs::read_to_string("/proc/self/stat")
            .ok()
            .as_deref()
            .and_then(cpu_ticks)
        {
            let total = ticks as f64 / self.ticks_per_second;
            let past = self.cpu.get();
            if total > past {
                self.cpu.inc_by(total - past);
            }
            families.extend(self.cpu.collect());
        }
        families
    }
}
