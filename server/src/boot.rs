//! The boot endpoint: plain HTTP for PXE clients, which speak nothing
//! else.
//!
//! - `GET /boot/ipxe?mac=MAC` answers the iPXE script for that machine: the
//!   image assigned to its MAC address, or the fleet default, with the
//!   assignment's extra kernel command line. Every request is recorded as
//!   a boot (`images boots`).
//! - `GET` or `HEAD /boot/artifacts/<sha256>` serves a registered kernel
//!   or initrd by content hash, with single `Range` requests (`206`), so
//!   an interrupted download resumes and a cache can keep it forever.
//!
//! Nothing here is secret-free by accident: what the script carries (a
//! pool join token in the assignment's command line) is as public as the
//! boot network. The artifacts are signed by the image key and checked by
//! hash; the node trusts the control plane only through the CA pin in its
//! token. Every decoder of peer bytes here (the query, the MAC, the Range
//! and Host headers) is a small pure function with property tests.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tracing::{debug, info, warn};

use crate::store::Store;

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

/// A MAC address in the form the store keeps: six lowercase hex pairs
/// joined by `:`. Accepts `:` or `-` separators, `%3A` escapes and upper
/// case, as iPXE's `${net0/mac}` and `${net0/mac:hexhyp}` give them.
pub fn parse_mac(s: &str) -> Option<String> {
    let s = s.replace("%3A", ":").replace("%3a", ":");
    let parts: Vec<&str> = s.split([':', '-']).collect();
    if parts.len() != 6 {
        return None;
    }
    let mut out = Vec::with_capacity(6);
    for p in parts {
        if p.len() != 2 || !p.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        out.push(p.to_ascii_lowercase());
    }
    Some(out.join(":"))
}

/// The `mac` parameter of a query string.
pub fn query_mac(query: &str) -> Option<String> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == "mac")
        .and_then(|(_, v)| parse_mac(v))
}

/// A `Range` header against a body of `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Range {
    /// Serve the whole body: no header, or one we ignore (several ranges,
    /// another unit, bad syntax), as RFC 9110 allows.
    Whole,
    /// Bytes `start..=end`.
    Part { start: u64, end: u64 },
    /// Nothing of the body is in the range: 416.
    Unsatisfiable,
}

pub fn parse_range(header: Option<&str>, len: u64) -> Range {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Range::Whole;
    };
    if spec.contains(',') {
        return Range::Whole;
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Range::Whole;
    };
    let num = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.len() <= 20 && s.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    match (a.trim(), b.trim()) {
        ("", suffix) => match num(suffix) {
            None => Range::Whole,
            Some(0) => Range::Unsatisfiable,
            Some(_) if len == 0 => Range::Unsatisfiable,
            Some(n) => Range::Part {
                start: len.saturating_sub(n),
                end: len - 1,
            },
        },
        (start, end) => {
            let Some(start) = num(start) else {
                return Range::Whole;
            };
            let end = match end {
                "" => None,
                e => match num(e) {
                    Some(e) => Some(e),
                    None => return Range::Whole,
                },
            };
            if end.is_some_and(|e| e < start) {
                return Range::Whole;
            }
            if start >= len {
                return Range::Unsatisfiable;
            }
            Range::Part {
                start,
                end: end.map_or(len - 1, |e| e.min(len - 1)),
            }
        }
    }
}

/// A Host header that is safe to put into a script: a host name or
/// address and an optional port, nothing else.
pub fn valid_host(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 255
        && h.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'[' | b']'))
}

/// A lowercase SHA-256 in hex.
pub fn valid_sha256(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Artifacts kept in memory after their first request: a fleet boots a
/// few images many times.
const CACHE_ENTRIES: usize = 8;

#[derive(Debug)]
struct State {
    store: Store,
    opts: BootOptions,
    cache: Mutex<HashMap<String, Bytes>>,
}

type Reply = Response<Full<Bytes>>;

fn text(status: StatusCode, body: impl Into<String>) -> Reply {
    let mut r = Response::new(Full::new(Bytes::from(body.into())));
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
        cache: Mutex::new(HashMap::new()),
    });
    info!(%addr, "boot endpoint listening");
    let task = tokio::spawn(async move {
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => c,
                Err(e) => {
                    warn!(error = %e, "boot endpoint: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let state = state.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(handle(&state, peer, req).await) }
                });
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await
                {
                    debug!(%peer, error = %e, "boot endpoint connection ended");
                }
            });
        }
    });
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
    let m = mac.clone();
    let found = state.store.run(move |s| s.image_for_mac(&m)).await;
    let remote = peer.to_string();
    let (outcome, reply) = match found {
        Err(e) => {
            warn!(error = %format!("{e:#}"), "boot endpoint: store error");
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "the server's store is unavailable; retry later\n",
            );
        }
        Ok(None) => (
            (None, "no image".to_string()),
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
            Ok((signed, manifest)) => {
                let id = signed.id().expect("a verified manifest decodes");
                let body =
                    image::ipxe_script(&manifest, &id, &image::Fetch::Http(&base), &a.append);
                (
                    (Some(a.image_id), "script".to_string()),
                    text(StatusCode::OK, body),
                )
            }
            Err(e) => {
                warn!(image = %a.image_id, error = %e, "boot endpoint: assigned image does not verify");
                (
                    (Some(a.image_id), format!("refused: {e}")),
                    text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("the assigned image does not verify: {e}\n"),
                    ),
                )
            }
        },
    };
    let ((image_id, outcome), reply) = (outcome, reply);
    let m = mac.clone();
    let o = outcome.clone();
    if let Err(e) = state
        .store
        .run(move |s| s.record_boot(&m, image_id.as_deref(), &remote, &o))
        .await
    {
        warn!(error = %format!("{e:#}"), "boot endpoint: cannot record a boot");
    }
    info!(%mac, %peer, %outcome, "iPXE script requested");
    reply
}

async fn artifact(state: &State, sha: &str, range: Option<&str>, head: bool) -> Reply {
    if !valid_sha256(sha) {
        return text(
            StatusCode::NOT_FOUND,
            "artifacts are named by their SHA-256, in lowercase hex\n",
        );
    }
    let cached = state
        .cache
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(sha)
        .cloned();
    let bytes = match cached {
        Some(b) => b,
        None => {
            let s = sha.to_string();
            match state.store.run(move |st| st.image_artifact(&s)).await {
                Ok(Some(b)) => {
                    let b = Bytes::from(b);
                    let mut cache = state.cache.lock().unwrap_or_else(|p| p.into_inner());
                    if cache.len() >= CACHE_ENTRIES {
                        cache.clear();
                    }
                    cache.insert(sha.to_string(), b.clone());
                    b
                }
                Ok(None) => return text(StatusCode::NOT_FOUND, "no such artifact\n"),
                Err(e) => {
                    warn!(error = %format!("{e:#}"), "boot endpoint: store error");
                    return text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "the server's store is unavailable; retry later\n",
                    );
                }
            }
        }
    };
    let len = bytes.len() as u64;
    let (status, body, content_range) = match parse_range(range, len) {
        Range::Whole => (StatusCode::OK, bytes, None),
        Range::Part { start, end } => (
            StatusCode::PARTIAL_CONTENT,
            bytes.slice(start as usize..=end as usize),
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
    let body_len = body.len();
    let mut r = Response::new(Full::new(if head { Bytes::new() } else { body }));
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
    if head {
        h.insert(hyper::header::CONTENT_LENGTH, body_len.into());
    }
    if let Some(cr) = content_range {
        h.insert(hyper::header::CONTENT_RANGE, cr.parse().expect("ascii"));
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn macs_in_every_form_ipxe_writes() {
        let want = Some("52:54:00:12:ab:cd".to_string());
        assert_eq!(parse_mac("52:54:00:12:AB:CD"), want);
        assert_eq!(parse_mac("52-54-00-12-ab-cd"), want);
        assert_eq!(parse_mac("52%3A54%3A00%3A12%3Aab%3Acd"), want);
        assert_eq!(parse_mac("52:54:00:12:ab"), None);
        assert_eq!(parse_mac("52:54:00:12:ab:cd:ef"), None);
        assert_eq!(parse_mac("5:254:00:12:ab:cd"), None);
        assert_eq!(parse_mac("zz:54:00:12:ab:cd"), None);
        assert_eq!(query_mac("x=1&mac=52:54:00:12:ab:cd"), want);
        assert_eq!(query_mac("mac="), None);
        assert_eq!(query_mac(""), None);
    }

    #[test]
    fn ranges_as_rfc_9110_reads_them() {
        assert_eq!(parse_range(None, 100), Range::Whole);
        assert_eq!(
            parse_range(Some("bytes=0-9"), 100),
            Range::Part { start: 0, end: 9 }
        );
        assert_eq!(
            parse_range(Some("bytes=90-"), 100),
            Range::Part { start: 90, end: 99 }
        );
        assert_eq!(
            parse_range(Some("bytes=90-500"), 100),
            Range::Part { start: 90, end: 99 }
        );
        assert_eq!(
            parse_range(Some("bytes=-10"), 100),
            Range::Part { start: 90, end: 99 }
        );
        assert_eq!(
            parse_range(Some("bytes=-500"), 100),
            Range::Part { start: 0, end: 99 }
        );
        assert_eq!(parse_range(Some("bytes=100-"), 100), Range::Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=-0"), 100), Range::Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=0-"), 0), Range::Unsatisfiable);
        assert_eq!(parse_range(Some("bytes=5-1"), 100), Range::Whole);
        assert_eq!(parse_range(Some("bytes=0-1,5-6"), 100), Range::Whole);
        assert_eq!(parse_range(Some("items=0-1"), 100), Range::Whole);
        assert_eq!(parse_range(Some("bytes=a-b"), 100), Range::Whole);
        assert_eq!(
            parse_range(Some("bytes=99999999999999999999999-"), 100),
            Range::Whole
        );
    }

    #[test]
    fn hosts_and_hashes() {
        assert!(valid_host("10.0.2.100:8080"));
        assert!(valid_host("[::1]:80"));
        assert!(valid_host("boot.example.org"));
        assert!(!valid_host("a b"));
        assert!(!valid_host("x\nkernel http://evil/"));
        assert!(!valid_host(""));
        assert!(valid_sha256(&"a".repeat(64)));
        assert!(!valid_sha256(&"A".repeat(64)));
        assert!(!valid_sha256("../../etc/passwd"));
    }

    proptest! {
        #[test]
        fn any_range_header_is_within_the_body(h in "\\PC{0,40}", len in 0u64..10_000) {
            match parse_range(Some(&h), len) {
                Range::Part { start, end } => prop_assert!(start <= end && end < len),
                Range::Whole | Range::Unsatisfiable => {}
            }
        }

        #[test]
        fn byte_ranges_cover_what_they_ask(start in 0u64..200, n in 0u64..200, len in 1u64..150) {
            let r = parse_range(Some(&format!("bytes={start}-{}", start + n)), len);
            if start >= len {
                prop_assert_eq!(r, Range::Unsatisfiable);
            } else {
                prop_assert_eq!(r, Range::Part { start, end: (start + n).min(len - 1) });
            }
        }

        #[test]
        fn any_query_gives_a_normal_mac_or_none(q in "\\PC{0,60}") {
            if let Some(m) = query_mac(&q) {
                prop_assert_eq!(parse_mac(&m), Some(m.clone()));
                prop_assert_eq!(m.len(), 17);
            }
        }

        #[test]
        fn every_mac_reads_back(b in proptest::array::uniform6(any::<u8>()), hyphen in any::<bool>()) {
            let sep = if hyphen { "-" } else { ":" };
            let s = b.iter().map(|x| format!("{x:02X}")).collect::<Vec<_>>().join(sep);
            let want = b.iter().map(|x| format!("{x:02x}")).collect::<Vec<_>>().join(":");
            prop_assert_eq!(parse_mac(&s), Some(want));
        }

        #[test]
        fn a_valid_host_never_breaks_a_script_line(h in "\\PC{0,40}") {
            if valid_host(&h) {
                prop_assert!(!h.contains(['\n', '\r', ' ', '$', '"']));
            }
        }
    }
}
