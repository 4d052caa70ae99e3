//! The side effects of commands.
//!
//! `exec.run` runs a program without a shell, with stdin closed, capturing
//! stdout and stderr together up to a bound (the rest is drained and
//! dropped, so the program never blocks on a full pipe), and kills it at its
//! timeout. The self-terminating kinds (reboot, kexec) are the host's.

use std::process::Stdio;
use std::time::Duration;

use bcd_core::command::Outcome;
use bcd_proto::v1::ExecArgs;
use tokio::io::AsyncReadExt;

/// What a side effect produced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Effect {
    pub outcome: Outcome,
    pub reason: String,
    pub exit_code: Option<i32>,
    pub output: Vec<u8>,
    pub truncated: bool,
}

impl Effect {
    pub fn ok() -> Effect {
        Effect {
            outcome: Outcome::Succeeded,
            reason: String::new(),
            exit_code: None,
            output: Vec::new(),
            truncated: false,
        }
    }

    pub fn failed(reason: impl Into<String>) -> Effect {
        Effect {
            outcome: Outcome::Failed,
            reason: reason.into(),
            ..Effect::ok()
        }
    }
}

async fn drain(
    mut r: impl tokio::io::AsyncRead + Unpin,
    buf: std::sync::Arc<std::sync::Mutex<(Vec<u8>, bool)>>,
    max: usize,
) {
    let mut chunk = [0u8; 8192];
    loop {
        match r.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                let mut b = buf.lock().unwrap_or_else(|p| p.into_inner());
                let room = max.saturating_sub(b.0.len());
                let take = room.min(n);
                b.0.extend_from_slice(&chunk[..take]);
                if take < n {
                    b.1 = true;
                }
            }
        }
    }
}

pub async fn exec(args: &ExecArgs) -> Effect {
    let mut cmd = tokio::process::Command::new(&args.program);
    cmd.args(&args.args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return Effect::failed(format!("cannot start {}: {e}", args.program)),
    };
    let buf = std::sync::Arc::new(std::sync::Mutex::new((Vec::new(), false)));
    let max = args.max_output as usize;
    let out = tokio::spawn(drain(child.stdout.take().expect("piped"), buf.clone(), max));
    let err = tokio::spawn(drain(child.stderr.take().expect("piped"), buf.clone(), max));
    let timeout = Duration::from_millis(args.timeout_ms.max(1));
    let status = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(s)) => Some(s),
        Ok(Err(e)) => return Effect::failed(format!("waiting for {}: {e}", args.program)),
        Err(_) => {
            let _ = child.kill().await;
            None
        }
    };
    let _ = out.await;
    let _ = err.await;
    let (output, truncated) = std::mem::take(&mut *buf.lock().unwrap_or_else(|p| p.into_inner()));
    let Some(status) = status else {
        return Effect {
            outcome: Outcome::Failed,
            reason: format!("timed out after {timeout:?}; killed"),
            exit_code: None,
            output,
            truncated,
        };
    };
    let code = status.code();
    let (outcome, reason) = match code {
        Some(0) => (Outcome::Succeeded, String::new()),
        Some(c) => (Outcome::Failed, format!("exit code {c}")),
        None => {
            use std::os::unix::process::ExitStatusExt;
            (
                Outcome::Failed,
                format!("killed by signal {}", status.signal().unwrap_or(0)),
            )
        }
    };
    Effect {
        outcome,
        reason,
        exit_code: code,
        output,
        truncated,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(program: &str, a: &[&str]) -> ExecArgs {
        ExecArgs {
            program: program.into(),
            args: a.iter().map(|s| s.to_string()).collect(),
            timeout_ms: 10_000,
            max_output: 16,
        }
    }

    #[tokio::test]
    async fn captures_exit_code_and_bounded_output() {
        let e = exec(&args("/bin/sh", &["-c", "echo hello; exit 3"])).await;
        assert_eq!(e.outcome, Outcome::Failed);
        assert_eq!(e.exit_code, Some(3));
        assert_eq!(e.output, b"hello\n");
        assert!(!e.truncated);
        let e = exec(&args("/bin/sh", &["-c", "head -c 100000 /dev/zero"])).await;
        assert_eq!(e.outcome, Outcome::Succeeded);
        assert_eq!(e.output.len(), 16);
        assert!(e.truncated);
    }

    #[tokio::test]
    async fn times_out_and_reports_missing_programs() {
        let mut a = args("/bin/sleep", &["30"]);
        a.timeout_ms = 100;
        let e = exec(&a).await;
        assert_eq!(e.outcome, Outcome::Failed);
        assert!(e.reason.starts_with("timed out"), "{}", e.reason);
        let e = exec(&args("/nonexistent/program", &[])).await;
        assert!(
            e.reason.starts_with("cannot start /nonexistent/program"),
            "{}",
            e.reason
        );
    }
}
