//! TLS to PostgreSQL: a real cluster serving TLS on loopback with a
//! certificate from a test CA. The store connects only to the server that
//! CA certified under the name it dialled, and takes its password from a
//! file rather than the address.

use std::path::Path;
use std::sync::Arc;

use bc_store::postgres::cluster::{ClusterOptions, TempCluster};
use bc_store::{ManualClock, Store};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};

fn ca(name: &str) -> (rcgen::Certificate, Issuer<'static, KeyPair>) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let cert = params.self_signed(&key).unwrap();
    (cert, Issuer::new(params, key))
}

/// A cluster serving TLS as `localhost` only (no IP name), with a role
/// `pw` that must log in with a password over TLS; the CA's PEM, the
/// port.
fn cluster(dir: &Path) -> (TempCluster, std::path::PathBuf, u16) {
    let mut cluster = TempCluster::start(ClusterOptions {
        durable: false,
        ..ClusterOptions::default()
    })
    .unwrap_or_else(|e| panic!("{e}"));
    let (ca_cert, issuer) = ca("store test CA");
    let ca_pem = ca_cert.pem();
    let key = KeyPair::generate().unwrap();
    let server = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let port = cluster
        .serve_tls(
            &server.pem(),
            &key.serialize_pem(),
            "hostssl all pw 127.0.0.1/32 scram-sha-256\nhost all pw 127.0.0.1/32 reject",
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", cluster.log()));
    let ca_path = dir.join("ca.pem");
    std::fs::write(&ca_path, ca_pem).unwrap();
    (cluster, ca_path, port)
}

async fn admin(cluster: &TempCluster, sql: &str) {
    let (client, conn) = tokio_postgres::connect(&cluster.url("postgres"), tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client.batch_execute(sql).await.unwrap();
}

/// Connects as the store would and asks the server whether the session is
/// encrypted.
async fn encrypted(url: &str) -> Result<bool, String> {
    let (config, tls) = bc_store::postgres::connection(url).map_err(|e| e.to_string())?;
    let tls = tls.expect("the address asks for TLS");
    let (client, conn) = config.connect(tls).await.map_err(|e| {
        use std::error::Error;
        format!("{e}: {:?}", e.source().map(|s| s.to_string()))
    })?;
    tokio::spawn(conn);
    let row = client
        .query_one(
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            &[],
        )
        .await
        .map_err(|e| e.to_string())?;
    Ok(row.get(0))
}

#[tokio::test]
async fn the_store_reaches_postgresql_over_tls_only_to_the_server_its_ca_names() {
    let d = tempfile::tempdir().unwrap();
    let (cluster, ca, port) = cluster(d.path());
    let ca = ca.display();

    // The CA it names, the name it dialled: encrypted, and a whole store
    // opens (migrates) over it.
    let url = format!("postgres://bc@localhost:{port}/postgres?sslrootcert={ca}");
    assert_eq!(encrypted(&url).await, Ok(true), "{}", cluster.log());
    let store = Store::open_postgres(&url, Arc::new(ManualClock::new(1_800_000_000_000)))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(store.now().await.is_ok());

    // The same server under a name its certificate does not carry.
    let by_ip = format!("postgres://bc@127.0.0.1:{port}/postgres?sslrootcert={ca}");
    let e = encrypted(&by_ip).await.unwrap_err();
    assert!(e.contains("certificate not valid for name"), "{e}");

    // Another CA of the same name: the server is not believed.
    let other = other_ca(d.path());
    let wrong = format!(
        "postgres://bc@localhost:{port}/postgres?sslrootcert={}",
        other.display()
    );
    let e = encrypted(&wrong).await.unwrap_err();
    assert!(e.contains("invalid peer certificate: BadSignature"), "{e}");
    drop(cluster);
}

fn other_ca(dir: &Path) -> std::path::PathBuf {
    let (cert, _) = ca("store test CA");
    let path = dir.join("other-ca.pem");
    std::fs::write(&path, cert.pem()).unwrap();
    path
}

#[tokio::test]
async fn the_password_comes_from_a_file_not_the_address() {
    let d = tempfile::tempdir().unwrap();
    let (cluster, ca, port) = cluster(d.path());
    admin(&cluster, "CREATE ROLE pw LOGIN PASSWORD 's3cret'").await;
    let pw = d.path().join("password");
    std::fs::write(&pw, "s3cret\n").unwrap();
    let base = format!(
        "postgres://pw@localhost:{port}/postgres?sslrootcert={}",
        ca.display()
    );
    let with_file = format!("{base}&password_file={}", pw.display());
    assert_eq!(encrypted(&with_file).await, Ok(true));
    std::fs::write(&pw, "wrong\n").unwrap();
    let e = encrypted(&with_file).await.unwrap_err();
    assert!(e.contains("password authentication failed"), "{e}");
    if std::env::var_os("PGPASSWORD").is_none() {
        let e = encrypted(&base).await.unwrap_err();
        assert!(e.contains("password missing"), "{e}");
    }
    // An address that would encrypt without checking the server is refused
    // before anything is dialled, saying how to check it.
    let e = bc_store::postgres::connection(&format!(
        "postgres://pw@localhost:{port}/postgres?sslmode=require"
    ))
    .err()
    .expect("refused")
    .to_string();
    assert!(e.contains("add sslrootcert="), "{e}");
}
