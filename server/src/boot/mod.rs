//! The boot endpoint: plain HTTP for PXE clients, which speak nothing
//! else.
//!
//! - `GET /boot/ipxe?mac=MAC` answers the iPXE script for that machine: the
//!   image assigned to its MAC address, else to the node that reported
//!   that MAC, else to that node's pool, else the fleet default
//!   (`bc_store::images::resolve`), with the assignment's extra kernel
//!   command line. An assignment made with a join token TTL gets a fresh
//!   one-use join token minted per request, and only for a MAC on the boot
//!   allow-list; any other MAC is refused. Every request is recorded as a
//!   boot (`images boots`).
//! - `GET` or `HEAD /boot/artifacts/<sha256>` serves a registered kernel
//!   or initrd by content hash, with single `Range` requests (`206`), so
//!   an interrupted download resumes and a cache can keep it forever. The
//!   bytes are streamed from the store in chunks as the client takes them:
//!   a download holds a few chunks in memory, never the artifact.
//!
//! Nothing here is secret-free by accident: what the script carries (a
//! join token in the assignment's command line, or a minted one) is as
//! public as the boot network. A minted token is one-use, short-lived and
//! handed only to allowed MAC addresses, and a MAC has at most one unspent
//! minted token (each request replaces it), so a flood of requests mints
//! no pile of tokens; a literal token in an assignment is readable by
//! anyone until it runs out. The artifacts are signed by the image key and checked by
//! hash; the node trusts the control plane only through the CA pin in its
//! token. Every decoder of peer bytes here (the query, the MAC, the Range
//! and Host headers) is a small pure function with property tests
//! ([`parse`]).

pub mod parse;

use bc_store::TokenId;
use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::BodyExt;
use hyper::body::{Bytes, Frame};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tracing::{info, warn};

use bc_store::Store;
use bc_store::images::{BootRecord, valid_sha256};
use bcd_proto::typed::Spelling;
use bcd_proto::v1;

/// What the boot endpoint records for an outcome: its spelling, and for a
/// refusal why (`refused: <why>`).
pub fn record(outcome: v1::BootOutcome, detail: &str) -> String {
    match outcome {
        v1::BootOutcome::Refused => format!("{}: {detail}", outcome.spelling()),
        v1::BootOutcome::Script | v1::BootOutcome::NoImage | v1::BootOutcome::Unspecified => {
            outcome.spelling().to_string()
        }
    }
}

/// A recorded outcome, typed; rows written before outcomes were typed
/// (`no image`) read back too.
pub fn outcome(recorded: &str) -> (v1::BootOutcome, String) {
    if let Some(why) = recorded.strip_prefix("refused: ") {
        return (v1::BootOutcome::Refused, why.to_string());
    }
    match recorded {
        "no image" => (v1::BootOutcome::NoImage, String::new()),
        other => match bcd_proto::typed::parse::<v1::BootOutcome>(other) {
            Some(o) => (o, String::new()),
            None => (v1::BootOutcome::Unspecified, other.to_string()),
        },
    }
}

pub use parse::{Range, parse_mac, parse_range, query_mac, valid_host};

/// How the boot endpoint runs.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct BootOptions {
    /// Serve iPXE scripts and images over plain HTTP on this address
    /// (e.g. 0.0.0.0:8080); off without it.
    #[arg(long = "boot-listen", id = "boot_listen")]
    pub listen: Option<SocketAddr>,
    /// The URL nodes reach the boot endpoint at, for the scripts (default:
    /// http:// and the Host the request came to).
    #[arg(long = "boot-url", id = "boot_url")]
    pub url: Option<String>,
    /// An image public key (hex, from images keygen); repeatable. Only
    /// images signed by one of them are registered and served.
    #[arg(long = "image-pubkey", value_parser = parse_key)]
    pub image_keys: Vec<Vec<u8>>,
}

fn parse_key(s: &str) -> Result<Vec<u8>, String> {
    hex::decode(s.trim())
        .ok()
        .filter(|b| b.len() == 32)
        .ok_or_else(|| {
            format!("--image-pubkey takes 64 hex digits (images keygen prints them), not {s:?}")
        })
}

/// The bytes of an artifact read from the store at a time.
const CHUNK: u32 = 256 << 10;

/// Chunks read ahead of what the client has taken.
const AHEAD: usize = 2;

#[derive(Debug)]
struct State {
    store: Store,
    opts: BootOptions,
    /// The fleet CA's pin, for the tokens the endpoint mints.
    ca_pin: String,
    /// The join service's seal key, for the same tokens.
    seal_key: [u8; 32],
    /// Digests the secrets of the tokens it mints.
    secrets: crate::pki::ca::SecretDigest,
}

type Reply = crate::http::bounded::Reply;

/// What one boot client may hold: iPXE clients fetch a script, a kernel
/// and an initrd over one or a few connections; a peer that opens more, or
/// sends its request head slowly, is closed. Downloads run at the client's
/// pace (no overall time limit).
pub const LIMITS: crate::http::bounded::Limits = crate::http::bounded::Limits {
    max_connections: 256,
    // A machine's firmware and iPXE use a few; a rack behind one NAT
    // address shares these.
    max_per_address: 32,
    head_timeout: std::time::Duration::from_secs(10),
    max_head: 8192,
    connection_limit: None,
};

fn text(status: StatusCode, body: impl Into<String>) -> Reply {
    let mut r = Response::new(crate::http::bounded::full(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Binds the boot endpoint and serves it until the task is dropped.
/// Returns the bound address.
pub async fn start(
    opts: BootOptions,
    store: Store,
    (ca_pin, seal_key, secrets): (String, [u8; 32], crate::pki::ca::SecretDigest),
) -> anyhow::Result<Option<(SocketAddr, tokio::task::JoinHandle<()>)>> {
    let Some(listen) = opts.listen else {
        return Ok(None);
    };
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {listen} for the boot endpoint: {e}"))?;
    let addr = listener.local_addr()?;
    let state = Arc::new(State {
        store,
        opts,
        ca_pin,
        seal_key,
        secrets,
    });
    info!(%addr, "boot endpoint listening");
    let handler: crate::http::bounded::Handler = Arc::new(move |peer, req| {
        let state = state.clone();
        Box::pin(async move { handle(&state, peer, req).await })
    });
    let task = tokio::spawn(crate::http::bounded::serve(
        listener,
        "boot endpoint",
        LIMITS,
        handler,
    ));
    Ok(Some((addr, task)))
}

async fn handle(state: &State, peer: SocketAddr, req: Request<hyper::body::Incoming>) -> Reply {
    let path = req.uri().path().to_string();
    let head = req.method() == Method::HEAD;
    if req.method() != Method::GET && !head {
        return text(StatusCode::METHOD_NOT_ALLOWED, "GET or HEAD\n");
    }
    if path == "/boot/ipxe" {
        return script(state, peer, &req).await;
    }
    if let Some(sha) = path.strip_prefix("/boot/artifacts/") {
        let range = req
            .headers()
            .get(hyper::header::RANGE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        return artifact(state, sha, range.as_deref(), head).await;
    }
    text(
        StatusCode::NOT_FOUND,
        "not found: the boot endpoint serves /boot/ipxe?mac=MAC and /boot/artifacts/SHA256\n",
    )
}

async fn script(state: &State, peer: SocketAddr, req: &Request<hyper::body::Incoming>) -> Reply {
    let Some(mac) = req.uri().query().and_then(query_mac) else {
        return text(
            StatusCode::BAD_REQUEST,
            "pass the booting MAC address: /boot/ipxe?mac=${net0/mac}\n",
        );
    };
    let base = match &state.opts.url {
        Some(u) => format!("{}/boot/artifacts", u.trim_end_matches('/')),
        None => {
            let host = req
                .headers()
                .get(hyper::header::HOST)
                .and_then(|h| h.to_str().ok())
                .filter(|h| valid_host(h));
            match host {
                Some(h) => format!("http://{h}/boot/artifacts"),
                None => {
                    return text(
                        StatusCode::BAD_REQUEST,
                        "no usable Host header: start serve with --boot-url http://HOST:PORT\n",
                    );
                }
            }
        }
    };
    let found = state.store.image_for_mac(&mac).await;
    let remote = peer.to_string();
    let (outcome, reply) = match found {
        Err(e) => {
            warn!(error = %e, "boot endpoint: store error");
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server's store is unavailable; retry later\n",
            );
        }
        Ok(None) => (
            (None, record(v1::BootOutcome::NoImage, "")),
            text(
                StatusCode::NOT_FOUND,
                format!(
                    "no image for {mac}: better-compute images assign IMAGE --default (or --mac {mac})\n"
                ),
            ),
        ),
        Ok(Some(a)) => match image::SignedManifest::parse(&a.signed_manifest)
            .and_then(|s| s.verify(&state.opts.image_keys).map(|m| (s, m)))
        {
            Ok((signed, manifest)) => match with_token(state, &mac, &a).await {
                Err(reply) => return reply,
                Ok(Err(why)) => (
                    (Some(a.image_id), record(v1::BootOutcome::Refused, &why)),
                    text(
                        StatusCode::FORBIDDEN,
                        format!(
                            "{why}: an operator allows it with better-compute images allow-mac \
                             {mac}\n"
                        ),
                    ),
                ),
                Ok(Ok(append)) => {
                    let id = signed.id().expect("a verified manifest decodes");
                    let body =
                        image::ipxe_script(&manifest, &id, &image::Fetch::Http(&base), &append);
                    (
                        (Some(a.image_id), record(v1::BootOutcome::Script, "")),
                        text(StatusCode::OK, body),
                    )
                }
            },
            Err(e) => {
                warn!(image = %a.image_id, error = %e, "boot endpoint: assigned image does not verify");
                (
                    (
                        Some(a.image_id),
                        record(v1::BootOutcome::Refused, &e.to_string()),
                    ),
                    text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("the assigned image does not verify: {e}\n"),
                    ),
                )
            }
        },
    };
    let ((image_id, outcome), reply) = (outcome, reply);
    let record = BootRecord {
        mac: mac.clone(),
        image_id,
        remote,
        outcome: outcome.clone(),
    };
    if let Err(e) = state.store.record_boot(&record).await {
        warn!(error = %e, "boot endpoint: cannot record a boot");
    }
    info!(%mac, %peer, %outcome, "iPXE script requested");
    reply
}

/// What the script of assignment `a` appends to the kernel command line
/// for `mac`: the assignment's text, and for an assignment that mints
/// tokens a fresh one-use join token (`Err(why)` for a MAC not on the
/// allow-list; the outer `Err` is the reply to a store failure).
async fn with_token(
    state: &State,
    mac: &str,
    a: &bc_store::images::Assigned,
) -> Result<Result<String, String>, Reply> {
    let Some(ttl_ms) = a.mint_ttl_ms else {
        return Ok(Ok(a.append.clone()));
    };
    let (id, secret) = bc_store::tokens::new_token_secret();
    let token = bcd_proto::token::JoinToken {
        id,
        secret,
        ca_pin: state.ca_pin.clone(),
        seal_key: Some(state.seal_key),
    };
    let new = bc_store::tokens::NewToken {
        id: TokenId::from(token.id.clone()),
        secret_sha256: state.secrets.of(&token.secret),
        ttl: std::time::Duration::from_millis(ttl_ms.max(0) as u64),
        uses: 1,
        description: bc_store::images::minted_description(mac),
        pool: bc_store::images::mint_pool(&a.target),
    };
    match state.store.mint_boot_token(mac, &new).await {
        Err(e) => {
            warn!(error = %e, "boot endpoint: store error");
            Err(text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server's store is unavailable; retry later\n",
            ))
        }
        Ok(None) => Ok(Err(format!(
            "{mac} is not on the boot allow-list, and its assignment ({}) hands out join tokens \
             only to MAC addresses on it",
            a.target
        ))),
        Ok(Some(m)) => {
            info!(%mac, token = %token.id, pool = ?m.pool, replaced = m.replaced, "join token minted for a boot");
            Ok(Ok(format!("{} bcd.token={token}", a.append)
                .trim()
                .to_string()))
        }
    }
}

/// `len` bytes of artifact `sha` from `from`, read from the store a chunk
/// at a time as the client takes them. A store failure or an artifact that
/// ends early ends the body with an error (hyper closes the connection; the
/// client resumes with a Range request).
fn stream(store: Store, sha: String, from: u64, len: u64) -> crate::http::bounded::Body {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(AHEAD);
    tokio::spawn(async move {
        let end = from + len;
        let mut at = from;
        while at < end {
            let want = (end - at).min(u64::from(CHUNK)) as u32;
            let next = match store.image_artifact_chunk(&sha, at, want).await {
                Ok(Some(data)) if !data.is_empty() => {
                    at += data.len() as u64;
                    Ok(Frame::data(Bytes::from(data)))
                }
                Ok(_) => Err(std::io::Error::other("the artifact ended early")),
                Err(e) => {
                    warn!(error = %e, "boot endpoint: store error mid-download");
                    Err(std::io::Error::other("the store is unavailable"))
                }
            };
            let failed = next.is_err();
            if tx.send(next).await.is_err() || failed {
                return;
            }
        }
    });
    http_body_util::StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)).boxed()
}

async fn artifact(state: &State, sha: &str, range: Option<&str>, head: bool) -> Reply {
    if !valid_sha256(sha) {
        return text(
            StatusCode::NOT_FOUND,
            "artifacts are named by their SHA-256, in lowercase hex\n",
        );
    }
    let len = match state.store.image_artifact_size(sha).await {
        Ok(Some(n)) => n,
        Ok(None) => return text(StatusCode::NOT_FOUND, "no such artifact\n"),
        Err(e) => {
            warn!(error = %e, "boot endpoint: store error");
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server's store is unavailable; retry later\n",
            );
        }
    };
    // The bytes to send: `from` and how many.
    let (status, from, body_len, content_range) = match parse_range(range, len) {
        Range::Whole => (StatusCode::OK, 0, len, None),
        Range::Part { start, end } => (
            StatusCode::PARTIAL_CONTENT,
            start,
            end - start + 1,
            Some(format!("bytes {start}-{end}/{len}")),
        ),
        Range::Unsatisfiable => {
            let mut r = text(StatusCode::RANGE_NOT_SATISFIABLE, "");
            r.headers_mut().insert(
                hyper::header::CONTENT_RANGE,
                format!("bytes */{len}").parse().expect("ascii"),
            );
            return r;
        }
    };
    let body = if head {
        crate::http::bounded::full(Bytes::new())
    } else {
        stream(state.store.clone(), sha.to_string(), from, body_len)
    };
    let mut r = Response::new(body);
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        hyper::header::CONTENT_TYPE,
        "application/octet-stream".parse().expect("ascii"),
    );
    h.insert(
        hyper::header::ACCEPT_RANGES,
        "bytes".parse().expect("ascii"),
    );
    h.insert(
        hyper::header::ETAG,
        format!("\"{sha}\"").parse().expect("ascii"),
    );
    h.insert(
        hyper::header::CACHE_CONTROL,
        "public, max-age=31536000, immutable"
            .parse()
            .expect("ascii"),
    );
    // The length is known before the bytes: a streamed body says it too,
    // so clients can show progress and resume.
    h.insert(hyper::header::CONTENT_LENGTH, body_len.into());
    if let Some(cr) = content_range {
        h.insert(hyper::header::CONTENT_RANGE, cr.parse().expect("ascii"));
    }
    r
}
