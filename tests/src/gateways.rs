//! What a gateway process is and holds, for the tests that start one or
//! play one: its credential, the process, and the key holder's
//! GatewayServices port reached with its certificate.

use std::path::Path;

use bcd_proto::v1::gateway_services_client::GatewayServicesClient;
use better_compute::gateway::credential::{self, GatewayCredential};
use rcgen::KeyPair;

use crate::{FAST, Server, stderr};

/// Adds a gateway credential on `server` and writes it to `out`; returns
/// what it printed on stderr.
pub fn add_gateway(server: &Server, name: &str, out: &Path) -> String {
    let o = server.cli(&[
        "gateways",
        "add",
        name,
        "--upstream",
        &server.url(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "gateways add: {}", stderr(&o));
    stderr(&o)
}

/// Starts a gateway-only process in `dir` on `server`'s SQLite store.
pub fn start_gateway(server: &Server, dir: &Path, credential: &Path, id: &str) -> Server {
    let store = format!("sqlite:{}", server.dir.join("store.db").display());
    start_gateway_on(&store, dir, credential, id)
}

/// Starts a gateway-only process in `dir` on the store at `store`.
pub fn start_gateway_on(store: &str, dir: &Path, credential: &Path, id: &str) -> Server {
    let mut args = FAST.to_vec();
    args.extend([
        "--role",
        "gateway",
        "--credential",
        credential.to_str().unwrap(),
        "--store",
        store,
        "--gateway-id",
        id,
    ]);
    Server::start(dir, &args).unwrap()
}

/// A runtime for the calls a test makes as a gateway.
pub fn runtime() -> tokio::runtime::Runtime {
    // Threads of its own: the tampering relay serves while the test waits
    // on a bcd process.
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// `message` signed (ECDSA P-256, DER) with the key in `key_pem`: what a
/// node key, or a gateway's own key, signs.
pub fn sign(key_pem: &str, message: &[u8]) -> Vec<u8> {
    rcgen::SigningKey::sign(&KeyPair::from_pem(key_pem).unwrap(), message).unwrap()
}

/// What a compromised gateway holds: its credential's certificate, and
/// the key holder's GatewayServices port reached with it.
pub fn gateway_port(
    rt: &tokio::runtime::Runtime,
    cred: &GatewayCredential,
) -> (
    credential::Certified,
    GatewayServicesClient<tonic::transport::Channel>,
) {
    let certified = rt.block_on(credential::certify(cred, &[])).unwrap();
    let channel = rt
        .block_on(credential::upstream_channel(cred, &certified))
        .unwrap();
    (certified, GatewayServicesClient::new(channel))
}

/// Runs the SQL `gateways add` printed (in `printed`) on the PostgreSQL
/// store at `url`, as a user who may create roles; returns the address
/// the gateway connects with, as the login role it made.
pub fn database_role(url: &str, printed: &str) -> String {
    let sql = &printed[printed
        .find("CREATE ROLE")
        .expect("the role's SQL is printed")..];
    let login = sql
        .split('"')
        .nth(1)
        .expect("the login role is named")
        .to_string();
    runtime().block_on(async {
        let config = bc_store::postgres::config(url).unwrap();
        let (c, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        c.batch_execute(sql).await.unwrap();
    });
    format!(
        "{}&user={login}",
        url.split("&user=")
            .next()
            .expect("the test address names its user")
    )
}
