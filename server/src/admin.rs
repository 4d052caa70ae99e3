//! The operator API. Every call carries the operator's bearer credential
//! (written to `operator.json` at first start); there is no other way in.
//! Errors never carry SQL, paths or backtraces: store failures are logged
//! here and reported as "unavailable".

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use bcd_proto::token::JoinToken;
use bcd_proto::v1::{
    CommandInfo, CreateTokenRequest, CreateTokenResponse, DeleteNodeRequest, DeleteNodeResponse,
    GetCommandRequest, ListCommandsRequest, ListCommandsResponse, ListNodesRequest,
    ListNodesResponse, NodeInfo, RunCommandRequest, admin_server::Admin,
};
use prost::Message;
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::gateway::{GatewayState, refusal_status};
use crate::store::{CommandRow, NewCommand, NewToken, Store, StoreError};

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

#[derive(Clone)]
pub struct AdminService {
    pub store: Store,
    pub ca_pin: String,
    pub worker_key: Arc<ring::signature::Ed25519KeyPair>,
    /// The gateway in this process, woken when a command is created.
    pub gateway: Option<Arc<GatewayState>>,
}

impl std::fmt::Debug for AdminService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminService").finish_non_exhaustive()
    }
}

/// Default deadline of a command.
pub const DEFAULT_NOT_AFTER: Duration = Duration::from_secs(3600);

fn info(c: CommandRow) -> CommandInfo {
    CommandInfo {
        command_id: c.id,
        node_id: c.node_id,
        seq: c.seq,
        kind: c.kind,
        summary: c.summary,
        state: c.state,
        reason: c.reason,
        exit_code: c.exit_code.unwrap_or(0),
        has_exit_code: c.exit_code.is_some(),
        output: c.output,
        output_truncated: c.output_truncated,
        created_at_ms: c.created_at_ms,
        not_after_ms: c.not_after_ms,
        result_at_ms: c.result_at_ms.unwrap_or(0),
        epoch: c.epoch,
    }
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

    async fn run_command(
        &self,
        request: Request<RunCommandRequest>,
    ) -> Result<Response<CommandInfo>, Status> {
        let r = request.into_inner();
        let (kind, args, summary) = crate::commands::parse(&r.kind, &r.args, r.timeout_ms)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let not_after = if r.not_after_ms == 0 {
            DEFAULT_NOT_AFTER
        } else {
            Duration::from_millis(r.not_after_ms)
        };
        let key = self.worker_key.clone();
        let (node, min_generation) = (r.node_id.clone(), r.min_generation);
        let idem = (!r.idempotency_key.is_empty()).then_some(r.idempotency_key);
        let (row, created) = self
            .store
            .run(move |s| {
                s.create_command(
                    &NewCommand {
                        node_id: &node,
                        kind,
                        summary: &summary,
                        not_after,
                        min_generation,
                        idempotency_key: idem.as_deref(),
                    },
                    |id, seq, now, not_after_ms| {
                        let payload = crate::commands::payload(
                            id,
                            &node,
                            seq,
                            kind,
                            args,
                            now,
                            not_after_ms,
                            min_generation,
                        );
                        bcd_proto::sign::seal(&key, payload.encode_to_vec())
                    },
                )
            })
            .await
            .map_err(|e| match e {
                crate::store::TxError::Refused(crate::store::Refusal::NoSuchNode(n)) => {
                    Status::not_found(format!("no node {n}: see better-compute nodes list"))
                }
                e => refusal_status(e),
            })?;
        if created {
            info!(cmd = %row.id, node = %row.node_id, kind = %row.kind, seq = row.seq, "command created");
            if let Some(gw) = &self.gateway {
                gw.wake(&row.node_id);
            }
        }
        Ok(Response::new(info(row)))
    }

    async fn list_commands(
        &self,
        request: Request<ListCommandsRequest>,
    ) -> Result<Response<ListCommandsResponse>, Status> {
        let r = request.into_inner();
        let node = (!r.node_id.is_empty()).then_some(r.node_id);
        let limit = if r.limit == 0 {
            100
        } else {
            r.limit.min(10_000)
        };
        let rows = self
            .store
            .run(move |s| s.list_commands(node.as_deref(), limit))
            .await
            .map_err(unavailable)?;
        Ok(Response::new(ListCommandsResponse {
            commands: rows.into_iter().map(info).collect(),
        }))
    }

    async fn get_command(
        &self,
        request: Request<GetCommandRequest>,
    ) -> Result<Response<CommandInfo>, Status> {
        let id = request.into_inner().command_id;
        let i = id.clone();
        let row = self
            .store
            .run(move |s| s.get_command(&i))
            .await
            .map_err(unavailable)?
            .ok_or_else(|| {
                Status::not_found(format!("no command {id}: see better-compute commands list"))
            })?;
        Ok(Response::new(info(row)))
    }
}
