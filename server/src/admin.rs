//! The operator API. Every call carries the operator's bearer credential
//! (written to `operator.json` at first start); there is no other way in.
//! Errors never carry SQL, paths or backtraces: store failures are logged
//! here and reported as "unavailable".

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bcd_proto::token::JoinToken;
use bcd_proto::v1::{
    CreateTokenRequest, CreateTokenResponse, DeleteNodeRequest, DeleteNodeResponse,
    ListNodesRequest, ListNodesResponse, NodeInfo, admin_server::Admin,
};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::store::{NewToken, Store, StoreError};

/// Checks the bearer credential against the operators known at start.
#[derive(Debug, Clone)]
pub struct OperatorAuth {
    pub token_hashes: Arc<HashSet<String>>,
}

impl tonic::service::Interceptor for OperatorAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let token = request
            .metadata()
            .get(bcd_proto::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or_else(|| {
                Status::unauthenticated(
                    "the operator API needs the operator credential (operator.json in the \
                     server's data directory)",
                )
            })?;
        if !self
            .token_hashes
            .contains(&bcd_proto::fingerprint(token.as_bytes()))
        {
            return Err(Status::unauthenticated(
                "the operator credential is not valid",
            ));
        }
        Ok(request)
    }
}

#[derive(Debug, Clone)]
pub struct AdminService {
    pub store: Store,
    pub ca_pin: String,
}

fn unavailable(e: StoreError) -> Status {
    warn!(error = %format!("{e:#}"), "store error");
    Status::unavailable("the server's store is unavailable; retry later")
}

pub const MAX_TOKEN_TTL: Duration = Duration::from_secs(365 * 86_400);

#[tonic::async_trait]
impl Admin for AdminService {
    async fn create_token(
        &self,
        request: Request<CreateTokenRequest>,
    ) -> Result<Response<CreateTokenResponse>, Status> {
        let r = request.into_inner();
        let ttl = if r.ttl_ms == 0 {
            Duration::from_secs(24 * 3600)
        } else {
            Duration::from_millis(r.ttl_ms)
        };
        if ttl > MAX_TOKEN_TTL {
            return Err(Status::invalid_argument(
                "a join token lives at most 365 days",
            ));
        }
        let uses = if r.uses == 0 { 1 } else { r.uses };
        if uses > 1_000_000 {
            return Err(Status::invalid_argument(
                "a join token has at most 1000000 uses",
            ));
        }
        let token = JoinToken {
            id: format!("{:016x}", rand::random::<u64>()),
            secret: format!("{:032x}", rand::random::<u128>()),
            ca_pin: self.ca_pin.clone(),
        };
        let (id, hash, desc) = (
            token.id.clone(),
            bcd_proto::fingerprint(token.secret.as_bytes()),
            r.description,
        );
        let expires_at_ms = self
            .store
            .run(move |s| {
                s.create_token(&NewToken {
                    id: &id,
                    secret_sha256: &hash,
                    ttl,
                    uses,
                    description: &desc,
                })
            })
            .await
            .map_err(unavailable)?;
        info!(token = %token.id, uses, ?ttl, "join token created");
        Ok(Response::new(CreateTokenResponse {
            token_id: token.id.clone(),
            token: token.to_string(),
            expires_at_ms,
            uses,
        }))
    }

    async fn list_nodes(
        &self,
        _request: Request<ListNodesRequest>,
    ) -> Result<Response<ListNodesResponse>, Status> {
        let (rows, now) = self
            .store
            .run(|s| s.list_nodes())
            .await
            .map_err(unavailable)?;
        Ok(Response::new(ListNodesResponse {
            server_time_ms: now,
            nodes: rows
                .into_iter()
                .map(|n| NodeInfo {
                    node_id: n.node_id,
                    hostname: n.hostname,
                    state: n.state,
                    epoch: n.epoch,
                    gateway_id: n.gateway_id,
                    cert_not_after_ms: n.cert_not_after_ms,
                    last_seen_age_ms: n.last_seen_age_ms,
                    boot_id: n.boot_id,
                    journal_id: n.journal_id,
                    incarnation_id: n.incarnation_id,
                    conditions: n.conditions,
                    taints: n.taints,
                    agent_version: n.agent_version,
                    server_time_ms: now,
                })
                .collect(),
        }))
    }

    async fn delete_node(
        &self,
        request: Request<DeleteNodeRequest>,
    ) -> Result<Response<DeleteNodeResponse>, Status> {
        let node = request.into_inner().node_id;
        let n = node.clone();
        let deleted = self
            .store
            .run(move |s| s.delete_node(&n))
            .await
            .map_err(unavailable)?;
        if !deleted {
            return Err(Status::not_found(format!(
                "no node {node}: see better-compute nodes list"
            )));
        }
        info!(%node, "node deleted");
        Ok(Response::new(DeleteNodeResponse {}))
    }
}
