//! The console's pages: HTML written here from the operator API's own
//! handlers, every value escaped ([`esc`]); the style, the one script and
//! the icon are served as they are written below.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use bcd_proto::v1::{
    self, CommandInfo, FleetEvent, ListCommandsRequest, ListEventsRequest, ListNodesRequest,
    NodeInfo, NodeState, RolloutState,
};
use tonic::Status;

use super::query;
use crate::api::AdminService;
use crate::api::auth::Operator;
use crate::words::{age, spelled, time};

pub const CSS: &str = include_str!("console.css");
pub const JS: &str = include_str!("console.js");
pub const ICON: &str = include_str!("favicon.svg");

/// Events a page shows at first (newer ones arrive live).
const EVENTS_SHOWN: u32 = 100;
/// Nodes one page of the list shows.
pub const NODES_PER_PAGE: u32 = 500;

/// `text` made safe inside HTML text and quoted attributes.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// `text` inside a URL's query or path segment.
fn url_part(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

const NAV: &[(&str, &str)] = &[
    ("/", "Fleet"),
    ("/nodes", "Nodes"),
    ("/events", "Events"),
    ("/rollouts", "Rollouts"),
    ("/commands", "Commands"),
];

/// A whole page around `body`.
fn layout(operator: Option<&Operator>, title: &str, body: &str) -> String {
    let mut nav = String::new();
    if let Some(o) = operator {
        nav.push_str("<nav>");
        for (href, name) in NAV {
            let _ = write!(nav, "<a href=\"{href}\">{name}</a>");
        }
        let _ = write!(
            nav,
            "</nav><form class=\"who\" method=\"post\" action=\"/logout\"><span>{} ({})</span>\
             <button type=\"submit\">Sign out</button></form>",
            esc(&o.name),
            esc(o.role.as_str())
        );
    }
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{t} · better-compute</title>\
         <link rel=\"stylesheet\" href=\"/console.css\">\
         <link rel=\"icon\" href=\"/favicon.svg\" type=\"image/svg+xml\">\
         <script src=\"/console.js\" defer></script></head>\
         <body><header><a class=\"brand\" href=\"/\">better-compute</a>{nav}</header>\
         <main><h1>{t}</h1>\n{body}</main></body></html>\n",
        t = esc(title)
    )
}

/// The sign-in page, with why the last try failed.
pub fn login(why: Option<&str>) -> String {
    let why = why
        .map(|w| format!("<p class=\"problem\" role=\"alert\">{}</p>", esc(w)))
        .unwrap_or_default();
    layout(
        None,
        "Sign in",
        &format!(
            "{why}<p>Mint a token with <code>better-compute operators login</code> and paste \
             it here; a browser holding an operator certificate is signed in without one.</p>\
             <form class=\"login\" method=\"post\" action=\"/login\">\
             <label for=\"token\">Console token</label>\
             <input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"off\" \
             spellcheck=\"false\" required placeholder=\"bcc1.…\">\
             <button type=\"submit\">Sign in</button></form>"
        ),
    )
}

/// A page that says what went wrong.
pub fn problem(operator: Option<&Operator>, why: &str) -> String {
    layout(
        operator,
        "Not shown",
        &format!("<p class=\"problem\" role=\"alert\">{}</p>", esc(why)),
    )
}

/// The page at `path` with query `q`, or `None` for no such page.
pub async fn page(
    svc: &AdminService,
    o: &Operator,
    path: &str,
    q: &str,
) -> Result<Option<String>, Status> {
    Ok(Some(match path {
        "/" => fleet(svc, o).await?,
        "/nodes" => nodes(svc, o, q).await?,
        "/events" => events(svc, o, q).await?,
        "/rollouts" => rollouts(svc, o).await?,
        "/commands" => commands(svc, o, q).await?,
        _ => match path.strip_prefix("/nodes/") {
            Some(id) if !id.is_empty() && !id.contains('/') => {
                let id = percent_encoding::percent_decode_str(id)
                    .decode_utf8_lossy()
                    .into_owned();
                node(svc, o, &id).await?
            }
            _ => return Ok(None),
        },
    }))
}

/// A table: its id, its column heads, and rows of cells already escaped
/// (each row with the attributes of its `<tr>`).
fn table(id: &str, heads: &[&str], rows: &[(String, Vec<String>)]) -> String {
    let mut t = format!("<table id=\"{id}\"><thead><tr>");
    for h in heads {
        let _ = write!(t, "<th>{h}</th>");
    }
    let _ = write!(t, "</tr></thead><tbody id=\"{id}-rows\">");
    for (attrs, cells) in rows {
        let _ = write!(t, "<tr {attrs}>");
        for c in cells {
            let _ = write!(t, "<td>{c}</td>");
        }
        t.push_str("</tr>");
    }
    t.push_str("</tbody></table>\n");
    t
}

fn node_link(id: &str) -> String {
    if id.is_empty() {
        return "-".into();
    }
    format!("<a href=\"/nodes/{}\">{}</a>", url_part(id), esc(id))
}

fn dash(s: &str) -> String {
    if s.is_empty() { "-".into() } else { esc(s) }
}

fn labels(n: &NodeInfo) -> String {
    n.intent
        .as_ref()
        .map(|i| crate::labels::show(&i.labels))
        .unwrap_or_default()
}

async fn all_nodes(
    svc: &AdminService,
    r: ListNodesRequest,
) -> Result<v1::ListNodesResponse, Status> {
    crate::api::nodes::list(svc, r).await
}

fn event_rows(events: &[FleetEvent]) -> Vec<(String, Vec<String>)> {
    events
        .iter()
        .rev()
        .map(|e| {
            (
                format!("data-event=\"{}\"", e.id),
                vec![
                    esc(&time(e.at_ms)),
                    esc(&e.kind),
                    node_link(&e.node_id),
                    esc(&e.detail),
                ],
            )
        })
        .collect()
}

/// A live events table: newest first, and the script adds what comes.
fn live_events(events: &[FleetEvent]) -> String {
    let after = events.iter().map(|e| e.id).max().unwrap_or(0);
    let t = table(
        "events",
        &["Time", "Kind", "Node", "Detail"],
        &event_rows(events),
    );
    format!(
        "<p class=\"live\">Newest first. <span id=\"live\" data-after=\"{after}\">\
         connecting…</span></p>{t}"
    )
}

async fn fleet(svc: &AdminService, o: &Operator) -> Result<String, Status> {
    let nodes = all_nodes(svc, ListNodesRequest::default()).await?.nodes;
    let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
    let mut cordoned = 0;
    let mut pools: BTreeMap<String, usize> = BTreeMap::new();
    for n in &nodes {
        *by_state.entry(spelled::<NodeState>(n.state)).or_default() += 1;
        if n.intent.as_ref().is_some_and(|i| i.cordoned) || !n.intent_error.is_empty() {
            cordoned += 1;
        }
        if !n.pool.is_empty() {
            *pools.entry(n.pool.clone()).or_default() += 1;
        }
    }
    let rollouts = crate::api::rollouts::list(svc).await?.rollouts;
    let active = rollouts
        .iter()
        .filter(|r| {
            matches!(
                RolloutState::try_from(r.state),
                Ok(RolloutState::Running | RolloutState::Paused)
            )
        })
        .count();
    let gateways = crate::api::gateways::list(svc).await?.gateways;
    let live_gateways = gateways.iter().filter(|g| g.revoked_at_ms == 0).count();
    let events = crate::api::events::list(
        svc,
        ListEventsRequest {
            limit: 20,
            ..Default::default()
        },
    )
    .await?
    .events;
    let mut body = String::from("<section class=\"tiles\">");
    let tile = |body: &mut String, figure: String, what: &str, href: &str| {
        let _ = write!(
            body,
            "<a class=\"tile\" href=\"{href}\"><span class=\"figure\">{figure}</span>\
             <span>{what}</span></a>"
        );
    };
    tile(&mut body, nodes.len().to_string(), "nodes", "/nodes");
    for (state, count) in &by_state {
        tile(
            &mut body,
            count.to_string(),
            &esc(state),
            &format!("/nodes?state={}", url_part(state)),
        );
    }
    tile(&mut body, cordoned.to_string(), "cordoned", "/nodes");
    tile(
        &mut body,
        active.to_string(),
        "rollouts running",
        "/rollouts",
    );
    tile(
        &mut body,
        live_gateways.to_string(),
        "gateway credentials",
        "/",
    );
    body.push_str("</section>\n");
    if !pools.is_empty() {
        body.push_str("<h2>Pools</h2><ul class=\"pools\">");
        for (pool, count) in &pools {
            let _ = write!(body, "<li>{}: {count}</li>", esc(pool));
        }
        body.push_str("</ul>\n");
    }
    body.push_str("<h2>Events</h2>");
    body.push_str(&live_events(&events));
    Ok(layout(Some(o), "Fleet", &body))
}

async fn nodes(svc: &AdminService, o: &Operator, q: &str) -> Result<String, Status> {
    let selector = query(q, "l").unwrap_or_default();
    let state = query(q, "state").unwrap_or_default();
    let state_wire = match state.as_str() {
        "" => NodeState::Unspecified,
        s => crate::words::node_state_filter(s).ok_or_else(|| {
            Status::invalid_argument(format!(
                "there is no node state {s:?} to filter by: choose connected, disconnected \
                 or unreachable"
            ))
        })?,
    };
    let after = query(q, "after").unwrap_or_default();
    let r = all_nodes(
        svc,
        ListNodesRequest {
            label_selector: selector.clone(),
            state: state_wire as i32,
            limit: NODES_PER_PAGE,
            after,
            ..Default::default()
        },
    )
    .await?;
    let rows: Vec<_> = r
        .nodes
        .iter()
        .map(|n| {
            (
                format!(
                    "data-node=\"{}\" data-state=\"{}\"",
                    esc(&n.node_id),
                    esc(&spelled::<NodeState>(n.state))
                ),
                vec![
                    node_link(&n.node_id),
                    dash(&n.hostname),
                    esc(&crate::words::node_state(n)),
                    dash(&n.gateway_id),
                    esc(&age(n.last_seen_age_ms)),
                    dash(&n.agent_version),
                    dash(&n.pool),
                    dash(&labels(n)),
                    dash(&n.conditions.join(", ")),
                ],
            )
        })
        .collect();
    let mut body = format!(
        "<form class=\"filter\" method=\"get\" action=\"/nodes\">\
         <label>Labels <input name=\"l\" value=\"{}\" placeholder=\"pool=a,gpu!=h100\"></label>\
         <label>State <input name=\"state\" value=\"{}\" placeholder=\"connected\"></label>\
         <button type=\"submit\">Filter</button></form>\
         <p>{} nodes.</p>",
        esc(&selector),
        esc(&state),
        r.nodes.len()
    );
    body.push_str(&table(
        "nodes",
        &[
            "Node",
            "Hostname",
            "State",
            "Gateway",
            "Last seen",
            "Version",
            "Pool",
            "Labels",
            "Conditions",
        ],
        &rows,
    ));
    if !r.next_after.is_empty() {
        let _ = write!(
            body,
            "<p><a rel=\"next\" href=\"/nodes?l={}&amp;state={}&amp;after={}\">More nodes</a></p>",
            url_part(&selector),
            url_part(&state),
            url_part(&r.next_after)
        );
    }
    Ok(layout(Some(o), "Nodes", &body))
}

fn command_rows(commands: &[CommandInfo]) -> Vec<(String, Vec<String>)> {
    commands
        .iter()
        .map(|c| {
            (
                format!("data-command=\"{}\"", esc(&c.command_id)),
                vec![
                    esc(&c.command_id),
                    node_link(&c.node_id),
                    esc(&spelled::<v1::CommandKind>(c.kind)),
                    esc(&c.summary),
                    esc(&crate::words::command_state(c)),
                    if c.has_exit_code {
                        c.exit_code.to_string()
                    } else {
                        "-".into()
                    },
                    esc(&time(c.created_at_ms)),
                    dash(&c.reason),
                ],
            )
        })
        .collect()
}

const COMMAND_HEADS: &[&str] = &[
    "Command", "Node", "Kind", "Summary", "State", "Exit", "Created", "Reason",
];

async fn node(svc: &AdminService, o: &Operator, id: &str) -> Result<String, Status> {
    let Some(n) = all_nodes(
        svc,
        ListNodesRequest {
            node_id: id.to_string(),
            ..Default::default()
        },
    )
    .await?
    .nodes
    .into_iter()
    .find(|n| n.node_id == id) else {
        return Err(Status::not_found(format!(
            "there is no node {id}: the node list shows the fleet's"
        )));
    };
    let spec = crate::api::specs::info(svc, id.to_string()).await?;
    let commands = crate::api::commands::list(
        svc,
        ListCommandsRequest {
            node_id: id.to_string(),
            limit: 20,
        },
    )
    .await?
    .commands;
    let events = crate::api::events::list(
        svc,
        ListEventsRequest {
            node_id: id.to_string(),
            limit: 20,
            ..Default::default()
        },
    )
    .await?
    .events;
    let inventory = crate::api::nodes::inventory(
        svc,
        v1::GetNodeInventoryRequest {
            node_id: id.to_string(),
        },
    )
    .await?;
    let mut body = String::from("<dl class=\"facts\">");
    let mut fact = |k: &str, v: String| {
        let _ = write!(body, "<dt>{k}</dt><dd>{v}</dd>");
    };
    fact("Hostname", dash(&n.hostname));
    fact(
        "State",
        format!(
            "<span id=\"state\">{}</span>, epoch {}, gateway {}, last seen {} ago",
            esc(&crate::words::node_state(&n)),
            n.epoch,
            dash(&n.gateway_id),
            esc(&age(n.last_seen_age_ms))
        ),
    );
    fact(
        "Version",
        format!(
            "{} (release floor {})",
            dash(&n.agent_version),
            n.release_floor
        ),
    );
    fact("Certificate expires", esc(&time(n.cert_not_after_ms)));
    fact(
        "TPM EK",
        if n.ek_sha256.is_empty() {
            "- (joined with a token)".into()
        } else {
            format!("<code>{}</code> (bound by attestation)", esc(&n.ek_sha256))
        },
    );
    fact("Boot", dash(&n.boot_id));
    fact("Pool", dash(&n.pool));
    fact("MACs", dash(&n.macs.join(", ")));
    fact("Labels", dash(&labels(&n)));
    fact(
        "Cordon",
        if n.intent_error.is_empty() {
            dash(&crate::words::cordon(&n))
        } else {
            format!(
                "unknown: the node's stored spec does not open ({})",
                esc(&n.intent_error)
            )
        },
    );
    fact("Conditions", dash(&n.conditions.join(", ")));
    fact("Taints", dash(&n.taints.join(", ")));
    fact(
        "Spec",
        format!(
            "generation {} desired, {} applied",
            spec.desired_generation, spec.applied_generation
        ),
    );
    body.push_str("</dl>\n<h2>GPUs</h2>");
    match inventory
        .sections
        .iter()
        .find(|s| s.section == v1::InventoryKind::Gpus as i32)
    {
        None => body.push_str("<p>No inventory reported yet.</p>"),
        Some(s) => match crate::words::gpus(&s.body) {
            Err(why) => {
                let _ = write!(body, "<p class=\"problem\">{}</p>", esc(&why));
            }
            Ok(gpus) => {
                let bound: BTreeMap<&str, &str> = spec
                    .assignments
                    .iter()
                    .flat_map(|a| {
                        a.gpus
                            .iter()
                            .map(|g| (g.as_str(), a.allocation_id.as_str()))
                    })
                    .collect();
                let rows: Vec<_> = gpus
                    .iter()
                    .map(|g| {
                        let uuid = g.uuid.as_deref().unwrap_or("");
                        (
                            format!("data-gpu=\"{}\"", esc(&g.pci_address)),
                            vec![
                                esc(&g.pci_address),
                                dash(uuid),
                                dash(g.model.as_deref().unwrap_or("")),
                                g.numa_node.map_or("-".into(), |n| n.to_string()),
                                dash(
                                    bound
                                        .get(uuid)
                                        .or_else(|| bound.get(g.pci_address.as_str()))
                                        .copied()
                                        .unwrap_or(""),
                                ),
                            ],
                        )
                    })
                    .collect();
                let _ = write!(body, "<p>Reported {}.</p>", esc(&time(s.updated_at_ms)));
                body.push_str(&table(
                    "gpus",
                    &["PCI address", "UUID", "Model", "NUMA", "Allocation"],
                    &rows,
                ));
            }
        },
    }
    body.push_str("<h2>Spec sections</h2>");
    let rows: Vec<_> = spec
        .sections
        .iter()
        .map(|s| {
            (
                String::new(),
                vec![
                    esc(&spelled::<v1::StateSection>(s.section)),
                    esc(&spelled::<v1::SectionState>(s.status)),
                    dash(&s.message),
                    esc(&age(i64::try_from(s.age_ms).unwrap_or(i64::MAX))),
                ],
            )
        })
        .collect();
    body.push_str(&table(
        "sections",
        &["Section", "Status", "Message", "Age"],
        &rows,
    ));
    body.push_str("<h2>Recent commands</h2>");
    body.push_str(&table("commands", COMMAND_HEADS, &command_rows(&commands)));
    body.push_str("<h2>Recent events</h2>");
    body.push_str(&table(
        "node-events",
        &["Time", "Kind", "Node", "Detail"],
        &event_rows(&events),
    ));
    Ok(layout(Some(o), &format!("Node {id}"), &body))
}

async fn events(svc: &AdminService, o: &Operator, q: &str) -> Result<String, Status> {
    let kind = query(q, "kind").unwrap_or_default();
    let events = crate::api::events::list(
        svc,
        ListEventsRequest {
            kind: kind.clone(),
            limit: EVENTS_SHOWN,
            within_ms: 7 * 24 * 3600 * 1000,
            ..Default::default()
        },
    )
    .await?
    .events;
    let body = if kind.is_empty() {
        live_events(&events)
    } else {
        format!(
            "<p>Kinds matching <code>{}</code>.</p>{}",
            esc(&kind),
            table(
                "kind-events",
                &["Time", "Kind", "Node", "Detail"],
                &event_rows(&events)
            )
        )
    };
    Ok(layout(Some(o), "Events", &body))
}

async fn rollouts(svc: &AdminService, o: &Operator) -> Result<String, Status> {
    let rollouts = crate::api::rollouts::list(svc).await?.rollouts;
    let rows: Vec<_> = rollouts
        .iter()
        .rev()
        .map(|r| {
            let settled = r
                .nodes
                .iter()
                .filter(|n| {
                    !matches!(
                        v1::RolloutNodeStatus::try_from(n.status),
                        Ok(v1::RolloutNodeStatus::Waiting | v1::RolloutNodeStatus::Upgrading)
                    )
                })
                .count();
            (
                format!("data-rollout=\"{}\"", esc(&r.id)),
                vec![
                    esc(&r.id),
                    esc(&r.version),
                    esc(&r.selector),
                    esc(&spelled::<RolloutState>(r.state)),
                    format!("{} of {}", r.wave, r.waves.len()),
                    format!("{settled} of {}", r.nodes.len()),
                    esc(&time(r.created_at_ms)),
                    dash(&r.reason),
                ],
            )
        })
        .collect();
    let body = table(
        "rollouts",
        &[
            "Rollout", "Version", "Selector", "State", "Wave", "Settled", "Created", "Reason",
        ],
        &rows,
    );
    Ok(layout(Some(o), "Rollouts", &body))
}

async fn commands(svc: &AdminService, o: &Operator, q: &str) -> Result<String, Status> {
    let node = query(q, "node").unwrap_or_default();
    let commands = crate::api::commands::list(
        svc,
        ListCommandsRequest {
            node_id: node.clone(),
            limit: 200,
        },
    )
    .await?
    .commands;
    let body = table("commands", COMMAND_HEADS, &command_rows(&commands));
    Ok(layout(Some(o), "Commands", &body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_escaped_in_pages() {
        assert_eq!(
            esc("<script>\"a\" & 'b'</script>"),
            "&lt;script&gt;&quot;a&quot; &amp; &#39;b&#39;&lt;/script&gt;"
        );
        let page = problem(None, "<img src=x onerror=alert(1)>");
        assert!(!page.contains("<img"), "{page}");
        assert_eq!(node_link("a\"b"), "<a href=\"/nodes/a%22b\">a&quot;b</a>");
    }
}
