//! The fleet's events, as operators read them.

use bc_store::NodeId;
use bc_store::events::{EVENTS_READ_AT_MOST, EventQuery};
use bcd_proto::v1;
use tonic::Status;

use super::AdminService;
use super::status::{bad_request, unavailable};

/// How many events a read answers when the request names no limit.
pub const DEFAULT_LIMIT: u32 = 1_000;

pub async fn list(
    svc: &AdminService,
    r: v1::ListEventsRequest,
) -> Result<v1::ListEventsResponse, Status> {
    if r.kind.len() > 200 {
        return Err(bad_request("a kind pattern is at most 200 characters"));
    }
    let q = EventQuery {
        node_id: (!r.node_id.is_empty()).then_some(NodeId::from(r.node_id)),
        kind: r.kind,
        after_id: r.after_id.max(0),
        since_ms: match r.within_ms {
            0 => 0,
            within => {
                let now = svc.store.now().await.map_err(unavailable)?;
                now.saturating_sub(i64::try_from(within).unwrap_or(i64::MAX))
            }
        },
        limit: match r.limit {
            0 => DEFAULT_LIMIT,
            n => n.min(EVENTS_READ_AT_MOST),
        },
    };
    let events = svc.store.list_fleet_events(&q).await.map_err(unavailable)?;
    Ok(v1::ListEventsResponse {
        events: events
            .into_iter()
            .map(|e| v1::FleetEvent {
                id: e.id,
                at_ms: e.at_ms,
                kind: e.kind,
                node_id: e.node_id.into_string(),
                detail: e.detail,
            })
            .collect(),
    })
}
