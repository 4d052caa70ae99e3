//! A throw-away PostgreSQL cluster: `initdb` and `pg_ctl` into a temporary
//! directory, listening only on a unix socket there, stopped and removed
//! when dropped. The simulator (`sim --store postgres`), the store suite
//! and the system tests run on one; nothing here is for production.
//!
//! PostgreSQL refuses to run as root: run as root, the cluster belongs to
//! the `postgres` system user (`runuser`). The binaries are PostgreSQL's
//! own; when they are missing the error says how to install them. A
//! watchdog process stops the cluster if its owner dies without dropping
//! it (a killed simulator, a test binary's shared cluster).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// The superuser of a throw-away cluster (trust authentication on its
/// socket, which only its owner's directory reaches).
pub const SUPERUSER: &str = "bc";
const PORT: u16 = 5432;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(
        "the PostgreSQL server programs (initdb, pg_ctl) are not installed: apt-get install postgresql (or set BC_PG_BINDIR)"
    )]
    NotInstalled,
    #[error(
        "PostgreSQL refuses to run as root and there is no postgres user to run it as: apt-get install postgresql, or run as another user"
    )]
    NoUser,
    #[error("{what} failed: {detail}")]
    Failed { what: String, detail: String },
    #[error("cannot prepare the cluster directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// How the cluster runs.
#[derive(Debug, Clone, Copy)]
pub struct ClusterOptions {
    /// Durable commits (fsync) as production runs; off for quick tests.
    pub durable: bool,
    pub max_connections: u32,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            durable: true,
            max_connections: 400,
        }
    }
}

/// A running throw-away cluster.
#[derive(Debug)]
pub struct TempCluster {
    root: PathBuf,
    bin: PathBuf,
    /// The user the server runs as (`postgres` when we are root).
    run_as: Option<String>,
    watchdog: Option<Child>,
    running: bool,
    /// Frozen by [`TempCluster::freeze`].
    frozen: bool,
    /// Its port: the unix socket's name, and TCP's once it listens there.
    port: u16,
}

/// The directory of the newest installed PostgreSQL's server programs.
pub fn bindir() -> Result<PathBuf, ClusterError> {
    if let Some(dir) = std::env::var_os("BC_PG_BINDIR") {
        let dir = PathBuf::from(dir);
        return dir
            .join("initdb")
            .exists()
            .then_some(dir)
            .ok_or(ClusterError::NotInstalled);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| ClusterError::NotInstalled)?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, b)| b)
        .ok_or(ClusterError::NotInstalled)
}

/// (uid, gid) of a user, from /etc/passwd.
fn user_ids(name: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() > 3 && f[0] == name).then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))?
    })
}

fn failed(what: &str, out: &std::process::Output) -> ClusterError {
    ClusterError::Failed {
        what: what.to_string(),
        detail: format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .trim()
        .to_string(),
    }
}

impl TempCluster {
    /// Creates and starts a cluster in a new temporary directory.
    pub fn start(opts: ClusterOptions) -> Result<TempCluster, ClusterError> {
        let bin = bindir()?;
        let root_user = rustix::process::geteuid().is_root();
        let run_as = if root_user {
            user_ids("postgres").ok_or(ClusterError::NoUser)?;
            Some("postgres".to_string())
        } else {
            None
        };
        let root = std::env::temp_dir().join(format!(
            "bc-pg-{}-{:08x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        let dir_err = |source| ClusterError::Dir {
            path: root.clone(),
            source,
        };
        std::fs::create_dir(&root).map_err(dir_err)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700)).map_err(dir_err)?;
        if let Some(user) = &run_as {
            let (uid, gid) = user_ids(user).ok_or(ClusterError::NoUser)?;
            std::os::unix::fs::chown(&root, Some(uid), Some(gid)).map_err(dir_err)?;
        }
        let mut cluster = TempCluster {
            root,
            bin,
            run_as,
            watchdog: None,
            running: false,
            frozen: false,
            port: PORT,
        };
        cluster.watchdog = cluster.spawn_watchdog().ok();
        let data = cluster.data();
        let out = cluster
            .command("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", SUPERUSER, "--auth=trust", "-E", "UTF8", "--no-sync"])
            .args(["--locale=C"])
            .output()
            .map_err(|e| ClusterError::Failed {
                what: "initdb".into(),
                detail: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(failed("initdb", &out));
        }
        let settings = format!(
            "\n# throw-away cluster\nlisten_addresses = ''\nunix_socket_directories = '{}'\n\
             port = {PORT}\nmax_connections = {}\nfsync = {}\nsynchronous_commit = on\n\
             full_page_writes = {}\nshared_buffers = 128MB\nlog_min_messages = warning\n",
            cluster.root.display(),
            opts.max_connections,
            if opts.durable { "on" } else { "off" },
            if opts.durable { "on" } else { "off" },
        );
        cluster.append_settings(&settings)?;
        cluster.start_again()?;
        Ok(cluster)
    }

    fn data(&self) -> PathBuf {
        self.root.join("data")
    }

    /// Appends `settings` to postgresql.conf (read at the next start).
    fn append_settings(&self, settings: &str) -> Result<(), ClusterError> {
        use std::io::Write;
        let conf = self.data().join("postgresql.conf");
        std::fs::OpenOptions::new()
            .append(true)
            .open(&conf)
            .and_then(|mut f| f.write_all(settings.as_bytes()))
            .map_err(|source| ClusterError::Dir { path: conf, source })
    }

    /// The cluster's directory (its socket is there).
    pub fn dir(&self) -> &Path {
        &self.root
    }

    fn command(&self, program: &str) -> Command {
        let exe = self.bin.join(program);
        let mut c = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        c.stdin(Stdio::null());
        c
    }

    /// Stops the cluster if this process dies without stopping it.
    fn spawn_watchdog(&self) -> std::io::Result<Child> {
        let stop = format!(
            "{} -D '{}' stop -m immediate",
            self.bin.join("pg_ctl").display(),
            self.data().display()
        );
        let stop = match &self.run_as {
            Some(user) => format!("runuser -u {user} -- {stop}"),
            None => stop,
        };
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 1; done; {stop} >/dev/null 2>&1; rm -rf '{dir}'",
            pid = std::process::id(),
            dir = self.root.display()
        );
        Command::new("sh")
            .args(["-c", &script])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
    }

    /// Starts the server (again, after [`TempCluster::stop`]) and waits
    /// until it accepts connections.
    pub fn start_again(&mut self) -> Result<(), ClusterError> {
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.root.join("server.log"))
            .args(["-w", "-t", "60", "start"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .output()
            .map_err(|e| ClusterError::Failed {
                what: "pg_ctl start".into(),
                detail: e.to_string(),
            })?;
        if !out.status.success() {
            let log = std::fs::read_to_string(self.root.join("server.log")).unwrap_or_default();
            return Err(ClusterError::Failed {
                what: "pg_ctl start".into(),
                detail: format!("{}\n{log}", failed("pg_ctl start", &out)),
            });
        }
        self.running = true;
        Ok(())
    }

    /// Freezes the server and every backend (SIGSTOP), as a hung database
    /// host is: connections stay open and nothing answers. `false` thaws
    /// it (SIGCONT). A frozen cluster is thawed before it is dropped.
    pub fn freeze(&mut self, frozen: bool) -> Result<(), ClusterError> {
        let pids: Vec<String> = self
            .processes("freezing the cluster")?
            .into_iter()
            .map(|(pid, _)| pid)
            .collect();
        let signal = if frozen { "-STOP" } else { "-CONT" };
        let out = Command::new("kill")
            .arg(signal)
            .args(&pids)
            .output()
            .map_err(|e| ClusterError::Failed {
                what: format!("kill {signal}"),
                detail: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(failed(&format!("kill {signal}"), &out));
        }
        self.frozen = frozen;
        Ok(())
    }

    /// The server's process and every backend and helper it started, each
    /// with the fields of its `/proc/PID/stat` after the command name
    /// (state first).
    fn processes(&self, what: &str) -> Result<Vec<(String, Vec<String>)>, ClusterError> {
        let pid = std::fs::read_to_string(self.data().join("postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().map(str::to_string))
            .ok_or_else(|| ClusterError::Failed {
                what: what.into(),
                detail: "no postmaster.pid: the cluster is not running".into(),
            })?;
        let fields = |pid: &str| -> Option<Vec<String>> {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // pid (comm) state ppid ...: the fields after the last ')'.
            let rest = stat.rsplit_once(')')?.1;
            Some(rest.split_whitespace().map(str::to_string).collect())
        };
        let mut found = vec![(
            pid.clone(),
            fields(&pid).ok_or_else(|| ClusterError::Failed {
                what: what.into(),
                detail: format!("the server's process {pid} is gone"),
            })?,
        )];
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let child = e.file_name().to_string_lossy().into_owned();
            if let Some(f) = fields(&child).filter(|f| f.get(1) == Some(&pid)) {
                found.push((child, f));
            }
        }
        Ok(found)
    }

    /// The CPU time the cluster has used so far, in seconds: the server's
    /// own, its live backends' and helpers', and that of the ones it has
    /// reaped (a backend's time counts once its connection ends, too).
    /// Benchmarks read it before and after a run.
    pub fn cpu_secs(&self) -> Result<f64, ClusterError> {
        let ticks = |f: &[String], from: usize, to: usize| -> u64 {
            f.get(from..=to)
                .into_iter()
                .flatten()
                .filter_map(|t| t.parse::<u64>().ok())
                .sum()
        };
        let processes = self.processes("reading the cluster's CPU time")?;
        // After the command name: utime and stime are fields 11 and 12,
        // the reaped children's cutime and cstime 13 and 14.
        let total: u64 = processes
            .iter()
            .enumerate()
            .map(|(i, (_, f))| ticks(f, 11, 12) + if i == 0 { ticks(f, 13, 14) } else { 0 })
            .sum();
        Ok(total as f64 / rustix::param::clock_ticks_per_second() as f64)
    }

    /// Stops the server (`fast`: open sessions are ended, as a database
    /// restart or failover ends them).
    pub fn stop(&mut self) -> Result<(), ClusterError> {
        let out = self
            .command("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args(["-w", "-t", "60", "-m", "fast", "stop"])
            .output()
            .map_err(|e| ClusterError::Failed {
                what: "pg_ctl stop".into(),
                detail: e.to_string(),
            })?;
        if !out.status.success() {
            return Err(failed("pg_ctl stop", &out));
        }
        self.running = false;
        Ok(())
    }

    /// The address of database `db` in this cluster.
    pub fn url(&self, db: &str) -> String {
        format!(
            "postgresql:///{db}?host={}&port={}&user={SUPERUSER}",
            self.root.display(),
            self.port
        )
    }

    /// Restarts the cluster listening on 127.0.0.1 as well, on a free port
    /// (which the unix socket takes too), with TLS from `cert_pem` and
    /// `key_pem`; `hba` goes first in pg_hba.conf (a rule matching first
    /// wins). Returns the port.
    pub fn serve_tls(
        &mut self,
        cert_pem: &str,
        key_pem: &str,
        hba: &str,
    ) -> Result<u16, ClusterError> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|source| ClusterError::Dir {
                path: self.root.clone(),
                source,
            })?
            .port();
        if self.running {
            self.stop()?;
        }
        let data = self.data();
        let write = |name: &str, bytes: &[u8]| -> Result<PathBuf, ClusterError> {
            use std::os::unix::fs::PermissionsExt;
            let path = data.join(name);
            let io = |source| ClusterError::Dir {
                path: path.clone(),
                source,
            };
            std::fs::write(&path, bytes).map_err(io)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(io)?;
            if let Some((uid, gid)) = self.run_as.as_deref().and_then(user_ids) {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid)).map_err(io)?;
            }
            Ok(path)
        };
        let cert = write("server.crt", cert_pem.as_bytes())?;
        let key = write("server.key", key_pem.as_bytes())?;
        let hba_path = data.join("pg_hba.conf");
        let old_hba = std::fs::read_to_string(&hba_path).map_err(|source| ClusterError::Dir {
            path: hba_path.clone(),
            source,
        })?;
        write("pg_hba.conf", format!("{hba}\n{old_hba}").as_bytes())?;
        let settings = format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {port}\nssl = on\n\
             ssl_cert_file = '{}'\nssl_key_file = '{}'\n",
            cert.display(),
            key.display()
        );
        self.append_settings(&settings)?;
        self.port = port;
        self.start_again()?;
        Ok(port)
    }

    /// Creates database `name` and returns its address.
    pub async fn create_database(&self, name: &str) -> Result<String, ClusterError> {
        create_database(&self.url("postgres"), name).await?;
        Ok(self.url(name))
    }

    /// The server's log, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.root.join("server.log")).unwrap_or_default()
    }
}

/// How long [`lock_waiters`] waits.
const LOCK_WAITERS_WITHIN: std::time::Duration = std::time::Duration::from_secs(30);

/// Waits until at least `n` other backends of `client`'s database wait for
/// a lock (`pg_stat_activity`): a test that holds a row knows the
/// transactions that want it are queued behind it. An error naming how
/// many came if fewer did within 30 s.
pub async fn lock_waiters(client: &tokio_postgres::Client, n: usize) -> Result<(), ClusterError> {
    let mut seen = 0;
    let waited = tokio::time::timeout(LOCK_WAITERS_WITHIN, async {
        loop {
            let row = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND wait_event_type = 'Lock'
                       AND pid <> pg_backend_pid()",
                    &[],
                )
                .await
                .map_err(|e| ClusterError::Failed {
                    what: "reading pg_stat_activity".into(),
                    detail: e.to_string(),
                })?;
            seen = row.get::<_, i64>(0).max(0) as usize;
            if seen >= n {
                return Ok(());
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await;
    waited.unwrap_or_else(|_| {
        Err(ClusterError::Failed {
            what: format!("waiting for {n} transactions to wait for a lock"),
            detail: format!("{seen} did within {LOCK_WAITERS_WITHIN:?}"),
        })
    })
}

/// Creates database `name` through the maintenance database at `admin`
/// (`postgres://.../postgres`) and returns the new database's address.
pub async fn create_database(admin: &str, name: &str) -> Result<String, ClusterError> {
    let fail = |e: tokio_postgres::Error| ClusterError::Failed {
        what: format!("creating database {name}"),
        detail: e.to_string(),
    };
    let (client, conn) = tokio_postgres::connect(admin, tokio_postgres::NoTls)
        .await
        .map_err(fail)?;
    let task = tokio::spawn(conn);
    let quoted = name.replace('"', "");
    client
        .batch_execute(&format!("CREATE DATABASE \"{quoted}\""))
        .await
        .map_err(fail)?;
    drop(client);
    let _ = task.await;
    Ok(replace_database(admin, &quoted))
}

/// `url` with its database replaced by `db`.
fn replace_database(url: &str, db: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let base = match base.rfind('/') {
        Some(i) if i > base.find("//").map_or(0, |j| j + 1) => &base[..i],
        _ => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

impl Drop for TempCluster {
    fn drop(&mut self) {
        if self.frozen {
            let _ = self.freeze(false);
        }
        if self.running {
            let _ = self
                .command("pg_ctl")
                .arg("-D")
                .arg(self.data())
                .args(["-m", "immediate", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let _ = std::fs::remove_dir_all(&self.root);
        if let Some(mut w) = self.watchdog.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
    }
}

/// A fresh database for a test, named after `prefix`: on the cluster whose
/// maintenance database `BC_TEST_POSTGRES` names (`scripts/test` starts
/// one), or else on a throw-away cluster this process starts on first use
/// and its watchdog stops when the process ends.
pub async fn test_database(prefix: &str) -> Result<String, ClusterError> {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU32, Ordering};
    static CLUSTER: OnceLock<Result<TempCluster, String>> = OnceLock::new();
    static N: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "{}_{}_{}",
        prefix.replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    );
    if let Ok(admin) = std::env::var("BC_TEST_POSTGRES") {
        return create_database(&admin, &name).await;
    }
    let cluster = tokio::task::spawn_blocking(|| {
        CLUSTER
            .get_or_init(|| {
                TempCluster::start(ClusterOptions {
                    durable: false,
                    ..ClusterOptions::default()
                })
                .map_err(|e| e.to_string())
            })
            .as_ref()
            .map(|c| c.url("postgres"))
            .map_err(|e| e.clone())
    })
    .await
    .map_err(|e| ClusterError::Failed {
        what: "starting the test cluster".into(),
        detail: e.to_string(),
    })?
    .map_err(|detail| ClusterError::Failed {
        what: "starting the test cluster".into(),
        detail,
    })?;
    create_database(&cluster, &name).await
}

#[cfg(test)]
mod tests {
    use super::replace_database;

    #[test]
    fn the_database_of_an_address_is_replaced() {
        assert_eq!(
            replace_database("postgresql:///postgres?host=/tmp/x&port=5432&user=bc", "t1"),
            "postgresql:///t1?host=/tmp/x&port=5432&user=bc"
        );
        assert_eq!(
            replace_database("postgres://u:p@db.example:5433/postgres", "t2"),
            "postgres://u:p@db.example:5433/t2"
        );
        assert_eq!(
            replace_database("postgres://u@db.example", "t3"),
            "postgres://u@db.example/t3"
        );
    }
}
