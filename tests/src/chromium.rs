//! Headless Chromium for the console's tests, driven over the DevTools
//! protocol on Chromium's pipe transport (`--remote-debugging-pipe`: JSON
//! messages ended by a NUL, written to its fd 3 and read from its fd 4), so
//! no WebSocket is needed. The few calls the tests make are sent as JSON;
//! every event is kept so a test can ask what the page logged.
//!
//! The DevTools crates bring a generated protocol of about a hundred
//! thousand lines and a WebSocket stack into the test build for the same
//! five calls; this is the transport alone.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use base64::Engine as _;
use serde_json::{Value, json};

/// Where Debian's chromium package puts the browser.
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// A running headless Chromium with one page.
#[derive(Debug)]
pub struct Browser {
    child: Child,
    to: ChildStdin,
    from: mpsc::Receiver<Value>,
    next: u64,
    session: String,
    /// Every event received so far, in order.
    pub events: Vec<Value>,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Starts Chromium (logging to `log`), trusting any certificate (the
    /// console's is the operator CA's, which no browser store holds), and
    /// opens a blank page.
    pub fn start(log: &Path) -> anyhow::Result<Browser> {
        anyhow::ensure!(
            Path::new(CHROMIUM).exists(),
            "{CHROMIUM} is missing: install Debian's chromium package (scripts/test does)"
        );
        let profile = tempfile::tempdir()?;
        // Our stdin becomes its fd 3 and our stdout its fd 4.
        let mut child = Command::new("/bin/sh")
            .arg("-c")
            .arg(r#"exec "$0" "$@" 3<&0 4>&1 0</dev/null 1>&2"#)
            .arg(CHROMIUM)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--disable-sync",
                "--ignore-certificate-errors",
                "--remote-debugging-pipe",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .context("start chromium")?;
        let to = child.stdin.take().expect("piped stdin");
        let from = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(from);
            loop {
                let mut message = Vec::new();
                match r.read_until(0, &mut message) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if message.last() == Some(&0) {
                    message.pop();
                }
                if let Ok(v) = serde_json::from_slice::<Value>(&message)
                    && tx.send(v).is_err()
                {
                    return;
                }
            }
        });
        let mut b = Browser {
            child,
            to,
            from: rx,
            next: 0,
            session: String::new(),
            events: Vec::new(),
            _profile: profile,
        };
        let target = b.call("Target.createTarget", json!({"url": "about:blank"}))?;
        let target = target["targetId"]
            .as_str()
            .context("no targetId")?
            .to_string();
        let attached = b.call(
            "Target.attachToTarget",
            json!({"targetId": target, "flatten": true}),
        )?;
        b.session = attached["sessionId"]
            .as_str()
            .context("no sessionId")?
            .to_string();
        for domain in ["Runtime.enable", "Log.enable", "Page.enable"] {
            b.call(domain, json!({}))?;
        }
        Ok(b)
    }

    /// Sends `method` with `params` (to the page once attached) and waits
    /// for its answer; events that arrive meanwhile are kept.
    pub fn call(&mut self, method: &str, params: Value) -> anyhow::Result<Value> {
        self.next += 1;
        let id = self.next;
        let mut m = json!({"id": id, "method": method, "params": params});
        if !self.session.is_empty() {
            m["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&m)?;
        bytes.push(0);
        self.to.write_all(&bytes).context("write to chromium")?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self
                .from
                .recv_timeout(left)
                .map_err(|_| anyhow!("chromium did not answer {method} within 30 s"))?;
            if v["id"].as_u64() == Some(id) {
                if let Some(e) = v.get("error") {
                    bail!("{method}: {e}");
                }
                return Ok(v["result"].clone());
            }
            self.events.push(v);
        }
    }

    /// Takes in the events that came since the last call.
    fn drain(&mut self) {
        while let Ok(v) = self.from.try_recv() {
            self.events.push(v);
        }
    }

    /// The value of `expression` in the page (a promise is awaited).
    pub fn eval(&mut self, expression: &str) -> anyhow::Result<Value> {
        let r = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
        )?;
        if let Some(e) = r.get("exceptionDetails") {
            bail!("{expression}: {e}");
        }
        Ok(r["result"]["value"].clone())
    }

    /// Waits up to `within` for `expression` to be true in the page.
    pub fn wait_until(&mut self, within: Duration, expression: &str) -> anyhow::Result<()> {
        let deadline = Instant::now() + within;
        loop {
            if self.eval(expression).ok() == Some(Value::Bool(true)) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("not true within {within:?}: {expression}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Opens `url` and waits until the page has loaded.
    pub fn open(&mut self, url: &str) -> anyhow::Result<()> {
        let r = self.call("Page.navigate", json!({"url": url}))?;
        if let Some(e) = r.get("errorText") {
            bail!("{url}: {e}");
        }
        self.loaded(url)
    }

    /// Waits until the page at `url`, or one it moved on to, has loaded.
    pub fn loaded(&mut self, what: &str) -> anyhow::Result<()> {
        // Ask until the document is complete and is no longer about:blank.
        self.wait_until(
            Duration::from_secs(20),
            "document.readyState === 'complete' && location.href !== 'about:blank'",
        )
        .with_context(|| format!("loading {what}"))
    }

    /// A PNG of the page as it is drawn now, written to `path`.
    pub fn screenshot(&mut self, path: &Path) -> anyhow::Result<PathBuf> {
        let r = self.call(
            "Page.captureScreenshot",
            json!({"format": "png", "captureBeyondViewport": true}),
        )?;
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().context("no screenshot data")?)?;
        std::fs::write(path, png)?;
        Ok(path.to_path_buf())
    }

    /// What the page reported as errors so far: uncaught exceptions,
    /// `console.error`, and the browser's own error entries (a resource that
    /// failed to load, a blocked script).
    pub fn errors(&mut self) -> Vec<String> {
        self.drain();
        self.events
            .iter()
            .filter_map(|e| {
                let p = &e["params"];
                match e["method"].as_str()? {
                    "Runtime.exceptionThrown" => Some(p["exceptionDetails"].to_string()),
                    "Runtime.consoleAPICalled"
                        if matches!(p["type"].as_str(), Some("error" | "assert")) =>
                    {
                        Some(p["args"].to_string())
                    }
                    "Log.entryAdded" if p["entry"]["level"].as_str() == Some("error") => {
                        Some(p["entry"].to_string())
                    }
                    _ => None,
                }
            })
            .collect()
    }
}
