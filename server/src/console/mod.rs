//! The web console (`serve --console-listen ADDR`): a read-only view of the
//! fleet for a browser, on a listener of its own.
//!
//! It speaks HTTPS with the operator API's serving certificate (the
//! operator CA's), and signs a browser in either by a client certificate
//! from the operator CA, when the browser offers one, or by a token from
//! `better-compute operators login` ([`crate::pki::console`]) kept in an
//! `HttpOnly`, `Secure`, `SameSite=Strict` cookie. Both are admitted by the
//! operator API's own check ([`crate::api::auth::admit`]) on every request,
//! so revoking an operator closes the console to it at once; any role may
//! look, and nothing here changes anything.
//!
//! The pages ([`pages`]) are HTML written by the server from the same
//! handlers that answer the operator API, so a page shows what the CLI
//! prints. One small script (no build step) keeps the events live over
//! server-sent events (`/events/stream`); a content security policy allows
//! only this listener's own script and style.

pub mod pages;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::{Bytes, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use tokio::net::TcpListener;
use tracing::info;

use crate::api::AdminService;
use crate::api::auth::{Granted, Operator, Refused, admit};
use crate::api::revoked_operators::RevokedOperators;
use crate::http::bounded::{self, ClientCert, Reply};
use crate::pki::console as token;

/// The cookie that holds a console token.
pub const COOKIE: &str = "bc_console";
/// The call whose role a page view needs (any operator's).
const VIEW: &str = "/bcd.v1.Admin/ListNodes";
/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// From one address at once (a browser opens six or so).
pub const MAX_PER_ADDRESS: usize = 24;
/// The most a sign-in form may post.
const MAX_FORM: usize = 4096;
/// How long one event stream runs before the browser is told to reconnect
/// (it does, from the last event it saw).
pub const STREAM_FOR: Duration = Duration::from_secs(55);
/// How often a stream asks the store for new events.
pub const STREAM_EVERY: Duration = Duration::from_secs(1);

/// What the console answers from.
#[derive(Debug)]
pub struct Console {
    pub admin: AdminService,
    /// The worker public keys that sign console tokens.
    pub keys: Vec<Vec<u8>>,
    pub revoked: Arc<RevokedOperators>,
}

/// `--console-listen`: an address, or `off` (the default).
pub fn parse_listen(s: &str) -> Result<Option<SocketAddr>, String> {
    match s.trim() {
        "off" | "none" | "" => Ok(None),
        a => a.parse().map(Some).map_err(|_| {
            format!("--console-listen takes an address such as 127.0.0.1:9466, or off; not {s:?}")
        }),
    }
}

/// Serves the console on `listener` until the task is dropped.
pub async fn serve(listener: TcpListener, tls: Arc<rustls::ServerConfig>, console: Arc<Console>) {
    let limits = bounded::Limits {
        max_connections: MAX_CONNECTIONS,
        max_per_address: MAX_PER_ADDRESS,
        head_timeout: crate::http::HEAD_TIMEOUT,
        max_head: crate::http::MAX_HEAD,
        // An event stream ends itself (STREAM_FOR); a page is one request.
        connection_limit: Some(STREAM_FOR + Duration::from_secs(30)),
    };
    let handler: bounded::Handler = Arc::new(move |_peer, req: Request<Incoming>| {
        let console = console.clone();
        Box::pin(async move { secured(answer(&console, req).await) })
    });
    bounded::serve_tls(listener, "console", limits, tls, handler).await
}

/// The headers every answer carries: no framing, no sniffing, no caching,
/// no referrer, and scripts and styles from this listener alone.
fn secured(mut r: Reply) -> Reply {
    let h = r.headers_mut();
    for (name, value) in [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
             connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "no-referrer"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::STRICT_TRANSPORT_SECURITY, "max-age=31536000"),
    ] {
        h.insert(name, HeaderValue::from_static(value));
    }
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    r
}

fn reply(status: StatusCode, kind: &'static str, body: impl Into<Bytes>) -> Reply {
    let mut r = Response::new(bounded::full(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(kind));
    r
}

const HTML: &str = "text/html; charset=utf-8";

fn html(status: StatusCode, body: String) -> Reply {
    reply(status, HTML, body)
}

fn redirect(to: &'static str) -> Reply {
    let mut r = reply(StatusCode::SEE_OTHER, HTML, "");
    r.headers_mut()
        .insert(header::LOCATION, HeaderValue::from_static(to));
    r
}

/// Why a request is not signed in.
enum Who {
    /// It brought no credential: sign in.
    Nobody,
    /// It brought one that does not open the console, and why.
    Refused(String),
    /// The store could not be read.
    Unavailable,
}

/// The operator a request signs in as: its client certificate when the
/// browser offered one, else its cookie's token.
async fn who(c: &Console, req: &Request<Incoming>) -> Result<Operator, Who> {
    let (fp, granted) = if let Some(ClientCert(der)) = req.extensions().get::<ClientCert>() {
        (bcd_proto::fingerprint(der), Granted::of(der))
    } else if let Some(t) = cookie(req, COOKIE) {
        let opened = token::open(&c.keys, &t, crate::clock::unix_ms())
            .map_err(|r| Who::Refused(r.to_string()))?;
        (
            opened.cert_sha256,
            Granted {
                name: Some(opened.operator),
                role: Some(opened.role),
            },
        )
    } else {
        return Err(Who::Nobody);
    };
    admit(&c.admin.store, &c.revoked, &fp, &granted, VIEW)
        .await
        .map_err(|e| match e {
            Refused::Denied(d) => Who::Refused(d.status().message().to_string()),
            Refused::Store(_) => Who::Unavailable,
        })
}

/// The value of cookie `name`, if the request carries it.
fn cookie(req: &Request<Incoming>, name: &str) -> Option<String> {
    req.headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|kv| {
            let (k, v) = kv.trim().split_once('=')?;
            (k == name).then(|| v.to_string())
        })
}

/// The query's `key`, percent-decoded (`+` is a space), if present.
pub fn query(q: &str, key: &str) -> Option<String> {
    q.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (k == key).then(|| {
            percent_encoding::percent_decode_str(&v.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        })
    })
}

async fn answer(c: &Console, req: Request<Incoming>) -> Reply {
    let path = req.uri().path().to_string();
    let q = req.uri().query().unwrap_or_default().to_string();
    match (req.method().clone(), path.as_str()) {
        (Method::GET | Method::HEAD, "/console.css") => asset("text/css", pages::CSS),
        (Method::GET | Method::HEAD, "/console.js") => asset("text/javascript", pages::JS),
        (Method::GET | Method::HEAD, "/favicon.svg" | "/favicon.ico") => {
            asset("image/svg+xml", pages::ICON)
        }
        (Method::GET | Method::HEAD, "/login") => match who(c, &req).await {
            Ok(_) => redirect("/"),
            Err(_) => html(StatusCode::OK, pages::login(None)),
        },
        (Method::POST, "/login") => sign_in(c, req).await,
        (Method::POST, "/logout") => {
            let mut r = redirect("/login");
            if let Ok(v) = HeaderValue::from_str(&format!(
                "{COOKIE}=; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age=0"
            )) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        (Method::GET | Method::HEAD, _) => {
            let operator = match who(c, &req).await {
                Ok(o) => o,
                Err(Who::Nobody) if path == "/events/stream" => {
                    return reply(StatusCode::UNAUTHORIZED, "text/plain", "sign in first\n");
                }
                Err(Who::Nobody) => return redirect("/login"),
                Err(Who::Refused(why)) => {
                    return html(StatusCode::FORBIDDEN, pages::login(Some(&why)));
                }
                Err(Who::Unavailable) => {
                    return html(
                        StatusCode::SERVICE_UNAVAILABLE,
                        pages::problem(None, "the store cannot be read now; try again shortly"),
                    );
                }
            };
            if path == "/events/stream" {
                let after = req
                    .headers()
                    .get("last-event-id")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
                    .or_else(|| query(&q, "after"))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                return stream(c, after);
            }
            match pages::page(&c.admin, &operator, &path, &q).await {
                Ok(Some(body)) => html(StatusCode::OK, body),
                Ok(None) => html(
                    StatusCode::NOT_FOUND,
                    pages::problem(Some(&operator), "there is no such page"),
                ),
                Err(status) => html(
                    match status.code() {
                        tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
                        tonic::Code::NotFound => StatusCode::NOT_FOUND,
                        _ => StatusCode::SERVICE_UNAVAILABLE,
                    },
                    pages::problem(Some(&operator), status.message()),
                ),
            }
        }
        _ => reply(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "the console is read-only: pages are read with GET\n",
        ),
    }
}

fn asset(kind: &'static str, body: &'static str) -> Reply {
    let mut r = reply(StatusCode::OK, kind, body);
    r.headers_mut().insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("private, max-age=300"),
    );
    r
}

/// `POST /login`: a token from the form opens a session cookie that lasts
/// as long as the token.
async fn sign_in(c: &Console, req: Request<Incoming>) -> Reply {
    use http_body_util::BodyExt;
    // A form posted from another site is not ours to act on.
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .map(str::to_string);
    if let Some(origin) = req.headers().get(header::ORIGIN)
        && let Ok(origin) = origin.to_str()
        && origin != "null"
        && host.as_deref() != origin.split_once("://").map(|(_, h)| h)
    {
        return html(
            StatusCode::FORBIDDEN,
            pages::login(Some("that form came from another site: sign in here")),
        );
    }
    let form = match http_body_util::Limited::new(req.into_body(), MAX_FORM)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return html(
                StatusCode::PAYLOAD_TOO_LARGE,
                pages::login(Some("that form is too long to be a token")),
            );
        }
    };
    let form = String::from_utf8_lossy(&form);
    let t = query(&form, "token").unwrap_or_default();
    let t = t.trim();
    let now = crate::clock::unix_ms();
    let opened = match token::open(&c.keys, t, now) {
        Ok(o) => o,
        Err(why) => return html(StatusCode::FORBIDDEN, pages::login(Some(&why.to_string()))),
    };
    let granted = Granted {
        name: Some(opened.operator.clone()),
        role: Some(opened.role),
    };
    match admit(
        &c.admin.store,
        &c.revoked,
        &opened.cert_sha256,
        &granted,
        VIEW,
    )
    .await
    {
        Ok(o) => {
            info!(operator = %o.name, "console sign-in");
            let max_age = (opened.expires_ms - now).max(0) / 1000;
            let mut r = redirect("/");
            if let Ok(v) = HeaderValue::from_str(&format!(
                "{COOKIE}={t}; Path=/; HttpOnly; Secure; SameSite=Strict; Max-Age={max_age}"
            )) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Err(Refused::Denied(d)) => html(
            StatusCode::FORBIDDEN,
            pages::login(Some(d.status().message())),
        ),
        Err(Refused::Store(_)) => html(
            StatusCode::SERVICE_UNAVAILABLE,
            pages::login(Some("the store cannot be read now; try again shortly")),
        ),
    }
}

/// `GET /events/stream`: server-sent events, one per fleet event after
/// `after`, for [`STREAM_FOR`]; then the browser reconnects from the last.
fn stream(c: &Console, after: i64) -> Reply {
    use http_body_util::{BodyExt, StreamBody};
    let (tx, rx) =
        tokio::sync::mpsc::channel::<Result<hyper::body::Frame<Bytes>, std::io::Error>>(8);
    let admin = c.admin.clone();
    tokio::spawn(async move {
        let _ = tx
            .send(Ok(hyper::body::Frame::data(Bytes::from_static(
                b"retry: 2000\n\n",
            ))))
            .await;
        let mut after = after;
        let end = tokio::time::Instant::now() + STREAM_FOR;
        while tokio::time::Instant::now() < end {
            let read = crate::api::events::list(
                &admin,
                bcd_proto::v1::ListEventsRequest {
                    after_id: after,
                    limit: 200,
                    within_ms: if after == 0 { 60_000 } else { 0 },
                    ..Default::default()
                },
            )
            .await;
            let Ok(mut read) = read else { break };
            // A first read (no cursor) comes newest first; the page puts
            // each event on top, so send them oldest first.
            read.events.sort_by_key(|e| e.id);
            for e in read.events {
                after = after.max(e.id);
                let data = serde_json::json!({
                    "id": e.id,
                    "time": crate::words::time(e.at_ms),
                    "kind": e.kind,
                    "node": e.node_id,
                    "detail": e.detail,
                });
                let frame = format!("id: {}\ndata: {data}\n\n", e.id);
                if tx
                    .send(Ok(hyper::body::Frame::data(Bytes::from(frame))))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            tokio::time::sleep(STREAM_EVERY).await;
        }
    });
    let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx)).boxed();
    let mut r = Response::new(body);
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode_and_listen_parses() {
        assert_eq!(
            query("l=pool%3Da%2Cgpu&state=connected", "l").as_deref(),
            Some("pool=a,gpu")
        );
        assert_eq!(
            query("token=bcc1.a+b", "token").as_deref(),
            Some("bcc1.a b")
        );
        assert_eq!(query("a=1", "b"), None);
        assert_eq!(query("flag", "flag").as_deref(), Some(""));
        assert_eq!(parse_listen("off"), Ok(None));
        assert!(
            parse_listen("nowhere")
                .unwrap_err()
                .contains("127.0.0.1:9466")
        );
    }
}
