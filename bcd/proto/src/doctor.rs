//! The doctor's report: what `bcd doctor` finds on a node and
//! `better-compute doctor` finds on the control plane, in one format (one
//! line per check as text, or JSON with `--json`). Both binaries print it,
//! so it lives here and neither links the other.

use serde::Serialize;

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

impl Level {
    pub fn name(self) -> &'static str {
        match self {
            Level::Ok => "ok",
            Level::Warn => "warn",
            Level::Fail => "fail",
        }
    }
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Check {
    /// `identity`, `certificate`, `clock`, `journal`, `slots`, `helper`,
    /// `gpus`, `cdi`, `env-files`, `sshd`, `firewall`, `udev`, `gateway`.
    pub check: &'static str,
    pub status: Level,
    /// What was found.
    pub summary: String,
    /// What to do next; empty when there is nothing to do.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub next: String,
}

impl Check {
    pub fn ok(check: &'static str, summary: impl Into<String>) -> Check {
        Check {
            check,
            status: Level::Ok,
            summary: summary.into(),
            next: String::new(),
        }
    }

    pub fn warn(check: &'static str, summary: impl Into<String>, next: impl Into<String>) -> Check {
        Check {
            check,
            status: Level::Warn,
            summary: summary.into(),
            next: next.into(),
        }
    }

    pub fn fail(check: &'static str, summary: impl Into<String>, next: impl Into<String>) -> Check {
        Check {
            check,
            status: Level::Fail,
            summary: summary.into(),
            next: next.into(),
        }
    }
}

/// Every check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The worst status.
    pub status: Level,
    pub checks: Vec<Check>,
}

impl Report {
    pub fn new(checks: Vec<Check>) -> Report {
        Report {
            status: checks.iter().map(|c| c.status).max().unwrap_or(Level::Ok),
            checks,
        }
    }

    /// 0 all ok, 1 a failure, 2 warnings only.
    pub fn exit_code(&self) -> u8 {
        match self.status {
            Level::Ok => 0,
            Level::Fail => 1,
            Level::Warn => 2,
        }
    }

    pub fn get(&self, check: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.check == check)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a report serializes")
    }

    /// One line per check, the next step indented under it.
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            out.push_str(&format!(
                "{:<4}  {:<12} {}\n",
                c.status.name(),
                c.check,
                c.summary
            ));
            if !c.next.is_empty() {
                out.push_str(&format!("{:18}-> {}\n", "", c.next));
            }
        }
        let (warn, fail) = self.checks.iter().fold((0, 0), |(w, f), c| match c.status {
            Level::Warn => (w + 1, f),
            Level::Fail => (w, f + 1),
            Level::Ok => (w, f),
        });
        out.push_str(&format!(
            "{} checks: {} ok, {warn} warn, {fail} fail\n",
            self.checks.len(),
            self.checks.len() - warn - fail
        ));
        out
    }
}
