//! The fence time of a gateway whose database fails: a gateway at the
//! default timings (a 20 s lease renewed every 5 s) on a PostgreSQL cluster
//! of its own, a fleet connected and commands running, then the database
//! hangs (every backend frozen: connections open, nothing answers) or stops
//! (connections refused). The gateway must stop admitting sessions within
//! half its lease of the last renewal that answered (10 s), well before the
//! lease can pass to another gateway. Used by the system test that holds
//! the bound and by `bench-fence`, which prints the figures.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bc_store::postgres::cluster::{ClusterOptions, TempCluster};

use crate::{Server, bin, wait_for};

/// How the database fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Every backend frozen (SIGSTOP): open connections get no answer.
    Hung,
    /// The server stopped: connections are refused at once.
    Stopped,
}

impl Failure {
    pub fn name(self) -> &'static str {
        match self {
            Failure::Hung => "hung",
            Failure::Stopped => "stopped",
        }
    }
}

/// A cluster of the caller's own (to stop, start or freeze) and a database
/// `name` on it.
pub fn own_cluster(name: &str) -> (TempCluster, String) {
    let cluster = TempCluster::start(ClusterOptions {
        durable: false,
        ..Default::default()
    })
    .unwrap();
    let url = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(cluster.create_database(name))
        .unwrap();
    (cluster, url)
}

/// `bcd sim` with `nodes` simulated nodes against the gateway at `url`.
pub fn bcd_sim(url: &str, token: &str, dir: &Path, nodes: usize, log: &Path) -> Child {
    Command::new(bin("bcd"))
        .args(["sim", "--nodes", &nodes.to_string(), "--server", url])
        .args(["--token", token, "--duration", "1h"])
        .arg("--data-dir")
        .arg(dir)
        .env("BCD_LOG", "info,bcd_agent=debug")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start bcd sim")
}

/// One gateway at the default timings with `nodes` connected and a
/// command running on each; the database fails as `failure` says. Returns
/// the time from the failure to the gateway's fence, once the database is
/// back, the gateway holds its lease again and the fleet has reconnected.
pub fn fence_time(failure: Failure, nodes: usize) -> Duration {
    let (mut cluster, url) = own_cluster(failure.name());
    let d = tempfile::tempdir().unwrap();
    let g = Server::start_postgres(&d.path().join("server"), &url, &["--gateway-id", "gw-h"])
        .expect("gateway starts");
    let sim_log = d.path().join("sim.log");
    let mut sim = bcd_sim(
        &g.url(),
        &g.token(nodes as u32),
        &d.path().join("nodes"),
        nodes,
        &sim_log,
    );
    let connected = |s: &Server| s.nodes().iter().filter(|n| n.state == "connected").count();
    wait_for(Duration::from_secs(60), "the fleet connected", || {
        (connected(&g) == nodes).then_some(())
    });
    for n in g.nodes() {
        g.run_command(&n.node_id, "exec.run", &["/bin/sh", "-c", "sleep 1"]);
    }
    assert!(!g.proc.log().contains("fencing"), "{}", g.proc.log());
    match failure {
        Failure::Hung => cluster.freeze(true).unwrap(),
        Failure::Stopped => cluster.stop().unwrap(),
    }
    let failed = Instant::now();
    wait_for(Duration::from_secs(20), "the gateway fenced", || {
        g.proc.log().contains("fencing").then_some(())
    });
    let fenced_in = failed.elapsed();
    match failure {
        Failure::Hung => cluster.freeze(false).unwrap(),
        Failure::Stopped => cluster.start_again().unwrap(),
    }
    wait_for(
        Duration::from_secs(30),
        "the gateway holding its lease again",
        || {
            g.proc
                .log()
                .contains("holding the gateway lease; admitting sessions")
                .then_some(())
        },
    );
    wait_for(Duration::from_secs(60), "the fleet connected again", || {
        (connected(&g) == nodes).then_some(())
    });
    let _ = sim.kill();
    let _ = sim.wait();
    fenced_in
}
